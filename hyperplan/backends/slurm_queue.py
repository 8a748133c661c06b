"""The Slurm back end's jobs and steps as Slurm's queue has them: read, named, signalled and cancelled.

Slurm's record is the truth about jobs. A status call reads ``scontrol show job`` and, for steps,
``squeue --steps``, each at most once per short interval (``CACHE_SECONDS``), shared by all calls; a
job or step missing from a shared read is asked about again with a fresh one before it counts as gone.

Every job is named ``PREFIX KIND . ID . NONCE`` (``job_prefix``), so a restarted server finds its own
among the cluster's, and a step is named after its task with the task's nonce, which only the server
knows, so that a tenant's own step cannot pass for the task's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from signal import SIGKILL, Signals
from typing import Any

from hyperplan.backends.base import BackendError
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.parse import Job

log = logging.getLogger(__name__)

LIVE_JOB_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"}
)
CACHE_SECONDS = 0.3


def job_prefix(root: Path) -> str:
    """The name prefix of every job of the back end over ``root``."""
    return "hp." + hashlib.sha256(str(root).encode()).hexdigest()[:10] + "."


class SlurmQueue:
    """This back end's view of Slurm's jobs and steps (callers hold the back end's lock)."""

    def __init__(self, client: SlurmClient, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._cache: tuple[float, dict[int, Job]] = (0.0, {})
        self._steps: tuple[float, dict[str, str]] = (0.0, {})  # live steps: id (J.S) -> name

    # --- jobs ------------------------------------------------------------------------------------

    def jobs(self) -> dict[int, Job]:
        """Every job Slurm knows, from a read shared for a short while."""
        at, jobs = self._cache
        if time.monotonic() - at > CACHE_SECONDS:
            try:
                jobs = {job.id: job for job in self.client.jobs()}
            except SlurmError as error:
                raise BackendError(f"Slurm does not answer: {error}") from None
            self._cache = (time.monotonic(), jobs)
        return jobs

    def job(self, job_id: int) -> Job | None:
        job = self.jobs().get(job_id)
        if job is None:  # submitted after the shared read, perhaps: only a fresh one may say it is gone
            self._cache = (0.0, {})
            job = self.jobs().get(job_id)
        return job

    def job_named(self, name: str) -> Job | None:
        """The newest live job named ``name`` (one submitted before a crash, its id not recorded)."""
        self.forget()
        live = [job for job in self.jobs().values() if job.name == name and job.state in LIVE_JOB_STATES]
        return max(live, key=lambda job: job.id) if live else None

    def live_jobs(self) -> list[Job]:
        """This back end's jobs Slurm still runs (or has queued), by name prefix."""
        self.forget()
        return [
            job
            for job in self.jobs().values()
            if job.name.startswith(self.prefix) and job.state in LIVE_JOB_STATES
        ]

    def forget(self) -> None:
        """Drop the shared reads: the next look asks Slurm (after a change this back end made)."""
        self._cache = (0.0, {})
        self._steps = (0.0, {})

    # --- steps -----------------------------------------------------------------------------------

    def live_steps(self, fresh: bool = False) -> dict[str, str]:
        """Slurm's live steps, id (``J.S``) -> name, from a read shared for a short while."""
        at, steps = self._steps
        if fresh or time.monotonic() - at > CACHE_SECONDS:
            try:
                text = self.client.run("squeue", "--steps", "--noheader", "--format=%i|%j")
            except SlurmError as error:
                raise BackendError(f"Slurm does not answer: {error}") from None
            steps = dict(line.split("|", 1) for line in text.splitlines() if "|" in line)
            self._steps = (time.monotonic(), steps)
        return steps

    def step_name(self, record: Mapping[str, Any]) -> str:
        """A node task's step's name: with the task's nonce, which only the server knows (task.json is
        its own), so the tenant cannot make a step of its own pass for the task's before it starts."""
        return f"{self.prefix}s.{record.get('task_id')}.{record.get('nonce', '')}"

    def task_of_step(self, step_name: str) -> str | None:
        """The task a step's name says it runs (None: not a node task's step of this back end)."""
        if not step_name.startswith(f"{self.prefix}s."):
            return None
        return step_name.removeprefix(f"{self.prefix}s.").rpartition(".")[0]

    def task_step(self, record: Mapping[str, Any], launch: Mapping[str, Any] | None) -> str | None:
        """The live step of a task on a node, as Slurm names it (never as the runner's ``started.json``
        says: the program may have rewritten that); None once it has gone, or before it has started.
        Of several with its name (the user may start more once it has seen it) the first one."""
        if launch is None:
            return None
        name, job = self.step_name(record), f"{launch.get('job_id')}."

        def found(steps: Mapping[str, str]) -> str | None:
            ids = [step for step, named in steps.items() if named == name and step.startswith(job)]
            return min(ids, key=lambda step: int(step.rpartition(".")[2])) if ids else None

        return found(self.live_steps()) or found(self.live_steps(fresh=True))

    # --- signals ---------------------------------------------------------------------------------

    def cancel(self, what: str, sig: Signals | None = None, full: bool = False, batch: bool = False) -> None:
        command = [
            "scancel",
            *(["--full"] if full else []),
            *(["--batch"] if batch else []),
            *([f"--signal={sig.name[3:]}"] if sig else []),
            what,
        ]
        try:
            self.client.run(*command)
        except SlurmError as error:
            log.info("%s", error)  # ended meanwhile
        self.forget()

    def kill_job(self, job_id: int, mark_killed: Callable[[str], None]) -> None:
        """SIGKILL to all of a job, now. (``scancel --signal=KILL J`` is taken as a cancel, which
        signals SIGTERM and kills only ``KillWait`` later: so each step, then the batch script.)
        ``mark_killed`` is told of each node task whose step is killed, before it is."""
        steps = self.live_steps(fresh=True)
        for step in sorted(steps):
            if step.startswith(f"{job_id}.") and not step.endswith(".batch") and not step.endswith(".extern"):
                task_id = self.task_of_step(steps[step])
                if task_id is not None:
                    mark_killed(task_id)
                self.cancel(step, SIGKILL)
        # The batch script and its children (``--full``), not the script alone: a child left to the
        # cancel's SIGTERM may ignore it, or be still dying when slurmstepd first looks, which keeps
        # the job COMPLETING a second or more.
        self.cancel(str(job_id), SIGKILL, full=True, batch=True)
        self.cancel(str(job_id))  # and cancelled: Slurm ends whatever the batch script left behind
