"""Storing what an attempt made: its checkpoints every ``checkpoint_sync_seconds`` while it trains (sync),
and once every task has ended (finish) the last checkpoints and, for a job that succeeded (or was stopped
with a model saved), ``model/`` of the first host packed to ``OUTPUT_PATH/JOB/output/model.tar.gz``;
then ``job_callbacks.attempt_ended`` gives the job its status, and the instances' disks go
(``job_disks.py``). The store lock keeps a sync and the
final store apart."""

from __future__ import annotations

import logging
from pathlib import Path

from hyperplan.core.jobs import LIVE_INSTANCE, AttemptState, InstanceState, Secondary
from hyperplan.objects.uris import BucketAccessError, StorageError
from hyperplan.services.jobs import job_callbacks, job_disks, refused_transfers
from hyperplan.services.jobs.job_attempt import read_attempt, storage_of
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from hyperplan.training.contract import Layout
from hyperplan.training.workspace import pack_model, sync_checkpoints

log = logging.getLogger(__name__)


def sync(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    current = read_attempt(runtime, job_id, attempt, AttemptState.RUNNING)
    if current is None:
        return
    storage = storage_of(runtime, current.job.account_id)
    with runtime.job_locks.store_lock(job_id):
        if read_attempt(runtime, job_id, attempt, AttemptState.RUNNING) is None:
            return  # the attempt ended while this waited: its final store has been made
        for instance in current.instances:
            if instance.state in LIVE_INSTANCE:
                try:
                    sync_checkpoints(Path(instance.root), current.instance_spec(instance.host), storage)
                except BucketAccessError as exc:  # rights revoked: they will not come back by themselves
                    reason = f"ClientError: the checkpoints could not be stored: {exc}"
                    return refused_transfers.fail_job(runtime, job_id, attempt, reason)
                except (StorageError, OSError) as exc:
                    log.warning("checkpoint sync of %s failed: %s", instance.task_id, exc)


def finish(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    """Store the attempt's last checkpoints and, when wanted, its model; then settle the job."""
    current = read_attempt(runtime, job_id, attempt, AttemptState.ENDING)
    if current is None:
        return
    storage = storage_of(runtime, current.job.account_id)
    model_uri = error = None
    roots = [Path(instance.root) for instance in current.instances]
    with runtime.job_locks.store_lock(job_id):
        job_disks.reattach(roots)
        for instance in current.instances:
            if instance.state == InstanceState.NOT_STARTED:
                continue
            try:
                sync_checkpoints(Path(instance.root), current.instance_spec(instance.host), storage)
            except (StorageError, OSError) as exc:
                log.warning("final checkpoint sync of %s failed: %s", instance.task_id, exc)
        first = current.instances[0]
        spec = current.instance_spec(first.host)
        if _wants_model(current.job, Path(first.root), spec.checkpoint_local_path):
            try:
                model_uri = pack_model(Path(first.root), spec, storage)
            except (StorageError, OSError) as exc:
                error = f"ClientError: the model could not be stored: {exc}"
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != AttemptState.ENDING:
            return
        job_callbacks.attempt_ended(session, runtime, job, model_uri, error)
    # Once the job's end is committed: a finish cut short before it runs again and finds its disks.
    job_disks.release(roots)


def _wants_model(job: TrainingJob, root: Path, checkpoint_path: str) -> bool:
    """A job that succeeded always stores its model; a stopped one stores the model it saved, if any."""
    if job.secondary_status == Secondary.UPLOADING:
        return True
    if job.secondary_status != Secondary.STOPPING or job.stop_reason == "failed":
        return False
    model_dir = Layout(root, checkpoint_path).model_dir
    return model_dir.is_dir() and any(model_dir.iterdir())
