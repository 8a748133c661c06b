"""The rankings (docs/PLANNING.md), over small random calendars: no ranking offers a placement that does
not fit or that would book a pool above its count; the earliest ranking's first offering is always among
the packing ranking's; the same calendar and request give the same offerings. And the LP upper bound is
at least the best booking found by brute force on small random instances; a packing score, added up from
its parts, is what its definition gives."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.bound import Job, exact_optimum, lp_bound
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import BookingPolicy, Fleet
from hyperplan.core.offerings import Offering
from hyperplan.core.search import search
from hyperplan.core.search_days import _EDGE_WEIGHT, packing_ends
from hyperplan.core.search_request import SearchRequest
from tests.core.support import fleet, pool, utc

NOW = utc(2026, 3, 2, 9, 17, 23)  # not on a slot, a minute or a day boundary
BOUNDARY = utc(2026, 3, 2, 11, 30)
DAY = timedelta(days=1)

Booking = tuple[int, int, int, int]  # (pool index, first day, days, count)


@st.composite
def situations(draw: st.DrawFn) -> tuple[Fleet, list[Booking], SearchRequest]:
    pools = tuple(pool(zone, draw(st.integers(2, 6))) for zone in "ab"[: draw(st.integers(1, 2))])
    policy = BookingPolicy(
        allowed_counts=None, horizon=timedelta(days=10), max_offerings=draw(st.integers(1, 4))
    )
    bookings = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(pools) - 1), st.integers(-1, 12), st.integers(1, 4), st.integers(1, 3)
            ),
            max_size=8,
        )
    )
    count = draw(st.integers(1, min(p.reservable for p in pools)))
    hours = draw(st.integers(1, 6 * 24))
    target = draw(st.sampled_from(("training-job", "hyperpod-cluster")))
    start_after = draw(st.none() | st.integers(0, 5 * 24).map(lambda h: NOW + timedelta(hours=h)))
    end_before = draw(st.none() | st.integers(2, 14).map(lambda d: BOUNDARY + d * DAY))
    if start_after is not None and end_before is not None and end_before < start_after + DAY:
        end_before = None
    request = SearchRequest("ml.p5.48xlarge", count, hours, target, start_after, end_before)
    return fleet(*pools, policy=policy), bookings, request


def calendar_of(the_fleet: Fleet, bookings: list[Booking]) -> CapacityCalendar:
    """The bookings that fit, in order (a booking that does not is left out)."""
    calendar = CapacityCalendar(the_fleet.pools)
    for index, first, days, count in bookings:
        key, start = the_fleet.pools[index].key, BOUNDARY + first * DAY
        if calendar.can_book(key, start, start + days * DAY, count):
            calendar.book(key, start, start + days * DAY, count)
    return calendar


def ranked(the_fleet: Fleet, ranking: str) -> Fleet:
    return replace(the_fleet, policy=replace(the_fleet.policy, ranking=ranking))


def check_placeable(
    the_fleet: Fleet, bookings: list[Booking], request: SearchRequest, offer: Offering
) -> None:
    soonest = NOW + timedelta(minutes=30)
    if request.start_after is not None:
        soonest = max(soonest, request.start_after)
    end_limit = request.end_before or NOW + the_fleet.policy.horizon
    assert offer.start >= soonest - timedelta(minutes=1)
    assert offer.end <= end_limit
    assert len(offer.segments) <= the_fleet.policy.max_segments
    whole_days = sum((s.end - s.start) // DAY for s in offer.segments)
    assert whole_days == -(-request.duration_hours // 24)
    if request.target == "hyperpod-cluster":
        assert len({s.pool_key for s in offer.segments}) == 1
    # Booked one after the other on the calendar as it was: every segment fits, none overbooks.
    calendar = calendar_of(the_fleet, bookings)
    for segment in offer.segments:
        assert segment.count == request.instance_count
        calendar.book(
            segment.pool_key, segment.start, segment.end, segment.count
        )  # raises if it does not fit


@settings(max_examples=30, deadline=None)
@given(situations())
def test_every_ranking_offers_only_placements_that_fit(
    situation: tuple[Fleet, list[Booking], SearchRequest],
) -> None:
    the_fleet, bookings, request = situation
    for ranking in ("packing", "earliest"):
        offers = search(ranked(the_fleet, ranking), calendar_of(the_fleet, bookings), request, NOW)
        assert len(offers) <= the_fleet.policy.max_offerings
        for offer in offers:
            check_placeable(the_fleet, bookings, request, offer)


@settings(max_examples=30, deadline=None)
@given(situations())
def test_packing_keeps_the_earliest_offering_and_is_deterministic(
    situation: tuple[Fleet, list[Booking], SearchRequest],
) -> None:
    the_fleet, bookings, request = situation
    earliest = search(ranked(the_fleet, "earliest"), calendar_of(the_fleet, bookings), request, NOW)
    packing = search(ranked(the_fleet, "packing"), calendar_of(the_fleet, bookings), request, NOW)
    again = search(ranked(the_fleet, "packing"), calendar_of(the_fleet, bookings), request, NOW)
    assert packing == again
    assert bool(packing) == bool(earliest)  # packing offers something exactly when a placement exists
    if earliest:
        assert earliest[0] in packing
        assert len(packing[0].segments) == len(earliest[0].segments)  # fewest segments still first


def test_packing_places_where_the_pool_is_least_loaded_and_flush_with_its_neighbours() -> None:
    """One pool of 8 with 6 booked until day 2; 2 instances for 2 days. Earliest fills the 2 left on the
    busy days; packing keeps those days for later requests that need only a little, and takes the first
    empty days, flush against the busy ones, not somewhere in the middle of the empty stretch. The
    earliest offering is still offered."""
    the_fleet = fleet(pool("a", 8), policy=BookingPolicy(allowed_counts=None, horizon=timedelta(days=10)))
    calendar = CapacityCalendar(the_fleet.pools)
    calendar.book(the_fleet.pools[0].key, NOW, BOUNDARY + 2 * DAY, 6)
    request = SearchRequest("ml.p5.48xlarge", 2, 48, "training-job")
    earliest = search(ranked(the_fleet, "earliest"), calendar, request, NOW)
    packing = search(the_fleet, calendar, request, NOW)
    assert earliest[0].end == BOUNDARY + 2 * DAY
    assert (packing[0].start, packing[0].end) == (BOUNDARY + 2 * DAY, BOUNDARY + 4 * DAY)
    assert earliest[0] in packing


# -- the bound ---------------------------------------------------------------------------------------


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[Job], list[int]]:
    capacity = [draw(st.integers(1, 3))]
    jobs = []
    for _ in range(draw(st.integers(1, 3))):
        days = draw(st.integers(1, 3))
        first = draw(st.integers(0, 2))
        stop = draw(st.integers(first + days, 6))
        jobs.append(Job(draw(st.integers(1, capacity[0])), days, first, stop, (0,)))
    return jobs, capacity


def best_by_brute_force(jobs: list[Job], capacity: list[int], contiguous: bool) -> int:
    """Every job booked or not, on any set of its days (any number of segments), or on a run of them."""

    def placements(job: Job) -> list[tuple[int, ...] | None]:
        days = range(job.first, job.stop)
        if contiguous:
            runs = [tuple(range(s, s + job.days)) for s in range(job.first, job.stop - job.days + 1)]
            return [None, *runs]
        return [None, *itertools.combinations(days, job.days)]

    best = 0
    for choice in itertools.product(*(placements(job) for job in jobs)):
        held: dict[int, int] = {}
        for job, days in zip(jobs, choice, strict=True):
            for day in days or ():
                held[day] = held.get(day, 0) + job.count
        if all(total <= capacity[0] for total in held.values()):
            best = max(best, sum(job.instance_days for job, days in zip(jobs, choice, strict=True) if days))
    return best


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 3).flatmap(
        lambda pools: st.lists(
            st.lists(st.integers(0, 40), min_size=pools, max_size=pools), min_size=1, max_size=12
        )
    ),
    st.integers(1, 8),
)
def test_a_packing_score_is_the_sum_of_its_parts(columns: list[list[int]], count: int) -> None:
    """opens[p, s] + closes[p, e] + count x (e - s) is, for every placement [s, e) of every pool, the
    score as docs/PLANNING.md defines it: the edge weight x how much the free count's steps at its two
    ends grow (the day before the window full, none after it), less what it leaves free while it holds."""
    free = np.array(columns, dtype=np.int64).T  # (pools, days)
    opens, closes = packing_ends(free, count)
    for p, row in enumerate(free.tolist()):
        before = [0, *row]  # the free count of the day before each day, the day before the window full
        step = [before[j] - row[j] for j in range(len(row))] + [0]
        for s, e in itertools.combinations(range(len(row) + 1), 2):
            grows = abs(step[s] + count) - abs(step[s]) + abs(step[e] - count) - abs(step[e])
            left_free = sum(row[s:e]) - count * (e - s)
            assert opens[p, s] + closes[p, e] + count * (e - s) == _EDGE_WEIGHT * grows - left_free


@given(instances())
def test_the_lp_bound_is_at_least_the_best_booking(instance: tuple[list[Job], list[int]]) -> None:
    jobs, capacity = instance
    bound = lp_bound(jobs, capacity)
    any_split = best_by_brute_force(jobs, capacity, contiguous=False)
    one_segment = best_by_brute_force(jobs, capacity, contiguous=True)
    assert bound >= any_split - 1e-6
    assert abs(exact_optimum(jobs, capacity) - one_segment) < 1e-6
