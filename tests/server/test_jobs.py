"""Training jobs on training plans, run for real as processes on the local back end, under the manual clock.

The rules (what is refused, the queue) run on in-process servers over the fake back end
(tests/inprocess.py); everything about real processes, signals, logs and crashes on real servers.

No test waits for service time: the clock is moved. Real processes take real time, so tests poll for
them (with generous timeouts). Grace periods and checkpoint syncs are made short through the settings.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from botocore.exceptions import ClientError

from hyperplan.backends.fake import Program
from hyperplan.backends.local import LocalBackend
from hyperplan.signing import Credentials
from tests.harness import ADMIN, Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN = str(EXAMPLES / "train_checkpointed.py")
P5 = "ml.p5.48xlarge"
M5 = "ml.m5.12xlarge"  # on-demand only in the small fleet: 4 instances in us-west-2a
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"
FINAL = ("Completed", "Failed", "Stopped")
LOG_GROUP = "/aws/sagemaker/TrainingJobs"


# -- helpers -------------------------------------------------------------------------------------------


def _set_clock(server: Server, moment: datetime) -> None:
    server.set_clock(moment)


def _buy(
    server: Server,
    credentials: Credentials,
    name: str,
    count: int,
    days: int,
    target: str = "training-job",
    **window: Any,
) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=24 * days, TargetResources=[target], **window
    )["TrainingPlanOfferings"][0]
    return str(
        client.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )["TrainingPlanArn"]
    )


def _job(
    name: str,
    command: list[str],
    *,
    plan: str | None = None,
    count: int = 1,
    instance_type: str = P5,
    hyperparameters: dict[str, str] | None = None,
    checkpoints: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 10}
    if plan:
        resources["TrainingPlanArn"] = plan
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": IMAGE,
            "ContainerEntrypoint": command[:2],
            **({"ContainerArguments": command[2:]} if command[2:] else {}),
        },
        "HyperParameters": hyperparameters or {},
        "InputDataConfig": [_channel()],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": resources,
        "StoppingCondition": {"MaxRuntimeInSeconds": 2419200},
        **extra,
    }
    if checkpoints:
        request["CheckpointConfig"] = {"S3Uri": f"s3://bucket/checkpoints/{name}"}
    return request


def _channel() -> dict[str, Any]:
    return {
        "ChannelName": "training",
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": "s3://bucket/input",
                "S3DataDistributionType": "FullyReplicated",
            }
        },
        "ContentType": "text/csv",
    }


def _sleeper(name: str, **kwargs: Any) -> dict[str, Any]:
    """A job that runs until it is told to stop."""
    return _job(name, ["python", "-c", "import time; time.sleep(3600)"], **kwargs)


def _describe(server: Server, name: str) -> dict[str, Any]:
    return dict(server.sagemaker().describe_training_job(TrainingJobName=name))


def _status(server: Server, name: str) -> tuple[str, str]:
    job = _describe(server, name)
    return job["TrainingJobStatus"], job["SecondaryStatus"]


def _output(server: Server, name: str) -> str:
    """algo-1's standard output, every page, from the native API `hyperplan jobs logs NAME` reads: for
    polls, which would otherwise start a process each (the tests check the command's own output too)."""
    client = server.native()
    text, cursor = "", None
    while True:
        page = client.get(f"/api/v1/training-jobs/{name}/logs", host="algo-1", stream="stdout", cursor=cursor)
        text, cursor = text + page["Data"], page["Cursor"]
        if not page["Data"]:
            return text


def _wait_status(server: Server, name: str, secondary: str, timeout: float = 90) -> dict[str, Any]:
    job = wait_until(lambda: (d := _describe(server, name))["SecondaryStatus"] == secondary and d, timeout)
    if not job:  # said in full: a repr in an assertion message is cut short
        found = _describe(server, name)
        history = [(t["Status"], t.get("StatusMessage")) for t in found.get("SecondaryStatusTransitions", [])]
        pytest.fail(
            f"{name} is not {secondary} after {timeout} s: {found['TrainingJobStatus']}/"
            f"{found['SecondaryStatus']}, {found.get('FailureReason')!r}; transitions {history}\n"
            f"the server's log ends:\n{server.log()[-3000:]}"
        )
    return dict(job)


def _statuses(job: dict[str, Any]) -> list[str]:
    return [t["Status"] for t in job["SecondaryStatusTransitions"]]


def _model_files(server: Server, uri: str) -> dict[str, bytes]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    with tarfile.open(server.data_dir / "s3" / bucket / key) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


# A job that fails when the test says so: it waits for a file in its working directory.
BRIEF = "until [ -e brief-go ]; do sleep 0.1; done; echo 'disk full' >&2; exit 3"


def _processes_running(command: str) -> list[int]:
    """The processes running `command` (not the timed-log wrapper around each, whose argv holds it too)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if command.encode() in argv and not any(part.endswith(b"timedlog.py") for part in argv):
                found.append(int(pid))
    return found


def _cwd(pid: int) -> Path:
    return Path(os.readlink(f"/proc/{pid}/cwd"))


def _job_processes(work_dir: Path) -> list[int]:
    """Processes whose working directory is under the back end or a job's instance tree: an orphan shows
    up here."""
    roots = [str((work_dir / "backend").resolve()), str((work_dir / "jobs").resolve())]
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if any(cwd.startswith(root) for root in roots):
            found.append(int(pid))
    return found


# -- fixtures ------------------------------------------------------------------------------------------


JOB_PERIODS = {
    "HYPERPLAN_JOB_RECLAIM_GRACE": "5",
    "HYPERPLAN_JOB_STOP_GRACE": "5",
    "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3",
}


DATASET_ROWS = 200


def _make_dataset(server: Server) -> None:
    dataset = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    subprocess.run(
        [sys.executable, EXAMPLES / "make_dataset.py", dataset, "--rows", str(DATASET_ROWS)],
        check=True,
        timeout=60,
    )


@pytest.fixture
def small(server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """The small fleet, short real-time periods, and a dataset in s3://bucket/input."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    _make_dataset(server)
    yield server.start()
    # Whatever a test left running goes with it: a back end told of nothing kills everything it has.
    LocalBackend(server.work_dir / "backend").adopt([])
    assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture
def fast_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    """The same, in process over the fake back end (tests/inprocess.py): for the job rules. Its tasks run
    until they are stopped, unless the test gives them a Program (`fast_small.world.command(...)`)."""
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET, env=JOB_PERIODS)
    _make_dataset(server)
    yield server.start()
    assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture
def split_plan(small: Server) -> tuple[Server, str, datetime]:
    """4 x p5 for training jobs: two one-day segments, two days apart (another team holds every p5 in
    between)."""
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    blocker = small.new_account("blocker")
    for count, name in ((8, "block-a"), (4, "block-b")):
        _buy(
            small,
            blocker,
            name,
            count,
            2,
            StartTimeAfter=start + timedelta(days=1),
            EndTimeBefore=start + timedelta(days=3),
        )
    arn = _buy(small, ADMIN, "split", 4, 2, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=4))
    segments = small.sagemaker().describe_training_plan(TrainingPlanName="split")["ReservedCapacitySummaries"]
    assert len(segments) == 2, segments
    return small, arn, start


# -- tests ---------------------------------------------------------------------------------------------


def test_seed_training_job_walkthrough_with_the_aws_cli(small: Server) -> None:
    seed_training_job_walkthrough(small, IMAGE, ["python", TRAIN])
    # The instance's tree stands for /opt/ml, as the contract lays it out.
    tree = small.work_dir / "jobs" / "1" / "attempt-1" / "algo-1"
    assert json.loads((tree / "input/config/hyperparameters.json").read_text()) == {"lr": "0.2", "seed": "3"}
    assert json.loads((tree / "input/config/resourceconfig.json").read_text())["hosts"] == ["algo-1"]
    assert (tree / "input/data/training/data.csv").is_file()


def seed_training_job_walkthrough(
    server: Server, image: str, entry_point: list[str], channels: tuple[dict[str, Any], ...] = ()
) -> dict[str, Any]:
    """The README's training job with the aws CLI, on a plan of its own, as a user sees it: its statuses,
    its model in S3, its logs. ``entry_point`` runs examples/train_checkpointed.py in ``image``, the
    dataset of ``_make_dataset`` in its training channel, ``channels`` besides. The job as it ended."""
    arn = _buy(server, ADMIN, "job-plan", 1, 1)
    plan = server.sagemaker().describe_training_plan(TrainingPlanName="job-plan")
    server.aws(
        "sagemaker",
        "create-training-job",
        "--training-job-name",
        "job-name",
        "--role-arn",
        ROLE,
        "--algorithm-specification",
        json.dumps(
            {
                "TrainingInputMode": "File",
                "TrainingImage": image,
                "ContainerEntrypoint": entry_point,
                "ContainerArguments": ["--epochs", "3"],
            }
        ),
        "--hyper-parameters",
        json.dumps({"lr": "0.2", "seed": "3"}),
        "--input-data-config",
        json.dumps([_channel(), *channels]),
        "--output-data-config",
        '{"S3OutputPath":"s3://bucket/output"}',
        "--resource-config",
        json.dumps({"VolumeSizeInGB": 10, "InstanceCount": 1, "InstanceType": P5, "TrainingPlanArn": arn}),
        "--stopping-condition",
        '{"MaxRuntimeInSeconds":1800}',
    )

    described = server.aws("sagemaker", "describe-training-job", "--training-job-name", "job-name")
    assert described["ResourceConfig"]["TrainingPlanArn"] == arn
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "to become Active" in described["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert _statuses(described) == ["Starting", "Pending"]
    listed = server.aws("sagemaker", "list-training-jobs", "--training-plan-arn-equals", arn)
    assert [(j["TrainingJobName"], j["TrainingPlanArn"]) for j in listed["TrainingJobSummaries"]] == [
        ("job-name", arn)
    ]

    _set_clock(server, plan["StartTime"] + timedelta(minutes=1))
    job = _wait_status(server, "job-name", "Completed", timeout=180)  # a container's image is pulled first
    assert job["TrainingJobStatus"] == "Completed"
    assert _statuses(job) == ["Starting", "Pending", "Downloading", "Training", "Uploading", "Completed"]
    uri = job["ModelArtifacts"]["S3ModelArtifacts"]
    assert uri == "s3://bucket/output/job-name/output/model.tar.gz"
    assert set(_model_files(server, uri)) == {"weights.npy", "summary.json"}
    summary = json.loads(_model_files(server, uri)["summary.json"])
    assert (summary["epochs"], summary["lr"], summary["seed"]) == (3, 0.2, 3)  # hyperparameters arrived
    assert summary["rows"] == DATASET_ROWS  # and the training channel
    logs = server.cli("jobs", "logs", "job-name").stdout
    assert "epoch 3: loss" in logs and "done: accuracy" in logs
    assert "job-name" in server.cli("jobs", "list").stdout
    # The plan's capacity is free again.
    plan = server.sagemaker().describe_training_plan(TrainingPlanName="job-plan")
    assert (plan["InUseInstanceCount"], plan["AvailableInstanceCount"]) == (0, 1)
    return job


def _checkpoints(server: Server, name: str) -> list[str]:
    stored = server.data_dir / "s3" / "bucket" / "checkpoints" / name
    return sorted(p.name for p in stored.glob("checkpoint-*.npz")) if stored.is_dir() else []


def test_a_checkpointed_job_is_interrupted_at_reclaim_and_resumes_in_the_next_segment(
    split_plan: tuple[Server, str, datetime],
) -> None:
    server, arn, start = split_plan
    began_ms = time.time() * 1000  # real time: the lines' times are when they were written
    client = server.sagemaker()
    hyperparameters = {"epochs": "16", "lr": "0.2", "seed": "5", "epoch-seconds": "0.4"}
    client.create_training_job(
        **_job(
            "resumed", ["python", TRAIN], plan=arn, count=2, hyperparameters=hyperparameters, checkpoints=True
        )
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
    _set_clock(server, start + timedelta(minutes=1))
    _wait_status(server, "resumed", "Training")
    assert wait_until(lambda: len(_checkpoints(server, "resumed")) >= 2), (
        "no checkpoints were synced while it ran"
    )

    _set_clock(server, start + timedelta(days=1, minutes=-30))  # the first segment's reclaim time
    job = _describe(server, "resumed")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    message = job["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "taken back" in message and "SIGTERM" in message and "next segment" in message, message
    plan = client.describe_training_plan(TrainingPlanName="split")
    assert plan["InUseInstanceCount"] == 0
    # The processes save a checkpoint and exit on SIGTERM; then the last checkpoints are stored.
    assert wait_until(lambda: not _job_processes(server.work_dir)), _job_processes(server.work_dir)
    interrupted_at = len(_checkpoints(server, "resumed"))
    assert 2 <= interrupted_at < 16

    _set_clock(server, start + timedelta(days=2))  # between the segments: still waiting
    assert _status(server, "resumed") == ("InProgress", "Pending")
    _set_clock(server, start + timedelta(days=3, minutes=1))  # the second segment
    job = _wait_status(server, "resumed", "Completed")
    assert _statuses(job) == [
        "Starting", "Pending", "Downloading", "Training", "Pending", "Downloading", "Training", "Uploading",
        "Completed",
    ]  # fmt: skip
    logs = server.cli("jobs", "logs", "resumed").stdout
    assert (
        "interrupted: saved epoch" in logs and "--- attempt 2 ---" in logs and "resuming after epoch" in logs
    )
    second = server.cli("jobs", "logs", "resumed", "--host", "algo-2").stdout
    assert "resuming after epoch" in second
    # CloudWatch Logs: a stream per instance that goes on across the attempts, each line with its time.
    stream = f"resumed/algo-1-{int(job['CreationTime'].timestamp())}"
    streams = server.aws(
        "logs", "describe-log-streams", "--log-group-name", LOG_GROUP, "--log-stream-name-prefix", "resumed/"
    )["logStreams"]  # fmt: skip
    assert [s["logStreamName"] for s in streams] == [stream, stream.replace("algo-1-", "algo-2-")]
    at = ("--log-group-name", LOG_GROUP, "--log-stream-name", stream)
    events = server.aws("logs", "get-log-events", *at, "--start-from-head")["events"]
    messages = [event["message"] for event in events]
    interrupted = next(i for i, m in enumerate(messages) if "interrupted: saved epoch" in m)
    assert any("resuming after epoch" in m for m in messages[interrupted:]), messages
    times = [event["timestamp"] for event in events]
    assert times == sorted(times) and began_ms <= times[0] and times[-1] <= time.time() * 1000, times
    timed = server.cli("jobs", "logs", "resumed", "--timestamps").stdout
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z .*resuming after epoch", timed, re.M), timed

    reference = _wait_status(server, "reference", "Completed")
    resumed_model = _model_files(server, job["ModelArtifacts"]["S3ModelArtifacts"])
    reference_model = _model_files(server, reference["ModelArtifacts"]["S3ModelArtifacts"])
    assert resumed_model["weights.npy"] == reference_model["weights.npy"]
    assert np.load(io.BytesIO(resumed_model["weights.npy"])).shape == (4,)


# Records the reclaim warning as a training script would: the variable at start, and what the envdir says
# when SIGTERM comes; then saves a "model" and exits, as a checkpointing script does.
WARNED = (
    'trap \'cat "$HYPERPLAN_ENV_DIR/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" '
    '> "$SM_MODEL_DIR/at-sigterm"; exit 0\' TERM; '
    'echo "$SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > "$SM_MODEL_DIR/at-start"; '
    "while :; do sleep 0.1; done"
)


def test_running_time_counts_across_segments_and_the_plans_end_interrupts_jobs(
    split_plan: tuple[Server, str, datetime],
) -> None:
    server, arn, start = split_plan
    client = server.sagemaker()
    client.create_training_job(**_job("endless", ["sh", "-c", WARNED], plan=arn, count=3, checkpoints=True))
    day = {"MaxRuntimeInSeconds": 86400}
    client.create_training_job(**_sleeper("capped", plan=arn, count=1, StoppingCondition=day))
    client.create_training_job(**_sleeper("waiting", plan=arn, count=2))
    # Exactly at each segment's start: running time counts from the service time a job starts at,
    # and a runner that sees the job late would otherwise start it a minute later on a busy machine.
    _set_clock(server, start)
    _wait_status(server, "endless", "Training")
    _wait_status(server, "capped", "Training")
    _set_clock(server, start + timedelta(days=1, minutes=-30))  # reclaim: 23.5 hours of running time
    assert _status(server, "capped") == ("InProgress", "Pending")
    _set_clock(server, start + timedelta(days=3))  # the last segment
    _wait_status(server, "endless", "Training")
    _wait_status(server, "capped", "Training")
    assert _status(server, "waiting") == ("InProgress", "Pending")
    _set_clock(server, start + timedelta(days=3, minutes=29))
    assert _status(server, "capped") == ("InProgress", "Training")
    _set_clock(server, start + timedelta(days=3, minutes=30))  # 24 hours of running time, in two segments
    capped = _wait_status(server, "capped", "MaxRuntimeExceeded")
    assert capped["TrainingTimeInSeconds"] == 86400
    assert _status(server, "waiting") == ("InProgress", "Pending")  # 2 needed, 1 free

    assert wait_until(
        lambda: (server.work_dir / "jobs/1/attempt-2/algo-1/model/at-start").exists()
    )  # trap set
    _set_clock(server, start + timedelta(days=4, minutes=-30))  # the last segment's reclaim time
    waiting = _describe(server, "waiting")
    assert (waiting["TrainingJobStatus"], waiting["SecondaryStatus"]) == ("Stopped", "Interrupted")
    assert "no capacity left" in waiting["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert _status(server, "endless") in {("Stopping", "Stopping"), ("Stopped", "Interrupted")}
    job = _wait_status(server, "endless", "Interrupted")
    assert job["TrainingJobStatus"] == "Stopped"
    message = job["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "last segment ended before the job finished" in message
    assert "s3://bucket/checkpoints/endless" in message
    # The model it saved when told to stop was stored; it knew the segment's end from the start.
    end = str(int((start + timedelta(days=4)).timestamp()))
    saved = _model_files(server, job["ModelArtifacts"]["S3ModelArtifacts"])
    assert saved == {"at-start": f"{end}\n".encode(), "at-sigterm": end.encode()}
    assert "The model it had saved is at" in message


PEERS = """
import json, os, socket, time
from pathlib import Path
hosts = json.loads(os.environ["SM_HOSTS"])
me = os.environ["SM_CURRENT_HOST"]
port = int(json.loads(os.environ["SM_HPS"])["port"])
model = Path(os.environ["SM_MODEL_DIR"])
(model / f"expiry-{me}").write_text(os.environ["SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"])
if me == hosts[0]:
    server = socket.create_server(("127.0.0.1", port))
    server.settimeout(60)
    connection, _ = server.accept()
    heard = connection.makefile().readline().strip()
    (model / "heard.json").write_text(json.dumps({"hosts": hosts, "me": me, "heard": heard}))
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    connection.sendall(f"hello from {me}, who sees {','.join(hosts)}\\n".encode())
    connection.close()
"""


def test_a_two_instance_job_runs_two_processes_that_reach_each_other_over_loopback(
    small: Server, tmp_path: Path
) -> None:
    from tests.harness import free_port

    script = tmp_path / "peers.py"
    script.write_text(PEERS)
    client = small.sagemaker()
    client.create_training_job(
        **_job(
            "pair",
            ["python", str(script)],
            instance_type=M5,
            count=2,
            hyperparameters={"port": str(free_port())},
        )
    )
    job = _wait_status(small, "pair", "Completed")
    assert job["ResourceConfig"] == {"InstanceType": M5, "InstanceCount": 2, "VolumeSizeInGB": 10}
    assert "TrainingPlanArn" not in job["ResourceConfig"]
    model = _model_files(small, job["ModelArtifacts"]["S3ModelArtifacts"])
    assert model["expiry-algo-1"] == b"0"  # on-demand capacity has no end
    heard = json.loads(model["heard.json"])
    assert heard == {
        "hosts": ["algo-1", "algo-2"],
        "me": "algo-1",
        "heard": "hello from algo-2, who sees algo-1,algo-2",
    }
    # On-demand: both instances were counted while they ran, and are free again.
    client.create_training_job(**_sleeper("four", instance_type=M5, count=4))
    _wait_status(small, "four", "Training")
    with pytest.raises(ClientError) as refused:
        client.create_training_job(**_sleeper("fifth", instance_type=M5, count=1))
    error = refused.value.response["Error"]
    assert error["Code"] == "ResourceLimitExceeded"
    assert f"pool {M5} in us-west-2a: 0 free" in error["Message"], error
    client.stop_training_job(TrainingJobName="four")
    _wait_status(small, "four", "Stopped")


def test_the_queue_is_fifo_with_backfill_and_pending_time_counts_only_while_the_plan_is_active(
    fast_small: InProcessServer,
) -> None:
    server = fast_small
    client = server.sagemaker()
    start = boundary_after(service_now(server) + timedelta(days=1))
    arn = _buy(server, ADMIN, "queue", 4, 3, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=3))
    assert client.describe_training_plan(TrainingPlanName="queue")["StartTime"] == start
    client.create_training_job(**_sleeper("big", plan=arn, count=3))
    client.create_training_job(**_sleeper("starved", plan=arn, count=2))
    small_one = list(server.world.command(Program.exits(0, stdout=b"small one\n")))
    client.create_training_job(**_job("small", small_one, plan=arn, count=1))
    client.create_training_job(
        **_sleeper(
            "impatient",
            plan=arn,
            count=2,
            StoppingCondition={"MaxRuntimeInSeconds": 2419200, "MaxPendingTimeInSeconds": 3600},
        )
    )
    # Scheduled for a day: nothing runs, and none of that waiting counts.
    _set_clock(server, start - timedelta(minutes=1))
    assert {n: _status(server, n)[1] for n in ("big", "starved", "small", "impatient")} == dict.fromkeys(
        ("big", "starved", "small", "impatient"), "Pending"
    )

    _set_clock(server, start)
    _wait_status(server, "big", "Training")
    _wait_status(server, "small", "Completed")  # later and smaller: it started beside "big" (backfill)
    starved = _describe(server, "starved")
    assert starved["SecondaryStatus"] == "Pending"
    assert (
        "needs 2 instances and plan queue has 1 of 4 free"
        in starved["SecondaryStatusTransitions"][-1]["StatusMessage"]
    )
    _set_clock(server, start + timedelta(minutes=59))
    assert _status(server, "impatient") == ("InProgress", "Pending")
    _set_clock(server, start + timedelta(hours=1))
    impatient = _describe(server, "impatient")
    assert (impatient["TrainingJobStatus"], impatient["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "MaxPendingTimeInSeconds (3600)" in impatient["SecondaryStatusTransitions"][-1]["StatusMessage"]

    _set_clock(server, start + timedelta(days=2, seconds=-1))
    assert _status(server, "starved") == ("InProgress", "Pending")
    _set_clock(server, start + timedelta(days=2))
    starved = _describe(server, "starved")
    assert (starved["TrainingJobStatus"], starved["SecondaryStatus"]) == ("Failed", "Failed")
    assert starved["FailureReason"].startswith("InsufficientCapacityError: ")

    # First in, first out: when "big" stops, the older of two waiting jobs gets the capacity even though
    # the younger, smaller one would fit as well.
    client.create_training_job(**_sleeper("older", plan=arn, count=3))
    client.create_training_job(**_sleeper("younger", plan=arn, count=2))
    client.stop_training_job(TrainingJobName="big")
    _wait_status(server, "big", "Stopped")
    _wait_status(server, "older", "Training")
    assert _status(server, "younger") == ("InProgress", "Pending")
    summaries = client.list_training_jobs(TrainingPlanArnEquals=arn, SortBy="Name", MaxResults=2)
    assert [s["TrainingJobName"] for s in summaries["TrainingJobSummaries"]] == ["big", "impatient"]
    rest = client.list_training_jobs(
        TrainingPlanArnEquals=arn, SortBy="Name", MaxResults=2, NextToken=summaries["NextToken"]
    )
    assert [s["TrainingJobName"] for s in rest["TrainingJobSummaries"]] == ["older", "small"]
    failed = client.list_training_jobs(StatusEquals="Failed")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in failed] == ["starved"]
    for name in ("older", "younger"):
        client.stop_training_job(TrainingJobName=name)


def test_stop_training_job_and_max_runtime(small: Server) -> None:
    client = small.sagemaker()
    arn = _buy(small, ADMIN, "stops", 2, 1)
    start = client.describe_training_plan(TrainingPlanName="stops")["StartTime"]
    hyperparameters = {"epochs": "1000", "epoch-seconds": "0.5"}
    client.create_training_job(
        **_job("long", ["python", TRAIN], plan=arn, hyperparameters=hyperparameters, checkpoints=True)
    )
    client.create_training_job(**_sleeper("queued", plan=arn, count=2))
    client.stop_training_job(TrainingJobName="queued")  # waiting: stopped at once
    queued = _describe(small, "queued")
    assert (queued["TrainingJobStatus"], queued["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "before it got instances" in queued["SecondaryStatusTransitions"][-1]["StatusMessage"]

    _set_clock(small, start + timedelta(minutes=1))
    _wait_status(small, "long", "Training")
    followed: list[str] = []
    follower = threading.Thread(
        target=lambda: followed.append(small.cli("jobs", "logs", "long", "--follow").stdout), daemon=True
    )
    follower.start()
    assert wait_until(lambda: "epoch 2:" in _output(small, "long"))
    began = time.monotonic()
    small.cli("jobs", "stop", "long")
    assert _status(small, "long") in {("Stopping", "Stopping"), ("Stopped", "Stopped")}
    job = _wait_status(small, "long", "Stopped")
    assert time.monotonic() - began < 30  # it saved its checkpoint on SIGTERM and exited, well within grace
    assert _statuses(job)[-3:] == ["Training", "Stopping", "Stopped"]
    assert "StopTrainingJob" in job["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "interrupted: saved epoch" in small.cli("jobs", "logs", "long").stdout
    follower.join(timeout=30)  # --follow ends by itself once the job has ended
    assert followed and followed[0] == small.cli("jobs", "logs", "long").stdout
    assert _checkpoints(small, "long")  # the last checkpoint was stored
    with pytest.raises(ClientError) as again:
        client.stop_training_job(TrainingJobName="long")
    assert again.value.response["Error"]["Code"] == "ValidationException"

    # A process that ignores SIGTERM is killed when the grace (5 s in these tests) has passed.
    stubborn = ["sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.2; done"]
    client.create_training_job(**_job("stubborn", stubborn, instance_type=M5))
    assert wait_until(lambda: "ready" in _output(small, "stubborn"))  # its trap is set
    began = time.monotonic()
    client.stop_training_job(TrainingJobName="stubborn")
    assert wait_until(lambda: _status(small, "stubborn") == ("Stopped", "Stopped"), timeout=60)
    assert 4.5 <= time.monotonic() - began < 30

    # MaxRuntimeInSeconds: stopped once that much running time (service time) has passed.
    client.create_training_job(
        **_sleeper("capped", instance_type=M5, StoppingCondition={"MaxRuntimeInSeconds": 600})
    )
    _wait_status(small, "capped", "Training")
    _set_clock(small, service_now(small) + timedelta(minutes=9))
    assert _status(small, "capped") == ("InProgress", "Training")
    _set_clock(small, service_now(small) + timedelta(minutes=1))
    job = _wait_status(small, "capped", "MaxRuntimeExceeded")
    assert job["TrainingJobStatus"] == "Stopped"
    assert job["TrainingTimeInSeconds"] == job["BillableTimeInSeconds"] == 600
    assert "MaxRuntimeInSeconds (600)" in job["SecondaryStatusTransitions"][-1]["StatusMessage"]


def test_a_failing_instance_fails_the_job_with_its_error(small: Server) -> None:
    client = small.sagemaker()
    client.create_training_job(
        **_job(
            "broken",
            ["python", "-c", "import sys; print('loading'); sys.exit('cannot open /opt/ml/input/data/x')"],
            instance_type=M5,
        )
    )
    client.create_training_job(
        **_job(
            "explained",
            [
                "sh",
                "-c",
                'echo "CUDA out of memory at step 7" > "$SM_OUTPUT_DIR/failure"; exit 2',
            ],
            instance_type=M5,
        )
    )
    broken = _wait_status(small, "broken", "Failed")
    assert broken["TrainingJobStatus"] == "Failed"
    reason = broken["FailureReason"]
    assert reason.startswith("AlgorithmError: instance algo-1 exited with code 1") and "cannot open" in reason
    explained = _wait_status(small, "explained", "Failed")
    assert explained["FailureReason"] == (
        "AlgorithmError: instance algo-1 exited with code 2: CUDA out of memory at step 7"
    )
    missing = _job("no-data", ["python", TRAIN], instance_type=M5)
    missing["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = "s3://bucket/nothing-here"
    client.create_training_job(**missing)
    job = _wait_status(small, "no-data", "Failed")
    assert (
        job["FailureReason"].startswith("ClientError:") and "s3://bucket/nothing-here" in job["FailureReason"]
    )


def test_every_rule_is_refused_with_its_own_message_and_nothing_is_written(fast_small: Server) -> None:
    small = fast_small
    team = small.new_account("rules", PaymentMode="approval")
    small.native().post("/api/v1/buckets/bucket/grants", {"Account": "rules"})  # the dataset's bucket
    client = small.sagemaker(team)
    theirs = _buy(small, small.new_account("stranger"), "theirs", 1, 1)
    pending = _buy(small, team, "unpaid", 1, 1)
    small.cli("accounts", "update", "rules", "--payment-mode", "auto")
    cluster_plan = _buy(small, team, "for-clusters", 1, 1, target="hyperpod-cluster")
    plan = _buy(small, team, "good", 2, 1)
    command = ["python", TRAIN]

    def refused(request: dict[str, Any], code: str, *words: str) -> None:
        with pytest.raises(ClientError) as exc:
            client.create_training_job(**request)
        error = exc.value.response["Error"]
        assert error["Code"] == code, (words, error)
        assert all(word in error["Message"] for word in words), (words, error["Message"])

    refused(_job("j", command, plan=theirs), "ValidationException", "has no training plan", "plan-ownership")
    refused(
        _job("j", command, plan=cluster_plan), "ValidationException", "serves hyperpod-cluster", "plan-target"
    )
    refused(_job("j", command, plan=pending), "ValidationException", "is Pending", "plan-status")
    refused(
        _job("j", command, plan=plan, instance_type=M5),
        "ValidationException",
        "reserves ml.p5",
        "instance-type",
    )
    refused(_job("j", command, plan=plan, count=4), "ValidationException", "more than plan", "plan-capacity")
    # Without a plan, the pool's on-demand capacity: none for p5 here, 4 for the controllers' type.
    refused(_job("j", command), "ResourceLimitExceeded", "on-demand", f"pool {P5} in us-west-2a: 0 free")
    refused(_job("j", command, instance_type=M5, count=5), "ResourceLimitExceeded", "us-west-2a: 4 free")
    refused(_job("j", command, instance_type="ml.g5.xlarge"), "ValidationException", "has no ml.g5.xlarge")
    # What this back end cannot run, each named.
    no_command = _job("j", command, plan=plan)
    del no_command["AlgorithmSpecification"]["ContainerEntrypoint"]
    refused(
        no_command, "ValidationException", "cannot run the image's own entry point", "ContainerEntrypoint"
    )
    groups = _job("j", command)
    groups["ResourceConfig"] = {
        "InstanceGroups": [{"InstanceType": P5, "InstanceCount": 1, "InstanceGroupName": "g"}],
        "TrainingPlanArn": plan,
    }
    refused(groups, "ValidationException", "ResourceConfig.InstanceGroups", "heterogeneous")
    refused(_job("j", command, plan=plan, EnableManagedSpotTraining=True), "ValidationException", "spot")
    pipe = _job("j", command, plan=plan)
    pipe["AlgorithmSpecification"]["TrainingInputMode"] = "Pipe"
    refused(pipe, "ValidationException", "Pipe mode")
    manifest = _job("j", command, plan=plan)
    manifest["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3DataType"] = "ManifestFile"
    refused(manifest, "ValidationException", "InputDataConfig", "ManifestFile")
    refused(_job("j", command, plan=plan, EnableNetworkIsolation=True), "ValidationException", "network")
    refused(
        _job("j", command, plan=plan, StoppingCondition={"MaxWaitTimeInSeconds": 3600}),
        "ValidationException",
        "MaxWaitTimeInSeconds",
    )
    assert client.list_training_jobs()["TrainingJobSummaries"] == []  # nothing half-written

    client.create_training_job(**_sleeper("taken", plan=plan))
    refused(_sleeper("taken", plan=plan), "ResourceInUse", "taken")
    assert [j["TrainingJobName"] for j in client.list_training_jobs()["TrainingJobSummaries"]] == ["taken"]
    # Another account sees nothing of it, and may use the same name.
    with pytest.raises(ClientError) as hidden:
        small.sagemaker().describe_training_job(TrainingJobName="taken")
    assert hidden.value.response["Error"]["Code"] == "ResourceNotFound"
    client.stop_training_job(TrainingJobName="taken")


def test_a_server_killed_mid_run_reconciles_its_jobs_and_leaves_no_orphan(small: Server) -> None:
    client = small.sagemaker()
    hyperparameters = {"epochs": "40", "epoch-seconds": "0.5"}  # 20 s: long enough to outlive a restart
    client.create_training_job(
        **_job(
            "survivor", ["python", TRAIN], instance_type=M5, hyperparameters=hyperparameters, checkpoints=True
        )
    )
    client.create_training_job(**_job("brief", ["sh", "-c", BRIEF], instance_type=M5))
    _wait_status(small, "survivor", "Training")
    _wait_status(small, "brief", "Training")
    assert wait_until(lambda: "epoch 2:" in _output(small, "survivor"))
    before = set(_job_processes(small.work_dir))

    small.kill()
    # "brief" ends while no server watches: told to, and waited for, rather than given time.
    (brief_dir,) = {_cwd(pid) for pid in _processes_running(BRIEF)}
    (brief_dir / "brief-go").write_text("now\n")
    assert wait_until(lambda: not _processes_running(BRIEF), timeout=60)
    small.restart()
    client = small.sagemaker()
    brief = _wait_status(small, "brief", "Failed")
    assert brief["FailureReason"] == "AlgorithmError: instance algo-1 exited with code 3: disk full"
    assert _status(small, "survivor") == ("InProgress", "Training")
    assert set(_job_processes(small.work_dir)) & before  # the same processes, not new ones

    survivor = _wait_status(small, "survivor", "Completed")
    assert _statuses(survivor) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    logs = small.cli("jobs", "logs", "survivor").stdout
    assert "resuming" not in logs and logs.count("epoch 1:") == 1 and "done: accuracy" in logs
    assert wait_until(lambda: not _job_processes(small.work_dir), timeout=30), _job_processes(small.work_dir)
    assert set(_model_files(small, survivor["ModelArtifacts"]["S3ModelArtifacts"])) == {
        "weights.npy",
        "summary.json",
    }
