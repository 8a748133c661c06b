from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.demo_load import background_bookings
from hyperplan.core.fleet import Fleet
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest

from .support import utc

P5 = "ml.p5.48xlarge"
NOW = utc(2026, 3, 4, 9, 17, 12)
nows = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31), timezones=st.just(UTC))
seeds = st.integers(0, 2**32)


@cache
def demo() -> Fleet:
    return parse_fleet(resources.files("hyperplan.fleet").joinpath("demo.toml").read_text())


def busy_calendar(now: datetime, seed: int = 0) -> CapacityCalendar:
    calendar = CapacityCalendar(demo().pools)
    for booking in background_bookings(demo(), now, seed):
        calendar.book(
            booking.pool_key, booking.start, booking.end, booking.count
        )  # raises if above reservable
    return calendar


def test_deterministic_and_only_in_pools_plans_can_book() -> None:
    bookings = background_bookings(demo(), NOW, 0)
    assert bookings == background_bookings(demo(), NOW, 0)
    assert bookings != background_bookings(demo(), NOW, 1)
    booked_types = {b.pool_key[0] for b in bookings}
    assert booked_types == set(demo().reservable_types())
    assert all(b.end.time() == demo().policy.segment_end for b in bookings)
    assert all(b.count in (1, 2, 4, 8, 16, 32, 64) for b in bookings)


def test_no_load_without_a_background_load_table() -> None:
    assert background_bookings(replace(demo(), background_load=None), NOW, 0) == []


def test_covers_the_horizon_and_is_the_same_whatever_the_day_it_is_computed() -> None:
    earlier = set(background_bookings(demo(), NOW, 0))
    later_now = NOW + timedelta(days=9)
    later = set(background_bookings(demo(), later_now, 0))
    horizon_end = NOW + demo().policy.horizon
    assert {b for b in earlier if b.end > later_now} <= later
    assert {b for b in later if b.start < horizon_end} - earlier == set()
    assert max(b.end for b in earlier) >= horizon_end


@settings(max_examples=25, deadline=None)
@given(nows, seeds)
def test_busy_but_not_full(now: datetime, seed: int) -> None:
    calendar = busy_calendar(now, seed)
    end = now + demo().policy.horizon
    for pool in demo().pools:
        if pool.reservable:
            booked = calendar.booked(pool.key, now, end)
            assert booked.max() <= pool.reservable
            assert 0.60 <= booked.mean() / pool.reservable <= 0.85
            assert (booked < pool.reservable).mean() > 0.5  # with gaps


@settings(max_examples=150, deadline=None)
@given(nows, seeds)
def test_the_console_example_gets_a_plan_in_two_segments_in_one_zone(now: datetime, seed: int) -> None:
    """16 x ml.p5.48xlarge for 10 days on a HyperPod cluster, window now + 30 min .. now + 8 weeks:
    no p5 pool has 10 free days in a row, so the best offering is two blocks in one zone."""
    calendar = busy_calendar(now, seed)
    window = {"start_after": now + timedelta(minutes=30), "end_before": now + timedelta(weeks=8)}
    offers = search(demo(), calendar, SearchRequest(P5, 16, 240, "hyperpod-cluster", **window), now)
    assert offers
    best = offers[0]
    assert len(best.segments) == 2
    assert len({s.pool_key for s in best.segments}) == 1
    assert sum(((s.end - s.start) for s in best.segments), timedelta()) >= timedelta(days=10)
    assert all(len(offer.segments) == 2 for offer in offers)

    small = search(demo(), calendar, SearchRequest(P5, 2, 96, "hyperpod-cluster"), now)
    assert small and len(small[0].segments) == 1
