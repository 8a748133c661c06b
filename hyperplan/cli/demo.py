"""`make demo`: a training plan's whole life, with a HyperPod cluster and a training job on plans, in a
minute or two.

    python -m hyperplan.cli.demo [--examples DIR] [--directory DIR]

It serves the demo fleet from a temporary directory under the manual clock, starting at DEMO_START
(always the same instant, so that every run meets the same calendar), and walks:

1. two plans for the same day, bought as a user buys them: one for a HyperPod cluster (a plan serves
   one target, as on AWS) and one for training jobs;
2. the cluster of examples/hyperpod (an on-demand controller group, a worker group on the first plan),
   its lifecycle script uploaded to S3; the controller runs at once, the workers wait for the plan;
3. the training job of examples/training-job on the second plan: Pending until the plan is Active;
4. the clock moved to the plans' start: the workers' nodes run their lifecycle script, the job trains
   and completes;
5. the clock moved to the reclaim time, 30 minutes before the end: the workers' nodes are taken back;
6. the clock moved to the end: both plans Expired, the worker group at 0 nodes, the job Completed;
7. the cluster deleted, which ends its on-demand controller.

Each step prints the real `aws` and `hyperplan` command lines it runs, which a user can copy, and what
they printed. The examples' files are used as they are, but for the plan's ARN put in place of their
YOUR-PLAN-ARN. At the end the server is stopped, no process of the demo is left (else it fails) and the
directory is removed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hyperplan.cli.demo_session import DemoFailed, DemoSession, demo_session, shown

DEMO_START = datetime(2027, 3, 1, 9, 0, tzinfo=UTC)
"""The service clock's first instant: a Monday morning, two and a half hours before the day's 11:30 UTC
boundary, where the demo fleet's calendar has a day free for both plans."""
INSTANCE_TYPE = "ml.p5.48xlarge"
CLUSTER_PLAN, JOB_PLAN, JOB = "demo-cluster-plan", "demo-job-plan", "demo-job"
PLAN_ARN_PLACEHOLDER = "YOUR-PLAN-ARN"
LEAD_TIME = timedelta(minutes=30)  # the demo fleet's [policy]: the soonest a plan may start, and reclaim
SEGMENT_END = (11, 30)  # ... and the UTC time every segment ends at
NODES_TIMEOUT = 180.0  # real node processes run their lifecycle scripts
JOB_TIMEOUT = 180.0
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Examples:
    """The example files the walk uses, and what it reads in them."""

    root: Path

    @property
    def cluster_config(self) -> Path:
        return self.root / "hyperpod" / "cluster-config.json"

    @property
    def on_create(self) -> Path:
        return self.root / "hyperpod" / "on_create.sh"

    @property
    def training_job(self) -> Path:
        return self.root / "training-job" / "training-job.json"

    @property
    def data(self) -> Path:
        return self.root / "training-job" / "numbers.csv"

    @property
    def code(self) -> Path:
        return self.root / "sdk" / "train.py"

    def check(self) -> None:
        for path in (self.cluster_config, self.on_create, self.training_job, self.data, self.code):
            if not path.is_file():
                raise DemoFailed(f"{path} is not there: run `make demo` in a clone of the repository")

    def cluster(self) -> dict[str, Any]:
        return dict(json.loads(self.cluster_config.read_text()))

    def job(self) -> dict[str, Any]:
        return dict(json.loads(self.training_job.read_text()))


def day_window(now: datetime) -> tuple[datetime, datetime]:
    """From `now` to the end of the first whole day a plan bought now can hold: a search in it offers that
    day only."""
    hour, minute = SEGMENT_END
    start = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if start < now + LEAD_TIME:
        start += timedelta(days=1)
    return now, start + timedelta(days=1)


def zulu(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def step(number: int, title: str) -> None:
    print(f"\n== {number}. {title}", flush=True)


def note(text: str) -> None:
    print(f"# {text}", flush=True)


# -- the walk -----------------------------------------------------------------------------------------


def walk(session: DemoSession, examples: Examples) -> None:
    started = time.monotonic()
    cluster = examples.cluster()
    cluster_name = str(cluster["ClusterName"])
    plan_groups = [g["InstanceGroupName"] for g in cluster["InstanceGroups"] if "TrainingPlanArn" in g]
    window = day_window(session.clock_start)

    step(1, f"A plan for a HyperPod cluster: 2 x {INSTANCE_TYPE} for a day, from today")
    cluster_plan = buy(session, CLUSTER_PLAN, "hyperpod-cluster", 2, window)
    step(2, f"A plan for training jobs: 1 x {INSTANCE_TYPE}, the same day (a plan serves one target)")
    job_plan = buy(session, JOB_PLAN, "training-job", 1, window)
    start, end = plan_times(session, CLUSTER_PLAN)

    step(3, f"The cluster of {shown(examples.cluster_config)}: its controller on demand, workers on the plan")
    create_cluster(session, examples, cluster_plan)
    wait_for_nodes(session, cluster_name, {g: 0 for g in plan_groups}, "the controller's node")
    show_groups(session, cluster_name)
    note("The controller runs on on-demand capacity; the workers wait, at 0, for their plan to start.")

    step(4, f"A training job of {shown(examples.training_job)} on the other plan")
    create_job(session, examples, job_plan)
    show_job(session)

    step(5, f"{zulu(start)}: the plans start")
    session.hyperplan("clock", "set", zulu(start))
    wait_for_nodes(session, cluster_name, {}, "the workers' nodes to run their lifecycle script")
    session.aws(
        *("sagemaker", "describe-training-plan", "--training-plan-name", CLUSTER_PLAN),
        *("--query", "[Status, InUseInstanceCount, AvailableInstanceCount]", "--output", "text"),
    )
    nodes = session.aws(
        *("sagemaker", "list-cluster-nodes", "--cluster-name", cluster_name),
        "--query",
        "ClusterNodeSummaries[].[InstanceGroupName, InstanceId, InstanceStatus.Status]",
        *("--output", "text"),
    )
    worker = next(line.split()[1] for line in nodes.splitlines() if line.split()[0] in plan_groups)
    session.hyperplan("clusters", "exec", cluster_name, worker, "--", "cat", "node-role.txt")
    wait_for_job(session)
    show_job(session, done=True)
    session.hyperplan("jobs", "logs", JOB)

    reclaim = end - LEAD_TIME
    step(6, f"{zulu(reclaim)}: 30 minutes before the end, the plan's capacity is taken back")
    session.hyperplan("clock", "set", zulu(reclaim))
    wait_for_workers_gone(session, cluster_name, plan_groups)
    show_groups(session, cluster_name)

    step(7, f"{zulu(end)}: the plans end")
    session.hyperplan("clock", "set", zulu(end))
    session.aws(
        *("sagemaker", "list-training-plans"),
        *("--query", "TrainingPlanSummaries[].[TrainingPlanName, Status]", "--output", "text"),
    )
    show_groups(session, cluster_name)
    session.aws(
        *("sagemaker", "list-training-jobs"),
        *("--query", "TrainingJobSummaries[].[TrainingJobName, TrainingJobStatus]", "--output", "text"),
    )

    step(8, "Tidy up: the on-demand controller is charged by the hour until its cluster is deleted")
    session.aws("sagemaker", "delete-cluster", "--cluster-name", cluster_name, "--output", "text")
    wait_for_cluster_gone(session, cluster_name)
    session.aws(*("sagemaker", "list-clusters", "--query", "length(ClusterSummaries)", "--output", "text"))
    note(f"The walk took {time.monotonic() - started:.0f} s of real time.")


def buy(session: DemoSession, name: str, target: str, count: int, window: tuple[datetime, datetime]) -> str:
    """Search the window and buy its first offering; the plan's ARN."""
    found = session.aws(
        *("sagemaker", "search-training-plan-offerings", "--instance-type", INSTANCE_TYPE),
        *("--instance-count", str(count), "--duration-hours", "24", "--target-resources", target),
        *("--start-time-after", zulu(window[0]), "--end-time-before", zulu(window[1])),
        "--query",
        "TrainingPlanOfferings[0].{Offering: TrainingPlanOfferingId, UpfrontFee: UpfrontFee, "
        "Zone: ReservedCapacityOfferings[0].AvailabilityZone, Start: ReservedCapacityOfferings[0].StartTime, "
        "End: ReservedCapacityOfferings[0].EndTime}",
        *("--output", "json"),
    )
    offering = json.loads(found or "null")
    if not offering:
        raise DemoFailed(f"no offering for {count} x {INSTANCE_TYPE} ({target}) in that window")
    return session.aws(
        *("sagemaker", "create-training-plan", "--training-plan-name", name),
        *(
            "--training-plan-offering-id",
            offering["Offering"],
            "--query",
            "TrainingPlanArn",
            "--output",
            "text",
        ),
    )


def plan_times(session: DemoSession, name: str) -> tuple[datetime, datetime]:
    plan = session.sagemaker().describe_training_plan(TrainingPlanName=name)
    return plan["StartTime"], plan["EndTime"]


def with_plan(session: DemoSession, template: Path, plan_arn: str) -> Path:
    """The example's JSON with the plan's ARN in place of its placeholder, as a user would make it."""
    made = session.directory / template.name
    session.run(["sed", f"s|{PLAN_ARN_PLACEHOLDER}|{plan_arn}|", shown(template)], stdout_to=made)
    return made


def create_cluster(session: DemoSession, examples: Examples, plan_arn: str) -> None:
    lifecycle = examples.cluster()["InstanceGroups"][0]["LifeCycleConfig"]
    bucket = lifecycle["SourceS3Uri"].removeprefix("s3://").split("/")[0]
    session.aws("s3", "mb", f"s3://{bucket}")
    target = f"{lifecycle['SourceS3Uri'].rstrip('/')}/{lifecycle['OnCreate']}"
    session.aws("s3", "cp", "--no-progress", shown(examples.on_create), target)
    config = with_plan(session, examples.cluster_config, plan_arn)
    session.aws(
        *("sagemaker", "create-cluster", "--cli-input-json", f"file://{shown(config)}"),
        *("--query", "ClusterArn", "--output", "text"),
    )


def create_job(session: DemoSession, examples: Examples, plan_arn: str) -> None:
    job = examples.job()
    channel = job["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"].rstrip("/")
    session.aws("s3", "cp", "--no-progress", shown(examples.data), f"{channel}/{examples.data.name}")
    source = session.directory / "sourcedir.tar.gz"
    session.run(["tar", "-czf", shown(source), "-C", shown(examples.code.parent), examples.code.name])
    submit = job["HyperParameters"]["sagemaker_submit_directory"]
    session.aws("s3", "cp", "--no-progress", shown(source), submit)
    spec = with_plan(session, examples.training_job, plan_arn)
    session.aws(
        *("sagemaker", "create-training-job", "--cli-input-json", f"file://{shown(spec)}"),
        *("--training-job-name", JOB, "--query", "TrainingJobArn", "--output", "text"),
    )


def show_groups(session: DemoSession, cluster_name: str) -> None:
    session.aws(
        *("sagemaker", "describe-cluster", "--cluster-name", cluster_name),
        "--query",
        "InstanceGroups[].[InstanceGroupName, CurrentCount, TargetCount, TrainingPlanStatus]",
        *("--output", "text"),
    )


def show_job(session: DemoSession, *, done: bool = False) -> None:
    query = (
        "[TrainingJobStatus, ModelArtifacts.S3ModelArtifacts]"
        if done
        else "[TrainingJobStatus, SecondaryStatus, SecondaryStatusTransitions[-1].StatusMessage]"
    )
    session.aws(
        *("sagemaker", "describe-training-job", "--training-job-name", JOB),
        *("--query", query, "--output", "text"),
    )


# -- waits on real processes (boto3: an `aws` process per poll would cost a second of CPU) --------------


def wait_for_nodes(session: DemoSession, cluster_name: str, expected: dict[str, int], what: str) -> None:
    """Every group at `expected` Running nodes (a group not named: at its target); a node that fails
    ends the wait at once, with its message."""
    client = session.sagemaker()

    def settled() -> bool:
        groups = client.describe_cluster(ClusterName=cluster_name)["InstanceGroups"]
        wanted = {
            g["InstanceGroupName"]: expected.get(g["InstanceGroupName"], g["TargetCount"]) for g in groups
        }
        running = {name: 0 for name in wanted}
        for node in client.list_cluster_nodes(ClusterName=cluster_name)["ClusterNodeSummaries"]:
            status = node["InstanceStatus"]
            if status["Status"] == "Failure":
                raise DemoFailed(f"node {node['InstanceId']} failed: {status.get('Message', '')}")
            if status["Status"] == "Running":
                running[node["InstanceGroupName"]] += 1
        return running == wanted

    session.wait_for(what, settled, NODES_TIMEOUT)


def wait_for_job(session: DemoSession) -> None:
    client = session.sagemaker()

    def ended() -> bool:
        job = client.describe_training_job(TrainingJobName=JOB)
        if job["TrainingJobStatus"] in ("Failed", "Stopped"):
            raise DemoFailed(f"the job ended {job['TrainingJobStatus']}: {job.get('FailureReason', '')}")
        return bool(job["TrainingJobStatus"] == "Completed")

    session.wait_for("the job to train and complete", ended, JOB_TIMEOUT)


def wait_for_workers_gone(session: DemoSession, cluster_name: str, plan_groups: Sequence[str]) -> None:
    client = session.sagemaker()

    def gone() -> bool:
        nodes = client.list_cluster_nodes(ClusterName=cluster_name)["ClusterNodeSummaries"]
        return not any(n["InstanceGroupName"] in plan_groups for n in nodes)

    session.wait_for("the workers' nodes to shut down", gone, NODES_TIMEOUT)


def wait_for_cluster_gone(session: DemoSession, cluster_name: str) -> None:
    client = session.sagemaker()

    def gone() -> bool:
        names = [c["ClusterName"] for c in client.list_clusters()["ClusterSummaries"]]
        return cluster_name not in names

    session.wait_for("the cluster and its controller to go", gone, NODES_TIMEOUT)


# -- the command --------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--examples", type=Path, default=EXAMPLES, help="the repository's examples/")
    parser.add_argument(
        "--directory", type=Path, help="where the server keeps its data (kept); default a temporary one"
    )
    arguments = parser.parse_args(argv)
    if (
        arguments.directory is not None
        and arguments.directory.exists()
        and any(arguments.directory.iterdir())
    ):
        # A store that has lived a walk already keeps its clock and its plans: the walk would not fit.
        parser.error(f"{arguments.directory} is not empty: give a new directory")
    examples = Examples(arguments.examples)
    try:
        examples.check()
    except DemoFailed as failure:
        print(f"The demo cannot start: {failure}", file=sys.stderr)
        return 1
    keep = arguments.directory is not None
    directory = arguments.directory or Path(tempfile.mkdtemp(prefix="hyperplan-demo-"))
    try:
        with demo_session(directory, DEMO_START, keep=keep) as session:
            introduce(session)
            walk(session, examples)
    except DemoFailed as failure:
        print(f"\nThe demo failed: {failure}", file=sys.stderr)
        print(f"Its server's log and data are kept in {directory}.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nInterrupted; the server is stopped, its log and data kept in {directory}.", file=sys.stderr)
        return 130
    kept = f"its data is kept in {directory}" if keep else "its directory is removed"
    print(f"\nThe server is stopped, nothing of the demo is left running, and {kept}.", flush=True)
    return 0


def introduce(session: DemoSession) -> None:
    print(
        f"hyperplan's demo fleet on {session.url}, under a manual clock that this walk moves, from "
        f"{zulu(session.clock_start)}; tenant work runs as host processes (`make run` runs it in "
        "containers as root). The commands below run with the administrator's keys, which the server "
        "wrote at its first start (the config file asks the aws CLI for ISO 8601 times):",
        flush=True,
    )
    print(session.exports(), flush=True)


if __name__ == "__main__":
    sys.exit(main())
