"""Restarts the real back end cannot stage on demand, played on the fake one: a runtime in this process
over a data directory and a FakeWorld that outlives it, as real processes outlive a server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.app import AppConfig, Application
from hyperplan.backends.base import TaskSpec
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import job_records, jobs
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from tests.harness import SERVER_START, unisolated

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
REQUEST: dict[str, Any] = {
    "TrainingJobName": "job",
    "RoleArn": "arn:aws:iam::123456789012:role/training",
    "AlgorithmSpecification": {"TrainingInputMode": "File", "ContainerEntrypoint": ["python", "train.py"]},
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
    "ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 2},
}
TASKS = ("job-1-a1-algo-1", "job-1-a1-algo-2")


def _application(data_dir: Path, world: FakeWorld) -> Application:
    """Tasks run on the fake back end until completed or signalled."""
    config = AppConfig(
        data_dir=data_dir,
        fleet_path=SMALL_FLEET,
        clock="manual",
        clock_start=SERVER_START,
        backend=lambda _work_dir: FakeBackend(world),
        **unisolated(data_dir),
    )
    return Application(config)


def _admin(runtime: ServiceContext) -> Caller:
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
    return Caller(admin.id, admin.name, True, "test")


def _job(runtime: ServiceContext) -> TrainingJob:
    with runtime.db.read() as session:
        return job_records.get(session, runtime, _admin(runtime), "job")


def _wait(check: Callable[[], Any], timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


@pytest.fixture
def world() -> Iterator[FakeWorld]:
    yield FakeWorld()


def test_a_launch_cut_short_starts_its_tasks_after_the_restart_and_strays_are_killed(
    tmp_path: Path, world: FakeWorld
) -> None:
    crashed = _application(tmp_path, world)
    crashed.bootstrap()  # opened, its workers never started: the launch after the commit never runs
    first = crashed.context
    jobs.create(first, _admin(first), TrainingJobSpec.from_wire(REQUEST))
    assert (_job(first).secondary_status, _job(first).attempt_state) == ("Downloading", "launching")
    assert not world.tasks
    FakeBackend(world).run(TaskSpec("stray", ("python", "-c", "pass")))  # nobody's task
    first.db.close()

    restarted = _application(tmp_path, world)
    restarted.start()
    second = restarted.context
    try:
        assert _wait(lambda: _job(second).secondary_status == "Training"), _job(second).status_message
        assert set(world.tasks) == set(TASKS)  # started once each; the stray was killed
        for task_id in TASKS:
            second.backend.complete(task_id, 0)  # type: ignore[attr-defined]
        assert _wait(lambda: _job(second).secondary_status == "Completed"), _job(second).status_message
        assert _job(second).model_uri == "s3://bucket/output/job/output/model.tar.gz"
    finally:
        restarted.stop()


def test_tasks_that_end_while_no_server_watches_settle_the_job_by_their_exit_status(
    tmp_path: Path, world: FakeWorld
) -> None:
    first_app = _application(tmp_path, world)
    first_app.start()
    first = first_app.context
    jobs.create(first, _admin(first), TrainingJobSpec.from_wire(REQUEST))
    assert _wait(lambda: _job(first).secondary_status == "Training")
    first_app.stop()
    backend = FakeBackend(world)
    backend.complete(TASKS[0], 0)
    backend.complete(TASKS[1], 3, stderr=b"Traceback ...\nRuntimeError: NCCL timeout\n")

    second_app = _application(tmp_path, world)
    second_app.start()
    second = second_app.context
    try:
        assert _wait(lambda: _job(second).secondary_status == "Failed")
        assert _job(second).failure_reason == (
            "AlgorithmError: instance algo-2 exited with code 3: Traceback ...\nRuntimeError: NCCL timeout"
        )
    finally:
        second_app.stop()


def test_tasks_the_back_end_lost_while_the_server_was_down_fail_the_job(
    tmp_path: Path, world: FakeWorld
) -> None:
    first_app = _application(tmp_path, world)
    first_app.start()
    first = first_app.context
    jobs.create(first, _admin(first), TrainingJobSpec.from_wire(REQUEST))
    assert _wait(lambda: _job(first).secondary_status == "Training")
    first_app.stop()

    second_app = _application(tmp_path, FakeWorld())  # the machine was wiped: nothing of the job is left
    second_app.start()
    second = second_app.context
    try:
        assert _wait(lambda: _job(second).secondary_status == "Failed")
        assert _job(second).failure_reason.startswith("InternalServerError: instance algo-1 was lost")
        with second.db.read() as session:  # its on-demand instances are free again
            assert all(i.state == "Lost" for i in job_records.instances_of(session, _job(second).id))
        jobs.create(
            second,
            _admin(second),
            TrainingJobSpec.from_wire({**REQUEST, "TrainingJobName": "again"} | _four()),
        )
    finally:
        second_app.stop()


def _four() -> dict[str, Any]:
    return {"ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 4}}


def test_the_runner_forgets_a_job_once_it_has_ended(tmp_path: Path, world: FakeWorld) -> None:
    """Its per-job locks and sync times follow the live jobs, not every job ever run."""
    application = _application(tmp_path, world)
    application.start()
    runtime = application.context
    try:
        jobs.create(runtime, _admin(runtime), TrainingJobSpec.from_wire(REQUEST))
        assert _wait(lambda: _job(runtime).secondary_status == "Training")
        runner = application.workers.job_runner
        assert runner.tracked_jobs() == {_job(runtime).id}  # its start lock, while it runs
        for task_id in TASKS:
            runtime.backend.complete(task_id, 0)  # type: ignore[attr-defined]
        assert _wait(lambda: _job(runtime).secondary_status == "Completed"), _job(runtime).status_message
        assert _wait(lambda: not runner.tracked_jobs()), runner.tracked_jobs()
    finally:
        application.stop()
