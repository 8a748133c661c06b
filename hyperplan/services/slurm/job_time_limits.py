"""Slurm jobs' time limits following the plans' reservations (each pass of slurm_reservations).

Work running outside reservations (on-demand) on a node of a reservation still ahead is cut to end
before it starts (slurm/on_demand_time.py); the jobs in a reservation whose end moved (an extension, a
manual clock's drift) move their time limit by as much.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from hyperplan.core.hostlist import compress
from hyperplan.services.slurm.desired_reservations import Desired
from hyperplan.services.slurm.reservation_notes import Note
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.on_demand_time import Ahead, shortened_limit
from hyperplan.slurm.parse import Job

log = logging.getLogger(__name__)


def outside_jobs(client: SlurmClient) -> list[Job]:
    """The jobs running outside any reservation (on-demand work)."""
    return [
        job
        for job in client.jobs()
        if job.reservation is None and job.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
    ]


def shorten_on_demand(
    client: SlurmClient, ahead: Sequence[Ahead], outside: Sequence[Job], real_now: datetime, lead: timedelta
) -> None:
    """Work running outside reservations on a node of a reservation still ahead gets a time limit that
    ends it before (as root: ``scontrol update JobId=N TimeLimit=M``, minutes from its start): the
    reservation may have been made after the work started, without a limit or with one ending later."""
    for reservation in ahead:
        if reservation.start is None:
            continue
        for job in outside:
            if job.start is None or not set(job.nodes) & set(reservation.nodes):
                continue
            minutes = shortened_limit(job.start, job.end, reservation.start, real_now, lead)
            if minutes is None:
                continue
            try:
                client.run("scontrol", "update", f"JobId={job.id}", f"TimeLimit={minutes}")
            except SlurmError as error:
                log.warning(
                    "could not limit Slurm job %s before %s: %s", job.id, reservation.name, error.detail
                )
                continue
            log.info(
                "Slurm job %s (outside reservations, on %s) now ends before reservation %s: TimeLimit=%d",
                job.id, compress(job.nodes), reservation.name, minutes,
            )  # fmt: skip


class PassQueue:
    """Slurm's queue (``squeue --json``) as one pass reads it: at most once, when a reservation's end
    first moves, its jobs kept by reservation. (Read for each reservation whose end moved, a pass that
    corrected many ends read and parsed the whole queue each time.) A failed read is tried again at the
    next reservation that needs it."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        self._by_reservation: dict[str, list[Job]] | None = None

    def jobs_in(self, reservation: str) -> list[Job]:
        """The jobs naming `reservation`; SlurmError when the queue cannot be read."""
        if self._by_reservation is None:
            found: dict[str, list[Job]] = {}
            for job in self.client.queue():
                if job.reservation is not None:
                    found.setdefault(job.reservation, []).append(job)
            self._by_reservation = found
        return self._by_reservation.get(reservation, [])


def follow_end(
    client: SlurmClient, want: Desired, before: datetime, after: datetime, queue: PassQueue | None = None
) -> list[Note]:
    """The reservation's end moved (an extension, or a manual clock's drift): the jobs in it move their
    time limit by as much (as root: ``scontrol update JobId=... TimeLimit=+N|-N``, in whole minutes
    rounded so that no job ends after its reservation). Their limit was the reservation's end, at most.
    `queue`: the pass's (read once for all its reservations); None: read for this one."""
    seconds = (after - before).total_seconds()
    minutes = int(seconds // 60) if seconds >= 0 else -int(-seconds // 60 + (1 if -seconds % 60 else 0))
    if minutes == 0:
        return []
    moved = []
    try:
        jobs = (queue or PassQueue(client)).jobs_in(want.name)
    except SlurmError as error:
        log.warning("could not read the jobs of Slurm reservation %s: %s", want.name, error.detail)
        return []
    for job in jobs:
        if job.state not in ("PENDING", "RUNNING", "SUSPENDED"):
            continue
        try:
            client.run("scontrol", "update", f"JobId={job.id}", f"TimeLimit={minutes:+d}")
        except SlurmError as error:
            log.warning("could not move the time limit of Slurm job %s: %s", job.id, error.detail)
            continue
        moved.append(str(job.id))
    if not moved:
        return []
    message = (
        f"Slurm job(s) {', '.join(moved)} in reservation {want.name}: time limit moved by {minutes:+d} "
        "minute(s) with the reservation's end."
    )
    return [Note(want.plan_id, "slurm-jobs-time-moved", message)]
