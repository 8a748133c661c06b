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
    span's start or end meets an interval's start or end, or where the span stops meeting an added
    interval. Spans between two added intervals that meet neither are not counted: when a purchase's
    segments lie far apart, what is held between them did not change.
    """
    added = list(around)
    if not added:
        return 0.0
    # A span starting in [s - window, e] meets the added interval (s, e).
    reaches = [(s - window, e) for s, e, _ in added]
    low = min(first for first, _ in reaches)
    high = max(last for _, last in reaches)
    relevant = [i for i in intervals if i[1] > low and i[0] < high + window]
    candidates = {edge for reach in reaches for edge in reach}
    for s, e, _ in relevant:
        for edge in (s, e):
            candidates.update((edge, edge - window))
    best = 0.0
    for start in candidates:
        if any(first <= start <= last for first, last in reaches):
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
