"""Training jobs: queued on a plan's capacity (or given on-demand capacity), run for real, checkpointed.

The store is the truth and every change is one transaction, as for clusters (``services/clusters.py``):

- **CreateTrainingJob** checks every rule before anything is written (:func:`check_request`: the modes
  this back end does not serve, the command, the channels and URIs; then the plan's binding rules from
  ``core/jobs.py``, or the pool's free on-demand instances), writes the job in ``Starting`` and, in the
  same transaction, offers the plan's capacity to its queue (:func:`schedule_plan`) or places an
  on-demand job at once.
- **Placing** a job (:func:`_place`) claims its instances (``capacity_claims.take``, consumer
  ``training-job:<id>``), records one instance row per host with the back-end task id it will have, and
  moves it to ``Downloading``; after the commit the runner (``services/job_runner.py``), woken, prepares each
  instance's directory tree and starts its task. The runner's I/O never runs inside a transaction or on
  the lifecycle loop: the loop only changes rows and hands work over after the commit.
- **Plan changes** (segment start, reclaim, end, failure) reach :func:`reconcile_plan`, registered by
  the composition root as a consumer of the lifecycle context: at a reclaim time running jobs get SIGTERM
  and go back to ``Pending`` (or, when no segment follows, are stopped as ``Interrupted``); at a segment start
  the queue is served.
- **Deadlines** are persisted timed events (``job.pending-limit``, ``job.max-runtime``) planned when a
  job starts or stops waiting or running, and re-planned when they fire early; they run at their due
  time under the manual clock like every lifecycle event.
- **Ends.** The runner's watcher reports when every task of an attempt has ended
  (:func:`tasks_ended`); the runner then stores the last checkpoints (and the model) and reports back
  (:func:`attempt_ended`), which picks the final status from why the job was ending.

Decisions where SageMaker's documents are silent (see also ``core/jobs.py``):

- Pending time counts from a segment's start to its reclaim time, not during the last 30 minutes of a
  segment (capacity is being taken back) nor between segments. Running time counts while a job holds its
  instances and has not been told to stop (Downloading, Training), in service time, across segments.
  ``TrainingTimeInSeconds`` and ``BillableTimeInSeconds`` both report it (plans are paid up front).
- At a reclaim time, a job with a later segment goes back to Pending at once (its instances are the
  plan's again); it keeps its place at the head of the queue while its processes end and its checkpoints
  are stored, and starts again in fresh instance directories, so what it had comes back only through
  ``CheckpointConfig``. Without a later segment it is Stopping, then Stopped/Interrupted; waiting jobs
  are Interrupted at once. A plan that fails (an administrator's cancellation) interrupts its jobs too.
- An instance that exits non-zero fails the job: the others get SIGTERM (SIGKILL after the reclaim
  grace) and the FailureReason is ``AlgorithmError: instance algo-K exited with code N: `` followed by
  ``/opt/ml/output/failure`` or else the tail of its stderr. Storage failures are ``ClientError: ...``.
- StopTrainingJob stops a waiting job at once; a job that is uploading its model completes. A stopped,
  interrupted or timed-out job stores the model its first instance saved, if it saved one.
- ``ModelArtifacts.S3ModelArtifacts`` is required in every DescribeTrainingJob answer; until the model
  is stored it names where it will be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hyperplan.backends.base import EXPIRATION_VARIABLE, BackendError, TaskRef
from hyperplan.core.jobs import (
    FINAL,
    FINAL_FOR_STOP,
    JOB_LIFECYCLE,
    PRIMARY,
    RUNNING,
    TARGET,
    WAITING,
    JobStatus,
    PlanFacts,
    Secondary,
    StopReason,
    Window,
    check_plan,
    countable,
    has_capacity_left,
    reached_at,
    select_to_start,
    usable_windows,
)
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.errors import ResourceInUse, ResourceLimitExceeded, ResourceNotFound, ValidationError
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services import capacity_claims, lifecycle, on_demand, status
from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext
from hyperplan.services.job_request import TrainingJobSpec
from hyperplan.services.job_work import JobSettings
from hyperplan.store.db import after_commit
from hyperplan.store.schema import (
    ReservedCapacity,
    ScheduledEvent,
    TrainingJob,
    TrainingJobInstance,
    TrainingJobTransition,
    TrainingPlan,
)
from hyperplan.training.contract import JobSpec, host_names

PENDING_LIMIT = "job.pending-limit"
MAX_RUNTIME = "job.max-runtime"
CAPACITY_LIMIT = "capacity"  # the 2-day wait for capacity (a setting) -> Failed, InsufficientCapacityError
MAX_PENDING = "max-pending"  # StoppingCondition.MaxPendingTimeInSeconds -> Stopped
EPSILON = timedelta(milliseconds=1)
FAILURE_REASON_MAX = 1024

# Instance states: Recorded (the task id is known, the task may not be started yet), Running, and the
# back end's final ones (Exited, Killed, Lost), or NotStarted when the attempt ended before it ran.
LIVE_INSTANCE = ("Recorded", "Running")


# -- settings -----------------------------------------------------------------------------------------


def settings_of(runtime: ServiceContext) -> JobSettings:
    return runtime.job_settings


def job_spec(job: TrainingJob, host: str, interpreter: str | None = None) -> JobSpec:
    """The contract's view of one instance of a stored job (its request decoded here, once)."""
    return request_of(job).instance(host, job.segment_end, interpreter)


def request_of(job: TrainingJob) -> TrainingJobSpec:
    return TrainingJobSpec.from_json(job.request)


# -- create and stop ------------------------------------------------------------------------------


def create(runtime: ServiceContext, caller: Caller, checked: TrainingJobSpec) -> TrainingJob:
    """CreateTrainingJob, for a request checked at the wire edge (TrainingJobSpec.from_wire)."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        name = checked.name
        if session.scalar(
            select(TrainingJob.id).where(
                TrainingJob.account_id == caller.account_id, TrainingJob.name == name
            )
        ):
            raise ResourceInUse(f"A training job named {name!r} already exists in this account.")
        plan = _bound_plan(session, runtime, caller, checked) if checked.plan_arn else None
        zone = None if plan else _on_demand_zone(session, runtime, checked)
        job = TrainingJob(
            account_id=caller.account_id,
            name=name,
            plan_id=plan.id if plan else None,
            instance_type=checked.instance_type,
            instance_count=checked.instance_count,
            availability_zone=zone,
            status=JobStatus.IN_PROGRESS,
            secondary_status=Secondary.STARTING,
            request=checked.to_json(),
            created_at=now,
            updated_at=now,
        )
        session.add(job)
        session.flush()
        where = f"plan {plan.name}" if plan else f"on-demand capacity in {zone}"
        _open_transition(session, job, Secondary.STARTING, f"Starting the job on {where}.", now)
        if plan is not None:
            schedule_plan(session, runtime, plan, now)
        else:
            _place(session, runtime, job, None, now)
    return job


def _bound_plan(
    session: Session, runtime: ServiceContext, caller: Caller, checked: TrainingJobSpec
) -> TrainingPlan:
    arn = checked.plan_arn or ""
    prefix = runtime.arn(caller.account_id, "training-plan/")
    plan = None
    if arn.startswith(prefix):
        plan = session.scalar(
            select(TrainingPlan).where(
                TrainingPlan.account_id == caller.account_id, TrainingPlan.name == arn.removeprefix(prefix)
            )
        )
    facts = None
    if plan is not None:
        segments = lifecycle.segments_of(session, plan.id)
        facts = PlanFacts(
            arn=plan_arn(runtime, plan),
            target=plan.target,
            status=plan.status,
            instance_type=plan.instance_type,
            instance_count=max((rc.count for rc in segments), default=0),
            capacity_left=has_capacity_left(windows_of(session, runtime, plan), runtime.clock.now()),
        )
    check_plan(facts, arn, checked.instance_type, checked.instance_count)
    assert plan is not None
    return plan


def _on_demand_zone(session: Session, runtime: ServiceContext, checked: TrainingJobSpec) -> str:
    """The pool of the job's type with the most free on-demand instances; refused, naming the pools, when
    none has enough."""
    pools = runtime.fleet.pools_of_type(checked.instance_type)
    if not pools:
        raise ValidationError(f"ResourceConfig.InstanceType: this fleet has no {checked.instance_type}.")
    free = {p.availability_zone: on_demand.free(session, p) for p in pools}
    best = max(pools, key=lambda p: (free[p.availability_zone], p.availability_zone))
    if checked.instance_count > free[best.availability_zone]:
        described = ", ".join(
            f"pool {checked.instance_type} in {zone}: {count} free" for zone, count in sorted(free.items())
        )
        raise ResourceLimitExceeded(
            f"ResourceConfig: a job without a TrainingPlanArn runs on on-demand capacity; it asks for "
            f"{checked.instance_count} on-demand {checked.instance_type}, but {described} (on-demand: the "
            "instances the fleet keeps out of plans, shared with clusters and other jobs). Name a training "
            "plan, or ask for fewer."
        )
    return best.availability_zone


def stop(runtime: ServiceContext, caller: Caller, name: str) -> TrainingJob:
    """StopTrainingJob: a waiting job is Stopped at once; a running one gets SIGTERM and is Stopping until
    its processes are gone (SIGKILL after the stop grace, 120 s by default). Stopping again does nothing;
    a job that is uploading its model completes."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = get(session, runtime, caller, name)
        current = Secondary(job.secondary_status)
        if current in FINAL:
            raise ValidationError(
                f"Training job {job.name} is {job.status}; only InProgress jobs can be stopped."
            )
        if current in WAITING:
            move(
                session,
                runtime,
                job,
                Secondary.STOPPED,
                "Stopped by StopTrainingJob before it got instances.",
                now,
            )
        elif current in RUNNING:
            grace = settings_of(runtime).stop_grace
            begin_stop(
                session,
                runtime,
                job,
                StopReason.USER,
                f"Stopping by StopTrainingJob: {_sigterm(grace)}",
                grace,
                now,
            )
    return job


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


# -- statuses -------------------------------------------------------------------------------------


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
        record=lambda: _open_transition(session, job, new, message, now),
    )
    job.status = PRIMARY[new]
    job.status_message = message
    job.updated_at = now
    if old == Secondary.PENDING:
        _close_pending(session, runtime, job, now)
    if old in RUNNING and new not in RUNNING:
        _close_running(session, job, now)
    if new == Secondary.PENDING:
        job.pending_since = now
        _plan_pending_limits(session, runtime, job, now)
    if new in RUNNING and old not in RUNNING:
        job.running_since = now
        _plan_runtime_limit(session, job, now)
    if new == Secondary.TRAINING and job.training_start_at is None:
        job.training_start_at = now
    if new in FINAL:
        job.training_end_at = now
        _cancel_events(session, job, (PENDING_LIMIT, MAX_RUNTIME))
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


def _open_transition(
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


# -- pending and running time ---------------------------------------------------------------------


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


def pending_time(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> timedelta:
    """The pending time that counts against the job's limits, up to `now`."""
    total = timedelta(seconds=job.pending_seconds)
    if job.pending_since is not None and job.plan_id is not None:
        plan = session.get(TrainingPlan, job.plan_id)
        if plan is not None:
            total += countable(job.pending_since, now, windows_of(session, runtime, plan))
    return total


def running_time(job: TrainingJob, now: datetime) -> timedelta:
    total = timedelta(seconds=job.running_seconds)
    if job.running_since is not None:
        total += max(now - job.running_since, timedelta(0))
    return total


def _close_pending(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    job.pending_seconds = pending_time(session, runtime, job, now).total_seconds()
    job.pending_since = None
    _cancel_events(session, job, (PENDING_LIMIT,))


def _close_running(session: Session, job: TrainingJob, now: datetime) -> None:
    job.running_seconds = running_time(job, now).total_seconds()
    job.running_since = None
    _cancel_events(session, job, (MAX_RUNTIME,))


def _limits(runtime: ServiceContext, job: TrainingJob) -> dict[str, timedelta]:
    limits = {CAPACITY_LIMIT: settings_of(runtime).capacity_wait}
    max_pending = request_of(job).stopping.max_pending_seconds
    if max_pending:
        limits[MAX_PENDING] = timedelta(seconds=max_pending)
    return limits


def _plan_pending_limits(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """Timed events for the moments the pending limits will be reached, if the plan lasts that long."""
    if job.plan_id is None or job.pending_since is None:
        return
    plan = session.get(TrainingPlan, job.plan_id)
    if plan is None:
        return
    windows = windows_of(session, runtime, plan)
    already = timedelta(seconds=job.pending_seconds)
    for kind, limit in _limits(runtime, job).items():
        due = reached_at(job.pending_since, already, limit, windows)
        if due is None and windows:
            # Not within the plan as it stands; look again when its last window closes, in case an
            # extension has made it longer by then.
            due = windows[-1].end
        if due is not None:
            schedule(session, PENDING_LIMIT, max(due, now), subject=_subject(job), limit=kind)


def _plan_runtime_limit(session: Session, job: TrainingJob, now: datetime) -> None:
    limit = timedelta(seconds=_max_runtime(job))
    left = limit - running_time(job, now)
    schedule(session, MAX_RUNTIME, now + max(left, timedelta(0)), subject=_subject(job))


def _max_runtime(job: TrainingJob) -> int:
    return int(request_of(job).stopping.max_runtime)


def _cancel_events(session: Session, job: TrainingJob, kinds: Sequence[str]) -> None:
    session.execute(
        update(ScheduledEvent)
        .where(
            ScheduledEvent.subject == _subject(job),
            ScheduledEvent.done.is_(False),
            ScheduledEvent.kind.in_(kinds),
        )
        .values(done=True)
    )


def _subject(job: TrainingJob) -> str:
    return consumer(job)


def consumer(job: TrainingJob) -> str:
    return f"training-job:{job.id}"


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The timed events of jobs, for the lifecycle loop."""

    def deadline(session: Session, event: DueEvent) -> None:
        on_limit(session, runtime, event.kind, event.subject, event.payload, event.due_at)

    return {PENDING_LIMIT: deadline, MAX_RUNTIME: deadline}


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
    limit = _max_runtime(job)
    if running_time(job, now) + EPSILON < timedelta(seconds=limit):
        _plan_runtime_limit(session, job, now)
        return
    grace = settings_of(runtime).stop_grace
    begin_stop(
        session,
        runtime,
        job,
        StopReason.MAX_RUNTIME,
        f"MaxRuntimeInSeconds ({limit}) reached: {_sigterm(grace)}",
        grace,
        now,
    )


def _on_pending_limit(
    session: Session, runtime: ServiceContext, job: TrainingJob, kind: str, now: datetime
) -> None:
    if job.secondary_status != Secondary.PENDING or kind not in _limits(runtime, job):
        return
    limit = _limits(runtime, job)[kind]
    waited = pending_time(session, runtime, job, now)
    if waited + EPSILON < limit:
        plan = session.get(TrainingPlan, job.plan_id) if job.plan_id else None
        windows = windows_of(session, runtime, plan) if plan else []
        due = reached_at(now, waited, limit, windows)
        if due is None and windows and windows[-1].end > now:
            due = windows[-1].end
        if due is not None:
            schedule(session, PENDING_LIMIT, due, subject=_subject(job), limit=kind)
        return
    plan_name = _plan_name(session, job)
    if kind == CAPACITY_LIMIT:
        job.failure_reason = (
            f"InsufficientCapacityError: the job waited {_span(limit)} while plan {plan_name} was Active "
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
            f"job waited that long for {job.instance_count} instances while plan {plan_name} was Active.",
            now,
        )


# -- the queue on a plan ----------------------------------------------------------------------------


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
    """Offer the plan's free capacity to its waiting jobs, oldest first, with backfill; the others are
    Pending with a message that says what they wait for.

    A job sent back by a reclaim keeps its place while its last processes end and its checkpoints are
    stored ("draining"): the capacity it would get is kept for it, so a later job cannot take it just
    because the next segment began a moment before the job was ready; it starts when it is."""
    waiting = list(
        session.scalars(
            select(TrainingJob)
            .where(TrainingJob.plan_id == plan.id, TrainingJob.secondary_status.in_(list(WAITING)))
            .order_by(TrainingJob.id)
        )
    )
    if not waiting:
        return
    segment = usable_segment(session, runtime, plan, now)
    free = segment.count - capacity_claims.in_use(session, plan.id, segment.id) if segment else 0
    started = set(select_to_start([(j.id, j.instance_count) for j in waiting], free)) if segment else set()
    for job in waiting:
        if job.attempt_state not in ("", "ended"):
            continue  # draining: placed once its last attempt has ended
        if job.id in started:
            _place(session, runtime, job, segment, now)
            continue
        message = _waiting_message(session, runtime, plan, segment, free, job, now)
        if job.secondary_status == Secondary.STARTING:
            move(session, runtime, job, Secondary.PENDING, message, now)
        elif segment is not None or job.attempt == 0:
            # A job sent back by a reclaim keeps the message that says why, until capacity is there.
            note(session, job, message, now)


def _waiting_message(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    segment: ReservedCapacity | None,
    free: int,
    job: TrainingJob,
    now: datetime,
) -> str:
    if segment is not None:
        return (
            f"Waiting for capacity: the job needs {job.instance_count} instances and plan {plan.name} has "
            f"{free} of {segment.count} free now; jobs on a plan start first in, first out, and a smaller "
            "later job may start first when an earlier one does not fit."
        )
    upcoming = [w for w in windows_of(session, runtime, plan) if w.start > now]
    if upcoming:
        return (
            f"Waiting for plan {plan.name} to become Active: its next segment starts at "
            f"{_when(upcoming[0].start)}."
        )
    return f"Waiting: plan {plan.name} has no capacity to give now."


def _place(
    session: Session,
    runtime: ServiceContext,
    job: TrainingJob,
    segment: ReservedCapacity | None,
    now: datetime,
) -> None:
    """Give the job its instances: claim them, record its tasks, and have the runner start them."""
    if segment is not None:
        plan = session.get(TrainingPlan, job.plan_id)
        assert plan is not None
        granted = capacity_claims.take(session, plan, consumer(job), job.instance_count, now)
        assert granted == job.instance_count, "placement is decided from the free count in this transaction"
        job.availability_zone = segment.availability_zone
        job.segment_end = segment.end
    job.attempt += 1
    job.attempt_state = "launching"
    job.stop_reason = ""
    for host in host_names(job.instance_count):
        session.add(
            TrainingJobInstance(
                job_id=job.id,
                attempt=job.attempt,
                host=host,
                task_id=f"job-{job.id}-a{job.attempt}-{host}",
                root=str(instance_root(runtime, job, job.attempt, host)),
                state="Recorded",
            )
        )
    where = (
        f"plan {_plan_name(session, job)}'s segment until {_when(segment.end)} in {segment.availability_zone}"
        if segment
        else f"on-demand capacity in {job.availability_zone}"
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


def instance_root(runtime: ServiceContext, job: TrainingJob, attempt: int, host: str) -> Path:
    """Each attempt gets fresh directories, as a restarted SageMaker job gets fresh instances: what it
    had before comes back only through its checkpoints."""
    return runtime.work_dir / "jobs" / str(job.id) / f"attempt-{attempt}" / host


def instances_of(session: Session, job_id: int, attempt: int | None = None) -> list[TrainingJobInstance]:
    query = select(TrainingJobInstance).where(TrainingJobInstance.job_id == job_id)
    if attempt is not None:
        query = query.where(TrainingJobInstance.attempt == attempt)
    return list(session.scalars(query.order_by(TrainingJobInstance.attempt, TrainingJobInstance.id)))


# -- following the plan -----------------------------------------------------------------------------


def reconcile_plan(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (segment start, reclaim, end, failure): its jobs follow, in this transaction.

    When the plan cannot give capacity now, running jobs are reclaimed: back to Pending when a later
    segment will, stopped as Interrupted when none will (and waiting jobs are then Interrupted too).
    When it can, its queue is served.
    """
    plan = session.get(TrainingPlan, plan_id)
    if plan is None or plan.target != TARGET:
        return
    jobs = list(
        session.scalars(
            select(TrainingJob)
            .where(
                TrainingJob.plan_id == plan.id,
                TrainingJob.status.in_((JobStatus.IN_PROGRESS, JobStatus.STOPPING)),
            )
            .order_by(TrainingJob.id)
        )
    )
    if not jobs:
        return
    if usable_segment(session, runtime, plan, now) is not None:
        schedule_plan(session, runtime, plan, now)
        return
    windows = windows_of(session, runtime, plan)
    later = next((w.start for w in windows if w.start > now), None)
    segment = capacity_claims.open_segment(session, plan, now)
    for job in jobs:
        current = Secondary(job.secondary_status)
        if current in RUNNING or current == Secondary.STOPPING:
            _reclaim(session, runtime, plan, job, segment, later, now)
        elif current in WAITING and later is None:
            move(session, runtime, job, Secondary.INTERRUPTED, _ended_message(plan, job), now)
        elif current in WAITING:
            message = _waiting_message(session, runtime, plan, None, 0, job, now)
            if current == Secondary.STARTING:
                move(session, runtime, job, Secondary.PENDING, message, now)
            elif job.attempt_state in ("", "ended") and job.attempt == 0:
                note(session, job, message, now)


def _reclaim(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    job: TrainingJob,
    segment: ReservedCapacity | None,
    later: datetime | None,
    now: datetime,
) -> None:
    """The plan takes its capacity back: SIGTERM now (with the segment's end published), SIGKILL after the
    reclaim grace; the job waits for the next segment, or ends Interrupted when there is none."""
    grace = settings_of(runtime).reclaim_grace
    end = segment.end if segment else job.segment_end
    env = {EXPIRATION_VARIABLE: str(int(end.timestamp())) if end else "0"}
    why = (
        f"Plan {plan.name}'s capacity is being taken back"
        + (f" before its segment ends at {_when(end)}" if end and end > now else "")
        + f": {_sigterm(grace)}"
    )
    capacity_claims.give_back(session, consumer(job), now)
    current = Secondary(job.secondary_status)
    if current == Secondary.STOPPING:
        terminate_instances(session, runtime, job, grace, env)  # stopping already: only sooner
    elif later is not None:
        move(
            session,
            runtime,
            job,
            Secondary.PENDING,
            f"{why} The job starts again from its checkpoints when the next segment starts at "
            f"{_when(later)}.",
            now,
        )
        terminate_instances(session, runtime, job, grace, env)
    else:
        begin_stop(
            session,
            runtime,
            job,
            StopReason.INTERRUPTED,
            f"{why} It was the plan's last segment: the job will end Interrupted.",
            grace,
            now,
            env,
        )


def _ended_message(plan: TrainingPlan, job: TrainingJob) -> str:
    checkpoints = request_of(job).checkpoint_uri
    kept = f" Its checkpoints are at {checkpoints}." if checkpoints and job.attempt else ""
    return (
        f"Interrupted: plan {plan.name} has no capacity left to give ({plan.status}) before the job "
        f"finished.{kept}"
    )


# -- the end of an attempt (called by the runner) -------------------------------------------------


def instance_failed(
    session: Session, runtime: ServiceContext, job: TrainingJob, instance: TrainingJobInstance
) -> None:
    """One instance of a running job failed while others still run: the job will fail; stop the rest."""
    if job.stop_reason or Secondary(job.secondary_status) not in RUNNING:
        return
    job.stop_reason = StopReason.FAILED
    job.failure_reason = failure_reason(instance)
    note(
        session,
        job,
        f"Instance {instance.host} failed; the other instances got SIGTERM. {job.failure_reason}",
        runtime.clock.now(),
    )
    terminate_instances(session, runtime, job, settings_of(runtime).reclaim_grace)


def tasks_ended(
    session: Session, runtime: ServiceContext, job: TrainingJob, instances: Sequence[TrainingJobInstance]
) -> None:
    """Every task of the current attempt has ended: its instances are free for other jobs now; how the
    tasks ended decides whether the job uploads its model or fails. The runner then stores the last
    checkpoints (and the model) and calls :func:`attempt_ended`."""
    now = runtime.clock.now()
    job.attempt_state = "ending"
    capacity_claims.give_back(session, consumer(job), now)
    current = Secondary(job.secondary_status)
    if current in RUNNING and not job.stop_reason:
        bad = [i for i in instances if i.state != "Exited" or i.exit_code != 0]
        if bad:
            job.stop_reason = StopReason.FAILED
            job.failure_reason = failure_reason(bad[0])
        else:
            uri = request_of(job).output_path
            move(
                session,
                runtime,
                job,
                Secondary.UPLOADING,
                f"All {len(instances)} instance(s) exited 0; storing the model under {uri}.",
                now,
            )
    # The runner finds the attempt in the store (ending) and does its I/O.
    after_commit(session, runtime.wakes.jobs.notify)
    _serve_plan_of(session, runtime, job, now)


def attempt_ended(
    session: Session, runtime: ServiceContext, job: TrainingJob, model_uri: str | None, error: str | None
) -> None:
    """The runner is done with an attempt (its checkpoints and model are stored, or it never ran): the job
    takes its final status, or waits for the next segment."""
    now = runtime.clock.now()
    job.attempt_state = "ended"
    capacity_claims.give_back(session, consumer(job), now)
    current = Secondary(job.secondary_status)
    if current == Secondary.STOPPING:
        reason = StopReason(job.stop_reason or StopReason.USER)
        if model_uri:
            job.model_uri = model_uri
        final = FINAL_FOR_STOP[reason]
        move(session, runtime, job, final, _final_message(session, job, final, model_uri), now)
    elif current == Secondary.UPLOADING:
        if error:
            job.failure_reason = error
            move(session, runtime, job, Secondary.FAILED, error, now)
        else:
            job.model_uri = model_uri
            move(
                session,
                runtime,
                job,
                Secondary.COMPLETED,
                f"Training completed; the model is at {model_uri}.",
                now,
            )
    elif current in RUNNING:
        job.failure_reason = job.failure_reason or error or "InternalServerError: the job's instances ended."
        move(session, runtime, job, Secondary.FAILED, job.failure_reason, now)
    _serve_plan_of(session, runtime, job, now)


def _final_message(session: Session, job: TrainingJob, final: Secondary, model_uri: str | None) -> str:
    saved = f" The model it had saved is at {model_uri}." if model_uri else ""
    if final == Secondary.FAILED:
        return job.failure_reason
    if final == Secondary.MAX_RUNTIME_EXCEEDED:
        return f"Stopped: MaxRuntimeInSeconds ({_max_runtime(job)}) reached.{saved}"
    if final == Secondary.INTERRUPTED:
        plan = session.get(TrainingPlan, job.plan_id) if job.plan_id else None
        name = plan.name if plan else "?"
        checkpoints = request_of(job).checkpoint_uri
        kept = f" Its checkpoints are at {checkpoints}." if checkpoints else ""
        return f"Interrupted: plan {name}'s last segment ended before the job finished.{kept}{saved}"
    return f"Stopped by StopTrainingJob.{saved}"


def failure_reason(instance: TrainingJobInstance) -> str:
    if instance.state == "Exited":
        what = f"exited with code {instance.exit_code}"
    elif instance.state == "Killed":
        what = "was killed by a signal"
    elif instance.state == "NotStarted":
        what = "was not started"
    else:
        what = "was lost"
    head = f"AlgorithmError: instance {instance.host} {what}"
    detail = (instance.message or "").strip()
    if not detail:
        return head + "."
    room = FAILURE_REASON_MAX - len(head) - 2
    return f"{head}: {detail[-room:]}"


def _serve_plan_of(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    if job.plan_id is None:
        return
    plan = session.get(TrainingPlan, job.plan_id)
    if plan is not None:
        schedule_plan(session, runtime, plan, now)


# -- reading ----------------------------------------------------------------------------------------


def get(session: Session, runtime: ServiceContext, caller: Caller, name: str) -> TrainingJob:
    prefix = runtime.arn(caller.account_id, "training-job/")
    job = session.scalar(
        select(TrainingJob).where(
            TrainingJob.account_id == caller.account_id, TrainingJob.name == name.removeprefix(prefix)
        )
    )
    if job is None:
        raise ResourceNotFound(f"Training job {name} does not exist.")
    return job


def list_jobs(session: Session, account_id: str) -> list[TrainingJob]:
    return list(
        session.scalars(
            select(TrainingJob).where(TrainingJob.account_id == account_id).order_by(TrainingJob.id)
        )
    )


def job_arn(runtime: ServiceContext, job: TrainingJob) -> str:
    return runtime.arn(job.account_id, f"training-job/{job.name}")


def plan_arn(runtime: ServiceContext, plan: TrainingPlan) -> str:
    return runtime.arn(plan.account_id, f"training-plan/{plan.name}")


def _plan_name(session: Session, job: TrainingJob) -> str:
    plan = session.get(TrainingPlan, job.plan_id) if job.plan_id else None
    return plan.name if plan else ""


# -- helpers ----------------------------------------------------------------------------------------


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 86400 == 0 and seconds:
        return f"{seconds // 86400} day(s)"
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600} hour(s)"
    return f"{seconds} s"


def _sigterm(grace: timedelta) -> str:
    return f"the instances got SIGTERM and get SIGKILL after {_span(grace)}."
