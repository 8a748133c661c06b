"""An upgrade: work a previous version started keeps running and is adopted.

Versions before the work directory kept their nodes and tasks in DATA_DIR/backend. A server of that
layout (an application whose back end is a local back end over DATA_DIR/backend) starts a training job
and stops, its task still running; the new server starts over the same data directory with the default
back end, finds the task there, adopts it through a second local back end over the old root, and the job
finishes when its process does. New work goes to the work directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hyperplan.app import AppConfig, Application
from hyperplan.backends.base import Backend, TaskState
from hyperplan.backends.composite import RoutingBackend, holds_work
from hyperplan.backends.local import LocalBackend
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import jobs
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from tests.harness import SERVER_START

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


def _request(name: str, script: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": [script],
        },
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/input"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _admin(runtime: ServiceContext) -> Caller:
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
        return Caller(admin.id, admin.name, True, "key")


def _status(runtime: ServiceContext, name: str) -> str:
    with runtime.db.read() as session:
        job = next(j for j in session.query(TrainingJob) if j.name == name)
        return f"{job.status}/{job.secondary_status}: {job.failure_reason}"


def _wait(runtime: ServiceContext, name: str, wanted: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not _status(runtime, name).startswith(wanted):
        assert time.monotonic() < deadline, f"{name} is {_status(runtime, name)}, not {wanted}"
        time.sleep(0.1)


def test_a_task_a_previous_version_started_in_the_data_directory_is_adopted_and_finishes(
    tmp_path: Path,
) -> None:
    data, work, go = tmp_path / "data", tmp_path / "work", tmp_path / "go"
    (data / "s3" / "bucket" / "input").mkdir(parents=True)
    (data / "s3" / "bucket" / "input" / "data.csv").write_text("1,2\n")

    def config(**backend: Callable[[Path], Backend]) -> AppConfig:
        return AppConfig(
            data_dir=data,
            fleet_path=SMALL_FLEET,
            clock="manual",
            clock_start=SERVER_START,
            isolation="none",
            work_dir=work,
            **backend,
        )

    previous = Application(config(backend=lambda _work_dir: LocalBackend(data / "backend")))
    previous.start()
    try:
        jobs.create(
            previous.context,
            _admin(previous.context),
            TrainingJobSpec.from_wire(_request("old", f"until [ -e {go} ]; do sleep 0.1; done")),
        )
        _wait(previous.context, "old", "InProgress/Training")
        backend = previous.context.backend
        deadline = time.monotonic() + 90  # its agent has started it (a loaded machine takes a while)
        while backend.task_status("job-1-a1-algo-1").state is not TaskState.RUNNING:
            assert time.monotonic() < deadline, backend.task_status("job-1-a1-algo-1")
            time.sleep(0.1)
    finally:
        previous.stop()  # its task runs on
    assert holds_work(data / "backend")

    upgraded = Application(config())
    upgraded.start()
    try:
        runtime = upgraded.context
        assert isinstance(runtime.backend, RoutingBackend)
        assert _status(runtime, "old").startswith("InProgress/Training")  # adopted, not lost
        jobs.create(runtime, _admin(runtime), TrainingJobSpec.from_wire(_request("new", "true")))
        _wait(runtime, "new", "Completed")
        go.touch()
        _wait(runtime, "old", "Completed")
    finally:
        upgraded.stop()
    assert (work / "backend" / "tasks").is_dir()  # the new job ran in the work directory
