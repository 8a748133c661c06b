"""Quota arithmetic, as values: a type's share cap, and the busiest rolling window of instance-hours.

The services (services/quotas.py) read what an account holds from the store and ask these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

Interval = tuple[datetime, datetime, int]
"""Held from start to end, this many instances."""

HOUR = timedelta(hours=1)


def share_cap(reservable: int, share: float) -> int:
    """The instances of a type one account may hold at once under a share of the type's reservable
    instances: rounded down, but at least one, so that a small pool is not closed to everyone."""
    return max(1, math.floor(reservable * share + 1e-9))


def instance_hours(interval: Interval, start: datetime, end: datetime) -> float:
    """The instance-hours of an interval that fall between start and end."""
    s, e, count = interval
    overlap = min(e, end) - max(s, start)
    return count * max(overlap, timedelta(0)) / HOUR


def busiest_window(intervals: Sequence[Interval], window: timedelta, around: Iterable[Interval]) -> float:
    """The most instance-hours the intervals hold in any ``window``-long span that meets one of
    ``around`` (the intervals being added: a span that meets none of them did not change).

    The held hours are piecewise linear in the span's start, so the most is at a breakpoint: where the
    span's start or end meets an interval's start or end.
    """
    added = list(around)
    if not added:
        return 0.0
    low = min(s for s, _, _ in added) - window
    high = max(e for _, e, _ in added)
    relevant = [i for i in intervals if i[1] > low and i[0] < high + window]
    candidates = {low, high}
    for s, e, _ in relevant:
        for edge in (s, e):
            candidates.update((edge, edge - window))
    best = 0.0
    for start in candidates:
        if low <= start <= high:
            best = max(best, sum(instance_hours(i, start, start + window) for i in relevant))
    return best


def on_demand_cap(
    on_demand: int, own: int | None, fleet_count: int | None, fleet_share: float | None
) -> int | None:
    """The on-demand instances of a type one account may hold at once (None: no quota): its own number if
    an administrator set one; else the fleet's number, capped by the fleet's share of the type's
    ``on_demand`` instances when that is less (a type with none has no share to cap)."""
    if own is not None:
        return own
    allowed = fleet_count
    if fleet_share is not None and on_demand > 0:
        capped = share_cap(on_demand, fleet_share)
        allowed = capped if allowed is None else min(allowed, capped)
    return allowed
