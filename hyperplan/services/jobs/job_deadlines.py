"""A job's limits come due: the timed events ``job.pending-limit`` and ``job.max-runtime`` (planned by
``job_clocks``) are run by the lifecycle loop (so is ``job.auto-book``, a job waiting to book its own
capacity looking again: ``auto_booking``); each acts when the limit is reached, or plans itself again
when it fires early (pending time only counts while the plan, or one of a job's several plans, can give
capacity)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from hyperplan.core.jobs import RUNNING, Secondary, StopReason, reached_at
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.jobs import auto_booking
from hyperplan.services.jobs.job_clocks import (
    CAPACITY_LIMIT,
    MAX_RUNTIME,
    PENDING_LIMIT,
    event_subject,
    job_windows,
    max_runtime,
    pending_limits,
    pending_time,
    plan_runtime_limit,
    running_time,
)
from hyperplan.services.jobs.job_records import names_of, plans_of, settings_of, sigterm, span
from hyperplan.services.jobs.job_status import begin_stop, move
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob

EPSILON = timedelta(milliseconds=1)


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The timed events of jobs, for the lifecycle loop."""

    def deadline(session: Session, event: DueEvent) -> None:
        on_limit(session, runtime, event.kind, event.subject, event.payload, event.due_at)

    return {PENDING_LIMIT: deadline, MAX_RUNTIME: deadline, **auto_booking.event_handlers(runtime)}


def on_limit(
    session: Session,
    runtime: ServiceContext,
    kind: str,
    subject: str,
    payload: Mapping[str, Any],
    now: datetime,
) -> None:
    """A deadline's timed event: act if the limit is reached, plan again if it is not yet."""
    job = session.get(TrainingJob, int(subject.removeprefix("training-job:")))
    if job is None:
        return
    if kind == MAX_RUNTIME:
        _on_max_runtime(session, runtime, job, now)
    elif kind == PENDING_LIMIT:
        _on_pending_limit(session, runtime, job, str(payload.get("limit", "")), now)


def _on_max_runtime(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    if Secondary(job.secondary_status) not in RUNNING:
        return
    limit = max_runtime(job)
    if running_time(job, now) + EPSILON < timedelta(seconds=limit):
        plan_runtime_limit(session, job, now)
        return
    grace = settings_of(runtime).stop_grace
    begin_stop(
        session,
        runtime,
        job,
        StopReason.MAX_RUNTIME,
        f"MaxRuntimeInSeconds ({limit}) reached: {sigterm(grace)}",
        grace,
        now,
    )


def _on_pending_limit(
    session: Session, runtime: ServiceContext, job: TrainingJob, kind: str, now: datetime
) -> None:
    if job.secondary_status != Secondary.PENDING or kind not in pending_limits(runtime, job):
        return
    limit = pending_limits(runtime, job)[kind]
    waited = pending_time(session, runtime, job, now)
    if waited + EPSILON < limit:
        windows = job_windows(session, runtime, job)
        due = reached_at(now, waited, limit, windows)
        if due is None and windows and windows[-1].end > now:
            due = windows[-1].end
        if due is not None:
            schedule(session, PENDING_LIMIT, due, subject=event_subject(job), limit=kind)
        return
    plans = plans_of(session, job)
    while_active = (
        f"plan {plans[0].name} was Active"
        if len(plans) == 1
        else f"one of plans {names_of(plans)} was Active"
    )
    if kind == CAPACITY_LIMIT:
        job.failure_reason = (
            f"InsufficientCapacityError: the job waited {span(limit)} while {while_active} "
            f"for {job.instance_count} of its instances; other jobs held them. Ask for fewer instances, or "
            "run it on a plan with room."
        )
        move(session, runtime, job, Secondary.FAILED, job.failure_reason, now)
    else:
        move(
            session,
            runtime,
            job,
            Secondary.STOPPED,
            f"Stopped: StoppingCondition.MaxPendingTimeInSeconds ({int(limit.total_seconds())}) reached: the "
            f"job waited that long for {job.instance_count} instances while {while_active}.",
            now,
        )
