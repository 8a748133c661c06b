"""The runner: the I/O of training jobs, off the request and lifecycle paths, and the watch on their tasks.

Work for a job runs on a small thread pool, one piece per phase, never inside a transaction:

- **launch** (``job_launch``, after a job is placed): prepare each instance's directory tree
  (``training/workspace``: config files, channels fetched through the bucket map, checkpoints restored,
  script-mode code), then start one back-end task per instance, each in a sandbox of its own
  (``node_id=None``) with the contract's argv, environment and working directory. The job moves to
  ``Training``.
- **sync** (``job_finish``, every ``checkpoint_sync_seconds`` while a job trains): store new and changed
  checkpoint files at ``CheckpointConfig.S3Uri``.
- **finish** (``job_finish``, once every task of an attempt has ended): store the last checkpoints and,
  for a job that succeeded (or was stopped with a model saved), pack ``model/`` of the first host to
  ``OUTPUT_PATH/JOB/output/model.tar.gz``; then :func:`job_callbacks.attempt_ended` gives the job its
  status.

Two locks per job order its pieces. The start lock: a launch checks, under it, that the job still wants
its instances before it starts any task, and a termination takes the same lock, so a task is either
never started or terminated after it was (both are quick calls: the lifecycle loop, which terminates at
a reclaim, never waits on I/O). The store lock: a periodic sync and the final store of an attempt never
overlap, and a sync that waited for the final store does nothing.

The watcher (a worker, hyperplan/worker.py; one pass is ``job_watch.watch``) reads the state of every
live task and brings it into the store: woken when work is handed over, and every WATCH_POLL seconds
while a task runs, since a process ends without telling anyone. When an instance fails it has the others
stopped; when every task of an attempt has ended it calls :func:`job_callbacks.tasks_ended`. Once a job
has ended for good, its locks are dropped.

After a restart, ``job_watch.settle_adoption`` and the runner's first step pick up where the last server
stopped: tasks that kept running are watched again, tasks that ended meanwhile are settled from their
exit status, a launch or a finish that was cut short is done again (both are idempotent: a task the back
end already has is not started twice, and storing the same files twice stores the same objects).

A job's logs are read in ``job_logs``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select

from hyperplan.core.jobs import BETWEEN_ATTEMPTS, FINAL, AttemptState, Secondary
from hyperplan.services.jobs import job_records
from hyperplan.services.jobs.job_finish import finish, sync
from hyperplan.services.jobs.job_launch import launch
from hyperplan.services.jobs.job_watch import watch
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingJob
from hyperplan.worker import Worker

log = logging.getLogger(__name__)

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
                select(TrainingJob.id).where(TrainingJob.attempt_state == AttemptState.RUNNING).limit(1)
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
                    select(TrainingJob).where(
                        TrainingJob.attempt_state.in_((AttemptState.LAUNCHING, AttemptState.ENDING))
                    )
                )
            ]
        for job_id, attempt, state in pending:
            if state == AttemptState.LAUNCHING:
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
            if Secondary(status) not in FINAL or state not in BETWEEN_ATTEMPTS
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
                job.id: job_records.request_of(job).checkpoints is not None
                for job in (
                    session.scalars(select(TrainingJob).where(TrainingJob.id.in_(unknown))) if unknown else ()
                )
            }
        self._checkpointed = {
            job_id: self._checkpointed.get(job_id, decoded.get(job_id, False)) for job_id, _ in rows
        }
        return [(job_id, attempt) for job_id, attempt in rows if self._checkpointed[job_id]]
