"""`hyperplan jobs`: list, describe and stop training jobs; read or follow an instance's logs; give a job
further plans to run on (`jobs plans`)."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    console,
    emit,
    json_output,
    native_client,
    plain,
    reporting_errors,
    sagemaker_client,
)
from hyperplan.cli.options import ClientTyper, TextCommand

app = ClientTyper(help="Training jobs: list, describe, logs, stop, plans.", no_args_is_help=True)
plans_app = ClientTyper(
    help="The plans a training job may run on: the one it names, and further ones added here.",
    no_args_is_help=True,
)
app.add_typer(plans_app, name="plans")

FOLLOW_PAUSE = 0.5  # seconds between polls of a log that has nothing new


@app.command("list")
def list_jobs(
    plan: Annotated[str | None, typer.Option(help="Only jobs on this training plan (its ARN).")] = None,
    status: Annotated[
        str | None, typer.Option(help="InProgress, Completed, Failed, Stopping, Stopped.")
    ] = None,
) -> None:
    """This account's training jobs, oldest first."""
    from hyperplan.cli.views.jobs import JobsTable

    query: dict[str, Any] = {"SortBy": "CreationTime", "SortOrder": "Ascending"}
    if plan:
        query["TrainingPlanArnEquals"] = plan
    if status:
        query["StatusEquals"] = status
    with reporting_errors():
        found = sagemaker_client().items("ListTrainingJobs", **query)
    emit(plain(found) if json_output() else found, JobsTable)


@app.command("describe")
def describe(name: str) -> None:
    """A job's status, where it runs, its image and what it resolved to, and every status it has had."""
    from urllib.parse import quote

    from hyperplan.cli.views.jobs import JobDetail

    with reporting_errors():
        job = plain(sagemaker_client().call("DescribeTrainingJob", TrainingJobName=name))
        # DescribeTrainingJob shows the TrainingImage as sent; the native view adds what it resolved to.
        native = native_client().get(f"/api/v1/training-jobs/{quote(name, safe='')}")
    for member in ("ResolvedImage", "ImageDigest", "RunningOnPlan"):
        if native.get(member):
            job[member] = native[member]
    if len(native.get("TrainingPlans") or ()) > 1:  # further plans beside the one it names
        job["TrainingPlans"] = native["TrainingPlans"]
    emit(job, JobDetail)


@app.command("stop", cls=TextCommand)
def stop(name: str) -> None:
    """Stop a job: a waiting one at once; a running one gets SIGTERM and 120 s before SIGKILL."""
    from hyperplan.cli.views.jobs import JobStatus

    with reporting_errors():
        client = sagemaker_client()
        client.call("StopTrainingJob", TrainingJobName=name)
        job = client.call("DescribeTrainingJob", TrainingJobName=name)
    console.print(JobStatus(job))


@app.command("logs", cls=TextCommand)
def logs(
    name: str,
    host: Annotated[str, typer.Option(help="The instance: algo-1, algo-2, ...")] = "algo-1",
    stderr: Annotated[bool, typer.Option("--stderr", help="Standard error instead of output.")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")] = False,
    timestamps: Annotated[
        bool, typer.Option("--timestamps", "-t", help="Each line after the time it was written (UTC).")
    ] = False,
) -> None:
    """One instance's output, every attempt in order (a job restarted in a later segment has several)."""
    stream = "stderr" if stderr else "stdout"
    cursor: str | None = None
    attempt: int | None = None
    with reporting_errors():
        client = native_client()
        while True:
            query = {
                "host": host,
                "stream": stream,
                "cursor": cursor,
                **({"timed": "true"} if timestamps else {}),
            }
            page = client.get(f"/api/v1/training-jobs/{name}/logs", **query)
            if timestamps:
                # Whole lines, each with its time; the page moves on even when none was of this stream.
                page["Data"] = "".join(f"{line['Time']} {line['Text']}\n" for line in page["Lines"])
                if page["Cursor"] != cursor and not page["Data"] and not page["Done"]:
                    cursor = page["Cursor"]
                    continue
            if page["Data"]:
                if attempt is not None and page["Attempt"] != attempt:
                    sys.stdout.write(f"--- attempt {page['Attempt']} ---\n")
                attempt = page["Attempt"]
                sys.stdout.write(page["Data"])
                sys.stdout.flush()
            cursor = page["Cursor"]
            if page["Data"]:
                continue
            if not follow or page["Done"]:
                return
            time.sleep(FOLLOW_PAUSE)


JobArg = Annotated[str, typer.Argument(help="The training job's name.", show_default=False)]
PlanArg = Annotated[
    str, typer.Argument(help="A training plan of your account: its name or ARN.", show_default=False)
]


def _plans_path(job: str, plan: str | None = None) -> str:
    from urllib.parse import quote

    path = f"/api/v1/training-jobs/{quote(job, safe='')}/plans"
    return f"{path}/{quote(plan, safe='')}" if plan is not None else path


@plans_app.command("list")
def list_plans(name: JobArg) -> None:
    """The plans a job may run on: the one it names first, then its further plans, and which it runs on
    now."""
    from hyperplan.cli.views.jobs import JobPlansTable

    with reporting_errors():
        answer = native_client().get(_plans_path(name))
    emit(answer, JobPlansTable)


@plans_app.command("add")
def add_plan(name: JobArg, plan: PlanArg) -> None:
    """Give a waiting or running job a further plan (a training-job plan of the job's instance type, big
    enough for it): it runs on whichever of its plans has room first, and carries on from its checkpoints
    on another when a segment ends. Adding one it has already changes nothing."""
    from hyperplan.cli.views.jobs import JobPlansTable

    with reporting_errors():
        answer = native_client().call("PUT", _plans_path(name, plan))
    emit(answer, JobPlansTable)


@plans_app.command("remove")
def remove_plan(name: JobArg, plan: PlanArg) -> None:
    """Take a further plan from a job: not the plan it names, nor the one it runs on now (stop the job, or
    wait until it no longer runs there)."""
    from hyperplan.cli.views.jobs import JobPlansTable

    with reporting_errors():
        answer = native_client().delete(_plans_path(name, plan))
    emit(answer, JobPlansTable)
