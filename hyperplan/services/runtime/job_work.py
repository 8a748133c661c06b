"""What the jobs' services and their runner share in memory: the settings and the per-job locks.

Two locks per job order its pieces (see services/jobs/job_runner.py): the start lock orders starting a job's
tasks against terminating them, the store lock orders its checkpoint syncs against its final store.
They live in the service context, so the services that terminate tasks and the runner that starts them
take the same lock without knowing each other. Locks are dropped once a job has ended for good.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class JobSettings:
    """Real-time periods for the processes of jobs, and the capacity wait; each can be set from the
    environment of `hyperplan serve` (seconds): HYPERPLAN_JOB_STOP_GRACE, HYPERPLAN_JOB_RECLAIM_GRACE,
    HYPERPLAN_JOB_CHECKPOINT_SYNC, HYPERPLAN_JOB_CAPACITY_WAIT."""

    stop_grace: timedelta = timedelta(seconds=120)  # StopTrainingJob and MaxRuntimeInSeconds, as on AWS
    reclaim_grace: timedelta = timedelta(seconds=120)  # SIGTERM to SIGKILL at a reclaim, or after a failure
    checkpoint_sync_seconds: float = 30.0  # how often running jobs' checkpoints are stored
    capacity_wait: timedelta = timedelta(days=2)  # pending time (plan Active) before InsufficientCapacity

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> JobSettings:
        env = os.environ if env is None else env
        default = cls()

        def seconds(name: str, fallback: float) -> float:
            text = env.get(name)
            try:
                return float(text) if text else fallback
            except ValueError:
                raise ValueError(f"{name}={text!r}: a number of seconds") from None

        return cls(
            stop_grace=timedelta(seconds=seconds("HYPERPLAN_JOB_STOP_GRACE", 120)),
            reclaim_grace=timedelta(seconds=seconds("HYPERPLAN_JOB_RECLAIM_GRACE", 120)),
            checkpoint_sync_seconds=seconds("HYPERPLAN_JOB_CHECKPOINT_SYNC", default.checkpoint_sync_seconds),
            capacity_wait=timedelta(
                seconds=seconds("HYPERPLAN_JOB_CAPACITY_WAIT", default.capacity_wait.total_seconds())
            ),
        )


class JobLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[int, str], threading.Lock] = {}

    def start_lock(self, job_id: int) -> threading.Lock:
        """Orders starting a job's tasks against terminating them; held only for those quick calls, so
        the lifecycle loop (which terminates at a reclaim) never waits on I/O."""
        return self._lock(job_id, "start")

    def store_lock(self, job_id: int) -> threading.Lock:
        """Orders a job's checkpoint syncs and its final store: the last sync of an attempt comes last."""
        return self._lock(job_id, "store")

    def _lock(self, job_id: int, kind: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault((job_id, kind), threading.Lock())

    def jobs(self) -> set[int]:
        with self._guard:
            return {job_id for job_id, _ in self._locks}

    def forget(self, job_ids: Iterable[int]) -> None:
        """Drop the locks of jobs that have ended for good; one held right now stays (its holder is
        finishing with an ended job: nobody else will ask for it)."""
        ended = set(job_ids)
        with self._guard:
            for key in [k for k, lock in self._locks.items() if k[0] in ended and not lock.locked()]:
                del self._locks[key]
