"""Managed spot training on a lent plan on the Slurm back end (issue 52, docs/SPOT.md), against the session's
dev cluster: account A's plan of one p5 node lends it; account B's spot job runs on it, a Slurm job of B's
user in A's reservation, which admits B's user while B's run is open; A's own job takes the node back
within the plan's notice (SIGTERM, the borrower checkpoints and exits); B's job waits, then resumes from
its checkpoint once A's job has ended; A's reservation admits A's user alone again. A borrower that
ignores SIGTERM is killed at the notice's end, and the owner has the node then, within the promise.

A real `hyperplan serve` on the Slurm back end in isolation mode users (tests/slurm/test_reservations.py's
slurm_server, which takes the server, its accounts' users, their Slurm jobs and the `hp-` reservations away
after the test), on the dev cluster's fleet with a `[spot]` table: every p5 node is reservable, so a spot
p5 job has no on-demand capacity and runs only on lent nodes. The clock is the accelerated one at one
service second per real second, so that the seconds a reclaim records are real ones (under the manual
clock they would be whatever the test moved the clock by)."""

from __future__ import annotations

import os
import re
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import tests.slurm.test_reservations as reservations
from hyperplan.backends import procfs
from hyperplan.signing import Credentials
from tests.harness import SERVER_START, Server, boundary_after, service_now, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.test_reservations import DAY, WAIT, _held, _user_of, slurm_server
from tests.slurm.test_several_plans import _slurm_jobs
from tests.slurm.test_work import P5, _buy_for_jobs

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

NOTICE_SECONDS = 5
KILL_GRACE_SECONDS = 10  # the [spot] table's kill_grace below
SPOT = f"""
[spot]
prefer = "lent"
notice = "{NOTICE_SECONDS}s"
kill_grace = "{KILL_GRACE_SECONDS}s"
"""
RECLAIM_LEAD = timedelta(minutes=30)  # a training-job plan's segment is taken back this long before its end
JOB_PERIODS = {"HYPERPLAN_JOB_STOP_GRACE": "5", "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3"}
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"

# The jobs' scripts, each run as `sh -c 'eval "$SM_HP_SCRIPT"'` (a hyperparameter holds the script; its
# lines joined with "; ", as a value may hold no line break). The borrower: a step every 0.1 s; on SIGTERM
# it saves its step as its checkpoint, says the deadline published in $HYPERPLAN_ENV_DIR and exits 75
# ("run me again"); at start it resumes from its checkpoint if one was restored and says the expiry
# variable (the segment's reclaim time); when a file `finish` appears in its working directory (the
# test's word), it writes the step it resumed from into its model and ends.
BORROWER = "; ".join(
    """
ckpt="$SM_CHECKPOINT_DIR/step"
step=0
if [ -e "$ckpt" ]; then step=$(cat "$ckpt"); fi
resumed=$step
expiry="$SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
published="$HYPERPLAN_ENV_DIR/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
echo "starting at step $step on $SLURMD_NODENAME as $(id -un) until $expiry"
trap 'echo "$step" > "$ckpt"; echo "saved step $step, deadline $(cat "$published")"; exit 75' TERM
until [ -e finish ]; do sleep 0.1; step=$((step + 1)); echo "step $step"; done
echo "$resumed" > "$SM_MODEL_DIR/resumed-from.txt"
echo "finished at step $step"
""".strip().splitlines()
)
# A borrower that ignores SIGTERM: only the kill at the notice's end ends it.
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
echo "owner started on $SLURMD_NODENAME as $(id -un)"
until [ -e go ]; do sleep 0.1; done
echo "owner done"
""".strip().splitlines()
)


@dataclass
class _RealSeconds(Server):
    """A server whose accelerated clock runs at one service second per real second."""

    def __post_init__(self) -> None:
        self.extra_args = (*self.extra_args, "--time-scale", "1")


def _request(name: str, script: str, bucket: str, *, plan: str | None = None) -> dict[str, Any]:
    """A one-p5 CreateTrainingJob request running `script`: a managed spot job (no plan), or a job on
    `plan`; its checkpoints and model in `bucket`."""
    resources: dict[str, Any] = {"InstanceType": P5, "InstanceCount": 1, "VolumeSizeInGB": 10}
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
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CheckpointConfig": {"S3Uri": f"s3://{bucket}/checkpoints/{name}"},
    }
    if plan is None:
        request["EnableManagedSpotTraining"] = True
        request["StoppingCondition"]["MaxWaitTimeInSeconds"] = 7200
    else:
        resources["TrainingPlanArn"] = plan
    return request


def _work_root(server: Server) -> Path:
    args = list(server.extra_args)
    return Path(args[args.index("--work-dir") + 1]).resolve()


def _directories(server: Server) -> dict[str, set[Path]]:
    """The working directories of the processes of training jobs (known by the TRAINING_JOB_NAME the
    training contract gives them) under the server's work root, wherever Slurm runs them on this host, by
    job name."""
    root = str(_work_root(server))
    found: dict[str, set[Path]] = {}
    for pid in procfs.all_pids():
        try:
            cwd = os.readlink(procfs.PROC / str(pid) / "cwd")
        except OSError:
            continue
        job = procfs.read_environ(pid).get("TRAINING_JOB_NAME")
        if cwd.startswith(root) and job:
            found.setdefault(job, set()).add(Path(cwd))
    return found


def _tell(server: Server, job: str, word: str) -> None:
    """Write the file `word` in the job's one instance's working directory: the test's word to its script."""
    directories = wait_until(lambda: len(found := _directories(server).get(job, ())) == 1 and found, WAIT)
    assert directories, f"{job} does not run on one instance: {_directories(server)}"
    for directory in directories:
        (directory / word).write_text("now\n")


def _output(server: Server, who: Credentials, job: str) -> str:
    """algo-1's standard output across the job's attempts (what `hyperplan jobs logs` reads)."""
    text, cursor = "", None
    while True:
        page = server.native(who).get(
            f"/api/v1/training-jobs/{job}/logs", host="algo-1", stream="stdout", cursor=cursor
        )
        text, cursor = text + page["Data"], page["Cursor"]
        if not page["Data"]:
            return text


def _training_jobs(cluster: Cluster, user: str) -> list[Any]:
    """The user's live Slurm jobs of training jobs (named `<prefix>t.<task>.<nonce>`)."""
    return [job for job in _slurm_jobs(cluster, user) if ".t." in job.name]


@dataclass
class _Lent:
    """A's plan of one p5 node, Active and lending with the notice above; B's account beside it."""

    server: Server
    cluster: Cluster
    owner: Credentials
    borrower: Credentials
    owner_user: str
    borrower_user: str
    borrower_id: str
    plan: str  # its ARN
    reservation: str  # its segment's Slurm reservation
    node: str  # the reservation's one node
    reclaim_at: datetime  # the segment's reclaim time

    def users(self) -> tuple[str, ...]:
        """The users A's reservation admits now, sorted."""
        held = _held(self.cluster).get(self.reservation)
        return tuple(sorted(held.users)) if held else ()

    def describe(self, who: Credentials, job: str) -> dict[str, Any]:
        return dict(self.server.sagemaker(who).describe_training_job(TrainingJobName=job))

    def status(self, who: Credentials, job: str) -> tuple[str, str]:
        described = self.describe(who, job)
        return described["TrainingJobStatus"], described["SecondaryStatus"]

    def until_status(self, who: Credentials, job: str, wanted: tuple[str, str]) -> dict[str, Any]:
        reached = wait_until(lambda: self.status(who, job) == wanted, timeout=WAIT)
        described = self.describe(who, job)
        assert reached, (
            f"{job} is not {wanted}: {described['TrainingJobStatus']}/{described['SecondaryStatus']}, "
            f"{[(t['Status'], t.get('StatusMessage', '')) for t in described['SecondaryStatusTransitions']]}"
            f"\nthe server's log ends:\n{self.server.log()[-3000:]}"
        )
        return described

    def borrowing(self, job: str, script: str) -> Any:
        """B's spot job `job` runs on the lent node: its Slurm job of B's user in A's reservation, which
        admits B's user beside A's. Its Slurm job."""
        self.server.sagemaker(self.borrower).create_training_job(**_request(job, script, "borrower-data"))
        self.until_status(self.borrower, job, ("InProgress", "Training"))

        def running() -> list[Any]:
            return [j for j in _training_jobs(self.cluster, self.borrower_user) if j.state == "RUNNING"]

        assert wait_until(running, timeout=WAIT), _slurm_jobs(self.cluster, self.borrower_user)
        [borrowed] = _training_jobs(self.cluster, self.borrower_user)
        assert (borrowed.state, borrowed.reservation, borrowed.nodes) == (
            "RUNNING",
            self.reservation,
            (self.node,),
        )
        assert self.users() == tuple(sorted((self.owner_user, self.borrower_user)))
        return borrowed

    def owner_takes_back(self, job: str, borrowed: str) -> tuple[float, set[str]]:
        """A's job `job` on the plan arrives; watched every 0.1 s until its Slurm job runs: the real
        seconds from its request, and what was seen ("borrower interrupted", "both running"). Its Slurm
        job runs in A's reservation on the node."""
        asked = time.monotonic()
        self.server.sagemaker(self.owner).create_training_job(
            **_request(job, OWNER, "owner-data", plan=self.plan)
        )
        seen: set[str] = set()
        while time.monotonic() < asked + NOTICE_SECONDS + KILL_GRACE_SECONDS + WAIT:
            if self.status(self.borrower, borrowed) == ("InProgress", "Interrupted"):
                seen.add("borrower interrupted")
            owner_running = [j for j in _training_jobs(self.cluster, self.owner_user) if j.state == "RUNNING"]
            if owner_running and [
                j for j in _training_jobs(self.cluster, self.borrower_user) if j.state == "RUNNING"
            ]:
                seen.add("both running")
            if owner_running:
                [owned] = owner_running
                assert (owned.reservation, owned.nodes) == (self.reservation, (self.node,)), owned
                return time.monotonic() - asked, seen
            time.sleep(0.1)
        raise AssertionError(
            f"A's job never ran: {self.status(self.owner, job)}, {_slurm_jobs(self.cluster, self.owner_user)}"
            f"\nthe server's log ends:\n{self.server.log()[-3000:]}"
        )

    def reclaims(self) -> list[str]:
        """The plan's lending.reclaim events, as A sees them."""
        events = self.server.native(self.owner).get("/api/v1/plans/lender/events")["Events"]
        return [event["Message"] for event in events if event["Kind"] == "lending.reclaim"]

    def runs(self) -> list[dict[str, Any]]:
        """The plan's borrower runs, as an administrator sees them."""
        runs: list[dict[str, Any]] = self.server.native().get(f"/api/v1/training-plans/{self.plan}/lending")[
            "Runs"
        ]
        return runs

    def nothing_left(self) -> None:
        """No Slurm job nor training process of either account; A's reservation admits A's user alone; the
        server's log holds no Traceback."""
        assert wait_until(lambda: self.users() == (self.owner_user,), timeout=WAIT), _held(self.cluster)
        users = (self.owner_user, self.borrower_user)
        assert wait_until(lambda: not any(_slurm_jobs(self.cluster, user) for user in users), timeout=WAIT)
        assert not _directories(self.server), _directories(self.server)
        assert "Traceback" not in self.server.log(), self.server.log()[-5000:]


@pytest.fixture
def lent(
    cluster: Cluster, slurm_server: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> _Lent:
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    fleet = tmp_path / "spot-fleet.toml"
    fleet.write_text(cluster.fleet.read_text() + SPOT)
    monkeypatch.setattr(reservations, "Server", _RealSeconds)  # slurm_server's servers: real seconds
    server = slurm_server("accelerated", fleet)
    [p5] = [p for p in server.native().get("/api/v1/fleet")["Pools"] if p["InstanceType"] == P5]
    assert p5["ReservableCount"] == p5["InstanceCount"], p5  # no on-demand p5: a spot p5 job only borrows
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    owner, borrower = server.new_account("team-alpha"), server.new_account("team-beta")
    owner_id, owner_user = _user_of(server, "team-alpha")
    borrower_id, borrower_user = _user_of(server, "team-beta")
    plan = _buy_for_jobs(server, owner, "lender", 1, 24, first_day, first_day + DAY)
    for who, bucket in ((owner, "owner-data"), (borrower, "borrower-data")):
        server.native(who).post("/api/v1/buckets", {"Name": bucket})
    reservation = f"hp-{owner_id}-lender-rc1"

    # The plan is Active: its reservation holds one p5 node for A's user alone; A lends it.
    server.set_clock(first_day + timedelta(minutes=1))
    only_owner = lambda: (held := _held(cluster).get(reservation)) is not None and held.users == (owner_user,)  # noqa: E731
    assert wait_until(only_owner, timeout=WAIT), _held(cluster)
    [node] = _held(cluster)[reservation].nodes
    answer = server.native(owner).call(
        "PUT", "/api/v1/training-plans/lender/lending", body={"Notice": NOTICE_SECONDS}
    )
    assert (answer["Mode"], answer["NoticeSeconds"]) == ("idle", NOTICE_SECONDS), answer
    reclaim_at = first_day + DAY - RECLAIM_LEAD
    return _Lent(
        server,
        cluster,
        owner,
        borrower,
        owner_user,
        borrower_user,
        borrower_id,
        plan,
        reservation,
        node,
        reclaim_at,
    )


def test_a_spot_job_borrows_a_lent_slurm_node_gives_it_back_within_the_notice_and_resumes(
    lent: _Lent,
) -> None:
    server, borrower = lent.server, lent.borrower
    lent.borrowing("sweep", BORROWER)
    assert wait_until(lambda: "step 3\n" in _output(server, borrower, "sweep"), timeout=WAIT), _output(
        server, borrower, "sweep"
    )
    reclaim_at = int(lent.reclaim_at.timestamp())
    first = f"starting at step 0 on {lent.node} as {lent.borrower_user} until {reclaim_at}"
    assert first in _output(server, borrower, "sweep"), _output(server, borrower, "sweep")

    # A's job on the plan arrives: B is Interrupted (SIGTERM with the deadline: it saves its step and
    # exits), A's job starts in its reservation on the node once B's processes are gone, within the
    # notice; the two never run at once.
    asked_at = int(service_now(server).timestamp())
    waited, seen = lent.owner_takes_back("own", "sweep")
    assert "both running" not in seen, seen
    assert waited <= NOTICE_SECONDS, waited  # B exits at once: A need not wait for the kill
    lent.until_status(lent.owner, "own", ("InProgress", "Training"))
    assert wait_until(
        lambda: f"owner started on {lent.node} as {lent.owner_user}" in _output(server, lent.owner, "own")
    )
    waiting = lent.until_status(borrower, "sweep", ("InProgress", "Pending"))
    statuses = [t["Status"] for t in waiting["SecondaryStatusTransitions"]]
    assert statuses[-2:] == ["Interrupted", "Pending"], statuses
    said = re.search(r"saved step (\d+), deadline (\d*)", _output(server, borrower, "sweep"))
    assert said, _output(server, borrower, "sweep")
    saved, deadline = int(said.group(1)), int(said.group(2) or 0)
    assert asked_at + NOTICE_SECONDS <= deadline <= asked_at + NOTICE_SECONDS + 3, (asked_at, deadline)
    assert wait_until(lambda: lent.users() == (lent.owner_user,), timeout=WAIT), _held(lent.cluster)
    # While A's job runs, B's waits: no Slurm job of B's anywhere (no on-demand p5 to run on).
    for _ in range(10):
        assert not _slurm_jobs(lent.cluster, lent.borrower_user), _slurm_jobs(
            lent.cluster, lent.borrower_user
        )
        assert lent.status(borrower, "sweep") == ("InProgress", "Pending")
        time.sleep(0.2)

    # The reclaim as the owner sees it (counts and seconds) and as the administrator does (whose run).
    [event] = lent.reclaims()
    assert f"notice {NOTICE_SECONDS} s" in event and "(within the promise)" in event, event
    for secret in ("sweep", "team-beta", lent.borrower_id, lent.borrower_user):
        assert secret not in event, event
    view = server.native(lent.owner).get("/api/v1/training-plans/lender/lending")
    assert (view["Reclaims"], view["PromisesKept"], view["PromisesBroken"]) == (1, 1, 0), view
    assert "Runs" not in view, view
    [run] = lent.runs()
    assert (run["TrainingJobName"], run["AccountName"], run["NoticeSeconds"]) == (
        "sweep",
        "team-beta",
        NOTICE_SECONDS,
    ), run
    assert 0 <= run["OwnerHadSeconds"] <= NOTICE_SECONDS + KILL_GRACE_SECONDS, run

    # A's job ends: B resumes on the node, in A's reservation again, from its checkpoint, and completes.
    _tell(server, "own", "go")
    lent.until_status(lent.owner, "own", ("Completed", "Completed"))
    lent.until_status(borrower, "sweep", ("InProgress", "Training"))
    assert wait_until(lambda: _output(server, borrower, "sweep").count("starting at step") == 2, timeout=WAIT)
    [resumed] = _training_jobs(lent.cluster, lent.borrower_user)
    assert (resumed.reservation, resumed.nodes) == (lent.reservation, (lent.node,)), resumed
    assert lent.users() == tuple(sorted((lent.owner_user, lent.borrower_user)))
    stored = server.data_dir / "s3" / "borrower-data" / "checkpoints" / "sweep" / "step"
    assert int(stored.read_text()) == saved >= 3
    assert f"starting at step {saved} on {lent.node}" in _output(server, borrower, "sweep")
    _tell(server, "sweep", "finish")
    job = lent.until_status(borrower, "sweep", ("Completed", "Completed"))
    statuses = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert statuses.count("Training") == 2 and statuses.count("Interrupted") == 1, statuses
    assert job["BillableTimeInSeconds"] < job["TrainingTimeInSeconds"], job
    bucket, _, key = job["ModelArtifacts"]["S3ModelArtifacts"].removeprefix("s3://").partition("/")
    with tarfile.open(server.data_dir / "s3" / bucket / key) as model:
        member = model.extractfile("resumed-from.txt")
        assert member is not None
        assert int(member.read().decode()) == saved
    lent.nothing_left()


def test_a_borrower_that_ignores_sigterm_on_a_lent_slurm_node_is_killed_at_the_notices_end(
    lent: _Lent,
) -> None:
    server, borrower = lent.server, lent.borrower
    lent.borrowing("stubborn", STUBBORN)
    assert wait_until(lambda: "started" in _output(server, borrower, "stubborn"), timeout=WAIT)

    # The owner has the node once the kill at the notice's end has ended B's processes: not before the
    # notice, within the promise.
    waited, seen = lent.owner_takes_back("own", "stubborn")
    assert "both running" not in seen and "borrower interrupted" in seen, seen
    assert NOTICE_SECONDS <= waited <= NOTICE_SECONDS + KILL_GRACE_SECONDS, waited
    assert "TERM ignored" in _output(server, borrower, "stubborn")
    lent.until_status(borrower, "stubborn", ("InProgress", "Pending"))
    [event] = lent.reclaims()
    assert f"notice {NOTICE_SECONDS} s" in event and "(within the promise)" in event, event
    [run] = lent.runs()
    assert (run["TrainingJobName"], run["NoticeSeconds"]) == ("stubborn", NOTICE_SECONDS), run
    assert NOTICE_SECONDS <= run["OwnerHadSeconds"] <= NOTICE_SECONDS + KILL_GRACE_SECONDS, run
    assert wait_until(lambda: lent.users() == (lent.owner_user,), timeout=WAIT), _held(lent.cluster)

    server.sagemaker(borrower).stop_training_job(TrainingJobName="stubborn")
    lent.until_status(borrower, "stubborn", ("Stopped", "Stopped"))
    _tell(server, "own", "go")
    lent.until_status(lent.owner, "own", ("Completed", "Completed"))
    lent.nothing_left()
