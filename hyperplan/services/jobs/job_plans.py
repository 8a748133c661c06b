"""A training job's further plans (docs/DECISIONS.md, "Consumers"): beside the plan it names (the wire's
TrainingPlanArn, ``TrainingJob.plan_id``, its primary plan) a job may be given more plans of its account
through the native API (``TrainingJobPlan`` rows, in the order added). It waits on all of them and runs on
whichever has room first (``job_queue.schedule_plan``); its attempt's claims, and everything that follows
the running attempt (segment end, deadlines, placement), are on that plan (``TrainingJob.attempt_plan_id``).

The rules for adding and removing one, checked before anything is written, and how a waiting job follows
its plans when one of them can no longer give capacity.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import (
    BETWEEN_ATTEMPTS,
    FINAL,
    WAITING,
    PlanFacts,
    Secondary,
    check_plan,
    has_capacity_left,
)
from hyperplan.errors import ResourceInUse, ResourceNotFound, ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs.job_clocks import job_windows, plans_changing, windows_of
from hyperplan.services.jobs.job_queue import schedule_plan, waiting_message
from hyperplan.services.jobs.job_records import (
    further_plan_ids,
    how_to_resume,
    names_of,
    plan_arn,
    plans_of,
    running_plan_id,
)
from hyperplan.services.jobs.job_status import move, note
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob, TrainingJobPlan, TrainingPlan

FIELD = "Plan"
"""How a refusal names the further plan of the native route (CreateTrainingJob's names its member)."""


def resolve(session: Session, runtime: ServiceContext, caller: Caller, ref: str) -> TrainingPlan | None:
    """The caller's plan by name or ARN; None when its account has none by that name (an ARN of another
    account is the same answer: it is not the caller's to use)."""
    prefix = runtime.arn(caller.account_id, "training-plan/")
    name = ref.removeprefix(prefix)
    if name != ref or not ref.startswith("arn:"):
        return session.scalar(
            select(TrainingPlan).where(
                TrainingPlan.account_id == caller.account_id, TrainingPlan.name == name
            )
        )
    return None


def plan_facts(session: Session, runtime: ServiceContext, plan: TrainingPlan) -> PlanFacts:
    """What the binding rules (core/jobs.py, check_plan) read of a plan."""
    return PlanFacts(
        arn=plan_arn(runtime, plan),
        target=plan.target,
        status=plan.status,
        instance_type=plan.instance_type,
        instance_count=max((rc.count for rc in lifecycle.segments_of(session, plan.id)), default=0),
        capacity_left=has_capacity_left(windows_of(session, runtime, plan), runtime.clock.now()),
    )


def add(
    session: Session, runtime: ServiceContext, caller: Caller, job: TrainingJob, ref: str, now: datetime
) -> TrainingPlan | None:
    """Give the job a further plan, by the rules CreateTrainingJob applies to its TrainingPlanArn, and
    offer that plan's capacity at once (a waiting job may start on it now). None when the job had it
    already: nothing changes."""
    _check_open(job)
    plan = resolve(session, runtime, caller, ref)
    if plan is not None and plan.id == job.plan_id:
        raise ValidationError(
            f"{FIELD}: plan {plan.name} is the plan training job {job.name} names (its TrainingPlanArn); "
            "a further plan is another one."
        )
    if plan is not None and plan.id in further_plan_ids(session, job.id):
        return None
    check_plan(
        plan_facts(session, runtime, plan) if plan else None,
        ref,
        job.instance_type,
        job.instance_count,
        field=FIELD,
    )
    assert plan is not None
    with plans_changing(session, runtime, job, now):
        session.add(TrainingJobPlan(job_id=job.id, plan_id=plan.id, added_at=now))
        session.flush()
    schedule_plan(session, runtime, plan, now)
    return plan


def remove(
    session: Session, runtime: ServiceContext, caller: Caller, job: TrainingJob, ref: str, now: datetime
) -> TrainingPlan:
    """Take a further plan from the job. Not the plan it names, nor the one its attempt runs on now."""
    plan = resolve(session, runtime, caller, ref)
    if plan is not None and plan.id == job.plan_id:
        raise ValidationError(
            f"{FIELD}: plan {plan.name} is the plan training job {job.name} names (its TrainingPlanArn); "
            "only a further plan can be removed."
        )
    row = (
        session.scalar(
            select(TrainingJobPlan).where(
                TrainingJobPlan.job_id == job.id, TrainingJobPlan.plan_id == plan.id
            )
        )
        if plan is not None
        else None
    )
    if plan is None or row is None:
        raise ResourceNotFound(f"Training job {job.name} has no further plan {ref}.")
    if running_plan_id(job) == plan.id:
        raise ResourceInUse(
            f"Training job {job.name} runs on plan {plan.name} now; stop the job, or wait until it no longer "
            "runs there, to remove the plan."
        )
    with plans_changing(session, runtime, job, now):
        session.delete(row)
        session.flush()
    if Secondary(job.secondary_status) in WAITING:
        if not capacity_ahead(session, runtime, job, now):  # (as a plan's end would: draining or not)
            move(session, runtime, job, Secondary.INTERRUPTED, ended_message(session, job), now)
        elif job.attempt_state in BETWEEN_ATTEMPTS:
            note(session, job, waiting_message(session, runtime, job, now), now)
    schedule_plan(session, runtime, plan, now)  # a place it kept there for the job is free for others
    return plan


def _check_open(job: TrainingJob) -> None:
    if job.plan_id is None and job.auto_book is not None:
        raise ValidationError(
            f"Training job {job.name} books its own capacity and has not booked a plan yet; further plans "
            "can be added once it has."
        )
    if job.plan_id is None:
        raise ValidationError(
            f"Training job {job.name} runs on on-demand capacity (it names no TrainingPlanArn); further "
            "plans are for a job on a plan, and work on a plan never mixes with on-demand capacity."
        )
    current = Secondary(job.secondary_status)
    if current in FINAL or current == Secondary.STOPPING:
        ended = "has ended" if current in FINAL else "is ending"
        raise ValidationError(
            f"Training job {job.name} is {job.status} ({current}): it {ended}, and further plans can be "
            "added only to a job that has not."
        )


def capacity_ahead(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> bool:
    """Whether any of the job's plans may still give capacity (an Active or a Scheduled segment ahead)."""
    return has_capacity_left(job_windows(session, runtime, job), now)


def follow_while_waiting(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """A plan of a waiting job cannot give capacity now: the job waits on, on its other plans or this
    one's next segment, saying so; or, when none of its plans has capacity ahead, ends Interrupted."""
    if not capacity_ahead(session, runtime, job, now):
        move(session, runtime, job, Secondary.INTERRUPTED, ended_message(session, job), now)
        return
    message = waiting_message(session, runtime, job, now)
    if job.secondary_status == Secondary.STARTING:
        move(session, runtime, job, Secondary.PENDING, message, now)
    elif job.attempt_state in BETWEEN_ATTEMPTS and job.attempt == 0:
        note(session, job, message, now)  # a job sent back by a reclaim keeps the message that says why


def ended_message(session: Session, job: TrainingJob) -> str:
    """Why a waiting job ended: none of its plans has capacity left to give."""
    kept = how_to_resume(job) if job.attempt else ""  # a job that never ran has none
    plans = plans_of(session, job)
    if len(plans) == 1:
        plan = plans[0]
        return (
            f"Interrupted: plan {plan.name} has no capacity left to give ({plan.status}) before the job "
            f"finished.{kept}"
        )
    statuses = ", ".join(f"{plan.name} {plan.status}" for plan in plans)
    return (
        f"Interrupted: none of its plans {names_of(plans)} has capacity left to give ({statuses}) before "
        f"the job finished.{kept}"
    )
