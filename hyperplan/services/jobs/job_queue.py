"""The queue on a plan: its free capacity offered to the waiting jobs that may run on it, oldest first with
backfill, and a job placed on it (its instances claimed on that plan, its tasks recorded, the runner woken
after the commit). A job on several plans is in each of their queues and starts in whichever has room
first."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan import metrics
from hyperplan.core.jobs import (
    BETWEEN_ATTEMPTS,
    TARGET,
    WAITING,
    InstanceState,
    Secondary,
    has_capacity_left,
    next_opening,
    select_to_start,
)
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.services.clusters import metering
from hyperplan.services.jobs.job_clocks import windows_of
from hyperplan.services.jobs.job_records import (
    begin_attempt,
    consumer,
    instance_root,
    names_of,
    naming,
    plans_of,
    request_of,
    when,
)
from hyperplan.services.jobs.job_status import move, note
from hyperplan.services.plans import capacity_claims, loans
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import ReservedCapacity, TrainingJob, TrainingJobInstance, TrainingPlan
from hyperplan.training.contract import host_names


def usable_segment(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, now: datetime
) -> ReservedCapacity | None:
    """The plan's open segment, if it can give capacity now (Active, before its reclaim time)."""
    if plan.status != PlanStatus.ACTIVE:
        return None
    segment = capacity_claims.open_segment(session, plan, now)
    lead = runtime.fleet.policy.reclaim_lead_for(TARGET)
    if segment is None or now >= segment.end - lead or (segment.released_at and now >= segment.released_at):
        return None
    return segment


def schedule_plan(session: Session, runtime: ServiceContext, plan: TrainingPlan, now: datetime) -> None:
    """Offer the plan's free capacity to the waiting jobs that may run on it (those that name it and
    those given it as a further plan), oldest first, with backfill; the others are Pending with a message
    that says what they wait for.

    A job sent back by a reclaim keeps its place while its last processes end and its checkpoints are
    stored ("draining"): the capacity it would get is kept for it, so a later job cannot take it just
    because the next segment began a moment before the job was ready; it starts when it is."""
    waiting = list(
        session.scalars(
            select(TrainingJob)
            .where(naming(plan.id), TrainingJob.secondary_status.in_(list(WAITING)))
            .order_by(TrainingJob.id)
        )
    )
    if not waiting:
        return
    segment = usable_segment(session, runtime, plan, now)
    lent = loans.lent(session, plan.id, segment.id) if segment else 0
    free = segment.count - capacity_claims.in_use(session, plan.id, segment.id) - lent if segment else 0
    queue = [(j.id, j.instance_count) for j in waiting]
    started = set(select_to_start(queue, free)) if segment else set()
    draining = drain_state.current(session).draining
    reclaiming: set[int] = set()
    if segment is not None and lent and not draining:
        reclaiming = _take_back_lent(session, runtime, plan, queue, free, lent, now) - started
    if draining:
        started = (
            set()
        )  # a drained fleet starts nothing (services/runtime/drain_state.py); resume serves the queue
    for job in waiting:
        if job.attempt_state not in BETWEEN_ATTEMPTS:
            continue  # draining: placed once its last attempt has ended
        if job.id in started:
            place(session, runtime, job, segment, now)
            continue
        message = (
            DRAINED
            if draining
            else _reclaim_message(session, plan, job, now)
            if job.id in reclaiming
            else waiting_message(session, runtime, job, now)
        )
        if job.secondary_status == Secondary.STARTING:
            move(session, runtime, job, Secondary.PENDING, message, now)
        elif segment is not None or job.attempt == 0:
            # A job sent back by a reclaim keeps the message that says why, until capacity is there.
            note(session, job, message, now)


def _take_back_lent(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    queue: list[tuple[int, int]],
    free: int,
    lent: int,
    now: datetime,
) -> set[int]:
    """The waiting jobs that would start if the plan's lent instances were back: as many as they need are
    taken back from the managed spot jobs that borrow them (services/jobs/spot.py); returns those jobs."""
    wanted = select_to_start(queue, free + lent)
    counts = dict(queue)
    needed = sum(counts[job_id] for job_id in wanted) - max(free, 0)
    if needed > 0:
        runtime.reclaim_lent(session, runtime, plan.id, needed, "owner-job", now)
    return set(wanted)


def _reclaim_message(session: Session, plan: TrainingPlan, job: TrainingJob, now: datetime) -> str:
    deadline = loans.latest_deadline(session, plan.id)
    by = f", by {when(deadline)} at the latest" if deadline is not None else ""
    return (
        f"Waiting for plan {plan.name}'s instances: some were lent to managed spot training while the plan "
        f"had them idle and are being taken back for this job{by}."
    )


def schedule_plans_of(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """Serve the queue of every plan the job may run on: the one its attempt held first (its instances
    are free there now), then the others in the job's order, where it may start itself if it waits."""
    plans = plans_of(session, job)
    plans.sort(key=lambda plan: plan.id != job.attempt_plan_id)  # stable: the job's order otherwise
    for plan in plans:
        schedule_plan(session, runtime, plan, now)


DRAINED = (
    "The fleet is drained for maintenance: the job starts when an administrator runs "
    "`hyperplan admin resume`."
)


def waiting_message(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> str:
    """What a waiting job waits for, plan by plan."""
    plans = plans_of(session, job)
    if len(plans) == 1:
        return _waiting_for_one(session, runtime, plans[0], job, now)
    states = "; ".join(_plan_state(session, runtime, plan, now) for plan in plans)
    return (
        f"Waiting for capacity on plans {names_of(plans)}: the job needs {job.instance_count} instances and "
        f"starts on whichever has room first; {states}."
    )


def _waiting_for_one(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, job: TrainingJob, now: datetime
) -> str:
    segment = usable_segment(session, runtime, plan, now)
    if segment is not None:
        free = (
            segment.count
            - capacity_claims.in_use(session, plan.id, segment.id)
            - loans.lent(session, plan.id, segment.id)
        )
        return (
            f"Waiting for capacity: the job needs {job.instance_count} instances and plan {plan.name} has "
            f"{free} of {segment.count} free now; jobs on a plan start first in, first out, and a smaller "
            "later job may start first when an earlier one does not fit."
        )
    opening = next_opening(windows_of(session, runtime, plan), now)
    if opening is not None:
        return f"Waiting for plan {plan.name} to become Active: its next segment starts at {when(opening)}."
    return f"Waiting: plan {plan.name} has no capacity to give now."


def _plan_state(session: Session, runtime: ServiceContext, plan: TrainingPlan, now: datetime) -> str:
    """One plan of several, as a waiting job's message says it."""
    segment = usable_segment(session, runtime, plan, now)
    if segment is not None:
        free = (
            segment.count
            - capacity_claims.in_use(session, plan.id, segment.id)
            - loans.lent(session, plan.id, segment.id)
        )
        return f"plan {plan.name} has {free} of {segment.count} free now"
    windows = windows_of(session, runtime, plan)
    opening = next_opening(windows, now)
    if opening is not None:
        return f"plan {plan.name}'s next segment starts at {when(opening)}"
    if not has_capacity_left(windows, now):
        return f"plan {plan.name} has no capacity left to give ({plan.status})"
    return f"plan {plan.name} has no capacity to give now"


def place(
    session: Session,
    runtime: ServiceContext,
    job: TrainingJob,
    segment: ReservedCapacity | None,
    now: datetime,
) -> None:
    """Give the job its instances: claim them on the segment's plan (or meter them on demand), record its
    tasks, and have the runner start them."""
    plan = session.get(TrainingPlan, segment.plan_id) if segment is not None else None
    if segment is not None:
        assert plan is not None
        granted = capacity_claims.take(session, plan, consumer(job), job.instance_count, now)
        assert granted == job.instance_count, "placement is decided from the free count in this transaction"
        job.availability_zone = segment.availability_zone
        job.segment_end = segment.end
    job.attempt_plan_id = plan.id if plan is not None else None  # its claims are on that plan
    where = (
        f"plan {plan.name}'s segment until {when(segment.end)} in {segment.availability_zone}"
        if segment and plan
        else f"on-demand capacity in {job.availability_zone}"
    )
    start_attempt(session, runtime, job, where, now)
    if segment is None:  # on-demand: metered while it holds its instances (services/clusters/metering.py)
        assert job.availability_zone is not None
        pool = metering.pool_of(runtime, job.instance_type, job.availability_zone)
        holder = metering.job_holder(job)
        metering.start(
            session, job.account_id, holder, f"training job {job.name}", pool, job.instance_count, now
        )


def start_attempt(
    session: Session, runtime: ServiceContext, job: TrainingJob, where: str, now: datetime
) -> None:
    """The job's next attempt on instances already decided (`where` says which, for its message): its
    tasks recorded, Downloading, and the runner woken after the commit."""
    if job.attempt == 0:  # its pending time as counted (job_clocks), once: at its first placement
        waited = job.pending_seconds + (
            (now - job.pending_since).total_seconds() if job.pending_since else 0.0
        )
        after_commit(session, lambda: metrics.JOB_PENDING.observe(max(waited, 0.0)))
    begin_attempt(job)
    job.stop_reason = ""
    for host in host_names(job.instance_count):
        session.add(
            TrainingJobInstance(
                job_id=job.id,
                attempt=job.attempt,
                host=host,
                task_id=f"job-{job.id}-a{job.attempt}-{host}",
                root=str(instance_root(runtime, job, job.attempt, host)),
                state=InstanceState.RECORDED,
            )
        )
    move(
        session,
        runtime,
        job,
        Secondary.DOWNLOADING,
        f"Preparing {job.instance_count} instance(s) on {where}: fetching input channels"
        + (", restoring checkpoints" if request_of(job).checkpoints else "")
        + ".",
        now,
    )
    # The runner finds the attempt in the store (launching) and does its I/O.
    after_commit(session, runtime.wakes.jobs.notify)
