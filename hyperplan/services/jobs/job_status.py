"""The one place a training job's status changes (checked against ``JOB_LIFECYCLE``, recorded as a
transition, its clocks and deadlines kept in step), and a job told to stop: Stopping, SIGTERM to its
tasks after the commit, SIGKILL after a grace."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.backends.base import BackendError, TaskRef
from hyperplan.core.jobs import FINAL, JOB_LIFECYCLE, LIVE_INSTANCE, PRIMARY, RUNNING, Secondary, StopReason
from hyperplan.services.jobs.job_clocks import (
    AUTO_BOOK,
    MAX_RUNTIME,
    PENDING_LIMIT,
    SPOT_MAX_WAIT,
    cancel_events,
    close_pending,
    close_running,
    plan_pending_limits,
    plan_runtime_limit,
)
from hyperplan.services.jobs.job_records import consumer, instances_of
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime import status
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import TrainingJob, TrainingJobTransition


def move(
    session: Session, runtime: ServiceContext, job: TrainingJob, new: Secondary, message: str, now: datetime
) -> None:
    """The one place a job's status changes: checked against the state machine, appended to its
    transitions, and its pending and running clocks and their deadlines kept in step."""
    old = status.change(
        session,
        JOB_LIFECYCLE,
        job,
        new,
        now,
        message,
        column="secondary_status",
        record=lambda: open_transition(session, job, new, message, now),
    )
    job.status = PRIMARY[new]
    job.status_message = message
    job.updated_at = now
    if old == Secondary.PENDING:
        close_pending(session, runtime, job, now)
    if old in RUNNING and new not in RUNNING:
        close_running(session, job, now)
    if new == Secondary.PENDING:
        job.pending_since = now
        plan_pending_limits(session, runtime, job, now)
    if new in RUNNING and old not in RUNNING:
        job.running_since = now
        plan_runtime_limit(session, job, now)
    if new == Secondary.TRAINING and job.training_start_at is None:
        job.training_start_at = now
    if new in FINAL:
        job.training_end_at = now
        cancel_events(session, job, (PENDING_LIMIT, MAX_RUNTIME, AUTO_BOOK, SPOT_MAX_WAIT))
        capacity_claims.give_back(session, consumer(job), now)


def note(session: Session, job: TrainingJob, message: str, now: datetime) -> None:
    """A new message for the current status (say, how much capacity is free now), without a new entry."""
    if message == job.status_message:
        return
    job.status_message = message
    job.updated_at = now
    current = _current_transition(session, job)
    if current is not None:
        current.message = message


def open_transition(
    session: Session, job: TrainingJob, status: Secondary, message: str, now: datetime
) -> None:
    current = _current_transition(session, job)
    if current is not None:
        current.ended_at = now
    session.add(TrainingJobTransition(job_id=job.id, status=status, started_at=now, message=message))
    job.status_message = message


def _current_transition(session: Session, job: TrainingJob) -> TrainingJobTransition | None:
    session.flush()
    return session.scalar(
        select(TrainingJobTransition)
        .where(TrainingJobTransition.job_id == job.id)
        .order_by(TrainingJobTransition.id.desc())
        .limit(1)
    )


def transitions_of(session: Session, job: TrainingJob) -> list[TrainingJobTransition]:
    return list(
        session.scalars(
            select(TrainingJobTransition)
            .where(TrainingJobTransition.job_id == job.id)
            .order_by(TrainingJobTransition.id)
        )
    )


def begin_stop(
    session: Session,
    runtime: ServiceContext,
    job: TrainingJob,
    reason: StopReason,
    message: str,
    grace: timedelta,
    now: datetime,
    env: Mapping[str, str] | None = None,
) -> None:
    """A running job is told to stop: Stopping, SIGTERM to its instances now, its end once they are gone."""
    job.stop_reason = reason
    move(session, runtime, job, Secondary.STOPPING, message, now)
    terminate_instances(session, runtime, job, grace, env)


def terminate_instances(
    session: Session,
    runtime: ServiceContext,
    job: TrainingJob,
    grace: timedelta,
    env: Mapping[str, str] | None = None,
) -> None:
    """After the commit: SIGTERM to every live task of the job's current attempt, SIGKILL after `grace`.
    A launch still preparing its instances sees the job's new status and starts nothing."""
    task_ids = [i.task_id for i in instances_of(session, job.id, job.attempt) if i.state in LIVE_INSTANCE]
    if task_ids:
        job_id = job.id
        after_commit(session, lambda: terminate_tasks(runtime, job_id, task_ids, grace, dict(env or {})))


def terminate_tasks(
    runtime: ServiceContext, job_id: int, task_ids: list[str], grace: timedelta, env: Mapping[str, str]
) -> None:
    """SIGTERM now, SIGKILL after `grace` (real time), for tasks the back end has; under the job's start
    lock, so that a launch in progress either has started them already or will not start them."""
    with runtime.job_locks.start_lock(job_id):
        for task_id in task_ids:
            with contextlib.suppress(BackendError):  # never started, or ended: nothing to do
                runtime.backend.terminate(TaskRef(task_id), grace, env=dict(env) or None)
    runtime.wakes.jobs.notify()
