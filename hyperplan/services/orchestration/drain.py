"""`hyperplan admin drain` and `admin resume`: the fleet in and out of maintenance
(services/runtime/drain_state.py says what a drained fleet refuses and holds back).

Drain records the state (and an audit record) in one transaction; with `stop_running` the same
transaction stops every running job as a reclaim does (plan jobs go back to Pending, SIGTERM now and
SIGKILL after the reclaim grace, so they checkpoint; on-demand jobs stop as Interrupted) and then every
cluster's groups are brought to no node. Resume clears the state, brings every group back to its target
or share and offers every plan's capacity to its queue.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import RUNNING, TARGET, Secondary, StopReason
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_reconcile
from hyperplan.services.jobs import spot
from hyperplan.services.jobs.job_queue import schedule_plan
from hyperplan.services.jobs.job_records import consumer, settings_of, sigterm
from hyperplan.services.jobs.job_status import begin_stop, move, terminate_instances
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.drain_state import DrainState
from hyperplan.store.schema import TrainingJob, TrainingPlan


def show(runtime: ServiceContext) -> DrainState:
    with runtime.db.read() as session:
        return drain_state.current(session)


def drain(runtime: ServiceContext, caller: Caller | None, *, stop_running: bool) -> DrainState:
    now = runtime.clock.now()
    by = f"{caller.account_name}/{caller.user_name}" if caller else ""
    with runtime.db.write() as session:
        before = drain_state.current(session)
        state = DrainState(True, before.since or now, stop_running or before.stop_running, by)
        drain_state.store(session, state)
        stopped = _stop_running_jobs(session, runtime, now) if state.stop_running else []
        audit.record(
            session,
            now,
            caller,
            "fleet.drain",
            target="fleet",
            detail={"StopRunning": state.stop_running, "JobsStopped": stopped, "WasDrained": before.draining},
        )
    if state.stop_running:
        cluster_reconcile.reconcile_all(runtime)  # every group to no node (cluster_reconcile reads the state)
    runtime.wakes.jobs.notify()
    runtime.wakes.nodes.notify()
    return state


def resume(runtime: ServiceContext, caller: Caller | None) -> DrainState:
    now = runtime.clock.now()
    with runtime.db.write() as session:
        before = drain_state.current(session)
        drain_state.store(session, drain_state.NOT_DRAINED)
        audit.record(
            session,
            now,
            caller,
            "fleet.resume",
            target="fleet",
            detail={"WasDrained": before.draining, "Since": before.since},
        )
        plans = session.scalars(
            select(TrainingPlan)
            .where(TrainingPlan.status == PlanStatus.ACTIVE, TrainingPlan.target == TARGET)
            .order_by(TrainingPlan.id)
        )
        for plan in plans:
            schedule_plan(session, runtime, plan, now)
        spot.serve(session, runtime, now)  # the spot jobs that waited through the drain
    cluster_reconcile.reconcile_all(runtime)
    runtime.wakes.jobs.notify()
    runtime.wakes.nodes.notify()
    return drain_state.NOT_DRAINED


def _stop_running_jobs(session: Session, runtime: ServiceContext, now: datetime) -> list[str]:
    grace = settings_of(runtime).reclaim_grace
    why = f"The fleet is drained for maintenance: {sigterm(grace)}"
    jobs = session.scalars(
        select(TrainingJob)
        .where(TrainingJob.secondary_status.in_([s.value for s in RUNNING]))
        .order_by(TrainingJob.id)
    )
    stopped = []
    for job in list(jobs):
        if job.spot:  # a managed spot job waits through the drain and resumes from its checkpoints
            spot.interrupt(session, runtime, job, "drained", grace, now)
        elif job.plan_id is not None:
            capacity_claims.give_back(session, consumer(job), now)
            message = f"{why} The job starts again from its checkpoints when the fleet resumes."
            move(session, runtime, job, Secondary.PENDING, message, now)
            terminate_instances(session, runtime, job, grace)
        else:
            begin_stop(
                session, runtime, job, StopReason.INTERRUPTED, f"{why} It ends Interrupted.", grace, now
            )
        stopped.append(job.name)
    return stopped
