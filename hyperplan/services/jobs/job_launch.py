"""Launch (after a job is placed): prepare each instance's directory tree (``training/workspace``: config
files, channels fetched through the bucket map, checkpoints restored, script-mode code), then start one
back-end task per instance, each in a sandbox of its own (``node_id=None``) with the contract's argv,
environment and working directory. The job moves to ``Training``. Under the job's start lock, a launch
checks that the job still wants its instances before it starts any task (see ``job_runner``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from hyperplan import metrics
from hyperplan.backends.base import BackendError, TaskSpec, UnknownResource
from hyperplan.backends.disks import DiskError
from hyperplan.core.jobs import LIVE_INSTANCE, RUNNING, AttemptState, InstanceState, Secondary
from hyperplan.objects.uris import StorageError
from hyperplan.services.jobs import job_callbacks, job_containers, job_disks, job_records, job_status
from hyperplan.services.jobs.job_attempt import read_attempt, storage_of
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.runtime import slurm_placement, tenancy
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from hyperplan.training.contract import NoCommand, UnsupportedInput
from hyperplan.training.workspace import prepare


def _wants_instances(runtime: ServiceContext, job_id: int, attempt: int) -> bool:
    with runtime.db.read() as session:
        job = session.get(TrainingJob, job_id)
        return (
            job is not None
            and job.attempt == attempt
            and job.attempt_state == AttemptState.LAUNCHING
            and job.secondary_status == Secondary.DOWNLOADING
            and not job.stop_reason
        )


def _known(runtime: ServiceContext, task_id: str) -> bool:
    try:
        runtime.backend.task_status(task_id)
    except UnknownResource:
        return False
    return True


def launch(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    current = read_attempt(runtime, job_id, attempt, AttemptState.LAUNCHING)
    if current is None:
        return
    storage = storage_of(runtime, current.job.account_id)
    specs: list[TaskSpec] = []
    image = None
    if job_containers.runs_in_containers(runtime):
        try:
            image = job_containers.pull_image(runtime, current.job, current.request)
        except (BackendError, ValueError) as exc:
            reference = current.job.resolved_image or current.request.algorithm.image
            _launch_failed(
                runtime, job_id, attempt, f"ClientError: the training image {reference} cannot be used: {exc}"
            )
            return
        _note_image(runtime, job_id, attempt, image)
    try:
        owner = tenancy.run_as(runtime, current.job.account_id)  # None: the server's own user
        if image is not None:  # the tree is root's in the container (job_containers.JobImage.owner)
            owner = image.owner
        interpreter = _interpreter(runtime, current.request)
        count = len(current.instances)
        for index, instance in enumerate(current.instances):
            if _known(runtime, instance.task_id):
                continue  # started before a restart: it runs, or has run, already
            if not _wants_instances(runtime, job_id, attempt):
                break  # stopped or reclaimed meanwhile: fetch no more
            spec = current.instance_spec(instance.host, interpreter)
            if image is not None:
                spec = job_containers.instance_spec(spec, image)
            root = Path(instance.root)
            if image is not None:  # its own disk, of VolumeSizeInGB (job_disks.py)
                job_disks.attach(runtime, root, current.request.volume_size_gb, image.ids)
            if root.is_relative_to(runtime.work_dir):  # (a tree stored by an older version is left as it is)
                tenancy.open_passage(runtime.work_dir, root.parent)
            contract = prepare(root, spec, storage, owner).contract
            if image is None:
                unreadable = tenancy.unreadable_program(contract.command.argv, spec.interpreter, owner)
                if unreadable is not None:
                    raise NoCommand(f"the program cannot be run: {unreadable}")
            with (
                runtime.db.read() as session
            ):  # on Slurm: one allocation of `count` nodes in the reservation of the plan it was placed on
                # (its own, or the one lending it idle nodes: a managed spot job, services/jobs/spot.py)
                where = slurm_placement.placement(
                    runtime,
                    session,
                    current.job.attempt_plan_id or current.job.lent_plan_id,
                    current.job.instance_type,
                    group=f"job-{job_id}-attempt-{attempt}",
                    group_size=count,
                    group_index=index,
                    zone=current.job.availability_zone,
                )
            if image is not None:
                pod = f"job-{job_id}-attempt-{attempt}"
                isolated = current.request.network_isolation
                task = job_containers.instance_task(
                    runtime, instance.task_id, spec, root, image, pod, isolated, where
                )
            else:
                task = TaskSpec(
                    instance.task_id,
                    contract.command.argv,
                    None,
                    contract.process_environment({}),
                    contract.command.cwd,
                    owner,
                    where,
                )
            specs.append(task)
    except DiskError as exc:
        _launch_failed(runtime, job_id, attempt, f"InternalServerError: an instance's disk: {exc}")
        return
    except (StorageError, NoCommand, UnsupportedInput, OSError, ValueError) as exc:
        _launch_failed(runtime, job_id, attempt, f"ClientError: the instances could not be prepared: {exc}")
        return
    error = None
    with runtime.job_locks.start_lock(job_id):
        if not _wants_instances(runtime, job_id, attempt):
            specs = []
        for task in specs:
            try:
                runtime.backend.run(task)
            except (BackendError, ValueError) as exc:
                metrics.BACKEND_ERRORS.inc()
                error = f"InternalServerError: instance {task.task_id} could not be started: {exc}"
                break
    if error is not None:
        _launch_failed(runtime, job_id, attempt, error)
        return
    _launched(runtime, job_id, attempt)


def _note_image(runtime: ServiceContext, job_id: int, attempt: int, image: job_containers.JobImage) -> None:
    """The job's history says what it runs: the image by its digest."""
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != AttemptState.LAUNCHING:
            return
        info = image.info
        job.image_digest = info.digest or None
        job_status.note(
            session,
            job,
            f"Downloading: image {info.reference} pulled ({info.digest or 'no registry digest'}); preparing "
            "the instances' input data.",
            runtime.clock.now(),
        )


def _launched(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    """Every task that should run does: the watcher takes over. A job stopped or reclaimed meanwhile has
    had them terminated; instances never started are recorded as such."""
    known = _known_tasks(runtime, job_id, attempt)
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != AttemptState.LAUNCHING:
            return
        started = _mark_unstarted(session, job_id, attempt, known)
        if started:
            _training(session, runtime, job, started, now)
        else:
            job_callbacks.attempt_ended(session, runtime, job, None, None)
    if started:
        runtime.wakes.jobs.notify()
    else:
        _release_disks(runtime, job_id, attempt)


def _training(
    session: Session, runtime: ServiceContext, job: TrainingJob, started: int, now: datetime
) -> None:
    """The attempt runs: the job is Training, unless it was stopped meanwhile."""
    job_records.move_attempt(job, AttemptState.RUNNING)
    if job.secondary_status == Secondary.DOWNLOADING and not job.stop_reason:
        where = "on loopback" if runtime.slurm is None else "as one Slurm job"
        job_status.move(
            session,
            runtime,
            job,
            Secondary.TRAINING,
            f"Training: {started} instance(s) running"
            + (f", hosts algo-1..algo-{started} {where}." if started > 1 else "."),
            now,
        )


def _release_disks(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    """An attempt that ended with no instance started: no finish will run for it, so its disks go here."""
    with runtime.db.read() as session:
        roots = [Path(i.root) for i in job_records.instances_of(session, job_id, attempt)]
    job_disks.release(roots)


def _known_tasks(runtime: ServiceContext, job_id: int, attempt: int) -> set[str]:
    """The tasks of an attempt the back end has (asked before a transaction opens, not inside one)."""
    with runtime.db.read() as session:
        task_ids = [i.task_id for i in job_records.instances_of(session, job_id, attempt)]
    return {task_id for task_id in task_ids if _known(runtime, task_id)}


def _mark_unstarted(session: Session, job_id: int, attempt: int, known: set[str]) -> int:
    """Record instances the back end never got as NotStarted; returns how many it has."""
    started = 0
    for instance in job_records.instances_of(session, job_id, attempt):
        if instance.state not in LIVE_INSTANCE:
            continue
        if instance.task_id in known:
            started += 1
        else:
            job_records.move_instance(instance, InstanceState.NOT_STARTED)
            instance.message = "the attempt ended before it was started"
    return started


def _launch_failed(runtime: ServiceContext, job_id: int, attempt: int, reason: str) -> None:
    """The job fails; whatever was started is stopped, and the watcher settles it."""
    known = _known_tasks(runtime, job_id, attempt)
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != AttemptState.LAUNCHING:
            return
        if not job.stop_reason and Secondary(job.secondary_status) in RUNNING:
            job.stop_reason, job.failure_reason = "failed", reason[: job_records.FAILURE_REASON_MAX]
        started = _mark_unstarted(session, job_id, attempt, known)
        if started:  # the watcher settles it, and the finish detaches the disks
            job_records.move_attempt(job, AttemptState.RUNNING)
            job_status.terminate_instances(session, runtime, job, runtime.job_settings.reclaim_grace)
            return
        job_callbacks.attempt_ended(session, runtime, job, None, reason)
    _release_disks(runtime, job_id, attempt)


def _interpreter(runtime: ServiceContext, request: TrainingJobSpec) -> str | None:
    """The Python the fleet file names for the job's training image (script mode and `python` commands),
    else the one isolation needs (services/os_users.default_interpreter), else the server's own (None)."""
    return runtime.fleet.interpreter_for(request.algorithm.image) or runtime.settings.default_interpreter
