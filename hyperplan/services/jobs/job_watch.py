"""The watch on jobs' tasks: one pass brings the back end's state of every live task into the store;
when an instance fails the others are stopped, when every task of an attempt has ended
``job_callbacks.tasks_ended`` is called. After a restart, the tasks the back end no longer has are
settled here (:func:`settle_adoption`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.backends.base import AdoptReport, TaskRef, UnknownResource
from hyperplan.core.jobs import LIVE_INSTANCE, AttemptState, InstanceState
from hyperplan.services.jobs import job_callbacks, job_records
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob, TrainingJobInstance
from hyperplan.training.workspace import read_failure

FAILURE_FILE_LIMIT = 4096


@dataclass(frozen=True)
class _Seen:
    instance_id: int
    state: InstanceState
    exit_code: int | None
    message: str
    out_of_memory: bool = False


def watch(runtime: ServiceContext) -> int:
    """One pass: the back end's state of every live task of a running attempt into the store; returns how
    many changed."""
    with runtime.db.read() as session:
        running = list(
            session.scalars(select(TrainingJob).where(TrainingJob.attempt_state == AttemptState.RUNNING))
        )
        attempts = {job.id: job_records.instances_of(session, job.id, job.attempt) for job in running}
    seen: list[_Seen] = []
    settle: list[int] = []
    for job in running:
        states = {}
        for instance in attempts[job.id]:
            states[instance.id] = instance.state
            if instance.state not in LIVE_INSTANCE:
                continue
            change = _look(runtime, instance)
            if change is not None:
                seen.append(change)
                states[instance.id] = change.state
        if not any(state in LIVE_INSTANCE for state in states.values()):
            settle.append(job.id)
    if seen or settle:
        _apply(runtime, seen)
    return len(seen)


def _look(runtime: ServiceContext, instance: TrainingJobInstance) -> _Seen | None:
    try:
        status = runtime.backend.task_status(instance.task_id)
    except UnknownResource:
        return _Seen(instance.id, InstanceState.LOST, None, "the back end has no such task")
    if status.state.is_final():
        message = _failure_file(Path(instance.root)) or status.message
        state = InstanceState(status.state.value)
        return _Seen(instance.id, state, status.exit_code, message, status.out_of_memory)
    if status.state.value == InstanceState.RUNNING and instance.state != InstanceState.RUNNING:
        return _Seen(instance.id, InstanceState.RUNNING, None, "")
    return None


def _failure_file(root: Path) -> str:
    """What the algorithm wrote to /opt/ml/output/failure, which SageMaker shows as the FailureReason."""
    try:
        return read_failure(root, FAILURE_FILE_LIMIT)  # the tenant's tree: no link followed
    except OSError:
        return ""


def _apply(runtime: ServiceContext, seen: list[_Seen]) -> None:
    now = runtime.clock.now()
    with runtime.db.write() as session:
        touched: set[int] = set()
        for change in seen:
            instance = session.get(TrainingJobInstance, change.instance_id)
            if instance is None or instance.state not in LIVE_INSTANCE:
                continue
            job_records.move_instance(instance, change.state)
            instance.exit_code = change.exit_code
            if change.state != InstanceState.RUNNING:
                instance.message, instance.ended_at = change.message, now
                instance.out_of_memory = change.out_of_memory
            touched.add(instance.job_id)
        for job in session.scalars(
            select(TrainingJob).where(TrainingJob.attempt_state == AttemptState.RUNNING)
        ):
            _settle(runtime, session, job)


def _settle(runtime: ServiceContext, session: Session, job: TrainingJob) -> None:
    instances = job_records.instances_of(session, job.id, job.attempt)
    live = [i for i in instances if i.state in LIVE_INSTANCE]
    if not live:
        job_callbacks.tasks_ended(
            session, runtime, job, [i for i in instances if i.state != InstanceState.NOT_STARTED] or instances
        )
        return
    failed = [
        i
        for i in instances
        if i.state not in LIVE_INSTANCE and not (i.state == InstanceState.EXITED and i.exit_code == 0)
    ]
    if failed:
        job_callbacks.instance_failed(session, runtime, job, failed[0])


def task_refs(runtime: ServiceContext) -> list[TaskRef]:
    """Every task the store knows (ended ones included), for the start's one `adopt` call."""
    with runtime.db.read() as session:
        return [TaskRef(t) for t in session.scalars(select(TrainingJobInstance.task_id))]


def settle_adoption(runtime: ServiceContext, report: AdoptReport) -> None:
    """Tasks the back end never got: a launch cut short starts them again (JobRunner._hand_over); a task
    of a running attempt that the back end lost is recorded as Lost, and the watcher settles its job."""
    missing = {ref.task_id for ref in report.missing if isinstance(ref, TaskRef)}
    if not missing:
        return
    now = runtime.clock.now()
    with runtime.db.write() as session:
        for instance in session.scalars(
            select(TrainingJobInstance).where(TrainingJobInstance.task_id.in_(missing))
        ):
            job = session.get(TrainingJob, instance.job_id)
            if instance.state not in LIVE_INSTANCE or job is None:
                continue
            if job.attempt_state == AttemptState.LAUNCHING and job.attempt == instance.attempt:
                continue
            job_records.move_instance(instance, InstanceState.LOST)
            instance.ended_at = now
            instance.message = "the back end did not have it after the server restarted"
