"""Deterministic background load: bookings that make a demo calendar look like a busy shared fleet.

Time is cut into 11:30-to-11:30 UTC days, and days into *cycles* of ``cycle_days`` (the fleet's
``[background_load]``). Every cycle of every reservable pool opens with a quiet run of ``quiet_days``
days, where ``quiet_booked`` of the pool is booked, and closes with a busy run where ``busy_booked`` is.
Each pool's cycles are shifted by their own phase, so that pools are not quiet at the same time.

The cycles are anchored to absolute days, not to ``now``: the same (fleet, seed) gives the same bookings
for overlapping stretches whatever ``now`` is, so a caller can add the next stretch as time moves on.

What this guarantees (the demo fleet's tests check it): a pool's capacity is free for a count c on at
most ``quiet_days`` days in a row whenever ``busy_booked`` leaves fewer than c free, and on at least
``quiet_days`` days in every cycle whenever ``quiet_booked`` leaves c free. With the defaults, on the
demo's ml.p5.48xlarge pools, 16 instances are free 5-7 days in a row and then not for 5-7 days, so a
10-day hyperpod-cluster search must split into two segments, while 2 instances for 4 days fit at once.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime, timedelta

from hyperplan.core.fleet import BackgroundLoad, Fleet, Pool
from hyperplan.core.offerings import Segment

DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MARGIN_DAYS = 14  # load past the horizon, so plans that start near the horizon meet some contention


def background_bookings(fleet: Fleet, now: datetime, seed: int) -> list[Segment]:
    """Bookings over every cycle that overlaps ``[now, now + horizon + 14 days]``, in every pool that
    plans can book; never above a pool's reservable count. Empty when the fleet declares no load."""
    load = fleet.background_load
    if load is None:
        return []
    first_boundary = datetime.combine(_EPOCH.date(), fleet.policy.segment_end, tzinfo=UTC)
    first_day = (now - first_boundary) // DAY
    last_day = (now + fleet.policy.horizon + _MARGIN_DAYS * DAY - first_boundary) // DAY
    bookings: list[Segment] = []
    for pool in fleet.pools:
        if pool.reservable > 0:
            for cycle in _cycles_over(pool, load, seed, first_day, last_day):
                bookings.extend(_cycle_bookings(pool, load, seed, cycle, first_boundary))
    return bookings


def _phase(pool: Pool, load: BackgroundLoad, seed: int) -> int:
    return int(_draws(seed, pool, "phase", 1)[0] * load.cycle_days)


def _cycles_over(pool: Pool, load: BackgroundLoad, seed: int, first_day: int, last_day: int) -> range:
    """Numbers of the cycles of ``pool`` that overlap days ``first_day .. last_day``."""
    phase = _phase(pool, load, seed)
    return range((first_day - phase) // load.cycle_days, (last_day - phase) // load.cycle_days + 1)


def _cycle_bookings(
    pool: Pool, load: BackgroundLoad, seed: int, cycle: int, first_boundary: datetime
) -> list[Segment]:
    quiet_draw, quiet_level_draw, busy_level_draw = _draws(seed, pool, f"cycle {cycle}", 3)
    low, high = load.quiet_days
    quiet_days = low + int(quiet_draw * (high - low + 1))
    quiet = math.floor(_between(load.quiet_booked, quiet_level_draw) * pool.reservable)
    busy = max(math.ceil(_between(load.busy_booked, busy_level_draw) * pool.reservable), quiet)
    busy = min(busy, pool.reservable)
    start_day = cycle * load.cycle_days + _phase(pool, load, seed)
    start, stop = (first_boundary + day * DAY for day in (start_day, start_day + load.cycle_days))
    # The quiet level holds all cycle long; the surge adds the rest for the busy run.
    surge_start = first_boundary + (start_day + quiet_days) * DAY
    return [
        *(Segment(pool.key, start, stop, count) for count in _plan_sized(quiet)),
        *(Segment(pool.key, surge_start, stop, count) for count in _plan_sized(busy - quiet)),
    ]


def _plan_sized(total: int) -> list[int]:
    """``total`` as counts a plan could have (powers of two, largest first), e.g. 37 -> 32, 4, 1."""
    return [1 << bit for bit in reversed(range(total.bit_length())) if total >> bit & 1]


def _between(bounds: tuple[float, float], draw: float) -> float:
    return bounds[0] + draw * (bounds[1] - bounds[0])


def _draws(seed: int, pool: Pool, topic: str, n: int) -> list[float]:
    """``n`` numbers in [0, 1), the same on every machine for the same arguments."""
    text = f"{seed}|{pool.instance_type}|{pool.availability_zone}|{topic}".encode()
    digest = hashlib.blake2b(text, digest_size=8 * n).digest()
    return [int.from_bytes(digest[8 * i : 8 * i + 8], "big") / 2**64 for i in range(n)]
