"""Quota arithmetic, as values: a type's share cap, and the busiest rolling window of instance-hours.

The services (services/plans/quotas.py) read what an account holds from the store and ask these.
"""

from __future__ import annotations

import bisect
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

    One sweep over the breakpoints in time order, carrying the held amount and its slope, in whole
    microseconds (exact): O(n log n) in the intervals, where weighing every interval at every breakpoint
    was O(n²), which an account holding many plans paid at every purchase.
    """
    added = list(around)
    if not added:
        return 0.0
    origin = min(s for s, _, _ in added)

    def at(instant: datetime) -> int:
        return (instant - origin) // _MICROSECOND

    span = window // _MICROSECOND
    # A span starting in [s - window, e] meets the added interval (s, e).
    reaches = _merged((at(s) - span, at(e)) for s, e, _ in added)
    slope_changes: dict[int, int] = {}
    for s, e, count in intervals:
        begins, ends = at(s), at(e)
        # d(held)/d(start): +count while the span's end is inside the interval and its start before
        # it, -count while its start is inside and its end beyond; 0 elsewhere.
        for point, change in ((begins - span, count), (ends - span, -count), (begins, -count), (ends, count)):
            slope_changes[point] = slope_changes.get(point, 0) + change
    candidates = {edge for reach in reaches for edge in reach}
    best = held = slope = 0
    previous: int | None = None
    for point in sorted(candidates.union(slope_changes)):
        if previous is not None:
            held += slope * (point - previous)
        slope += slope_changes.get(point, 0)
        previous = point
        if _within(reaches, point):
            best = max(best, held)
    return best / (HOUR // _MICROSECOND)


_MICROSECOND = timedelta(microseconds=1)


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Closed spans, overlapping or touching ones merged, in order."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _within(spans: Sequence[tuple[int, int]], point: int) -> bool:
    """`point` lies in one of `spans` (merged, in order)."""
    index = bisect.bisect_right(spans, (point, math.inf)) - 1
    return index >= 0 and spans[index][0] <= point <= spans[index][1]


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
