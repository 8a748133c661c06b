"""A training job's rows: finding and naming them, its stored request decoded, its instances and where
their directories are; and the wording the jobs' status messages share."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import (
    ATTEMPT_LIFECYCLE,
    BETWEEN_ATTEMPTS,
    INSTANCE_LIFECYCLE,
    AttemptState,
    InstanceState,
    JobStatus,
)
from hyperplan.core.status import IllegalTransition
from hyperplan.errors import ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.job_work import JobSettings
from hyperplan.store import tx_facts
from hyperplan.store.schema import TrainingJob, TrainingJobInstance, TrainingJobPlan, TrainingPlan
from hyperplan.training.contract import JobSpec

FAILURE_REASON_MAX = 1024


def move_attempt(job: TrainingJob, new: AttemptState) -> None:
    """The one write of an attempt's state: a move its lifecycle lists (core/jobs.py), or
    IllegalTransition."""
    ATTEMPT_LIFECYCLE.check(AttemptState(job.attempt_state), new)
    job.attempt_state = new


def begin_attempt(job: TrainingJob) -> None:
    """The job's next attempt, launching: only between attempts (none yet, or the last one ended)."""
    if job.attempt_state not in BETWEEN_ATTEMPTS:
        raise IllegalTransition(f"a training job cannot begin an attempt while one is {job.attempt_state}")
    job.attempt += 1
    job.attempt_state = ATTEMPT_LIFECYCLE.initial


def move_instance(instance: TrainingJobInstance, new: InstanceState) -> None:
    """The one write of an instance's state: a move its lifecycle lists, or IllegalTransition."""
    INSTANCE_LIFECYCLE.check(InstanceState(instance.state), new)
    instance.state = new


def settings_of(runtime: ServiceContext) -> JobSettings:
    return runtime.job_settings


def job_spec(job: TrainingJob, host: str, interpreter: str | None = None) -> JobSpec:
    """The contract's view of one instance of a stored job (its request decoded here, once)."""
    return runs_as(job).instance(host, job.segment_end, interpreter)


def request_of(job: TrainingJob) -> TrainingJobSpec:
    """The CreateTrainingJob request as it was given."""
    return TrainingJobSpec.from_json(job.request)


def runs_as(job: TrainingJob) -> TrainingJobSpec:
    """The stored request with the instances the job runs on: the job's row says them, which for a job
    that booked its own capacity are its plan's, not the ResourceConfig it was sent with
    (services/jobs/auto_booking.py)."""
    return dataclasses.replace(
        request_of(job), instance_type=job.instance_type, instance_count=job.instance_count
    )


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


def further_plan_ids(session: Session, job_id: int) -> list[int]:
    """The plans a job was given beside the one it names, in the order they were added."""
    return list(
        session.scalars(
            select(TrainingJobPlan.plan_id)
            .where(TrainingJobPlan.job_id == job_id)
            .order_by(TrainingJobPlan.id)
        )
    )


def plans_of(session: Session, job: TrainingJob) -> list[TrainingPlan]:
    """Every plan the job may run on: the one it names (the wire's TrainingPlanArn) first, then its
    further plans in the order they were added; none for an on-demand job."""
    if job.plan_id is None:
        return []
    ids = [job.plan_id, *further_plan_ids(session, job.id)]
    return [plan for plan in (session.get(TrainingPlan, plan_id) for plan_id in ids) if plan is not None]


def names_of(plans: list[TrainingPlan]) -> str:
    """Plans as a status message names them: "a", "a and b", "a, b and c"."""
    names = [plan.name for plan in plans]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def naming(plan_id: int) -> ColumnElement[bool]:
    """The jobs that may run on a plan: those that name it and those given it as a further plan."""
    further = select(TrainingJobPlan.job_id).where(TrainingJobPlan.plan_id == plan_id)
    return or_(TrainingJob.plan_id == plan_id, TrainingJob.id.in_(further))


_JOB_TABLES = frozenset({"training_jobs", "training_job_plans"})


def plans_of_live_jobs(session: Session) -> frozenset[int]:
    """Every plan a job in progress or stopping names, as its plan or a further one. Read once a
    transaction while it writes no job (store/tx_facts.py): a lifecycle batch's plan events each ask."""
    return tx_facts.fact(session, "plans of live jobs", _JOB_TABLES, _read_plans_of_live_jobs)


def _read_plans_of_live_jobs(session: Session) -> frozenset[int]:
    live = select(TrainingJob.id).where(TrainingJob.status.in_((JobStatus.IN_PROGRESS, JobStatus.STOPPING)))
    named = select(TrainingJob.plan_id).where(TrainingJob.id.in_(live), TrainingJob.plan_id.is_not(None))
    further = select(TrainingJobPlan.plan_id).where(TrainingJobPlan.job_id.in_(live))
    return frozenset(session.scalars(named.union(further)))


def running_plan_id(job: TrainingJob) -> int | None:
    """The plan whose capacity the job's attempt holds while it is under way (launching, running, or
    storing what it made); None between attempts and for on-demand work."""
    if job.attempt_state in BETWEEN_ATTEMPTS or job.plan_id is None:
        return None
    # An attempt recorded before attempts had a plan of their own ran on the job's one plan.
    return job.attempt_plan_id or job.plan_id


def consumer(job: TrainingJob) -> str:
    return f"training-job:{job.id}"


DISK_TREE = "ml"
"""In containers, the instance's tree (its ``/opt/ml``) is this directory of its disk, which is mounted at
``attempt-N/HOST`` (``job_disks.py``); beside the tree on the same disk are the container's ``/tmp`` and the
server's staging directories."""


def instance_root(runtime: ServiceContext, job: TrainingJob, attempt: int, host: str) -> Path:
    """Each attempt gets fresh directories, as a restarted SageMaker job gets fresh instances: what it
    had before comes back only through its checkpoints."""
    instance = runtime.work_dir / "jobs" / str(job.id) / f"attempt-{attempt}" / host
    return instance / DISK_TREE if runtime.images is not None else instance


def instances_of(session: Session, job_id: int, attempt: int | None = None) -> list[TrainingJobInstance]:
    query = select(TrainingJobInstance).where(TrainingJobInstance.job_id == job_id)
    if attempt is not None:
        query = query.where(TrainingJobInstance.attempt == attempt)
    return list(session.scalars(query.order_by(TrainingJobInstance.attempt, TrainingJobInstance.id)))


def when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds % 86400 == 0 and seconds:
        return f"{seconds // 86400} day(s)"
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600} hour(s)"
    return f"{seconds} s"


def sigterm(grace: timedelta) -> str:
    return f"the instances got SIGTERM and get SIGKILL after {span(grace)}."


def how_to_resume(job: TrainingJob) -> str:
    """What a job ended before it finished says of its checkpoints (a leading space), none without a
    CheckpointConfig: where they are and how to carry on from them, as SageMaker resumes (a new job)."""
    checkpoints = request_of(job).checkpoint_uri
    if not checkpoints:
        return ""
    return (
        f" Its checkpoints are in {checkpoints} (CheckpointConfig.S3Uri): create a new job with the same "
        "CheckpointConfig to resume from them."
    )
