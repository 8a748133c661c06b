"""A calendar about 80% booked: random whole-day segments, booked until the target fraction is reached.

Segments follow the booking policy's day grid (11:30 UTC to 11:30 UTC) inside the 120-day window that
starts at the first boundary after ``now + lead_time``, so every booking is one a search could have
offered. The same bookings serve the in-process benchmark (booked straight into a
:class:`CapacityCalendar`) and the HTTP ones (written to a server's store as plans before it starts).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hyperplan.core.calendar import SLOTS_PER_DAY, CapacityCalendar
from hyperplan.core.fleet import Fleet, Pool

WINDOW_DAYS = 120
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Booking:
    pool_index: int
    start: datetime
    end: datetime
    count: int


@dataclass(frozen=True)
class FillSpec:
    target: float = 0.80  # booked fraction of reservable instance-slots over the window
    counts: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_days: int = 14
    max_plans: int | None = None  # stop at this many bookings even below the target
    seed: int = 7


def window_start(fleet: Fleet, now: datetime) -> datetime:
    """The first day boundary a plan may start on: ``segment_end`` at or after ``now + lead_time``."""
    earliest = now + fleet.policy.lead_time
    boundary = datetime.combine(earliest.date(), fleet.policy.segment_end, tzinfo=UTC)
    return boundary if boundary >= earliest else boundary + DAY


def reservable_pools(fleet: Fleet) -> list[tuple[int, Pool]]:
    return [(index, pool) for index, pool in enumerate(fleet.pools) if pool.reservable > 0]


def capacity_slots(fleet: Fleet, days: int = WINDOW_DAYS) -> int:
    return sum(pool.reservable for _, pool in reservable_pools(fleet)) * days * SLOTS_PER_DAY


def booked_fraction(
    fleet: Fleet, calendar: CapacityCalendar, start: datetime, days: int = WINDOW_DAYS
) -> float:
    """Booked over reservable instance-slots of every reservable pool in ``[start, start + days)``."""
    end = start + days * DAY
    booked = sum(int(calendar.booked(pool.key, start, end).sum()) for _, pool in reservable_pools(fleet))
    return booked / capacity_slots(fleet, days)


def fill(
    fleet: Fleet, calendar: CapacityCalendar, now: datetime, spec: FillSpec = FillSpec()
) -> list[Booking]:
    """Book random segments into ``calendar`` until ``spec.target`` of the window is booked (or
    ``spec.max_plans`` bookings are made, or nothing more fits). Returns the bookings in booking order."""
    rng = random.Random(spec.seed)
    start = window_start(fleet, now)
    pools = reservable_pools(fleet)
    weights = [pool.reservable for _, pool in pools]
    capacity, booked = capacity_slots(fleet), 0
    bookings: list[Booking] = []
    misses = 0
    while booked < spec.target * capacity and misses < 20_000:
        if spec.max_plans is not None and len(bookings) >= spec.max_plans:
            break
        index, pool = rng.choices(pools, weights)[0]
        booking = _random_booking(rng, spec, index, pool, start, shrink=misses // 2_000)
        if booking is None or not calendar.can_book(pool.key, booking.start, booking.end, booking.count):
            misses += 1
            continue
        calendar.book(pool.key, booking.start, booking.end, booking.count)
        bookings.append(booking)
        booked += booking.count * _days(booking) * SLOTS_PER_DAY
        misses = 0
    return bookings


def _random_booking(
    rng: random.Random, spec: FillSpec, index: int, pool: Pool, window: datetime, shrink: int
) -> Booking | None:
    """A random segment; the longer nothing has fit, the smaller the segments tried (``shrink``)."""
    counts = [c for c in spec.counts if c <= pool.reservable]
    counts = counts[: max(len(counts) - shrink, 1)]
    days = rng.randint(1, max(spec.max_days >> shrink, 1))
    first = rng.randrange(WINDOW_DAYS - days + 1)
    start = window + first * DAY
    return Booking(index, start, start + days * DAY, rng.choice(counts)) if counts else None


def _days(booking: Booking) -> int:
    return (booking.end - booking.start) // DAY
