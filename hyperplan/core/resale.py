"""Resale of returned capacity: which of a returned window's instances a new booking needed, and what the
returning account is credited for them (issue 53; services/plans/resale.py reads and writes the rows).

Capacity a plan gives back goes to the calendar at once, and the next booking may take it. An instance of
a returned window counts as resold only where the booking could not have been served without it: per
30-minute slot (core/calendar.py's, a booking holds every slot it touches), the booking's count less the
pool's free instances of its own (reservable, less what everything else holds, less the returned
instances still unsold) is what it took from the returned windows, at most what they still held unsold.
So capacity that would have been free anyway earns nothing, and no instance-hour is resold twice.

Several returned windows covering one slot are drawn from in the order given (the service gives the
earliest returned first): a deterministic rule, and each returning account is credited only for what it
gave back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal

from hyperplan.core.calendar import slot_start

_HOUR_SECONDS = Decimal(3600)


def free_of_its_own(reservable: int, held: Sequence[int], unsold: Sequence[Sequence[int]]) -> list[int]:
    """Per slot, the instances the pool had free before the booking without the returned windows:
    `reservable` less what the pool's other bookings `held` there, less every window's `unsold` there
    (each window's counts aligned with `held`). Never below 0 (a pool shrunk below what it sold)."""
    return [
        max(0, reservable - held_here - sum(window[i] for window in unsold))
        for i, held_here in enumerate(held)
    ]


def resold(count: int, free: Sequence[int], unsold: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per window (in the order of `unsold`), per slot: the instances a new booking of `count` took
    from it. In each slot the booking needed max(0, count - free) of the returned instances (`free`:
    free_of_its_own), drawn from the windows in order, each at most what it still held unsold."""
    if count < 0:
        raise ValueError(f"a booking holds at least 0 instances, not {count}")
    taken = [[0] * len(free) for _ in unsold]
    for i, free_here in enumerate(free):
        needed = max(0, count - free_here)
        for w, window in enumerate(unsold):
            if needed <= 0:
                break
            take = min(needed, max(0, window[i]))
            taken[w][i] = take
            needed -= take
    return taken


@dataclass(frozen=True)
class Span:
    """`count` instances resold over [start, end): one Resale row."""

    start: datetime
    end: datetime
    count: int

    def instance_hours(self) -> Decimal:
        """Exact, in Decimal: a credit is worked out from it without a float's rounding."""
        seconds = Decimal((self.end - self.start) // timedelta(microseconds=1)) / 1_000_000
        return self.count * seconds / _HOUR_SECONDS


def spans(first_slot: int, counts: Sequence[int], start: datetime, end: datetime) -> list[Span]:
    """`counts` (per slot from `first_slot`) as runs of one count each, none of 0, each clipped to
    [start, end) (the window's overlap with the booking: a slot it touches only in part is resold only
    for that part)."""
    result: list[Span] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        if counts[i] > 0:
            low, high = max(slot_start(first_slot + i), start), min(slot_start(first_slot + j), end)
            if low < high:
                result.append(Span(low, high, counts[i]))
        i = j
    return result


def credit(instance_hours: Decimal, price_per_instance_hour: Decimal, share: Decimal, places: int) -> Decimal:
    """What the returning account earns for resold instance-hours: their value at what it paid, times
    the policy's share, rounded down to the currency's minor unit (`places`)."""
    if instance_hours < 0 or not 0 <= share <= 1:
        raise ValueError(f"a credit of share {share} of {instance_hours} instance-hours")
    exact = instance_hours * price_per_instance_hour * share
    return exact.quantize(Decimal(1).scaleb(-places), rounding=ROUND_DOWN)


def room(paid: Decimal, refunded: Decimal, credited: Decimal) -> Decimal:
    """What a returning plan may still be credited: its refunds and credits never add up to more than
    it paid."""
    return max(Decimal(0), paid - refunded - credited)
