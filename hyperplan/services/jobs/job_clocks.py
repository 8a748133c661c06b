"""A job's pending and running clocks, and the timed events planned for when its limits will be reached.

``job_status.move`` keeps them in step with every change of status; ``job_deadlines`` acts when one of
the events comes due. Pending time counts only while the plan can give capacity, or for a job on several
plans while any of them can (see ``services/jobs/jobs.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session

from hyperplan.core.jobs import TARGET, Window, countable, merged_windows, reached_at, usable_windows
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.events.loop import schedule
from hyperplan.services.jobs.job_records import consumer, plans_of, request_of, settings_of
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ScheduledEvent, TrainingJob, TrainingPlan

PENDING_LIMIT = "job.pending-limit"


MAX_RUNTIME = "job.max-runtime"


SPOT_MAX_WAIT = "job.spot-max-wait"  # a spot job's MaxWaitTimeInSeconds since its creation (spot.py)
AUTO_BOOK = "job.auto-book"  # a job waiting to book its own capacity looks again (auto_booking.py)


CAPACITY_LIMIT = "capacity"  # the 2-day wait for capacity (a setting) -> Failed, InsufficientCapacityError


MAX_PENDING = "max-pending"  # StoppingCondition.MaxPendingTimeInSeconds -> Stopped


def windows_of(session: Session, runtime: ServiceContext, plan: TrainingPlan) -> list[Window]:
    """When the plan can give capacity: each segment's start to its reclaim time; none once it failed."""
    if plan.status in (PlanStatus.FAILED, PlanStatus.PENDING):
        return []
    lead = runtime.fleet.policy.reclaim_lead_for(TARGET)
    segments = [
        (rc.start, rc.released_at or rc.end)
        for rc in lifecycle.segments_of(session, plan.id)
        if rc.holds_capacity
    ]
    return usable_windows(segments, lead)


def job_windows(session: Session, runtime: ServiceContext, job: TrainingJob) -> list[Window]:
    """When any of the job's plans can give capacity (core/jobs.py, merged_windows); none on demand."""
    return merged_windows(
        window for plan in plans_of(session, job) for window in windows_of(session, runtime, plan)
    )


def pending_time(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> timedelta:
    """The pending time that counts against the job's limits, up to `now`."""
    total = timedelta(seconds=job.pending_seconds)
    if job.pending_since is not None and job.plan_id is not None:
        total += countable(job.pending_since, now, job_windows(session, runtime, job))
    return total


def running_time(job: TrainingJob, now: datetime) -> timedelta:
    total = timedelta(seconds=job.running_seconds)
    if job.running_since is not None:
        total += max(now - job.running_since, timedelta(0))
    return total


def close_pending(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    job.pending_seconds = pending_time(session, runtime, job, now).total_seconds()
    job.pending_since = None
    cancel_events(session, job, (PENDING_LIMIT,))


def close_running(session: Session, job: TrainingJob, now: datetime) -> None:
    job.running_seconds = running_time(job, now).total_seconds()
    job.running_since = None
    cancel_events(session, job, (MAX_RUNTIME,))


def pending_limits(runtime: ServiceContext, job: TrainingJob) -> dict[str, timedelta]:
    limits = {CAPACITY_LIMIT: settings_of(runtime).capacity_wait}
    max_pending = request_of(job).stopping.max_pending_seconds
    if max_pending:
        limits[MAX_PENDING] = timedelta(seconds=max_pending)
    return limits


def plan_pending_limits(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """Timed events for the moments the pending limits will be reached, if the plan lasts that long."""
    if job.plan_id is None or job.pending_since is None:
        return
    windows = job_windows(session, runtime, job)
    already = timedelta(seconds=job.pending_seconds)
    for kind, limit in pending_limits(runtime, job).items():
        due = reached_at(job.pending_since, already, limit, windows)
        if due is None and windows:
            # Not within the plan as it stands; look again when its last window closes, in case an
            # extension has made it longer by then.
            due = windows[-1].end
        if due is not None:
            schedule(session, PENDING_LIMIT, max(due, now), subject=event_subject(job), limit=kind)


@contextmanager
def plans_changing(
    session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime
) -> Iterator[None]:
    """The job's plans change inside: a Pending job's time so far counts by the plans it had, and from
    now on, with its limits' events, by the plans it has after (an hour before a plan was added does not
    count by that plan)."""
    counting = job.pending_since is not None
    if counting:
        close_pending(session, runtime, job, now)
    yield
    if counting:
        job.pending_since = now
        plan_pending_limits(session, runtime, job, now)


def plan_runtime_limit(session: Session, job: TrainingJob, now: datetime) -> None:
    limit = timedelta(seconds=max_runtime(job))
    left = limit - running_time(job, now)
    schedule(session, MAX_RUNTIME, now + max(left, timedelta(0)), subject=event_subject(job))


def max_runtime(job: TrainingJob) -> int:
    return int(request_of(job).stopping.max_runtime)


def cancel_events(session: Session, job: TrainingJob, kinds: Sequence[str]) -> None:
    session.execute(
        update(ScheduledEvent)
        .where(
            ScheduledEvent.subject == event_subject(job),
            ScheduledEvent.done.is_(False),
            ScheduledEvent.kind.in_(kinds),
        )
        .values(done=True)
    )


def event_subject(job: TrainingJob) -> str:
    return consumer(job)
