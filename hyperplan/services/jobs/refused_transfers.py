"""A transfer refused by the account's bucket rights while a job runs: the job fails, saying why.

The runner's launch and finish already fail a job whose transfer fails; a periodic checkpoint sync only
logs a failure (the next sync may succeed), except this one: rights revoked since the job was created do
not come back by themselves, so the job fails with the refusal (hyperplan/services/storage/bucket_rights.py)
as its FailureReason, and its instances are stopped.
"""

from __future__ import annotations

from hyperplan.core.jobs import RUNNING, AttemptState, Secondary, StopReason
from hyperplan.services.jobs import job_records, job_status
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob


def fail_job(runtime: ServiceContext, job_id: int, attempt: int, reason: str) -> None:
    """The running attempt fails with `reason`; its instances get SIGTERM (the watcher settles the job)."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if (
            job is None
            or job.attempt != attempt
            or job.attempt_state != AttemptState.RUNNING
            or job.stop_reason
        ):
            return
        if Secondary(job.secondary_status) not in RUNNING:
            return
        job.stop_reason, job.failure_reason = StopReason.FAILED, reason[: job_records.FAILURE_REASON_MAX]
        job_status.note(
            session, job, f"A transfer was refused; the instances got SIGTERM. {reason}", runtime.clock.now()
        )
        job_status.terminate_instances(session, runtime, job, job_records.settings_of(runtime).reclaim_grace)
