"""Managed spot training on idle reserved capacity (docs/SPOT.md).

A spot job (``EnableManagedSpotTraining``, no plan) waits ``Pending`` until it is placed, oldest first
with backfill: on instances a plan lends, or on the pool's free on-demand capacity, whichever the
fleet's ``[spot] prefer`` names first. A plan lends when its owner set a lending policy
(services/plans/lending.py): instances of its open segment that none of its owner's work holds or waits
for, to jobs of other accounts, from its segment's start until the stop-lending point (the segment's
reclaim time less the policy's margin), and only to a job that can run the policy's minimum run before
that point. Each attempt of a spot job is a ``SpotRun``: it holds its instances until the attempt's
tasks have ended, and is then settled (spot_money.py: the borrower pays per second at the spot price,
the owner is credited its share).

**The promise.** When the owner needs lent instances (a job of its queued on the plan: job_queue.py; a
group of its scaling up: clusters/group_capacity.py; the stop-lending point; the plan failing), runs are
taken back (:func:`reclaim_for_owner`): the borrower is Interrupted (``SpotInterrupted``, shown as
``Interrupted``), its tasks get SIGTERM at once with the expiry variable set to the deadline (the
notice's end, never after the segment's reclaim time) and SIGKILL at the deadline, which the back end
keeps even if the server dies meanwhile. The owner's work starts in the transaction that ends the run
(:func:`run_ended`), so the seconds the owner waited are the run's end less the request. Each reclaim
is a plan event (counts and seconds, never the borrower) and counted in
``hyperplan_spot_reclaims_total{promise}``. The borrower waits again and resumes from its checkpoints.

**Its wait.** ``MaxWaitTimeInSeconds`` counts from the job's creation, waits and runs together (as
SageMaker's model documents it): a timed event stops it then, as ``MaxWaitTimeExceeded``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from hyperplan import metrics
from hyperplan.backends.base import EXPIRATION_VARIABLE
from hyperplan.core.fleet import Pool
from hyperplan.core.jobs import BETWEEN_ATTEMPTS, FINAL, RUNNING, WAITING, Secondary, StopReason
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.spot import (
    Lending,
    Loan,
    choose_reclaims,
    may_start_loan,
    promise_kept,
    reclaim_deadline,
    stop_lending_at,
)
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.clusters import cluster_reconcile, group_capacity, metering
from hyperplan.services.jobs import spot_money
from hyperplan.services.jobs.job_clocks import SPOT_MAX_WAIT, event_subject
from hyperplan.services.jobs.job_queue import TARGET as JOB_TARGET
from hyperplan.services.jobs.job_queue import schedule_plan, start_attempt
from hyperplan.services.jobs.job_records import naming, settings_of, sigterm, span, when
from hyperplan.services.jobs.job_status import begin_stop, move, note, terminate_instances
from hyperplan.services.plans import capacity_claims, lifecycle, loans, on_demand, quotas
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import tx_facts
from hyperplan.store.db import after_commit
from hyperplan.store.schema import LendingPolicy, ReservedCapacity, SpotRun, TrainingJob, TrainingPlan

MAX_WAIT = SPOT_MAX_WAIT
STOP_LENDING = "spot.stop-lending"  # a run's plan reaches its stop-lending point
# Why an owner took its lent instances back: each such reclaim is a plan event and counted in the metric.
# (A run is also interrupted for the fleet's reasons, "drained" and on Slurm "on-demand-taken": no promise.)
OWNER_NEEDS = ("owner-job", "owner-group", "segment-end", "plan-ended", "lending-off")


# -- a spot job's life -------------------------------------------------------------------------------


def begin(session: Session, runtime: ServiceContext, job: TrainingJob, max_wait: int, now: datetime) -> None:
    """A spot job just written (Starting): its wait bound planned, and placed at once if it can be."""
    job.spot = True
    job.max_wait_seconds = max_wait
    schedule(session, MAX_WAIT, job.created_at + timedelta(seconds=max_wait), subject=event_subject(job))
    serve(session, runtime, now)


_JOBS_TABLE = frozenset({"training_jobs"})


def _any_waiting(session: Session) -> bool:
    """Whether a spot job waits to be placed: read once a transaction while it writes no job
    (store/tx_facts.py), since every plan event of a lifecycle batch serves the spot jobs."""
    return session.scalar(select(TrainingJob.id).where(*_waiting()).limit(1)) is not None


def _waiting() -> tuple[ColumnElement[bool], ...]:
    return (
        TrainingJob.spot.is_(True),
        TrainingJob.secondary_status.in_(list(WAITING)),
        TrainingJob.attempt_state.in_(list(BETWEEN_ATTEMPTS)),
    )


def serve(session: Session, runtime: ServiceContext, now: datetime) -> None:
    """Place the waiting spot jobs that capacity allows, oldest first (a later one that fits starts when an
    earlier one does not); the others wait Pending with a message that says for what."""
    if not tx_facts.fact(session, "spot jobs waiting", _JOBS_TABLE, _any_waiting):
        return
    waiting = list(session.scalars(select(TrainingJob).where(*_waiting()).order_by(TrainingJob.id)))
    if not waiting:
        return
    drained = drain_state.current(session).draining
    for job in waiting:
        if not drained and _place(session, runtime, job, now):
            continue
        message = (
            "The fleet is drained for maintenance: the job waits for compute capacity until an administrator "
            "runs `hyperplan admin resume`."
            if drained
            else _waiting_message(runtime, job)
        )
        if job.secondary_status == Secondary.STARTING:
            move(session, runtime, job, Secondary.PENDING, message, now)
        elif job.status_message != message and not job.status_message.startswith("Interrupted"):
            note(session, job, message, now)


def _waiting_message(runtime: ServiceContext, job: TrainingJob) -> str:
    first = (
        "instances a training plan lends while idle, then free on-demand capacity"
        if runtime.fleet.spot.prefer == "lent"
        else "free on-demand capacity, then instances a training plan lends while idle"
    )
    deadline = job.created_at + timedelta(seconds=job.max_wait_seconds or 0)
    return (
        f"Waiting for compute capacity: {job.instance_count} {job.instance_type} on {first}; "
        f"MaxWaitTimeInSeconds ends the job at {when(deadline)} if it has not completed."
    )


def _place(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> bool:
    ways = (_on_lent, _on_demand) if runtime.fleet.spot.prefer == "lent" else (_on_demand, _on_lent)
    return any(way(session, runtime, job, now) for way in ways)


@dataclass(frozen=True)
class _Lender:
    plan: TrainingPlan
    segment: ReservedCapacity
    lending: Lending
    reclaim_at: datetime  # the segment's reclaim time for the plan's own work


def _on_lent(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> bool:
    """On one lending plan's idle instances (all of the job's in one segment, hence one zone): the plan
    whose stop-lending point is latest, so the job runs longest."""
    lenders = [
        lender
        for lender in _lenders(session, runtime, job, now)
        if idle(session, runtime, lender.plan, lender.segment, now) >= job.instance_count
    ]
    if not lenders:
        return False
    lender = max(lenders, key=lambda one: (stop_lending_at(one.reclaim_at, one.lending), -one.plan.id))
    pool = metering.pool_of(runtime, job.instance_type, lender.segment.availability_zone)
    if pool is None:
        return False
    stop = stop_lending_at(lender.reclaim_at, lender.lending)
    job.availability_zone = lender.segment.availability_zone
    job.segment_end = lender.reclaim_at  # the expiry variable: the latest the instances are the job's
    job.attempt_plan_id = None
    job.lent_plan_id = lender.plan.id
    start_attempt(
        session,
        runtime,
        job,
        f"idle instances a training plan lends in {job.availability_zone}, at the spot price, until "
        f"{when(stop)} at the latest; the plan's owner may take them back earlier with "
        f"{int(lender.lending.notice.total_seconds())} s notice",
        now,
    )
    run = _new_run(session, runtime, job, pool, now, lender.plan, lender.segment)
    run.notice_seconds = int(lender.lending.notice.total_seconds())
    schedule(session, STOP_LENDING, stop, subject=f"spot-run:{run.id}")
    _admit_borrowers(session, runtime)
    return True


def _admit_borrowers(session: Session, runtime: ServiceContext) -> None:
    """On Slurm a lending plan's reservation admits its borrowers' users while their runs are open: the
    reservation pass, woken after the commit, adds and removes them (services/slurm); a borrower's
    instances submitted before it has are submitted again until it has (backends/slurm_submit.py)."""
    if runtime.slurm is not None:
        after_commit(session, runtime.slurm.wake.notify)


def _lenders(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> list[_Lender]:
    """Other accounts' Active plans of the job's type that lend, with an open segment that may start a loan
    now."""
    plans = session.scalars(
        select(TrainingPlan)
        .join(LendingPolicy, LendingPolicy.plan_id == TrainingPlan.id)
        .where(
            TrainingPlan.status == PlanStatus.ACTIVE,
            TrainingPlan.instance_type == job.instance_type,
            TrainingPlan.account_id != job.account_id,
        )
        .order_by(TrainingPlan.id)
    )
    found = []
    for plan in plans:
        lending = loans.policy_of(session, plan.id)
        segment = capacity_claims.open_segment(session, plan, now)
        if lending is None or segment is None or (segment.released_at and now >= segment.released_at):
            continue
        reclaim_at = segment.end - runtime.fleet.policy.reclaim_lead_for(plan.target)
        if may_start_loan(now, reclaim_at, lending):
            found.append(_Lender(plan, segment, lending, reclaim_at))
    return found


def idle(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, segment: ReservedCapacity, now: datetime
) -> int:
    """The segment's instances that none of its owner's work holds or waits for, less those lent now."""
    lent = loans.lent(session, plan.id, segment.id)
    if plan.target == JOB_TARGET:
        free = segment.count - capacity_claims.in_use(session, plan.id, segment.id) - lent
        return 0 if _owner_jobs_waiting(session, plan) else max(free, 0)
    # The groups' share, or their nodes while more are still shutting down (each holds its instance).
    held = max(
        group_capacity.wanted_of(session, runtime, plan.id, now), group_capacity.nodes_on(session, plan.id)
    )
    return max(segment.count - held - lent, 0)


def _owner_jobs_waiting(session: Session, plan: TrainingPlan) -> bool:
    """Whether a job of the owner waits for this plan: its instances are the job's, not a borrower's."""
    return (
        session.scalar(
            select(TrainingJob.id)
            .where(naming(plan.id), TrainingJob.secondary_status.in_(list(WAITING)))
            .limit(1)
        )
        is not None
    )


def _on_demand(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> bool:
    """On the pool of the job's type with the most free on-demand instances, within the account's
    on-demand quota."""
    pools = runtime.fleet.pools_of_type(job.instance_type)
    free = {pool: on_demand.free(session, pool) for pool in pools}
    fitting = [pool for pool in pools if free[pool] >= job.instance_count]
    if not fitting:
        return False
    try:
        quotas.check_on_demand(session, runtime, job.account_id, job.instance_type, job.instance_count)
    except ResourceLimitExceeded:
        return False
    pool = max(fitting, key=lambda p: (free[p], p.availability_zone))
    job.availability_zone = pool.availability_zone
    job.segment_end = None
    job.attempt_plan_id = None
    job.lent_plan_id = None
    start_attempt(
        session, runtime, job, f"on-demand capacity in {pool.availability_zone} at the spot price", now
    )
    _new_run(session, runtime, job, pool, now)
    return True


def _new_run(
    session: Session,
    runtime: ServiceContext,
    job: TrainingJob,
    pool: Pool,
    now: datetime,
    plan: TrainingPlan | None = None,
    segment: ReservedCapacity | None = None,
) -> SpotRun:
    run = SpotRun(
        job_id=job.id,
        attempt=job.attempt,
        account_id=job.account_id,
        plan_id=plan.id if plan else None,
        reserved_capacity_id=segment.id if segment else None,
        owner_account_id=plan.account_id if plan else None,
        instance_type=job.instance_type,
        availability_zone=pool.availability_zone,
        count=job.instance_count,
        price_per_instance_hour=spot_money.spot_price_of(runtime, pool),
        currency=pool.currency,
        lender_share=runtime.fleet.spot.lender_share if plan else 0,
        notice_seconds=0,
        started_at=now,
        reclaim_reason="",
        charged=0,
        credited=0,
        settled=False,
    )
    session.add(run)
    session.flush()
    return run


# -- taking lent instances back ----------------------------------------------------------------------


def reclaim_for_owner(
    session: Session, runtime: ServiceContext, plan_id: int, needed: int, why: str, now: datetime
) -> None:
    """The plan's owner needs `needed` more instances than are free: runs are taken back (the ones already
    being taken back count), those past their minimum run first. It is ``ServiceContext.reclaim_lent``."""
    plan = session.get(TrainingPlan, plan_id)
    if plan is None:
        return
    lending = loans.policy_or_default(session, runtime.fleet.spot, plan_id)
    runs = {run.id: run for run in loans.open_runs(session, plan_id)}
    chosen = choose_reclaims(
        [Loan(r.id, r.count, r.started_at, r.reclaim_requested_at is not None) for r in runs.values()],
        needed,
        now,
        lending,
    )
    for run_id in chosen:
        run = runs[run_id]
        _interrupt(session, runtime, run, why, _deadline(run, lending, now, None), now)


def _interrupt(
    session: Session, runtime: ServiceContext, run: SpotRun, why: str, deadline: datetime, now: datetime
) -> None:
    """The run's job is told its instances go back: SIGTERM now with the deadline published, SIGKILL then."""
    if run.reclaim_requested_at is not None:
        return
    run.reclaim_reason = why
    run.reclaim_requested_at = now
    run.reclaim_deadline = max(deadline, now)
    job = session.get(TrainingJob, run.job_id)
    if job is None or job.attempt != run.attempt:
        return
    notice = run.reclaim_deadline - now
    env = {EXPIRATION_VARIABLE: str(int(run.reclaim_deadline.replace(tzinfo=UTC).timestamp()))}
    current = Secondary(job.secondary_status)
    if current in RUNNING:
        move(
            session,
            runtime,
            job,
            Secondary.SPOT_INTERRUPTED,
            f"Interrupted: {_why_words(why)}: {sigterm(notice)} (at {when(run.reclaim_deadline)}). The job "
            "then waits for compute capacity again and resumes from its checkpoints.",
            now,
        )
        terminate_instances(session, runtime, job, notice, env)
    elif current in (Secondary.STOPPING, Secondary.SPOT_INTERRUPTED):
        terminate_instances(session, runtime, job, notice, env)  # ending already: no later than the deadline
    # Uploading: its tasks have ended; the run ends with the attempt.


def interrupt(
    session: Session, runtime: ServiceContext, job: TrainingJob, why: str, grace: timedelta, now: datetime
) -> None:
    """A running spot job whose instances go for a reason of the fleet's, not an owner's (a drain that
    stops running work; on Slurm, a reservation taking its on-demand node): interrupted with `grace`, as
    a borrower is, and waiting again once its processes are gone (within its MaxWaitTimeInSeconds)."""
    run = session.scalar(
        select(SpotRun).where(
            SpotRun.job_id == job.id, SpotRun.attempt == job.attempt, SpotRun.ended_at.is_(None)
        )
    )
    if run is not None:
        _interrupt(session, runtime, run, why, now + grace, now)


def _why_words(why: str) -> str:
    if why == "drained":
        return "the fleet is drained for maintenance"
    if why == "on-demand-taken":
        return "its on-demand node is taken by a training plan's reservation"
    return "the instances it borrowed are going back to their owner"


def plan_changed(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (a segment's start, reclaim or end, a failure, its lending policy): runs on a plan
    that stopped lending, or cannot lend now, are taken back (no later than the segment's reclaim time);
    then the waiting spot jobs are served (a segment that starts, or a plan that starts lending, may lend)."""
    plan = session.get(TrainingPlan, plan_id)
    if plan is not None and plan_id in loans.plans_with_open_runs(session):
        lends = loans.policy_of(session, plan_id) is not None
        for run in loans.open_runs(session, plan_id):
            if lends and _still_lendable(session, runtime, plan, run, now):
                continue
            lending = loans.policy_or_default(session, runtime.fleet.spot, plan_id)
            why = (
                "plan-ended"
                if plan.status != PlanStatus.ACTIVE
                else "lending-off"
                if not lends
                else "segment-end"
            )
            hard_end = _hard_end(session, runtime, plan, run)
            _interrupt(session, runtime, run, why, _deadline(run, lending, now, hard_end), now)
    serve(session, runtime, now)


def _deadline(run: SpotRun, lending: Lending, now: datetime, hard_end: datetime | None) -> datetime:
    """The notice promised when the run started (a policy changed since never shortens it), never past
    the segment's reclaim time."""
    promised = (
        replace(lending, notice=timedelta(seconds=run.notice_seconds)) if run.notice_seconds else lending
    )
    return reclaim_deadline(now, promised, hard_end)


def _still_lendable(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, run: SpotRun, now: datetime
) -> bool:
    segment = session.get(ReservedCapacity, run.reserved_capacity_id) if run.reserved_capacity_id else None
    if plan.status != PlanStatus.ACTIVE or segment is None or not segment.holds_capacity:
        return False
    if segment.released_at is not None and now >= segment.released_at:
        return False
    return now < segment.end - runtime.fleet.policy.reclaim_lead_for(plan.target)


def _hard_end(session: Session, runtime: ServiceContext, plan: TrainingPlan, run: SpotRun) -> datetime | None:
    segment = session.get(ReservedCapacity, run.reserved_capacity_id) if run.reserved_capacity_id else None
    return segment.end - runtime.fleet.policy.reclaim_lead_for(plan.target) if segment else None


# -- the end of a run --------------------------------------------------------------------------------


def run_ended(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """The job's attempt gave its instances back (its tasks have ended): its run ends and is settled; a run
    taken back for the owner is recorded and the owner's work served at once; then the other spot jobs."""
    if not job.spot:
        return
    run = session.scalar(
        select(SpotRun).where(
            SpotRun.job_id == job.id, SpotRun.attempt == job.attempt, SpotRun.ended_at.is_(None)
        )
    )
    job.lent_plan_id = None
    if run is None:
        return
    run.ended_at = max(now, run.started_at)
    spot_money.settle(session, runtime, run, now)
    if run.plan_id is not None:
        _admit_borrowers(session, runtime)  # on Slurm: the borrower's user leaves the reservation
    plan = session.get(TrainingPlan, run.plan_id) if run.plan_id is not None else None
    if plan is None:
        return
    if run.reclaim_requested_at is not None and run.reclaim_reason in OWNER_NEEDS:
        _record_reclaim(session, runtime, plan, run)
    if plan.target == JOB_TARGET:
        schedule_plan(session, runtime, plan, now)
    else:
        cluster_reconcile.reconcile_plan(session, runtime, plan.id, now)


def _record_reclaim(session: Session, runtime: ServiceContext, plan: TrainingPlan, run: SpotRun) -> None:
    """The plan's event and the promise's metric: counts and seconds only, never the borrower."""
    assert run.reclaim_requested_at is not None and run.reclaim_deadline is not None and run.ended_at
    notice = run.reclaim_deadline - run.reclaim_requested_at
    waited = run.ended_at - run.reclaim_requested_at
    kept = promise_kept(
        run.reclaim_requested_at, run.ended_at, run.reclaim_deadline, runtime.fleet.spot.kill_grace
    )
    why = {
        "owner-job": "for a training job of the plan's",
        "owner-group": "for a cluster instance group of the plan's",
        "segment-end": "before the segment's reclaim time",
        "plan-ended": "as the plan can no longer give capacity",
        "lending-off": "as the plan stopped lending",
    }.get(run.reclaim_reason, "")
    lifecycle.record(
        session,
        plan,
        "lending.reclaim",
        f"Took back {run.count} instance(s) lent to managed spot training {why}: notice "
        f"{int(notice.total_seconds())} s, the plan had them after {_seconds(waited)} s "
        f"({'within' if kept else 'past'} the promise).",
        run.ended_at,
    )
    outcome = "kept" if kept else "broken"
    after_commit(session, lambda: metrics.SPOT_RECLAIMS.labels(promise=outcome).inc())


def _seconds(delta: timedelta) -> str:
    return (
        f"{delta.total_seconds():.0f}" if delta >= timedelta(seconds=10) else f"{delta.total_seconds():.1f}"
    )


# -- timed events --------------------------------------------------------------------------------------


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The timed events of spot jobs and runs, for the lifecycle loop."""

    def max_wait(session: Session, event: DueEvent) -> None:
        job = session.get(TrainingJob, int(event.subject.removeprefix("training-job:")))
        if job is not None:
            _on_max_wait(session, runtime, job, event.due_at)

    def stop_lending(session: Session, event: DueEvent) -> None:
        run = session.get(SpotRun, int(event.subject.removeprefix("spot-run:")))
        if run is None or run.ended_at is not None or run.plan_id is None:
            return
        plan = session.get(TrainingPlan, run.plan_id)
        if plan is None:
            return
        lending = loans.policy_or_default(session, runtime.fleet.spot, plan.id)
        deadline = _deadline(run, lending, event.due_at, _hard_end(session, runtime, plan, run))
        _interrupt(session, runtime, run, "segment-end", deadline, event.due_at)

    return {MAX_WAIT: max_wait, STOP_LENDING: stop_lending}


def _on_max_wait(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """MaxWaitTimeInSeconds since the job's creation has passed: a waiting job is Stopped at once, one that
    runs is stopped (SIGTERM, its model and checkpoints kept) and ends MaxWaitTimeExceeded."""
    current = Secondary(job.secondary_status)
    if current in FINAL or current in (Secondary.STOPPING, Secondary.UPLOADING):
        return
    limit = job.max_wait_seconds or 0
    why = (
        f"MaxWaitTimeInSeconds ({limit}) reached: the job waited and ran {span(timedelta(seconds=limit))} "
        "in all since its creation"
    )
    if current in WAITING:
        move(session, runtime, job, Secondary.MAX_WAIT_TIME_EXCEEDED, f"Stopped: {why}.", now)
        return
    grace = settings_of(runtime).stop_grace
    if current == Secondary.SPOT_INTERRUPTED:  # its processes are ending already
        job.stop_reason = StopReason.MAX_WAIT
        move(session, runtime, job, Secondary.STOPPING, f"{why}; its processes are ending.", now)
        return
    begin_stop(session, runtime, job, StopReason.MAX_WAIT, f"{why}: {sigterm(grace)}", grace, now)
