"""The search gives exactly what it gave before it was made cheaper: the same offerings (pools, times,
counts, fees, order) or the same error, for every request of a seeded corpus, compared with the code of
that time kept in tests/core/search_reference.py.

The corpus mixes calendars like the benchmark's (several pools of a type, ~80% booked by whole-day
plans over a 120-day window) with small ones booked at odd minutes, under both rankings, 1 to 4
segments and 1 to 5 offerings; requests with and without windows, partial first days, windows that
leave only the soonest start, and bad ones. The calendar changes between requests (bookings, releases,
a pool's reservable count), so that whatever the search keeps between requests is checked to follow.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from hyperplan.core import search as live
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import BookingPolicy, Fleet, Pool
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import HyperplanError
from tests.core import search_reference as reference

from .support import fleet, utc

DAY = timedelta(days=1)
BIG, SMALL = "ml.p5.48xlarge", "ml.p4d.24xlarge"
Outcome = tuple[Any, ...]


def outcome(module: Any, the_fleet: Fleet, calendar: CapacityCalendar, asked: Any, now: datetime) -> Outcome:
    """What a search gives, as plain values both modules' results compare by."""
    try:
        offers = module.search(the_fleet, calendar, asked, now)
    except HyperplanError as exc:
        return ("error", type(exc).__name__, str(exc))
    return tuple(
        (
            o.target,
            tuple((s.pool_key, s.start, s.end, s.count, s.duration_hours_minutes) for s in o.segments),
            o.upfront_fee,
            o.currency,
            o.duration_hours_minutes,
        )
        for o in offers
    )


def check_same(the_fleet: Fleet, calendar: CapacityCalendar, asked: SearchRequest, now: datetime) -> bool:
    """Asserts both searches agree; returns what they gave."""
    old_request = reference.SearchRequest(*(getattr(asked, f) for f in SearchRequest.__dataclass_fields__))
    # The live search first, twice: what it keeps between requests must not change its answer.
    first = outcome(live, the_fleet, calendar, asked, now)
    again = outcome(live, the_fleet, calendar, asked, now)
    expected = outcome(reference, the_fleet, calendar, old_request, now)
    assert first == expected, (asked, now)
    assert again == expected, (asked, now)
    return expected


def found(outcome: Outcome) -> bool:
    return bool(outcome) and outcome[0] != "error"


def change(
    rng: random.Random, the_fleet: Fleet, calendar: CapacityCalendar, now: datetime, held: list[Any]
) -> None:
    """One change to the calendar: book, release, or a pool's reservable count."""
    pool = rng.choice(the_fleet.pools)
    roll = rng.random()
    if roll < 0.15 and held:
        calendar.release(*held.pop(rng.randrange(len(held))))
    elif roll < 0.25:
        calendar.set_reservable(pool.key, rng.randint(max(pool.reservable - 3, 0), pool.reservable))
    else:
        start = now + timedelta(minutes=rng.randint(-600, 20 * 24 * 60))
        count = rng.randint(1, max(pool.reservable, 1))
        booking = (pool.key, start, start + timedelta(minutes=rng.randint(30, 3 * 24 * 60)), count)
        if calendar.can_book(*booking):
            calendar.book(*booking)
            held.append(booking)


# -- calendars like the benchmark's -------------------------------------------------------------------


def bench_like_fleet(ranking: str, max_segments: int) -> Fleet:
    pools = (
        Pool(BIG, "us-west-2a", 128, 128, Decimal("55.04"), "USD"),
        Pool(BIG, "us-west-2b", 128, 128, Decimal("55.04"), "USD"),
        Pool(BIG, "us-west-2c", 104, 96, Decimal("55.04"), "USD"),
        Pool(SMALL, "us-west-2a", 64, 64, Decimal("32.77"), "USD"),
        Pool(SMALL, "us-west-2b", 64, 64, Decimal("31.10"), "USD"),
    )
    policy = BookingPolicy(
        horizon=timedelta(days=120), max_segments=max_segments, max_offerings=3, ranking=ranking
    )
    return fleet(*pools, policy=policy)


def filled(the_fleet: Fleet, rng: random.Random, start: datetime, share: float) -> CapacityCalendar:
    """Whole-day plans of 1-16 instances for 1-14 days until ``share`` of the window is booked."""
    calendar = CapacityCalendar(the_fleet.pools)
    capacity = sum(p.reservable for p in the_fleet.pools) * 120
    booked = misses = 0
    while booked < share * capacity and misses < 300:
        pool = rng.choices(the_fleet.pools, [p.reservable for p in the_fleet.pools])[0]
        count, days, first = rng.choice((1, 2, 4, 8, 16)), rng.randint(1, 14), rng.randint(0, 119)
        begin = start + first * DAY
        end = min(begin + days * DAY, start + 120 * DAY)
        if calendar.can_book(pool.key, begin, end, count):
            calendar.book(pool.key, begin, end, count)
            booked += count * ((end - begin) // DAY)
        else:
            misses += 1
    return calendar


def bench_like_request(rng: random.Random, the_fleet: Fleet, now: datetime) -> SearchRequest:
    kind = rng.choice((BIG, SMALL))
    days = rng.randint(1, 30) if rng.random() < 0.9 else rng.randint(31, 150)
    start_after = end_before = None
    roll = rng.random()
    if roll < 0.5:
        start_after = now + timedelta(hours=rng.randint(1, 100 * 24), minutes=rng.randint(0, 59))
    if roll < 0.25:
        end_before = (start_after or now) + (days + rng.randint(-1, 20)) * DAY
    return SearchRequest(
        instance_type=kind,
        instance_count=rng.choice((1, 2, 4, 8, 16, 32, 64)),
        duration_hours=days * 24 - rng.randrange(24),
        target=rng.choice(("training-job", "hyperpod-cluster")),
        start_after=start_after,
        end_before=end_before,
    )


def test_bench_like_calendars_give_the_same_offerings() -> None:
    rng = random.Random(20)
    offered = 0
    for case in range(6):
        ranking = ("packing", "earliest")[case % 2]
        the_fleet = bench_like_fleet(ranking, max_segments=2 if case < 4 else 3)
        origin = utc(2026, 12, 31, 23, 50)
        calendar = filled(the_fleet, rng, origin + timedelta(minutes=40), rng.choice((0.6, 0.8, 0.9)))
        held: list[Any] = []
        for _ in range(45):
            now = origin + timedelta(minutes=rng.randint(0, 3 * 24 * 60), seconds=rng.randint(0, 59))
            offered += found(check_same(the_fleet, calendar, bench_like_request(rng, the_fleet, now), now))
            if rng.random() < 0.2:
                change(rng, the_fleet, calendar, now, held)
    assert offered > 100  # the corpus is not all empty answers


# -- small calendars, odd minutes, every policy knob -------------------------------------------------------


def small_fleet(rng: random.Random) -> Fleet:
    zones = "abc"[: rng.randint(1, 3)]
    prices = [Decimal(rng.choice(("10.00", "12.34", "9.99"))) for _ in zones]
    pools = tuple(
        Pool(BIG, f"us-west-2{z}", 8, rng.randint(2, 8), price, "USD")
        for z, price in zip(zones, prices, strict=True)
    )
    policy = BookingPolicy(
        horizon=timedelta(days=rng.randint(3, 25)),
        min_days=1 if rng.random() < 0.9 else 2,
        max_days=182 if rng.random() < 0.8 else rng.choice((10, 4)),
        allowed_counts=rng.choice((None, None, (1, 2, 4, 8))),
        max_segments=rng.randint(1, 4),
        max_offerings=rng.randint(1, 5),
        ranking=rng.choice(("packing", "earliest")),
    )
    return fleet(*pools, policy=policy)


def small_request(rng: random.Random, now: datetime, the_fleet: Fleet) -> SearchRequest:
    horizon, largest = the_fleet.policy.horizon, min(p.reservable for p in the_fleet.pools)
    longest = 24 * min(horizon.days - 1, 9)  # hours: mostly plans that fit the window
    start_after = end_before = None
    if rng.random() < 0.5:
        start_after = now + timedelta(minutes=rng.randint(-600, int(horizon / timedelta(minutes=1)) + 600))
    if rng.random() < 0.4:
        end_before = (start_after or now) + timedelta(hours=rng.randint(12, 24 * 12))
    return SearchRequest(
        instance_type=BIG if rng.random() < 0.97 else SMALL,
        instance_count=rng.randint(1, largest) if rng.random() < 0.95 else rng.randint(0, 9),
        duration_hours=rng.randint(1, longest) if rng.random() < 0.95 else rng.randint(-1, 720),
        target=rng.choice(("training-job", "hyperpod-cluster")) if rng.random() < 0.97 else "endpoint",
        start_after=start_after,
        end_before=end_before,
    )


def stripes(rng: random.Random, the_fleet: Fleet, calendar: CapacityCalendar, now: datetime) -> None:
    """Whole days closed here and there in every pool, so that long plans need several segments."""
    boundary = now.replace(hour=11, minute=30, second=0, microsecond=0)
    share = rng.uniform(0.15, 0.5)
    for pool in the_fleet.pools:
        for day in range(-1, the_fleet.policy.horizon.days + 12):
            if rng.random() < share:
                start = boundary + day * DAY + timedelta(minutes=rng.choice((0, 0, 0, 30, 600)))
                if calendar.can_book(pool.key, start, start + DAY, pool.reservable):
                    calendar.book(pool.key, start, start + DAY, pool.reservable)


def test_small_calendars_give_the_same_offerings_and_errors() -> None:
    rng = random.Random(10)
    offered = errors = 0
    for _ in range(40):
        the_fleet = small_fleet(rng)
        calendar = CapacityCalendar(the_fleet.pools)
        now = utc(2026, 3, 2) + timedelta(minutes=rng.randint(0, 48 * 60), seconds=rng.randint(0, 59))
        held: list[Any] = []
        if rng.random() < 0.6:
            stripes(rng, the_fleet, calendar, now)
        for _ in range(rng.randint(0, 40)):
            change(rng, the_fleet, calendar, now, held)
        for _ in range(20):
            asked = small_request(rng, now, the_fleet)
            got = check_same(the_fleet, calendar, asked, now)
            offered += found(got)
            errors += got[:1] == ("error",)
            if rng.random() < 0.3:
                change(rng, the_fleet, calendar, now, held)
            now += timedelta(minutes=rng.choice((0, 1, 29, 30, 31, 600, 24 * 60)), seconds=rng.randint(0, 3))
    assert offered > 150 and errors > 20


def test_a_plan_fills_the_window_only_from_the_soonest_start() -> None:
    """StartTimeAfter so late that no boundary start is left: only the partial day can open a plan."""
    the_fleet = replace(bench_like_fleet("packing", 2), policy=BookingPolicy(horizon=timedelta(days=4)))
    calendar = CapacityCalendar(the_fleet.pools)
    now = utc(2026, 3, 2, 9, 17, 23)
    for minutes in (0, 60, 130, 131, 600):
        start_after = now + timedelta(days=4) - timedelta(minutes=minutes)
        for days in (1, 2):
            for target in ("training-job", "hyperpod-cluster"):
                asked = SearchRequest(BIG, 8, days * 24, target, start_after)
                check_same(the_fleet, calendar, asked, now)
