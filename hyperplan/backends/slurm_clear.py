"""An account's OS user going, on the Slurm back end: its jobs cancelled, its leftovers swept off the nodes.

The user's Slurm jobs are cancelled, then on each of the back end's nodes one short batch job of root's
(``--nodelist``, ``CLEAR_TIME_LIMIT``) runs the copied ``scratch.py`` on the user's uid: every process
of it killed, every file it owns in /tmp, /var/tmp and /dev/shm removed.

Asynchronous where it must be: this waits up to ``CLEAR_WAIT_SECONDS`` for the jobs to end (on free
nodes they do in seconds), then returns, leaving the others queued; each runs when Slurm can place it
on its node. A node that another job holds whole (every job of this back end is ``--exclusive``) is
swept once that job ends; a node in another account's reservation once the reservation has ended (Slurm
refuses root a reservation that does not name it, so the job waits outside it), or earlier in a gap
before one starts; a drained or down node once it is back. The uid is never given to another account,
so a sweep that comes late removes nothing of anyone else's. Each job's output is kept in
``ROOT/clears``.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from hyperplan.backends.base import BackendError, RunAs
from hyperplan.backends.slurm_queue import LIVE_JOB_STATES
from hyperplan.backends.slurm_submit import NO_REQUEUE, SCRATCH_FILE, Submitter
from hyperplan.slurm.client import SlurmClient, SlurmError

log = logging.getLogger(__name__)

CLEAR_TIME_LIMIT = 5
"""Minutes a node's clearing job (``clear_user``) may run: a sweep of its scratch directories takes
seconds; a short limit lets Slurm fit it in before a reservation that starts soon."""
CLEAR_WAIT_SECONDS = 30.0
"""How long ``clear_user`` waits for its clearing jobs to end (the nodes free: a few seconds) before it
returns and leaves the rest queued. The caller removes the OS user next, which ``userdel`` refuses
while a process of it runs on the server's machine (a node too, on a one-machine cluster)."""


def clear_user(
    submitter: Submitter,
    run_as: RunAs,
    machines: Sequence[str] | None,
    partition: str | None,
    clears: Path,
) -> None:
    """Clear ``run_as`` off ``machines`` (None: every node Slurm knows), as the module says. BackendError
    when Slurm refuses a job (the others are submitted first)."""
    if run_as.uid == 0 or run_as.gid == 0:
        raise BackendError(f"cannot clear {run_as.user}: uid 0 is root")
    client = submitter.client
    try:
        _cancel_jobs_of(client, run_as.user)
        targets = machines if machines is not None else [n.name for n in client.nodes()]
    except SlurmError as error:
        raise BackendError(f"Slurm does not answer: {error}") from None
    refused, submitted = [], {}
    for machine in targets:
        try:
            submitted[_submit_clear(submitter, run_as.uid, machine, partition, clears)] = machine
        except SlurmError as error:
            refused.append(f"{machine}: {error.detail}")
    if refused:
        raise BackendError(f"cannot clear uid {run_as.uid} on every node: {'; '.join(refused)}")
    queued = _wait_for_jobs(client, submitted, CLEAR_WAIT_SECONDS)
    if queued:
        log.warning(
            "uid %s: its sweep still waits for nodes %s (Slurm jobs %s)",
            run_as.uid,
            ",".join(sorted(submitted[job_id] for job_id in queued)),
            ",".join(map(str, sorted(queued))),
        )


def _wait_for_jobs(client: SlurmClient, job_ids: Iterable[int], seconds: float) -> set[int]:
    """Wait until Slurm says each job has ended, for up to ``seconds``; those still live then."""
    live, until = set(job_ids), time.monotonic() + seconds
    while live:
        try:
            live &= {job.id for job in client.jobs() if job.state in LIVE_JOB_STATES}
        except SlurmError as error:
            log.info("%s", error)  # (not for us to wait on, then: the jobs go on by themselves)
            break
        if not live or time.monotonic() >= until:
            break
        time.sleep(0.5)
    return live


def _cancel_jobs_of(client: SlurmClient, user: str) -> None:
    """Every job of ``user``: those the server ran have ended, but the user may have submitted its
    own from inside them (its jobs left pending would start later, as nobody)."""
    try:
        client.run("scancel", f"--user={user}")
    except SlurmError as error:
        if "invalid user" not in error.detail.lower():
            raise  # (a user already gone from this machine has no job Slurm could name)


def _submit_clear(submitter: Submitter, uid: int, machine: str, partition: str | None, clears: Path) -> int:
    """One node's clearing job, as root (the server's own user: no ``runuser``)."""
    command = shlex.join([submitter.python, "-I", "-S", str(submitter.tools / SCRATCH_FILE), str(uid)])
    options = [
        f"--job-name=hp-clear.{uid}.{machine}",  # outside the prefix: adopt never cancels it
        f"--nodelist={machine}",
        "--nodes=1",
        "--ntasks=1",
        NO_REQUEUE,
        f"--time={CLEAR_TIME_LIMIT}",
        f"--chdir={clears}",
        f"--output={clears / f'{uid}.{machine}.log'}",
        *([f"--partition={partition}"] if partition else []),
        f"--wrap={command}",
    ]
    return submitter.sbatch(None, options, None)
