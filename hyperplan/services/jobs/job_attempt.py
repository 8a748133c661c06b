"""What the runner's I/O for one attempt of a job needs, read once from the store, and the storage
(the fleet's buckets) it works against."""

from __future__ import annotations

from dataclasses import dataclass

from hyperplan.core.jobs import AttemptState
from hyperplan.objects.storage import Storage
from hyperplan.services.jobs import job_records
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store.schema import TrainingJob, TrainingJobInstance
from hyperplan.training.contract import JobSpec


@dataclass(frozen=True)
class Attempt:
    """What the I/O of one attempt needs, read once from the store."""

    job: TrainingJob
    instances: list[TrainingJobInstance]
    request: TrainingJobSpec  # the job's stored request, decoded once for the whole attempt, with the
    # instances it runs on (job_records.runs_as)

    def instance_spec(self, host: str, interpreter: str | None = None) -> JobSpec:
        return self.request.instance(host, self.job.segment_end, interpreter)


def read_attempt(runtime: ServiceContext, job_id: int, attempt: int, state: AttemptState) -> Attempt | None:
    with runtime.db.read() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != state:
            return None
        return Attempt(job, job_records.instances_of(session, job_id, attempt), job_records.runs_as(job))


def storage_of(runtime: ServiceContext, account_id: str) -> Storage:
    """Transfers made for the job's account: each bucket checked against its rights (bucket_rights)."""
    return bucket_rights.storage_for(runtime, account_id)
