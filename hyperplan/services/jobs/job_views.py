"""Training jobs as the handlers show them: each function owns its read transaction and returns frozen
views, so that no handler touches the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.auto_book import AutoBookRequest
from hyperplan.core.jobs import shown
from hyperplan.core.spot import billable_seconds, training_seconds
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import auto_booking, job_clocks, job_records, job_status
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import SpotRun, TrainingJob, TrainingPlan
from hyperplan.training.workspace import model_uri


@dataclass(frozen=True)
class TransitionView:
    status: str
    started_at: datetime
    ended_at: datetime | None
    message: str


@dataclass(frozen=True)
class JobView:
    name: str
    arn: str
    model_uri: str  # where the model is, or (until it is stored) where it will be
    status: str
    secondary_status: str
    request: TrainingJobSpec
    created_at: datetime
    updated_at: datetime
    transitions: tuple[TransitionView, ...]
    failure_reason: str
    training_start_at: datetime | None
    training_end_at: datetime | None
    running_seconds: int  # across segments, up to now
    # TrainingTimeInSeconds and BillableTimeInSeconds: both the running time for a job on a plan or on
    # demand; for a managed spot job, from its first start to its end (waits and interruptions included)
    # and the seconds its runs held instances (what it is charged for).
    training_seconds: int = 0
    billable_seconds: int = 0
    spot: bool = False
    # The reference the TrainingImage resolved to at creation (the fleet's image map); None without an
    # image, or for a job made before resolutions were recorded.
    resolved_image: str | None = None
    # The digest of the image the job's instances last ran in (runtime podman); None without one.
    image_digest: str | None = None
    # The ARNs of the plans it may run on, the one it names first (none on demand), and the one its
    # attempt runs on now, if any.
    plan_arns: tuple[str, ...] = ()
    running_on_plan: str | None = None
    # A job that books its own capacity: what it asked for, the plan it booked (None until it has), and
    # while it waits to book, why (its status message); None for a job that named its plan or runs on
    # demand.
    auto_book: AutoBookView | None = None


@dataclass(frozen=True)
class AutoBookView:
    request: AutoBookRequest
    booked_plan: str | None
    waiting: str | None


@dataclass(frozen=True)
class JobPlanView:
    arn: str
    name: str
    primary: bool  # the plan the job names (its TrainingPlanArn)
    status: str
    running_on_it: bool  # the job's attempt holds this plan's capacity now


@dataclass(frozen=True)
class JobPlansView:
    job_name: str
    plans: tuple[JobPlanView, ...]


@dataclass(frozen=True)
class JobSummary:
    name: str
    arn: str
    created_at: datetime
    updated_at: datetime
    status: str
    secondary_status: str
    training_end_at: datetime | None
    plan_arn: str | None


def describe(runtime: ServiceContext, caller: Caller, name: str) -> JobView:
    now = runtime.clock.now()
    with runtime.db.read() as session:
        job = job_records.get(session, runtime, caller, name)
        request = job_records.request_of(job)
        on_plans = plans_view_of(session, runtime, job)
        return JobView(
            name=job.name,
            arn=job_records.job_arn(runtime, job),
            model_uri=job.model_uri or model_uri(request.instance("algo-1", job.segment_end)),
            status=job.status,
            secondary_status=shown(job.secondary_status),
            request=request,
            created_at=job.created_at,
            updated_at=job.updated_at,
            transitions=tuple(
                TransitionView(shown(t.status), t.started_at, t.ended_at, t.message)
                for t in job_status.transitions_of(session, job)
            ),
            failure_reason=job.failure_reason,
            training_start_at=job.training_start_at,
            training_end_at=job.training_end_at,
            running_seconds=int(job_clocks.running_time(job, now).total_seconds()),
            **_times(session, job, now),
            spot=job.spot,
            resolved_image=job.resolved_image,
            image_digest=job.image_digest,
            plan_arns=tuple(plan.arn for plan in on_plans.plans),
            running_on_plan=next((plan.arn for plan in on_plans.plans if plan.running_on_it), None),
            auto_book=_auto_book_view(job, on_plans),
        )


def _times(session: Session, job: TrainingJob, now: datetime) -> dict[str, int]:
    running = int(job_clocks.running_time(job, now).total_seconds())
    if not job.spot:
        return {"training_seconds": running, "billable_seconds": running}
    runs = [
        (run.started_at, run.ended_at)
        for run in session.scalars(select(SpotRun).where(SpotRun.job_id == job.id).order_by(SpotRun.id))
    ]
    first = runs[0][0] if runs else None
    return {
        "training_seconds": training_seconds(first, job.training_end_at, now),
        "billable_seconds": billable_seconds(runs, now),
    }


def _auto_book_view(job: TrainingJob, on_plans: JobPlansView) -> AutoBookView | None:
    request = auto_booking.booking_request(job)
    if request is None:
        return None
    booked = next((plan.name for plan in on_plans.plans if plan.primary), None)
    waiting = job.status_message if auto_booking.waiting_to_book(job) else None
    return AutoBookView(request, booked, waiting)


def plans(runtime: ServiceContext, caller: Caller, name: str) -> JobPlansView:
    """The plans one of the caller's jobs may run on, and which it runs on now."""
    with runtime.db.read() as session:
        return plans_view_of(session, runtime, job_records.get(session, runtime, caller, name))


def plans_view_of(session: Session, runtime: ServiceContext, job: TrainingJob) -> JobPlansView:
    running = job_records.running_plan_id(job)
    return JobPlansView(
        job_name=job.name,
        plans=tuple(
            JobPlanView(
                arn=job_records.plan_arn(runtime, plan),
                name=plan.name,
                primary=plan.id == job.plan_id,
                status=plan.status,
                running_on_it=plan.id == running,
            )
            for plan in job_records.plans_of(session, job)
        ),
    )


def summaries(runtime: ServiceContext, caller: Caller) -> list[JobSummary]:
    """Every job of the caller's account, oldest first."""
    with runtime.db.read() as session:
        plans = {
            plan.id: job_records.plan_arn(runtime, plan)
            for plan in session.scalars(
                select(TrainingPlan).where(TrainingPlan.account_id == caller.account_id)
            )
        }
        return [_summary(runtime, job, plans) for job in job_records.list_jobs(session, caller.account_id)]


def _summary(runtime: ServiceContext, job: TrainingJob, plans: dict[int, str]) -> JobSummary:
    return JobSummary(
        name=job.name,
        arn=job_records.job_arn(runtime, job),
        created_at=job.created_at,
        updated_at=job.updated_at,
        status=job.status,
        secondary_status=shown(job.secondary_status),
        training_end_at=job.training_end_at,
        plan_arn=plans[job.plan_id] if job.plan_id is not None else None,
    )
