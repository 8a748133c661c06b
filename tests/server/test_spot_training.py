"""Managed spot training on idle reserved capacity (issue 51), from outside, as the two teams involved see it.

An owner's plan lends its idle instances (PUT /api/v1/training-plans/{plan}/lending); a spot job of
another account (boto3's EnableManagedSpotTraining, MaxWaitTimeInSeconds, CheckpointConfig, no plan) runs
on them; the owner's own job takes them back after the plan's notice; the spot job resumes from its
checkpoints once they are idle again, and the ledgers, the plan's events and the metric say what happened.

Real servers over the local back end, real job processes (runtime process), on the spot fleet
(tests/fleets/spot.toml: no on-demand p5, so a spot p5 job runs only on lent instances; a notice of 3 s).
The manual clock is moved wherever service time must pass; the one test that measures how long a kill
took runs on a clock that runs by itself at scale 1, so that the seconds it records are real ones.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from hyperplan.backends import procfs
from hyperplan.backends.local import LocalBackend
from hyperplan.signing import Credentials
from tests.harness import REGION, Server, free_port, service_now, wait_until

SPOT_FLEET = Path(__file__).parent.parent / "fleets" / "spot.toml"
P5 = "ml.p5.48xlarge"
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"

# What tests/fleets/spot.toml says, which the assertions count on.
ON_DEMAND_PRICE = Decimal("50.00")  # per p5-hour, the fleet's one pool
PRICE_FRACTION = Decimal("0.35")
LENDER_SHARE = Decimal("0.8")
NOTICE_SECONDS = 3
KILL_GRACE_SECONDS = 10
MIN_RUN = timedelta(minutes=5)
STOP_MARGIN = timedelta(minutes=15)
RECLAIM_LEAD = timedelta(minutes=30)  # a training-job plan's segment is taken back this long before its end

# Short real-time periods of the job machinery (as tests/server/test_jobs.py sets them).
JOB_PERIODS = {
    "HYPERPLAN_JOB_RECLAIM_GRACE": "5",
    "HYPERPLAN_JOB_STOP_GRACE": "5",
    "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3",
}

HOUR = timedelta(hours=1)
SPOT_STOPPING = {"MaxRuntimeInSeconds": 6 * 3600, "MaxWaitTimeInSeconds": 12 * 3600}

# The jobs' scripts, each run as `sh -c 'eval "$SM_HP_SCRIPT"'`: a hyperparameter holds the script, as
# ContainerArguments' members are at most 256 characters; its lines are joined with "; ", as a value may
# hold no line break.
#
# The borrower's training: a step every 0.1 s until it is told to stop. On SIGTERM it takes its time (2 s,
# so that the interruption can be seen), saves its step as a checkpoint and exits 75 ("run me again"); at
# start it resumes from its checkpoint if one was restored. When a file `finish` appears in its working
# directory (the test's word that the training is done), it writes the step it resumed from into its
# model and ends. Each instance keeps a checkpoint of its own.
BORROWER = "; ".join(
    """
ckpt="$SM_CHECKPOINT_DIR/step-$SM_CURRENT_HOST"
step=0
if [ -e "$ckpt" ]; then step=$(cat "$ckpt"); fi
resumed=$step
echo "starting at step $step"
trap 'sleep 2; echo "$step" > "$ckpt"; echo "saved step $step"; exit 75' TERM
until [ -e finish ]; do sleep 0.1; step=$((step + 1)); echo "step $step"; done
echo "$resumed" > "$SM_MODEL_DIR/resumed-from.txt"
echo "finished at step $step"
""".strip().splitlines()
)
# A borrower that ignores SIGTERM: only a kill ends it.
STUBBORN = "; ".join(
    """
trap 'echo "TERM ignored"' TERM
echo started
while :; do sleep 0.1; done
""".strip().splitlines()
)
# The owner's job: it runs until a file `go` appears in its working directory.
OWNER = "; ".join(
    """
echo "owner started"
until [ -e go ]; do sleep 0.1; done
echo "owner done"
""".strip().splitlines()
)

# -- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture
def start_spot(
    server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Server]]:
    """Starts a server on the spot fleet (each test one); after the test, nothing of its jobs is left
    running and its log holds no Traceback."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    started: list[Server] = []

    def start(**options: Any) -> Server:
        server = server_factory(data_dir=tmp_path / "spot", fleet=SPOT_FLEET, **options)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        LocalBackend(server.work_dir / "backend").adopt([])  # whatever a failed test left running goes
        assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture
def spot(start_spot: Callable[..., Server]) -> Server:
    """A server on the spot fleet under the manual clock."""
    return start_spot()


# -- helpers -------------------------------------------------------------------------------------------


class Team:
    """An account as its users see the service: its name, its keys, its clients."""

    def __init__(self, server: Server, name: str) -> None:
        self.server, self.name = server, name
        self.credentials: Credentials = server.new_account(name)
        self.sagemaker = server.sagemaker(self.credentials)
        self.native = server.native(self.credentials)
        self.account_id = str(self.native.get("/api/v1/whoami")["AccountId"])

    def bucket(self, name: str) -> str:
        self.native.post("/api/v1/buckets", {"Name": name})
        return name

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.server.url,
            region_name=REGION,
            aws_access_key_id=self.credentials.access_key,
            aws_secret_access_key=self.credentials.secret_key,
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        )

    def describe(self, job: str) -> dict[str, Any]:
        return dict(self.sagemaker.describe_training_job(TrainingJobName=job))

    def status(self, job: str) -> tuple[str, str]:
        described = self.describe(job)
        return described["TrainingJobStatus"], described["SecondaryStatus"]

    def wait_status(self, job: str, secondary: str, timeout: float = 90) -> dict[str, Any]:
        found = wait_until(lambda: (d := self.describe(job))["SecondaryStatus"] == secondary and d, timeout)
        if not found:  # said in full: a repr in an assertion message is cut short
            described = self.describe(job)
            pytest.fail(
                f"{job} is not {secondary} after {timeout} s: {described['TrainingJobStatus']}/"
                f"{described['SecondaryStatus']}; transitions {_history(described)}\n"
                f"the server's log ends:\n{self.server.log()[-3000:]}"
            )
        return dict(found)

    def output(self, job: str, host: str = "algo-1") -> str:
        """An instance's standard output across the job's attempts (what `hyperplan jobs logs` reads)."""
        text, cursor = "", None
        while True:
            page = self.native.get(
                f"/api/v1/training-jobs/{job}/logs", host=host, stream="stdout", cursor=cursor
            )
            text, cursor = text + page["Data"], page["Cursor"]
            if not page["Data"]:
                return text

    def ledger(self) -> list[Decimal]:
        entries = self.native.get(f"/api/v1/accounts/{self.name}/ledger")["Entries"]
        return [Decimal(entry["Amount"]) for entry in entries]


def _history(job: dict[str, Any]) -> list[tuple[str, str]]:
    return [(t["Status"], t.get("StatusMessage", "")) for t in job["SecondaryStatusTransitions"]]


def _statuses(job: dict[str, Any]) -> list[str]:
    return [t["Status"] for t in job["SecondaryStatusTransitions"]]


def _last_message(job: dict[str, Any]) -> str:
    return str(job["SecondaryStatusTransitions"][-1].get("StatusMessage", ""))


def _buy(team: Team, name: str, count: int = 2) -> dict[str, Any]:
    """A one-day training-job plan of `count` p5, from the first offering; the plan as described."""
    offering = team.sagemaker.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    team.sagemaker.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return dict(team.sagemaker.describe_training_plan(TrainingPlanName=name))


def _lending_path(plan: str) -> str:
    return f"/api/v1/training-plans/{plan}/lending"


def _lend(owner: Team, plan: str) -> dict[str, Any]:
    """The owner's plan lends its idle instances, with a notice of NOTICE_SECONDS (the fleet's default
    minimum run and stop-lending margin)."""
    return dict(owner.native.call("PUT", _lending_path(plan), body={"Notice": NOTICE_SECONDS}))


def _request(
    name: str,
    script: str,
    bucket: str,
    *,
    count: int = 2,
    spot: bool = False,
    plan: str | None = None,
    stopping: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A CreateTrainingJob request running `script` (a hyperparameter the entry point evaluates) on `count`
    p5, its checkpoints and model in `bucket`: a managed spot job (no plan) or a job on `plan`."""
    resources: dict[str, Any] = {"InstanceType": P5, "InstanceCount": count, "VolumeSizeInGB": 10}
    if plan is not None:
        resources["TrainingPlanArn"] = plan
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": IMAGE,
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": ['eval "$SM_HP_SCRIPT"'],
        },
        "HyperParameters": {"script": script},
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/output"},
        "ResourceConfig": resources,
        "StoppingCondition": stopping or (SPOT_STOPPING if spot else {"MaxRuntimeInSeconds": 6 * 3600}),
        "CheckpointConfig": {"S3Uri": f"s3://{bucket}/checkpoints/{name}"},
    }
    if spot:
        request["EnableManagedSpotTraining"] = True
    return request


def _processes_of(server: Server, job: str) -> set[Path]:
    """The working directories (each a job instance's tree) of this server's processes of training job
    `job`, known by the TRAINING_JOB_NAME the training contract gives them; the log wrapper aside."""
    root = str(server.work_dir.resolve())
    found: set[Path] = set()
    for pid in procfs.all_pids():
        try:
            argv = (procfs.PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(procfs.PROC / str(pid) / "cwd")
        except OSError:
            continue
        if not cwd.startswith(root) or any(part.endswith(b"timedlog.py") for part in argv):
            continue
        if procfs.read_environ(pid).get("TRAINING_JOB_NAME") == job:
            found.add(Path(cwd))
    return found


def _tell(server: Server, job: str, word: str, instances: int) -> None:
    """Write the file `word` in the working directory of each of the job's `instances` instances: the
    test's signal to its script (go, finish)."""
    directories = wait_until(lambda: len(found := _processes_of(server, job)) == instances and found, 60)
    assert directories, f"{job} does not run on {instances} instances: {_processes_of(server, job)}"
    for directory in directories:
        (directory / word).write_text("now\n")


def _watch_handover(
    server: Server, owner: tuple[Team, str], borrower: tuple[Team, str], timeout: float = 60
) -> set[str]:
    """What a watcher sees, every 50 ms, from the owner's job's creation until it trains: "borrower
    interrupted while the owner waited" (InProgress/Interrupted beside InProgress/Pending), "both
    running" (processes of both jobs at once: the owner did not wait), "owner training". Each a (team,
    job)."""
    (owner_team, owner_job), (borrower_team, borrower_job) = owner, borrower
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owner_status = owner_team.status(owner_job)
        if borrower_team.status(borrower_job) == ("InProgress", "Interrupted") and owner_status == (
            "InProgress",
            "Pending",
        ):
            seen.add("borrower interrupted while the owner waited")
        if _processes_of(server, owner_job) and _processes_of(server, borrower_job):
            seen.add("both running")
        if owner_status == ("InProgress", "Training"):
            seen.add("owner training")
            return seen
        time.sleep(0.05)
    return seen


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the metrics listener, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _reclaims(port: int, promise: str) -> float:
    return _scrape(port).get(("hyperplan_spot_reclaims_total", frozenset({("promise", promise)})), 0.0)


def _reclaim_events(owner: Team, plan: str) -> list[dict[str, Any]]:
    events = owner.native.get(f"/api/v1/plans/{plan}/events")["Events"]
    return [event for event in events if event["Kind"] == "lending.reclaim"]


def _seconds_in(message: str) -> list[float]:
    """The numbers of seconds a message states ("notice 3 s", "after 0.4 s")."""
    return [float(n) for n in re.findall(r"(\d+(?:\.\d+)?) ?s\b", message)]


def _spot_charge(count: int, seconds: int) -> Decimal:
    """What a borrower of `count` p5 pays for `seconds`: the fleet's fraction of the on-demand price, per
    second, rounded to cents."""
    exact = ON_DEMAND_PRICE * PRICE_FRACTION * count * seconds / 3600
    return exact.quantize(Decimal("0.01"))


def _credit(charge: Decimal) -> Decimal:
    """The owner's share of a charge, rounded down to cents."""
    return (charge * LENDER_SHARE).quantize(Decimal("0.01"), rounding=ROUND_DOWN)


def _model_file(team: Team, job: dict[str, Any], name: str) -> str:
    """A file of a completed job's model.tar.gz, read back through S3 as its account."""
    bucket, _, key = job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("s3://").partition("/")
    body = team.s3().get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        member = archive.extractfile(name)
        assert member is not None, name
        return member.read().decode()


def _start_of_plan(server: Server, plan: dict[str, Any]) -> datetime:
    """The manual clock moved a minute into the plan's first segment: the plan is Active."""
    moment: datetime = plan["StartTime"] + timedelta(minutes=1)
    server.set_clock(moment)
    return moment


# -- the whole story -----------------------------------------------------------------------------------


def test_a_spot_job_borrows_idle_instances_gives_them_back_at_the_owners_job_and_resumes_after_it(
    start_spot: Callable[..., Server],
) -> None:
    metrics_port = free_port()
    server = start_spot(extra_args=("--metrics-listen", f"127.0.0.1:{metrics_port}"))
    owner, borrower = Team(server, "team-alpha"), Team(server, "team-beta")
    bucket = borrower.bucket("beta-data")
    plan = _buy(owner, "alpha-plan")
    owner_budget_after_purchase = owner.ledger()
    started = _start_of_plan(server, plan)
    _lend(owner, "alpha-plan")
    kept_before = _reclaims(metrics_port, "kept")

    # The borrower's spot job runs on the two lent instances.
    borrower.sagemaker.create_training_job(**_request("nightly-sweep", BORROWER, bucket, spot=True))
    borrower.wait_status("nightly-sweep", "Training")
    assert wait_until(lambda: "step 3\n" in borrower.output("nightly-sweep")), borrower.output(
        "nightly-sweep"
    )
    assert wait_until(lambda: len(_processes_of(server, "nightly-sweep")) == 2), _processes_of(
        server, "nightly-sweep"
    )
    server.set_clock(started + HOUR)  # an hour of borrowed time
    assert borrower.status("nightly-sweep") == ("InProgress", "Training")

    # The owner's job arrives: the borrower is told, the owner's job waits until its processes are gone.
    owner.sagemaker.create_training_job(
        **_request("alpha-train", OWNER, owner.bucket("alpha-data"), plan=plan["TrainingPlanArn"])
    )
    seen = _watch_handover(server, (owner, "alpha-train"), (borrower, "nightly-sweep"))
    assert "owner training" in seen, (owner.describe("alpha-train"), borrower.describe("nightly-sweep"))
    assert "borrower interrupted while the owner waited" in seen, seen
    assert "both running" not in seen, seen
    assert not _processes_of(server, "nightly-sweep")
    waiting = borrower.wait_status("nightly-sweep", "Pending")
    assert waiting["TrainingJobStatus"] == "InProgress"
    assert _statuses(waiting)[-2:] == ["Interrupted", "Pending"], _history(waiting)
    assert "saved step" in borrower.output("nightly-sweep")

    # What the owner sees of it: counts and seconds, nobody's name.
    (event,) = _reclaim_events(owner, "alpha-plan")
    message = event["Message"]
    assert NOTICE_SECONDS in _seconds_in(message), message
    for secret in ("nightly-sweep", "team-beta", borrower.account_id):
        assert secret not in message, message
    assert _reclaims(metrics_port, "kept") == kept_before + 1
    lent = owner.native.get(_lending_path("alpha-plan"))
    assert (lent["Reclaims"], lent["PromisesKept"], lent["PromisesBroken"]) == (1, 1, 0), lent
    assert "Runs" not in lent, lent  # the borrowers' jobs are for administrators' eyes

    # The owner's job runs an hour while the borrower waits, and completes; then the borrower resumes.
    server.set_clock(started + 2 * HOUR)
    assert borrower.status("nightly-sweep") == ("InProgress", "Pending")
    _tell(server, "alpha-train", "go", instances=2)
    owner.wait_status("alpha-train", "Completed")
    borrower.wait_status("nightly-sweep", "Training")
    assert wait_until(lambda: borrower.output("nightly-sweep").count("starting at step") == 2)
    server.set_clock(started + 3 * HOUR)  # another hour of borrowed time
    _tell(server, "nightly-sweep", "finish", instances=2)
    job = borrower.wait_status("nightly-sweep", "Completed")

    # Placed at its creation (lent instances were idle), interrupted, waiting, placed again.
    assert _statuses(job) == [
        "Starting", "Downloading", "Training", "Interrupted", "Pending", "Downloading", "Training",
        "Uploading", "Completed",
    ]  # fmt: skip
    saved = (
        borrower.s3().get_object(Bucket=bucket, Key="checkpoints/nightly-sweep/step-algo-1")["Body"].read()
    )
    resumed_from = _model_file(borrower, job, "resumed-from.txt")
    assert int(resumed_from) == int(saved) >= 3, (resumed_from, saved)
    assert f"starting at step {int(saved)}" in borrower.output("nightly-sweep")
    # Two hours on instances, three from the first start to the end.
    assert (job["BillableTimeInSeconds"], job["TrainingTimeInSeconds"]) == (2 * 3600, 3 * 3600)

    # Each run charged to the borrower per second at the spot price; the owner credited its share.
    charge = _spot_charge(count=2, seconds=3600)
    assert borrower.ledger() == [-charge, -charge]
    credits = owner.ledger()[len(owner_budget_after_purchase) :]
    assert credits == [_credit(charge), _credit(charge)], credits
    assert sum(credits) <= charge * 2
    assert not _processes_of(server, "nightly-sweep") and not _processes_of(server, "alpha-train")


# -- the promise ---------------------------------------------------------------------------------------


def test_a_borrower_that_ignores_sigterm_is_killed_at_the_notices_end(
    start_spot: Callable[..., Server],
) -> None:
    """On a clock that runs by itself at scale 1: the seconds between the reclaim and the owner having its
    instances are measured, not set by the test (under the manual clock they would be whatever the test
    moved the clock by, since the kill waits for the deadline's service time)."""
    server = start_spot(clock="accelerated", extra_args=("--time-scale", "1"))
    owner, borrower = Team(server, "team-alpha"), Team(server, "team-beta")
    plan = _buy(owner, "alpha-plan")
    _start_of_plan(server, plan)
    _lend(owner, "alpha-plan")
    borrower.sagemaker.create_training_job(
        **_request("stubborn", STUBBORN, borrower.bucket("beta-data"), spot=True)
    )
    borrower.wait_status("stubborn", "Training")
    assert wait_until(lambda: len(_processes_of(server, "stubborn")) == 2), _processes_of(server, "stubborn")

    owner.sagemaker.create_training_job(
        **_request("alpha-train", OWNER, owner.bucket("alpha-data"), plan=plan["TrainingPlanArn"])
    )
    seen = _watch_handover(server, (owner, "alpha-train"), (borrower, "stubborn"))
    assert "owner training" in seen, (owner.describe("alpha-train"), borrower.describe("stubborn"))
    assert "borrower interrupted while the owner waited" in seen, seen
    assert "both running" not in seen, seen
    # It was told, and took no notice.
    assert wait_until(lambda: "TERM ignored" in borrower.output("stubborn"), timeout=10)
    assert not _processes_of(server, "stubborn")  # killed, not given up on
    assert borrower.wait_status("stubborn", "Pending")["TrainingJobStatus"] == "InProgress"

    (event,) = _reclaim_events(owner, "alpha-plan")
    stated = _seconds_in(event["Message"])
    assert NOTICE_SECONDS in stated, event["Message"]
    assert all(seconds <= NOTICE_SECONDS + KILL_GRACE_SECONDS for seconds in stated), event["Message"]
    # An administrator sees whose run it was, and the seconds the owner waited.
    (run,) = server.native().get(_lending_path(plan["TrainingPlanArn"]))["Runs"]
    assert (run["TrainingJobName"], run["AccountName"], run["NoticeSeconds"]) == (
        "stubborn",
        "team-beta",
        NOTICE_SECONDS,
    ), run
    assert NOTICE_SECONDS <= run["OwnerHadSeconds"] <= NOTICE_SECONDS + KILL_GRACE_SECONDS, run

    borrower.sagemaker.stop_training_job(TrainingJobName="stubborn")
    borrower.wait_status("stubborn", "Stopped")
    _tell(server, "alpha-train", "go", instances=2)
    owner.wait_status("alpha-train", "Completed")
    assert not _processes_of(server, "stubborn") and not _processes_of(server, "alpha-train")


# -- what is not lent ----------------------------------------------------------------------------------


def test_a_plan_that_lends_nothing_leaves_a_spot_job_waiting_for_compute_capacity(spot: Server) -> None:
    owner, borrower = Team(spot, "team-alpha"), Team(spot, "team-beta")
    plan = _buy(owner, "alpha-plan")
    started = _start_of_plan(spot, plan)
    borrower.sagemaker.create_training_job(
        **_request("nightly-sweep", BORROWER, borrower.bucket("beta-data"), count=1, spot=True)
    )
    spot.set_clock(started + timedelta(minutes=10))
    job = borrower.describe("nightly-sweep")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "Waiting for compute capacity" in _last_message(job), _history(job)
    assert owner.sagemaker.describe_training_plan(TrainingPlanName="alpha-plan")["InUseInstanceCount"] == 0
    assert not _processes_of(spot, "nightly-sweep")

    # The same plan lending: the job starts at once, without any other event.
    _lend(owner, "alpha-plan")
    borrower.wait_status("nightly-sweep", "Training")
    borrower.sagemaker.stop_training_job(TrainingJobName="nightly-sweep")
    borrower.wait_status("nightly-sweep", "Stopped")
    assert not _processes_of(spot, "nightly-sweep")


def test_no_borrower_starts_within_the_stop_lending_margin(spot: Server) -> None:
    owner, borrower = Team(spot, "team-alpha"), Team(spot, "team-beta")
    plan = _buy(owner, "alpha-plan")
    reclaim_at = plan["EndTime"] - RECLAIM_LEAD
    # A minute too late for a loan: the borrower could not run its minimum before lending stops.
    spot.set_clock(reclaim_at - STOP_MARGIN - MIN_RUN + timedelta(minutes=1))
    _lend(owner, "alpha-plan")
    borrower.sagemaker.create_training_job(
        **_request("late-sweep", BORROWER, borrower.bucket("beta-data"), count=1, spot=True)
    )
    spot.advance_clock("1m")
    job = borrower.describe("late-sweep")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "Waiting for compute capacity" in _last_message(job), _history(job)
    assert owner.sagemaker.describe_training_plan(TrainingPlanName="alpha-plan")["InUseInstanceCount"] == 0
    assert not _processes_of(spot, "late-sweep")
    assert not _reclaim_events(owner, "alpha-plan")


# -- the wait and the request --------------------------------------------------------------------------


def test_a_spot_job_whose_wait_runs_out_stops_with_max_wait_time_exceeded(spot: Server) -> None:
    borrower = Team(spot, "team-beta")
    hour = {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 3600}
    borrower.sagemaker.create_training_job(
        **_request("patient", BORROWER, borrower.bucket("beta-data"), count=1, spot=True, stopping=hour)
    )
    created = service_now(spot)
    spot.set_clock(created + timedelta(seconds=3599))
    assert borrower.status("patient") == ("InProgress", "Pending")
    spot.set_clock(created + timedelta(seconds=3600))
    job = borrower.describe("patient")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "MaxWaitTimeExceeded")
    assert "MaxWaitTimeInSeconds" in _last_message(job), _history(job)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            {"StoppingCondition": {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 3600}},
            "MaxWaitTimeInSeconds",
        ),
        ({"StoppingCondition": {"MaxRuntimeInSeconds": 3600}}, "MaxWaitTimeInSeconds"),
        ({"TrainingPlanArn": True}, "TrainingPlanArn"),
    ],
    ids=["wait-below-runtime", "no-wait", "names-a-plan"],
)
def test_a_spot_request_that_breaks_sagemakers_rules_is_a_validation_exception_naming_the_field(
    spot: Server, change: dict[str, Any], field: str
) -> None:
    borrower = Team(spot, "team-beta")
    request = _request("refused", BORROWER, borrower.bucket("beta-data"), count=1, spot=True)
    if change.pop("TrainingPlanArn", None):
        request["ResourceConfig"]["TrainingPlanArn"] = _buy(borrower, "beta-plan")["TrainingPlanArn"]
    request.update(change)
    with pytest.raises(ClientError) as refused:
        borrower.sagemaker.create_training_job(**request)
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    assert field in error["Message"], error
    assert borrower.sagemaker.list_training_jobs()["TrainingJobSummaries"] == []
