"""The runner: the I/O of training jobs, off the request and lifecycle paths, and the watch on their tasks.

Work for a job runs on a small thread pool, one piece per phase, never inside a transaction:

- **launch** (after a job is placed): prepare each instance's directory tree (``training/workspace``:
  config files, channels fetched through the bucket map, checkpoints restored, script-mode code), then
  start one back-end task per instance, each in a sandbox of its own (``node_id=None``) with the
  contract's argv, environment and working directory. The job moves to ``Training``.
- **sync** (every ``checkpoint_sync_seconds`` while a job trains): store new and changed checkpoint files
  at ``CheckpointConfig.S3Uri``.
- **finish** (once every task of an attempt has ended): store the last checkpoints and, for a job that
  succeeded (or was stopped with a model saved), pack ``model/`` of the first host to
  ``OUTPUT_PATH/JOB/output/model.tar.gz``; then :func:`jobs.attempt_ended` gives the job its status.

Two locks per job order its pieces. The start lock: a launch checks, under it, that the job still wants
its instances before it starts any task, and a termination takes the same lock, so a task is either
never started or terminated after it was (both are quick calls: the lifecycle loop, which terminates at
a reclaim, never waits on I/O). The store lock: a periodic sync and the final store of an attempt never
overlap, and a sync that waited for the final store does nothing.

The watcher (a worker, hyperplan/worker.py) reads the state of every live task and brings it into the
store: woken when work is handed over, and every WATCH_POLL seconds while a task runs, since a process
ends without telling anyone. When an instance fails it has the others stopped; when every task of an
attempt has ended it calls :func:`jobs.tasks_ended`. Once a job has ended for good, its locks are dropped.

After a restart, :func:`settle_adoption` and the runner's first step pick up where the last server
stopped: tasks that kept running are watched again, tasks that ended meanwhile are settled from their
exit status, a launch or a finish that was cut short is done again (both are idempotent: a task the back
end already has is not started twice, and storing the same files twice stores the same objects).
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.backends.base import AdoptReport, BackendError, LogStream, TaskRef, TaskSpec, UnknownResource
from hyperplan.core.jobs import FINAL, RUNNING, Secondary
from hyperplan.errors import ValidationError
from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import StorageError
from hyperplan.services import jobs, tenancy
from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext
from hyperplan.services.job_request import TrainingJobSpec
from hyperplan.services.jobs import LIVE_INSTANCE
from hyperplan.store.schema import TrainingJob, TrainingJobInstance
from hyperplan.training.contract import JobSpec, Layout, NoCommand, UnsupportedInput
from hyperplan.training.workspace import pack_model, prepare, read_failure, sync_checkpoints
from hyperplan.worker import Worker

log = logging.getLogger(__name__)

FAILURE_FILE_LIMIT = 4096
LOG_PAGE = 1 << 16


WATCH_POLL = 1.0  # seconds between looks while a task runs: its process ends without telling anyone
SAFETY_POLL = 5.0  # seconds between looks when nothing runs (work handed over by a commit wakes it)


class JobRunner:
    """The pool that does the jobs' I/O, and the watcher of their tasks. One per application.

    Its worker is woken (``wakes.jobs``) after a commit that gives it work: a job to launch (attempt state
    ``launching``) or to finish (``ending``), or tasks to watch. Each step hands every such attempt not
    already in hand to the pool, so work cut short by a stop is picked up by the next start's first step.
    """

    def __init__(self, runtime: ServiceContext, workers: int = 4, poll: float = SAFETY_POLL) -> None:
        self.runtime = runtime
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job-work")
        self._guard = threading.Lock()
        self._in_flight: set[tuple[int, str]] = set()
        self._last_sync: dict[int, float] = {}  # per job, pruned once the job has ended (_forget_ended)
        # Whether each job now training keeps checkpoints: its request is decoded the first time it is
        # seen training, not on every pass; only jobs still training are remembered (watcher thread only).
        self._checkpointed: dict[int, bool] = {}
        self.worker = Worker("job-watcher", self._step, poll=poll, wake=runtime.wakes.jobs)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        """Stop watching and drop queued work; tasks keep running (the next start adopts them)."""
        self.worker.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        self.worker.wake()

    def _step(self) -> float | None:
        watch(self.runtime)
        self._hand_over()
        next_sync = self._sync_due()
        self._forget_ended()
        with self.runtime.db.read() as session:
            running = session.scalar(
                select(TrainingJob.id).where(TrainingJob.attempt_state == "running").limit(1)
            )
        if running is None:
            return next_sync
        return WATCH_POLL if next_sync is None else min(WATCH_POLL, next_sync)

    # -- work -------------------------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Attempts to launch or to finish go to the pool (once each: one in hand is not handed again)."""
        with self.runtime.db.read() as session:
            pending = [
                (job.id, job.attempt, job.attempt_state)
                for job in session.scalars(
                    select(TrainingJob).where(TrainingJob.attempt_state.in_(("launching", "ending")))
                )
            ]
        for job_id, attempt, state in pending:
            if state == "launching":
                self._submit(job_id, "launch", launch, attempt)
            else:
                self._submit(job_id, "finish", finish, attempt)

    def _submit(
        self, job_id: int, kind: str, work: Callable[[ServiceContext, int, int], None], attempt: int
    ) -> None:
        key = (job_id, f"{kind}:{attempt}")
        with self._guard:
            if key in self._in_flight:
                return
            self._in_flight.add(key)

        def run() -> None:
            try:
                work(self.runtime, job_id, attempt)
            except Exception:
                log.exception("%s of training job %d (attempt %d) failed", kind, job_id, attempt)
            finally:
                with self._guard:
                    self._in_flight.discard(key)
                self.wake()

        try:
            self._pool.submit(run)
        except RuntimeError:  # shutting down: the next start resumes it
            with self._guard:
                self._in_flight.discard(key)

    def tracked_jobs(self) -> set[int]:
        """The jobs this runner keeps locks or sync times for (ended jobs are forgotten)."""
        with self._guard:
            synced = set(self._last_sync)
        return self.runtime.job_locks.jobs() | synced

    def _forget_ended(self) -> None:
        """Drop the locks and sync times of jobs that have ended for good, so that the runner's memory
        follows the live jobs, not every job ever run."""
        tracked = self.tracked_jobs()
        if not tracked:
            return
        with self.runtime.db.read() as session:
            rows = session.execute(
                select(TrainingJob.id, TrainingJob.secondary_status, TrainingJob.attempt_state).where(
                    TrainingJob.id.in_(tracked)
                )
            ).all()
        live = {
            job_id
            for job_id, status, state in rows
            if Secondary(status) not in FINAL or state not in ("", "ended")
        }
        ended = tracked - live
        self.runtime.job_locks.forget(ended)
        with self._guard:
            for job_id in ended:
                self._last_sync.pop(job_id, None)

    def _sync_due(self) -> float | None:
        """Hand the checkpoints of training jobs to storage every `checkpoint_sync_seconds`; returns the
        seconds until the next sync is due (None: no job has one)."""
        now = time.monotonic()
        training = self._training_with_checkpoints()
        every = self.runtime.job_settings.checkpoint_sync_seconds
        next_due: float | None = None
        for job_id, attempt in training:
            with self._guard:
                last = self._last_sync.setdefault(job_id, now)
            if now - last >= every:
                with self._guard:
                    self._last_sync[job_id] = now
                self._submit(job_id, "sync", sync, attempt)
                last = now
            left = every - (now - last)
            next_due = left if next_due is None else min(next_due, left)
        return next_due

    def _training_with_checkpoints(self) -> list[tuple[int, int]]:
        """(job id, attempt) of the training jobs that keep checkpoints. Only the requests of jobs not
        seen training before are read and decoded."""
        with self.runtime.db.read() as session:
            rows = session.execute(
                select(TrainingJob.id, TrainingJob.attempt).where(
                    TrainingJob.secondary_status == Secondary.TRAINING
                )
            ).all()
            unknown = [job_id for job_id, _ in rows if job_id not in self._checkpointed]
            decoded = {
                job.id: jobs.request_of(job).checkpoints is not None
                for job in (
                    session.scalars(select(TrainingJob).where(TrainingJob.id.in_(unknown))) if unknown else ()
                )
            }
        self._checkpointed = {
            job_id: self._checkpointed.get(job_id, decoded.get(job_id, False)) for job_id, _ in rows
        }
        return [(job_id, attempt) for job_id, attempt in rows if self._checkpointed[job_id]]


# -- launch ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Attempt:
    """What the I/O of one attempt needs, read once from the store."""

    job: TrainingJob
    instances: list[TrainingJobInstance]
    request: TrainingJobSpec  # the job's stored request, decoded once for the whole attempt

    def instance_spec(self, host: str, interpreter: str | None = None) -> JobSpec:
        return self.request.instance(host, self.job.segment_end, interpreter)


def _read_attempt(runtime: ServiceContext, job_id: int, attempt: int, state: str) -> _Attempt | None:
    with runtime.db.read() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != state:
            return None
        return _Attempt(job, jobs.instances_of(session, job_id, attempt), jobs.request_of(job))


def _wants_instances(runtime: ServiceContext, job_id: int, attempt: int) -> bool:
    with runtime.db.read() as session:
        job = session.get(TrainingJob, job_id)
        return (
            job is not None
            and job.attempt == attempt
            and job.attempt_state == "launching"
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
    current = _read_attempt(runtime, job_id, attempt, "launching")
    if current is None:
        return
    storage = _storage(runtime)
    specs: list[TaskSpec] = []
    try:
        owner = tenancy.run_as(runtime, current.job.account_id)  # None: the server's own user
        interpreter = _interpreter(runtime, current.request)
        for instance in current.instances:
            if _known(runtime, instance.task_id):
                continue  # started before a restart: it runs, or has run, already
            if not _wants_instances(runtime, job_id, attempt):
                break  # stopped or reclaimed meanwhile: fetch no more
            spec = current.instance_spec(instance.host, interpreter)
            root = Path(instance.root)
            if root.is_relative_to(runtime.work_dir):  # (a tree stored by an older version is left as it is)
                tenancy.open_passage(runtime.work_dir, root.parent)
            contract = prepare(root, spec, storage, owner).contract
            unreadable = tenancy.unreadable_program(contract.command.argv, spec.interpreter, owner)
            if unreadable is not None:
                raise NoCommand(f"the program cannot be run: {unreadable}")
            specs.append(
                TaskSpec(
                    instance.task_id,
                    contract.command.argv,
                    None,
                    contract.process_environment({}),
                    contract.command.cwd,
                    owner,
                )
            )
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
                error = f"InternalServerError: instance {task.task_id} could not be started: {exc}"
                break
    if error is not None:
        _launch_failed(runtime, job_id, attempt, error)
        return
    _launched(runtime, job_id, attempt)


def _launched(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    """Every task that should run does: the watcher takes over. A job stopped or reclaimed meanwhile has
    had them terminated; instances never started are recorded as such."""
    known = _known_tasks(runtime, job_id, attempt)
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != "launching":
            return
        started = _mark_unstarted(session, job_id, attempt, known)
        if not started:
            jobs.attempt_ended(session, runtime, job, None, None)
            return
        job.attempt_state = "running"
        if job.secondary_status == Secondary.DOWNLOADING and not job.stop_reason:
            jobs.move(
                session,
                runtime,
                job,
                Secondary.TRAINING,
                f"Training: {started} instance(s) running"
                + (f", hosts algo-1..algo-{started} on loopback." if started > 1 else "."),
                now,
            )
    runtime.wakes.jobs.notify()


def _known_tasks(runtime: ServiceContext, job_id: int, attempt: int) -> set[str]:
    """The tasks of an attempt the back end has (asked before a transaction opens, not inside one)."""
    with runtime.db.read() as session:
        task_ids = [i.task_id for i in jobs.instances_of(session, job_id, attempt)]
    return {task_id for task_id in task_ids if _known(runtime, task_id)}


def _mark_unstarted(session: Session, job_id: int, attempt: int, known: set[str]) -> int:
    """Record instances the back end never got as NotStarted; returns how many it has."""
    started = 0
    for instance in jobs.instances_of(session, job_id, attempt):
        if instance.state not in LIVE_INSTANCE:
            continue
        if instance.task_id in known:
            started += 1
        else:
            instance.state, instance.message = "NotStarted", "the attempt ended before it was started"
    return started


def _launch_failed(runtime: ServiceContext, job_id: int, attempt: int, reason: str) -> None:
    """The job fails; whatever was started is stopped, and the watcher settles it."""
    known = _known_tasks(runtime, job_id, attempt)
    with runtime.db.write() as session:
        job = session.get(TrainingJob, job_id)
        if job is None or job.attempt != attempt or job.attempt_state != "launching":
            return
        if not job.stop_reason and Secondary(job.secondary_status) in RUNNING:
            job.stop_reason, job.failure_reason = "failed", reason[: jobs.FAILURE_REASON_MAX]
        started = _mark_unstarted(session, job_id, attempt, known)
        if not started:
            jobs.attempt_ended(session, runtime, job, None, reason)
            return
        job.attempt_state = "running"
        jobs.terminate_instances(session, runtime, job, runtime.job_settings.reclaim_grace)


# -- sync and finish ------------------------------------------------------------------------------


def sync(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    current = _read_attempt(runtime, job_id, attempt, "running")
    if current is None:
        return
    storage = _storage(runtime)
    with runtime.job_locks.store_lock(job_id):
        if _read_attempt(runtime, job_id, attempt, "running") is None:
            return  # the attempt ended while this waited: its final store has been made
        for instance in current.instances:
            if instance.state in LIVE_INSTANCE:
                try:
                    sync_checkpoints(Path(instance.root), current.instance_spec(instance.host), storage)
                except (StorageError, OSError) as exc:
                    log.warning("checkpoint sync of %s failed: %s", instance.task_id, exc)


def finish(runtime: ServiceContext, job_id: int, attempt: int) -> None:
    """Store the attempt's last checkpoints and, when wanted, its model; then settle the job."""
    current = _read_attempt(runtime, job_id, attempt, "ending")
    if current is None:
        return
    storage = _storage(runtime)
    model_uri = error = None
    with runtime.job_locks.store_lock(job_id):
        for instance in current.instances:
            if instance.state == "NotStarted":
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
        if job is None or job.attempt != attempt or job.attempt_state != "ending":
            return
        jobs.attempt_ended(session, runtime, job, model_uri, error)


def _wants_model(job: TrainingJob, root: Path, checkpoint_path: str) -> bool:
    """A job that succeeded always stores its model; a stopped one stores the model it saved, if any."""
    if job.secondary_status == Secondary.UPLOADING:
        return True
    if job.secondary_status != Secondary.STOPPING or job.stop_reason == "failed":
        return False
    model_dir = Layout(root, checkpoint_path).model_dir
    return model_dir.is_dir() and any(model_dir.iterdir())


def _storage(runtime: ServiceContext) -> Storage:
    return Storage.in_data_dir(runtime.data_dir, runtime.fleet.buckets)


# -- watching ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Seen:
    instance_id: int
    state: str
    exit_code: int | None
    message: str


def watch(runtime: ServiceContext) -> int:
    """One pass: the back end's state of every live task of a running attempt into the store; returns how
    many changed."""
    with runtime.db.read() as session:
        running = list(session.scalars(select(TrainingJob).where(TrainingJob.attempt_state == "running")))
        attempts = {job.id: jobs.instances_of(session, job.id, job.attempt) for job in running}
    seen: list[_Seen] = []
    settle: list[int] = []
    for job in running:
        states = {}
        for instance in attempts[job.id]:
            states[instance.id] = instance.state
            if instance.state not in LIVE_INSTANCE:
                continue
            change = _look(runtime, instance)
            if change is not None:
                seen.append(change)
                states[instance.id] = change.state
        if not any(state in LIVE_INSTANCE for state in states.values()):
            settle.append(job.id)
    if seen or settle:
        _apply(runtime, seen)
    return len(seen)


def _look(runtime: ServiceContext, instance: TrainingJobInstance) -> _Seen | None:
    try:
        status = runtime.backend.task_status(instance.task_id)
    except UnknownResource:
        return _Seen(instance.id, "Lost", None, "the back end has no such task")
    if status.state.is_final():
        message = _failure_file(Path(instance.root)) or status.message
        return _Seen(instance.id, status.state.value, status.exit_code, message)
    if status.state.value == "Running" and instance.state != "Running":
        return _Seen(instance.id, "Running", None, "")
    return None


def _failure_file(root: Path) -> str:
    """What the algorithm wrote to /opt/ml/output/failure, which SageMaker shows as the FailureReason."""
    try:
        return read_failure(root, FAILURE_FILE_LIMIT)  # the tenant's tree: no link followed
    except OSError:
        return ""


def _apply(runtime: ServiceContext, seen: list[_Seen]) -> None:
    now = runtime.clock.now()
    with runtime.db.write() as session:
        touched: set[int] = set()
        for change in seen:
            instance = session.get(TrainingJobInstance, change.instance_id)
            if instance is None or instance.state not in LIVE_INSTANCE:
                continue
            instance.state, instance.exit_code = change.state, change.exit_code
            if change.state != "Running":
                instance.message, instance.ended_at = change.message, now
            touched.add(instance.job_id)
        for job in session.scalars(select(TrainingJob).where(TrainingJob.attempt_state == "running")):
            _settle(runtime, session, job)


def _settle(runtime: ServiceContext, session: Session, job: TrainingJob) -> None:
    instances = jobs.instances_of(session, job.id, job.attempt)
    live = [i for i in instances if i.state in LIVE_INSTANCE]
    if not live:
        jobs.tasks_ended(
            session, runtime, job, [i for i in instances if i.state != "NotStarted"] or instances
        )
        return
    failed = [
        i
        for i in instances
        if i.state not in LIVE_INSTANCE and not (i.state == "Exited" and i.exit_code == 0)
    ]
    if failed:
        jobs.instance_failed(session, runtime, job, failed[0])


# -- after a restart --------------------------------------------------------------------------------


def task_refs(runtime: ServiceContext) -> list[TaskRef]:
    """Every task the store knows (ended ones included), for the start's one `adopt` call."""
    with runtime.db.read() as session:
        return [TaskRef(t) for t in session.scalars(select(TrainingJobInstance.task_id))]


def settle_adoption(runtime: ServiceContext, report: AdoptReport) -> None:
    """Tasks the back end never got: a launch cut short starts them again (JobRunner._hand_over); a task
    of a running attempt that the back end lost is recorded as Lost, and the watcher settles its job."""
    missing = {ref.task_id for ref in report.missing if isinstance(ref, TaskRef)}
    if not missing:
        return
    now = runtime.clock.now()
    with runtime.db.write() as session:
        for instance in session.scalars(
            select(TrainingJobInstance).where(TrainingJobInstance.task_id.in_(missing))
        ):
            job = session.get(TrainingJob, instance.job_id)
            if instance.state not in LIVE_INSTANCE or job is None:
                continue
            if job.attempt_state == "launching" and job.attempt == instance.attempt:
                continue
            instance.state, instance.ended_at = "Lost", now
            instance.message = "the back end did not have it after the server restarted"


# -- logs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogPage:
    data: bytes
    cursor: str
    attempt: int
    done: bool


def read_logs(
    runtime: ServiceContext, caller: Caller, name: str, host: str, stream: str, cursor: str | None
) -> LogPage:
    """A job's log for one host, across its attempts in order. The cursor is ``ATTEMPT:OFFSET`` (bytes);
    ``done`` once the job has ended and everything has been read."""
    try:
        kind = LogStream(stream)
    except ValueError:
        raise ValidationError("stream must be stdout or stderr.") from None
    position = parse_cursor(cursor)
    with runtime.db.read() as session:
        job = jobs.get(session, runtime, caller, name)
        tasks = {i.attempt: i.task_id for i in jobs.instances_of(session, job.id) if i.host == host}
        final = Secondary(job.secondary_status) in FINAL and job.attempt_state in ("", "ended")
    if host not in {f"algo-{n}" for n in range(1, job.instance_count + 1)}:
        raise ValidationError(f"host must be one of algo-1..algo-{job.instance_count}.")
    attempts = sorted(tasks)
    attempt, offset = position or (attempts[0] if attempts else 1, 0)
    while attempts:
        data = b""
        if attempt in tasks:
            with contextlib.suppress(UnknownResource):
                data = runtime.backend.read_log(TaskRef(tasks[attempt]), kind, offset, LOG_PAGE).data
            if len(data) == LOG_PAGE and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]  # whole lines, so no character is cut in two
        if data:
            return LogPage(data, f"{attempt}:{offset + len(data)}", attempt, False)
        later = [a for a in attempts if a > attempt]
        if not later:
            break
        attempt, offset = later[0], 0
    return LogPage(b"", f"{attempt}:{offset}", attempt, final)


MAX_LOG_ATTEMPT = 2**31 - 1
MAX_LOG_OFFSET = 2**40
"""1 TiB: far past any log, and an offset every file system seeks to (ext4 refuses past 16 TiB)."""
_CURSOR = re.compile(r"([0-9]{1,13}):([0-9]{1,13})")


def parse_cursor(cursor: str | None) -> tuple[int, int] | None:
    """``ATTEMPT:OFFSET`` as read_logs gives it (None: from the start), checked before anything is read:
    the attempt from 1 to MAX_LOG_ATTEMPT, the offset from 0 to MAX_LOG_OFFSET."""
    if not cursor:
        return None
    match = _CURSOR.fullmatch(cursor)
    if match is None or not 1 <= int(match[1]) <= MAX_LOG_ATTEMPT or int(match[2]) > MAX_LOG_OFFSET:
        raise ValidationError(
            f"cursor must be ATTEMPT:OFFSET as a previous answer gave it (attempt 1 to {MAX_LOG_ATTEMPT}, "
            f"offset 0 to {MAX_LOG_OFFSET}), not {cursor[:64]!r}."
        )
    return int(match[1]), int(match[2])


def _interpreter(runtime: ServiceContext, request: TrainingJobSpec) -> str | None:
    """The Python the fleet file names for the job's training image (script mode and `python` commands),
    else the one isolation needs (services/os_users.default_interpreter), else the server's own (None)."""
    return runtime.fleet.interpreter_for(request.algorithm.image) or runtime.settings.default_interpreter
