"""What the runner (``services/jobs/job_runner.py``) reports back, inside its transactions: an instance that
failed, every task of an attempt ended, the attempt's I/O done; the job takes its final status or waits,
and the plan's queue is served again."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.core.jobs import FINAL_FOR_STOP, RUNNING, AttemptState, InstanceState, Secondary, StopReason
from hyperplan.services.clusters import metering
from hyperplan.services.jobs import spot
from hyperplan.services.jobs.job_clocks import max_runtime
from hyperplan.services.jobs.job_queue import schedule_plans_of
from hyperplan.services.jobs.job_records import (
    FAILURE_REASON_MAX,
    consumer,
    how_to_resume,
    move_attempt,
    names_of,
    plans_of,
    request_of,
    settings_of,
)
from hyperplan.services.jobs.job_status import move, note, terminate_instances
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import TrainingJob, TrainingJobInstance


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
    move_attempt(job, AttemptState.ENDING)
    capacity_claims.give_back(session, consumer(job), now)
    if job.plan_id is None:  # on-demand instances given back: no later hour is metered
        metering.stop(session, metering.job_holder(job), now)
    current = Secondary(job.secondary_status)
    if current in RUNNING and not job.stop_reason:
        bad = [i for i in instances if i.state != InstanceState.EXITED or i.exit_code != 0]
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
    spot.run_ended(session, runtime, job, now)  # a spot job's instances are free for their owner now
    _serve_plan_of(session, runtime, job, now)


def attempt_ended(
    session: Session, runtime: ServiceContext, job: TrainingJob, model_uri: str | None, error: str | None
) -> None:
    """The runner is done with an attempt (its checkpoints and model are stored, or it never ran): the job
    takes its final status, or waits for the next segment."""
    now = runtime.clock.now()
    move_attempt(job, AttemptState.ENDED)
    capacity_claims.give_back(session, consumer(job), now)
    if job.plan_id is None:
        metering.stop(session, metering.job_holder(job), now)
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
    elif current == Secondary.SPOT_INTERRUPTED:
        move(
            session,
            runtime,
            job,
            Secondary.PENDING,
            "Interrupted: the instances it borrowed went back to their owner and its checkpoints are "
            "stored; it waits for compute capacity and resumes from them.",
            now,
        )
    spot.run_ended(session, runtime, job, now)  # an attempt that ended before its tasks did
    _serve_plan_of(session, runtime, job, now)
    spot.serve(session, runtime, now)  # what the job gave back may be lent, or on demand, again


def _final_message(session: Session, job: TrainingJob, final: Secondary, model_uri: str | None) -> str:
    saved = f" The model it had saved is at {model_uri}." if model_uri else ""
    if final == Secondary.FAILED:
        return job.failure_reason
    if final == Secondary.MAX_RUNTIME_EXCEEDED:
        return f"Stopped: MaxRuntimeInSeconds ({max_runtime(job)}) reached.{saved}"
    if final == Secondary.INTERRUPTED:
        plans = plans_of(session, job)
        kept = how_to_resume(job)
        if not plans:  # on-demand: a drain, or a Slurm reservation taking its node
            return f"Interrupted: its on-demand capacity was taken back before the job finished.{kept}{saved}"
        if len(plans) == 1:
            last = f"plan {plans[0].name}'s last segment"
        else:
            last = f"the last segment of its plans {names_of(plans)}"
        return f"Interrupted: {last} ended before the job finished.{kept}{saved}"
    return f"Stopped by StopTrainingJob.{saved}"


def failure_reason(instance: TrainingJobInstance) -> str:
    """SageMaker's FailureReason names who failed by its prefix: ``AlgorithmError:`` for the training
    code (an exit code, a signal), ``OutOfMemoryError:`` when its memory limit killed it,
    ``InternalServerError:`` for the platform. An instance the back end
    lost (its machine failed, as Slurm's NODE_FAIL; its process ended with nothing watching it; the back
    end no longer has it) is the platform's failure, not the training code's."""
    if instance.out_of_memory:  # as SageMaker names it, whatever the exit status the kill left
        return _with_detail(
            f"OutOfMemoryError: instance {instance.host} ran out of memory (its memory limit); use an "
            "instance type with more memory, or reduce the memory usage of the training job",
            instance,
        )
    if instance.state == InstanceState.EXITED:
        what = f"exited with code {instance.exit_code}"
    elif instance.state == InstanceState.KILLED:
        what = "was killed by a signal"
    elif instance.state == InstanceState.NOT_STARTED:
        what = "was not started"
    else:
        return _with_detail(f"InternalServerError: instance {instance.host} was lost", instance)
    return _with_detail(f"AlgorithmError: instance {instance.host} {what}", instance)


def _with_detail(head: str, instance: TrainingJobInstance) -> str:
    detail = (instance.message or "").strip()
    if not detail:
        return head + "."
    room = FAILURE_REASON_MAX - len(head) - 2
    return f"{head}: {detail[-room:]}"


def _serve_plan_of(session: Session, runtime: ServiceContext, job: TrainingJob, now: datetime) -> None:
    """The instances the job gave back are free on its attempt's plan; a job sent back by a reclaim may
    start again on any of its plans with room."""
    schedule_plans_of(session, runtime, job, now)
