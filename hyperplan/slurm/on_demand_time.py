"""How long on-demand work may run on a Slurm fleet, and when a reservation takes its nodes (values only).

On a Slurm fleet on-demand work (cluster nodes and training jobs without a plan) runs in the partition,
outside reservations, next to the plans' reservations on the same nodes. Slurm never places work where it
would run into a reservation, and never ends it for one (hyperplan makes its reservations with
``IGNORE_JOBS``), so the service decides:

- **At submission** (:func:`time_limit`): a limit ending :data:`MARGIN` before the earliest reservation
  ahead on any node the work may land on, so that Slurm may place it on those nodes until then; with no
  reservation ahead, no limit at all (``UNLIMITED``), as on the local back end, where on-demand work runs
  until it ends (or ``MaxRuntimeInSeconds``). A reservation too close to leave a minute of work before
  the margin is no reason to cut the work short: Slurm does not place work on its nodes anyway.
- **When a reservation lands later** on nodes where on-demand work runs (:func:`shortened_limit`): the
  work's limit is cut to end :data:`MARGIN` before the reservation, a backstop that holds even if no
  server runs then.
- **When the reservation is near** (:func:`taken`): the work on its nodes is ended by the service, within
  a lead (the margin and the work's grace between SIGTERM and SIGKILL) of the reservation's start.

Times are real (UTC) instants; the callers turn a manual or accelerated clock's service time into them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

MARGIN = timedelta(minutes=2)
"""On-demand work ends this long before the next reservation on its nodes (Slurm counts in minutes)."""
SLURM_MINIMUM = timedelta(minutes=1)
"""The shortest time limit Slurm takes."""


@dataclass(frozen=True)
class Ahead:
    """A reservation on some of a pool's nodes: ``start`` None when it has started."""

    name: str
    nodes: tuple[str, ...]
    start: datetime | None


def time_limit(starts: Iterable[datetime], now: datetime) -> timedelta | None:
    """The limit for work submitted outside reservations at ``now`` that may land on nodes with
    reservations starting at ``starts``: None (unlimited) when none leaves room for a minute of work."""
    room = [start - now - MARGIN for start in starts if start - now - MARGIN >= SLURM_MINIMUM]
    return min(room) if room else None


def taken(reservations: Iterable[Ahead], now: datetime, lead: timedelta) -> dict[str, str]:
    """The nodes (-> the reservation's name) whose on-demand work is to be ended at ``now``: those of
    reservations that have started or start within ``lead``. A node two reservations name goes to the
    earlier one."""
    found: dict[str, tuple[datetime, str]] = {}
    for reservation in reservations:
        start = now if reservation.start is None else reservation.start
        if start > now + lead:
            continue
        for node in reservation.nodes:
            if node not in found or start < found[node][0]:
                found[node] = (start, reservation.name)
    return {node: name for node, (_, name) in sorted(found.items())}


def shortened_limit(
    job_start: datetime, job_end: datetime | None, reservation_start: datetime, now: datetime, lead: timedelta
) -> int | None:
    """The time limit, in whole minutes from its start, to give a running job outside reservations
    (ending at ``job_end``, None: unlimited) on a node of a reservation starting at
    ``reservation_start``, so that it ends :data:`MARGIN` before it; None when nothing is to change: it
    ends in time already, or the reservation is within ``lead`` (the work is then ended by the service,
    with its grace, rather than cut by Slurm)."""
    deadline = reservation_start - MARGIN
    if reservation_start <= now + lead or (job_end is not None and job_end <= deadline):
        return None
    return max(1, int((deadline - job_start).total_seconds() // 60))
