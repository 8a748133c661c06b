"""Training jobs: queued on a plan's capacity (or given on-demand capacity), run for real, checkpointed.

This module holds the entry points: CreateTrainingJob, StopTrainingJob, and how a plan's jobs follow
the plan (:func:`reconcile_plan`). The rest of a job's life is in its own modules: ``job_records``
(finding and naming a job's rows), ``job_clocks`` (pending and running time, the limits' timed events
planned), ``job_status`` (the one place a job's status changes; stopping its tasks), ``job_deadlines``
(a limit's timed event come due), ``job_queue`` (placement on a plan's capacity), ``job_callbacks``
(what the runner reports back), ``job_views`` (reads for the handlers).

The store is the truth and every change is one transaction, as for clusters
(``services/clusters/clusters.py``):

- **CreateTrainingJob** checks every rule before anything is written (``TrainingJobSpec.from_wire``: the
  modes this back end does not serve, the command, the channels and URIs, the TrainingImage's grammar; then
  the plan's binding rules from ``core/jobs.py``, or the pool's free on-demand instances), resolves the
  TrainingImage through the fleet's image map (``core/image_refs.py``; the reference is recorded with the
  job and named in its first transition), writes the job in ``Starting`` and, in the
  same transaction, offers the plan's capacity to its queue (``job_queue.schedule_plan``) or places an
  on-demand job at once.
- **Placing** a job (``job_queue.place``) claims its instances (``capacity_claims.take``, consumer
  ``training-job:<id>``), records one instance row per host with the back-end task id it will have, and
  moves it to ``Downloading``; after the commit the runner (``services/jobs/job_runner.py``), woken, prepares
  each instance's directory tree and starts its task. The runner's I/O never runs inside a transaction or on
  the lifecycle loop: the loop only changes rows and hands work over after the commit.
- **Plan changes** (segment start, reclaim, end, failure) reach :func:`reconcile_plan`, registered by
  the composition root as a consumer of the lifecycle context: at a reclaim time running jobs get SIGTERM
  and go back to ``Pending`` (or, when no segment follows, are stopped as ``Interrupted``); at a segment start
  the queue is served.
- **Booking its own capacity.** A job with an auto-book request (the tag ``hyperplan:auto-book``, the
  native ``AutoBook``) names no plan and runs on none on demand: once its creation commits, it books a plan
  (``auto_booking``), waits Pending while nothing acceptable is free, and runs on the plan it bought as if
  it had named it.
- **Several plans.** A job may be given further plans (:func:`add_plan`, :func:`remove_plan`; the rules
  in ``job_plans``): it is in each plan's queue and runs on whichever has room first
  (``TrainingJob.attempt_plan_id`` is the plan its attempt holds); only that plan's reclaim takes it
  back, and it then starts again on any of its plans with room.
- **Deadlines** are persisted timed events (``job.pending-limit``, ``job.max-runtime``) planned when a
  job starts or stops waiting or running (``job_clocks``), and re-planned when they fire early
  (``job_deadlines``); they run at their due time under the manual clock like every lifecycle event.
- **Ends.** The runner's watcher reports when every task of an attempt has ended
  (``job_callbacks.tasks_ended``); the runner then stores the last checkpoints (and the model) and
  reports back (``job_callbacks.attempt_ended``), which picks the final status from why the job was
  ending.

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
  An instance the back end lost (its machine failed, or it ended with nothing watching it) is the
  platform's failure: ``InternalServerError: instance algo-K was lost: ...``.
- StopTrainingJob stops a waiting job at once; a job that is uploading its model completes. A stopped,
  interrupted or timed-out job stores the model its first instance saved, if it saved one.
- ``ModelArtifacts.S3ModelArtifacts`` is required in every DescribeTrainingJob answer; until the model
  is stored it names where it will be.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.backends.base import EXPIRATION_VARIABLE
from hyperplan.core import served_types
from hyperplan.core.bucket_rights import Right
from hyperplan.core.jobs import (
    FINAL,
    RUNNING,
    TARGET,
    WAITING,
    JobStatus,
    Secondary,
    StopReason,
    check_plan,
    next_opening,
)
from hyperplan.errors import ResourceInUse, ResourceLimitExceeded, ValidationError
from hyperplan.objects.uris import SCHEME
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import metering
from hyperplan.services.jobs import auto_booking, job_plans, job_views, spot, spot_money
from hyperplan.services.jobs.job_clocks import windows_of
from hyperplan.services.jobs.job_queue import place, schedule_plan, usable_segment
from hyperplan.services.jobs.job_records import (
    consumer,
    get,
    how_to_resume,
    job_arn,
    names_of,
    naming,
    plans_of,
    plans_of_live_jobs,
    running_plan_id,
    settings_of,
    sigterm,
    when,
)
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.jobs.job_status import begin_stop, move, open_transition, terminate_instances
from hyperplan.services.jobs.job_views import JobPlansView
from hyperplan.services.plans import capacity_claims, on_demand, quotas
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store.schema import ReservedCapacity, TrainingJob, TrainingPlan
from hyperplan.training.contract import script_mode


def job_uses(request: TrainingJobSpec) -> list[bucket_rights.Use]:
    """The URIs of a CreateTrainingJob request and the right each needs."""
    uses: list[bucket_rights.Use] = [
        (f"InputDataConfig[{index}].DataSource.S3DataSource.S3Uri", channel.uri, Right.READ)
        for index, channel in enumerate(request.channels)
    ]
    uses.append(("OutputDataConfig.S3OutputPath", request.output_path, Right.WRITE))
    if request.checkpoint_uri:
        uses.append(("CheckpointConfig.S3Uri", request.checkpoint_uri, Right.WRITE))  # read and write
    script = script_mode(request.hyperparameters)
    if script is not None and script.submit_directory.startswith(SCHEME):
        uses.append(("HyperParameters.sagemaker_submit_directory", script.submit_directory, Right.READ))
    return uses


def create(runtime: ServiceContext, caller: Caller, checked: TrainingJobSpec) -> str:
    """CreateTrainingJob, for a request checked at the wire edge (TrainingJobSpec.from_wire); returns the
    job's ARN."""
    now = runtime.clock.now()
    resolved_image = _resolved_image(runtime, checked)  # the fleet's map: no store needed
    if checked.auto_book is not None:
        auto_booking.check(runtime, checked)  # what the fleet could never book: no store needed
    with runtime.db.write() as session:
        drain_state.refuse_if_drained(session, "CreateTrainingJob")
        name = checked.name
        if session.scalar(
            select(TrainingJob.id).where(
                TrainingJob.account_id == caller.account_id, TrainingJob.name == name
            )
        ):
            raise ResourceInUse(f"A training job named {name!r} already exists in this account.")
        plan = _bound_plan(session, runtime, caller, checked) if checked.plan_arn else None
        on_demand = plan is None and checked.auto_book is None and not checked.spot
        zone = _on_demand_zone(session, runtime, caller, checked) if on_demand else None
        if checked.spot:
            _check_spot(session, runtime, caller, checked)
        bucket_rights.require(session, runtime, caller, job_uses(checked))
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
            resolved_image=resolved_image,
            created_at=now,
            updated_at=now,
        )
        session.add(job)
        session.flush()
        if checked.auto_book is not None:
            where = auto_booking.begin(session, runtime, job, checked.auto_book, now)
        elif checked.spot:
            where = "managed spot capacity (idle instances plans lend, or free on-demand capacity)"
        else:
            where = f"plan {plan.name}" if plan else f"on-demand capacity in {zone}"
        image = f"; its image resolves to {resolved_image}" if resolved_image else ""
        open_transition(session, job, Secondary.STARTING, f"Starting the job on {where}{image}.", now)
        if plan is not None:
            schedule_plan(session, runtime, plan, now)
        elif checked.spot:
            assert checked.stopping.max_wait_seconds is not None  # checked with the request
            spot.begin(session, runtime, job, checked.stopping.max_wait_seconds, now)
        elif on_demand:
            place(session, runtime, job, None, now)
    if checked.auto_book is not None:  # the purchase is a write of its own: after this one committed
        auto_booking.book(runtime, job.id, caller)
    return job_arn(runtime, job)


def _resolved_image(runtime: ServiceContext, checked: TrainingJobSpec) -> str | None:
    """The reference the job's TrainingImage resolves to through the fleet's image map (the URI itself
    when no entry maps it); recorded with the job. DescribeTrainingJob keeps showing the URI as sent."""
    if checked.algorithm.image is None:
        return None
    try:
        return str(runtime.fleet.resolve_image(checked.algorithm.image).reference)
    except ValidationError as error:
        raise ValidationError(f"AlgorithmSpecification.TrainingImage: {error.message}.") from None


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
    facts = job_plans.plan_facts(session, runtime, plan) if plan is not None else None
    check_plan(facts, arn, checked.instance_type, checked.instance_count)
    assert plan is not None
    return plan


def _check_spot(session: Session, runtime: ServiceContext, caller: Caller, checked: TrainingJobSpec) -> None:
    """A spot job's type must be one the fleet has, and a budget account must hold an hour of it at the
    spot price; where it runs is decided when capacity is there (spot.py)."""
    pools = runtime.fleet.pools_of_type(checked.instance_type)
    if not pools:
        raise served_types.refuse_unknown_for_job(
            runtime.fleet, checked.instance_type, "ResourceConfig.InstanceType"
        )
    if checked.instance_count > max(p.instance_count for p in pools):
        raise ValidationError(
            f"ResourceConfig.InstanceCount: {checked.instance_count} {checked.instance_type} is more than "
            "any pool of the fleet holds, lent or on demand; ask for fewer."
        )
    dearest = max(pools, key=lambda pool: pool.on_demand_price_per_instance_hour)  # wherever it lands
    spot_money.check_budget(
        session, runtime, caller.account_id, dearest, checked.instance_count, "CreateTrainingJob"
    )


def _on_demand_zone(
    session: Session, runtime: ServiceContext, caller: Caller, checked: TrainingJobSpec
) -> str:
    """The pool of the job's type with the most free on-demand instances; refused, naming the pools, when
    none has enough, and refused when the account's on-demand quota or its budget does not allow it."""
    pools = runtime.fleet.pools_of_type(checked.instance_type)
    if not pools:
        raise served_types.refuse_unknown_for_job(
            runtime.fleet, checked.instance_type, "ResourceConfig.InstanceType"
        )
    quotas.check_on_demand(session, runtime, caller.account_id, checked.instance_type, checked.instance_count)
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
    metering.check_budget(session, caller.account_id, best, checked.instance_count, "CreateTrainingJob")
    return best.availability_zone


def stop(runtime: ServiceContext, caller: Caller, name: str) -> None:
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
        elif current == Secondary.SPOT_INTERRUPTED:  # its processes are ending already (spot.py)
            job.stop_reason = StopReason.USER
            move(session, runtime, job, Secondary.STOPPING, "Stopping by StopTrainingJob.", now)
        elif current in RUNNING:
            grace = settings_of(runtime).stop_grace
            begin_stop(
                session,
                runtime,
                job,
                StopReason.USER,
                f"Stopping by StopTrainingJob: {sigterm(grace)}",
                grace,
                now,
            )


def add_plan(runtime: ServiceContext, caller: Caller, name: str, plan_ref: str) -> JobPlansView:
    """Give a job a further plan (its name or ARN): it may run on whichever of its plans has room first.
    Adding one it has already changes nothing."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = get(session, runtime, caller, name)
        added = job_plans.add(session, runtime, caller, job, plan_ref, now)
        if added is not None:
            _audit_plan(session, caller, job, "training-job.plan-add", added, now)
        return job_views.plans_view_of(session, runtime, job)


def remove_plan(runtime: ServiceContext, caller: Caller, name: str, plan_ref: str) -> JobPlansView:
    """Take a further plan from a job; not the one it names, nor the one it runs on now."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = get(session, runtime, caller, name)
        removed = job_plans.remove(session, runtime, caller, job, plan_ref, now)
        _audit_plan(session, caller, job, "training-job.plan-remove", removed, now)
        return job_views.plans_view_of(session, runtime, job)


def _audit_plan(
    session: Session, caller: Caller, job: TrainingJob, action: str, plan: TrainingPlan, now: datetime
) -> None:
    audit.record(
        session, now, caller, action, account_id=job.account_id, target=job.name, detail={"Plan": plan.name}
    )


def reconcile_plan(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (segment start, reclaim, end, failure): the jobs that may run on it follow, in this
    transaction.

    When the plan cannot give capacity now, the jobs running on it are reclaimed: back to Pending when a
    later segment of any of their plans will give capacity (another plan Active now: as soon as their
    processes have ended), stopped as Interrupted when none will; waiting jobs wait on, on their other
    plans or this one's next segment, or are Interrupted when none of their plans has capacity ahead.
    When it can, its queue is served.
    """
    auto_booking.plan_changed(session, runtime, plan_id, now)  # a plan of any target frees capacity
    plan = session.get(TrainingPlan, plan_id)
    if plan is None or plan.target != TARGET or plan.id not in plans_of_live_jobs(session):
        return
    jobs = list(
        session.scalars(
            select(TrainingJob)
            .where(naming(plan.id), TrainingJob.status.in_((JobStatus.IN_PROGRESS, JobStatus.STOPPING)))
            .order_by(TrainingJob.id)
        )
    )
    if not jobs:
        return
    if usable_segment(session, runtime, plan, now) is not None:
        schedule_plan(session, runtime, plan, now)
        return
    segment = capacity_claims.open_segment(session, plan, now)
    for job in jobs:
        current = Secondary(job.secondary_status)
        if current in RUNNING or current == Secondary.STOPPING:
            if running_plan_id(job) == plan.id:  # a job running on another of its plans carries on
                _reclaim(session, runtime, plan, job, segment, now)
        elif current in WAITING:
            job_plans.follow_while_waiting(session, runtime, job, now)


def _reclaim(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    job: TrainingJob,
    segment: ReservedCapacity | None,
    now: datetime,
) -> None:
    """The plan takes its capacity back: SIGTERM now (with the segment's end published), SIGKILL after the
    reclaim grace; the job waits for capacity on its plans, or ends Interrupted when none has any ahead."""
    grace = settings_of(runtime).reclaim_grace
    end = segment.end if segment else job.segment_end
    env = {EXPIRATION_VARIABLE: str(int(end.timestamp())) if end else "0"}
    why = (
        f"Plan {plan.name}'s capacity is being taken back"
        + (f" before its segment ends at {when(end)}" if end and end > now else "")
        + f": {sigterm(grace)}"
    )
    capacity_claims.give_back(session, consumer(job), now)
    current = Secondary(job.secondary_status)
    resumes = _where_it_resumes(session, runtime, plan, job, now)
    if current == Secondary.STOPPING:
        terminate_instances(session, runtime, job, grace, env)  # stopping already: only sooner
    elif resumes is not None:
        move(session, runtime, job, Secondary.PENDING, f"{why} {resumes}", now)
        terminate_instances(session, runtime, job, grace, env)
    else:
        plans = plans_of(session, job)
        last = (
            "the plan's last segment" if len(plans) == 1 else f"the last segment of plans {names_of(plans)}"
        )
        begin_stop(
            session,
            runtime,
            job,
            StopReason.INTERRUPTED,
            f"{why} It was {last}: the job will end Interrupted once its checkpoints are stored."
            + how_to_resume(job),
            grace,
            now,
            env,
        )


def _where_it_resumes(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, job: TrainingJob, now: datetime
) -> str | None:
    """Where a reclaimed job starts again, as its message says it; None when none of its plans has
    capacity ahead."""
    if not job_plans.capacity_ahead(session, runtime, job, now):
        return None
    plans = plans_of(session, job)
    if len(plans) == 1:
        later = next_opening(windows_of(session, runtime, plan), now)
        return (
            f"The job starts again from its checkpoints when the next segment starts at {when(later)}."
            if later
            else "The job starts again from its checkpoints when its plan can give capacity again."
        )
    active = [other for other in plans if usable_segment(session, runtime, other, now) is not None]
    if active:
        return (
            f"The job starts again from its checkpoints on whichever of plans {names_of(plans)} has room "
            f"first: plan {active[0].name} is Active now."
        )
    openings = [(next_opening(windows_of(session, runtime, other), now), other.name) for other in plans]
    soonest = min(((at, name) for at, name in openings if at is not None), default=None)
    first = f": the next segment to start is plan {soonest[1]}'s, at {when(soonest[0])}" if soonest else ""
    return (
        f"The job starts again from its checkpoints on whichever of plans {names_of(plans)} has room "
        f"first{first}."
    )
