"""A training job on several plans (issue 48): beside the plan it names (the wire's TrainingPlanArn) a job
is given further plans with the native API or `hyperplan jobs plans`, waits on all of them, runs on
whichever has room first, and carries on from its checkpoints on another when a segment ends.

The whole walk runs real processes on a real server (the resume test's training script); the rules, the
refusals and the CLI run on in-process servers over the fake back end (tests/inprocess.py). No test waits
for service time: the manual clock is moved.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from hyperplan.backends.local import LocalBackend
from hyperplan.cli.client import ApiError, NativeClient
from tests.harness import ADMIN, Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_jobs import (
    JOB_PERIODS,
    M5,
    SMALL_FLEET,
    TRAIN,
    _buy,
    _checkpoints,
    _describe,
    _job,
    _make_dataset,
    _model_files,
    _sleeper,
    _statuses,
    _wait_status,
)

# -- helpers -------------------------------------------------------------------------------------------


def _plans_path(job: str, plan: str | None = None) -> str:
    path = f"/api/v1/training-jobs/{quote(job, safe='')}/plans"
    return path if plan is None else f"{path}/{quote(plan, safe='')}"


def _plans(client: NativeClient, job: str) -> list[tuple[str, bool, bool]]:
    """The job's plans as (name, primary, running on it), in the answer's order."""
    answer = client.get(_plans_path(job))
    assert answer["TrainingJobName"] == job
    return [(p["TrainingPlanName"], p["Primary"], p["RunningOnIt"]) for p in answer["Plans"]]


def _add(client: NativeClient, job: str, plan: str) -> dict[str, Any]:
    return dict(client.call("PUT", _plans_path(job, plan)))


def _refused(call: Any, code: str, *words: str) -> str:
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.code == code, (words, refused.value.code, refused.value.message)
    assert all(word in refused.value.message for word in words), (words, refused.value.message)
    return str(refused.value.message)


def _last_message(job: dict[str, Any]) -> str:
    return str(job["SecondaryStatusTransitions"][-1]["StatusMessage"])


def _messages(job: dict[str, Any], status: str) -> list[str]:
    return [t["StatusMessage"] for t in job["SecondaryStatusTransitions"] if t["Status"] == status]


def _job_audit(server: Server) -> list[tuple[str, str, str]]:
    events = server.native().get("/api/v1/audit")["Events"]
    return [
        (e["Action"], e["Target"], e["Detail"]["Plan"])
        for e in events
        if e["Action"].startswith("training-job.")
    ]


# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture
def small(server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The small fleet on a real server, short real-time periods, and a dataset in s3://bucket/input."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    _make_dataset(server)
    yield server.start()
    LocalBackend(server.work_dir / "backend").adopt([])  # whatever a failed test left running goes
    assert "Traceback" not in server.log(), server.log()[-5000:]


# A second reservable type beside the small fleet's, for the instance-type rule.
P4D_POOL = """
[[pools]]
instance_type = "ml.p4d.24xlarge"
zone = "us-west-2a"
count = 2
price_per_instance_hour = "30.00"
"""


@pytest.fixture
def fast_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    """The small fleet and a pool of p4d, in process over the fake back end: its tasks run until they are
    stopped."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET.read_text() + P4D_POOL)
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=fleet, env=JOB_PERIODS)
    _make_dataset(server)
    yield server.start()
    assert "Traceback" not in server.log(), server.log()[-5000:]


# -- tests ---------------------------------------------------------------------------------------------


def test_a_job_on_two_plans_starts_on_the_one_with_room_and_resumes_on_the_other_at_its_segment_end(
    small: Server,
) -> None:
    """Plan "later" (the job names it) starts a day after plan "sooner" (added as a further plan) and
    outlives it: the job starts on "sooner", is taken back at its reclaim time, and starts again on
    "later", Active by then, from its checkpoints, with the model an uninterrupted run makes."""
    server, client, native = small, small.sagemaker(), small.native()
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    sooner = _buy(
        server, ADMIN, "sooner", 1, 2, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=2)
    )
    later = _buy(
        server,
        ADMIN,
        "later",
        1,
        2,
        StartTimeAfter=start + timedelta(days=1),
        EndTimeBefore=start + timedelta(days=3),
    )
    hyperparameters = {"epochs": "20", "lr": "0.2", "seed": "5", "epoch-seconds": "0.4"}
    client.create_training_job(
        **_job("hopper", ["python", TRAIN], plan=later, hyperparameters=hyperparameters, checkpoints=True)
    )
    # The same job, never interrupted and without pauses, on on-demand capacity: the reference model.
    client.create_training_job(
        **_job(
            "reference",
            ["python", TRAIN],
            instance_type=M5,
            hyperparameters={**hyperparameters, "epoch-seconds": "0"},
            checkpoints=True,
        )
    )
    assert "Waiting for plan later to become Active" in _last_message(_describe(server, "hopper"))

    answer = _add(native, "hopper", sooner)  # by its ARN
    assert answer["Plans"] == [
        {
            "TrainingPlanArn": later,
            "TrainingPlanName": "later",
            "Primary": True,
            "Status": "Scheduled",
            "RunningOnIt": False,
        },
        {
            "TrainingPlanArn": sooner,
            "TrainingPlanName": "sooner",
            "Primary": False,
            "Status": "Scheduled",
            "RunningOnIt": False,
        },
    ]
    job = _describe(server, "hopper")
    assert job["ResourceConfig"]["TrainingPlanArn"] == later  # as sent, whatever it runs on
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    waiting = _last_message(job)
    assert "Waiting for capacity on plans later and sooner" in waiting, waiting
    assert f"plan sooner's next segment starts at {start:%Y-%m-%d %H:%M} UTC" in waiting, waiting

    server.set_clock(start + timedelta(minutes=1))  # "sooner" is Active, "later" a day away
    _wait_status(server, "hopper", "Training")
    assert "on plan sooner's segment" in _messages(_describe(server, "hopper"), "Downloading")[0]
    assert _plans(native, "hopper") == [("later", True, False), ("sooner", False, True)]
    assert native.get("/api/v1/training-jobs/hopper")["RunningOnPlan"] == sooner
    assert client.describe_training_plan(TrainingPlanName="sooner")["InUseInstanceCount"] == 1
    assert wait_until(lambda: len(_checkpoints(server, "hopper")) >= 2), "no checkpoints were synced"

    # "later" became Active a day in; a day after that "sooner" takes its capacity back.
    server.set_clock(start + timedelta(days=2, minutes=-30))
    job = _describe(server, "hopper")
    assert len(_messages(job, "Pending")) == 2, _statuses(job)  # back to Pending (and maybe on already)
    reclaimed = _messages(job, "Pending")[-1]
    assert "Plan sooner's capacity is being taken back" in reclaimed, reclaimed
    assert "starts again from its checkpoints" in reclaimed and "plan later is Active now" in reclaimed
    assert client.describe_training_plan(TrainingPlanName="sooner")["InUseInstanceCount"] == 0
    # Once its processes have saved a checkpoint and ended, it starts on "later" without waiting for
    # anything else to happen.
    assert wait_until(lambda: _plans(native, "hopper") == [("later", True, True), ("sooner", False, False)])
    job = _wait_status(server, "hopper", "Completed")
    assert _statuses(job) == [
        "Starting", "Pending", "Downloading", "Training", "Pending", "Downloading", "Training", "Uploading",
        "Completed",
    ]  # fmt: skip
    downloads = _messages(job, "Downloading")
    assert "on plan sooner's segment" in downloads[0] and "on plan later's segment" in downloads[1], downloads
    logs = server.cli("jobs", "logs", "hopper").stdout
    assert (
        "interrupted: saved epoch" in logs and "--- attempt 2 ---" in logs and "resuming after epoch" in logs
    )
    reference = _wait_status(server, "reference", "Completed")
    hopped = _model_files(server, job["ModelArtifacts"]["S3ModelArtifacts"])
    assert (
        hopped["weights.npy"]
        == _model_files(server, reference["ModelArtifacts"]["S3ModelArtifacts"])["weights.npy"]
    )
    assert _plans(native, "hopper") == [("later", True, False), ("sooner", False, False)]
    assert client.describe_training_plan(TrainingPlanName="later")["InUseInstanceCount"] == 0


def test_adding_a_plan_follows_create_training_jobs_rules_and_refusals_write_nothing(
    fast_small: InProcessServer,
) -> None:
    server = fast_small
    team = server.new_account("team", PaymentMode="approval")
    server.native().post("/api/v1/buckets/bucket/grants", {"Account": "team"})  # the dataset's bucket
    client, native = server.sagemaker(team), server.native(team)
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    soon: dict[str, Any] = {"StartTimeAfter": start, "EndTimeBefore": start + timedelta(days=2)}
    unpaid = _buy(server, team, "unpaid", 2, 1, **soon)
    server.cli("accounts", "update", "team", "--payment-mode", "auto")
    later: dict[str, Any] = {
        "StartTimeAfter": start + timedelta(days=3),
        "EndTimeBefore": start + timedelta(days=4),
    }
    named = _buy(server, team, "named", 2, 1, **later)
    spare = _buy(server, team, "spare", 2, 2, **soon)
    _buy(server, team, "tiny", 1, 2, **soon)
    _buy(server, team, "for-clusters", 2, 2, target="hyperpod-cluster", **soon)
    theirs = _buy(server, server.new_account("stranger"), "theirs", 2, 2, **soon)
    client.create_training_job(**_sleeper("waiter", plan=named, count=2))
    p4d = client.search_training_plan_offerings(
        InstanceType="ml.p4d.24xlarge",
        InstanceCount=2,
        DurationHours=48,
        TargetResources=["training-job"],
        **soon,
    )["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"]
    client.create_training_plan(TrainingPlanName="other-type", TrainingPlanOfferingId=p4d)
    client.create_training_job(**_sleeper("loose", instance_type=M5))
    client.create_training_job(**_sleeper("gone", plan=spare))
    client.stop_training_job(TrainingJobName="gone")

    def add(job: str, plan: str) -> Any:
        return lambda: _add(native, job, plan)

    _refused(add("waiter", "theirs"), "ValidationException", "Plan: this account has no training plan theirs")
    _refused(add("waiter", theirs), "ValidationException", "plan-ownership rule")  # another account's ARN
    _refused(add("waiter", "for-clusters"), "ValidationException", "serves hyperpod-cluster", "plan-target")
    _refused(add("waiter", unpaid), "ValidationException", "is Pending", "plan-status rule")
    _refused(add("waiter", "other-type"), "ValidationException", "reserves ml.p4d.24xlarge", "instance-type")
    _refused(add("waiter", "tiny"), "ValidationException", "more than plan", "plan-capacity rule")
    _refused(add("waiter", "named"), "ValidationException", "is the plan training job waiter names")
    _refused(add("loose", "spare"), "ValidationException", "on-demand capacity", "names no TrainingPlanArn")
    _refused(add("gone", "tiny"), "ValidationException", "is Stopped (Stopped)", "has ended")
    _refused(add("nobody", "spare"), "ResourceNotFound", "nobody")
    _refused(lambda: _add(server.native(), "waiter", spare), "ResourceNotFound", "waiter")  # not theirs
    _refused(lambda: server.native().get(_plans_path("waiter")), "ResourceNotFound", "waiter")
    assert _plans(native, "waiter") == [("named", True, False)]  # nothing half-written
    assert _job_audit(server) == []

    def described(name: str) -> dict[str, Any]:
        return dict(client.describe_training_job(TrainingJobName=name))

    server.set_clock(start + timedelta(minutes=1))  # "spare" is Active; "named" three days away
    assert described("waiter")["SecondaryStatus"] == "Pending"
    first = _add(native, "waiter", "spare")
    job = described("waiter")  # started by the request itself: no other event came
    assert job["SecondaryStatus"] in ("Downloading", "Training"), _last_message(job)
    assert "on plan spare's segment" in _messages(job, "Downloading")[0]
    assert _add(native, "waiter", spare) == first  # by name or ARN, again: nothing changes
    assert [(p["TrainingPlanName"], p["RunningOnIt"]) for p in first["Plans"]] == [
        ("named", False),
        ("spare", True),
    ]
    assert _job_audit(server) == [("training-job.plan-add", "waiter", "spare")]
    assert client.describe_training_plan(TrainingPlanName="spare")["InUseInstanceCount"] == 2

    remove = lambda plan: lambda: native.delete(_plans_path("waiter", plan))  # noqa: E731
    _refused(remove("spare"), "ResourceInUse", "runs on plan spare now", "stop the job, or wait")
    _refused(remove("named"), "ValidationException", "only a further plan can be removed")
    _refused(remove("tiny"), "ResourceNotFound", "has no further plan tiny")
    _refused(remove("nope"), "ResourceNotFound", "has no further plan nope")
    assert _plans(native, "waiter") == [("named", True, False), ("spare", False, True)]
    assert len(_job_audit(server)) == 1
    client.stop_training_job(TrainingJobName="waiter")
    assert wait_until(lambda: described("waiter")["SecondaryStatus"] == "Stopped")
    _refused(add("waiter", "tiny"), "ValidationException", "has ended")


def test_a_waiting_job_waits_on_its_other_plans_when_one_fails_and_ends_when_none_is_left(
    fast_small: InProcessServer,
) -> None:
    server, admin = fast_small, fast_small.native()
    client = server.sagemaker()
    start = boundary_after(service_now(server) + timedelta(days=1))
    first = _buy(server, ADMIN, "first", 1, 1, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=1))
    window: dict[str, Any] = {
        "StartTimeAfter": start + timedelta(days=2),
        "EndTimeBefore": start + timedelta(days=3),
    }
    _buy(server, ADMIN, "second", 1, 1, **window)
    _buy(server, ADMIN, "third", 1, 1, **window)
    client.create_training_job(**_sleeper("patient", plan=first))
    for plan in ("second", "third"):
        _add(admin, "patient", plan)

    admin.post("/api/v1/accounts/admin/plans/first/cancel", {"Reason": "maintenance"})
    job = _describe(server, "patient")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    message = _last_message(job)
    assert "Waiting for capacity on plans first, second and third" in message, message
    assert "plan first has no capacity left to give (Failed)" in message, message

    # Removing a plan it waits on: it waits on the last one, until that fails too.
    admin.delete(_plans_path("patient", "second"))
    assert _plans(admin, "patient") == [("first", True, False), ("third", False, False)]
    assert _describe(server, "patient")["SecondaryStatus"] == "Pending"
    admin.post("/api/v1/accounts/admin/plans/third/cancel", {"Reason": "maintenance"})
    job = _describe(server, "patient")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Interrupted")
    assert _last_message(job) == (
        "Interrupted: none of its plans first and third has capacity left to give (first Failed, third "
        "Failed) before the job finished."
    )
    assert _job_audit(server) == [
        ("training-job.plan-add", "patient", "second"),
        ("training-job.plan-add", "patient", "third"),
        ("training-job.plan-remove", "patient", "second"),
    ]


def test_a_job_running_on_a_further_plan_carries_on_when_the_plan_it_names_ends(
    fast_small: InProcessServer,
) -> None:
    server, admin, client = fast_small, fast_small.native(), fast_small.sagemaker()
    start = boundary_after(service_now(server) + timedelta(days=1))
    short = _buy(server, ADMIN, "short", 1, 1, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=1))
    _buy(server, ADMIN, "long", 1, 2, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=2))
    client.create_training_job(**_sleeper("holder", plan=short))  # first in: it gets "short"
    client.create_training_job(**_sleeper("runner", plan=short))
    _add(admin, "runner", "long")
    server.set_clock(start)
    _wait_status(server, "holder", "Training")
    _wait_status(server, "runner", "Training")
    assert _plans(admin, "runner") == [("short", True, False), ("long", False, True)]

    server.set_clock(start + timedelta(days=1, minutes=-30))  # "short" takes its capacity back
    holder = _wait_status(server, "holder", "Interrupted")
    assert "It was the plan's last segment" in _messages(holder, "Stopping")[0]
    runner = _describe(server, "runner")
    assert _statuses(runner) == ["Starting", "Pending", "Downloading", "Training"]  # never taken back
    assert client.describe_training_plan(TrainingPlanName="long")["InUseInstanceCount"] == 1
    client.stop_training_job(TrainingJobName="runner")
    _wait_status(server, "runner", "Stopped")


def test_pending_time_counts_by_a_plan_only_from_when_it_was_added(fast_small: InProcessServer) -> None:
    server, admin, client = fast_small, fast_small.native(), fast_small.sagemaker()
    start = boundary_after(service_now(server) + timedelta(days=1))
    busy = _buy(server, ADMIN, "busy", 1, 2, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=2))
    window: dict[str, Any] = {
        "StartTimeAfter": start + timedelta(days=3),
        "EndTimeBefore": start + timedelta(days=4),
    }
    far = _buy(server, ADMIN, "far", 1, 1, **window)
    client.create_training_job(**_sleeper("holder", plan=busy))
    hour = {"MaxRuntimeInSeconds": 2419200, "MaxPendingTimeInSeconds": 3600}
    client.create_training_job(**_sleeper("impatient", plan=far, StoppingCondition=hour))
    server.set_clock(start + timedelta(hours=2))  # "busy" has been Active (and full) for two hours
    _wait_status(server, "holder", "Training")
    _add(admin, "impatient", "busy")  # those two hours were not its to wait on: they do not count
    server.set_clock(start + timedelta(hours=2, minutes=59))
    assert _describe(server, "impatient")["SecondaryStatus"] == "Pending"
    server.set_clock(start + timedelta(hours=3))
    job = _describe(server, "impatient")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "MaxPendingTimeInSeconds (3600) reached" in _last_message(job)
    assert "while one of plans far and busy was Active" in _last_message(job)
    client.stop_training_job(TrainingJobName="holder")
    _wait_status(server, "holder", "Stopped")


def test_the_cli_lists_adds_and_removes_a_jobs_plans(fast_small: InProcessServer) -> None:
    server = fast_small
    start = boundary_after(service_now(server) + timedelta(days=1))
    window: dict[str, Any] = {"StartTimeAfter": start, "EndTimeBefore": start + timedelta(days=1)}
    named = _buy(server, ADMIN, "named", 1, 1, **window)
    extra = _buy(server, ADMIN, "extra", 1, 1, **window)
    server.sagemaker().create_training_job(**_sleeper("cli-job", plan=named))

    added = server.cli("jobs", "plans", "add", "cli-job", extra).stdout  # an ARN: a "/" in the path
    assert "Plans of training job cli-job" in added
    assert "named" in added and "further" in added and extra in added
    listed = json.loads(server.cli("jobs", "plans", "list", "cli-job", "--json").stdout)
    assert [(p["TrainingPlanName"], p["Primary"]) for p in listed["Plans"]] == [
        ("named", True),
        ("extra", False),
    ]
    assert "Plans: named, extra" in server.cli("jobs", "describe", "cli-job").stdout
    refused = server.cli("jobs", "plans", "remove", "cli-job", "named", check=False)
    assert refused.returncode == 1
    assert refused.stderr.startswith("ValidationException: ") and "only a further plan" in refused.stderr
    removed = json.loads(server.cli("--json", "jobs", "plans", "remove", "cli-job", "extra").stdout)
    assert [p["TrainingPlanName"] for p in removed["Plans"]] == ["named"]
    server.sagemaker().stop_training_job(TrainingJobName="cli-job")
