"""The search's rules of time on the busy demo calendar, at every awkward instant of tests.instants:
every offering starts no sooner than 30 minutes from now, ends at 11:30 UTC, opens every later segment
at 11:30, covers whole days (plus the partial first day when it starts between boundaries), starts
within the 56-day horizon, and costs what its segments' real lengths cost."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from functools import cache
from importlib import resources

import pytest

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.demo_load import background_bookings
from hyperplan.core.fleet import Fleet
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.offerings import Offering
from hyperplan.core.pricing import segment_price
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest
from tests.instants import at_awkward_instants

BOUNDARY = time(11, 30)
DAY = timedelta(days=1)
REQUESTS = [
    SearchRequest("ml.p5.48xlarge", 16, 240, "hyperpod-cluster", None, None),  # the console's example
    SearchRequest("ml.p5.48xlarge", 4, 30, "training-job", None, None),  # 30 h: two whole days
    SearchRequest("ml.p4d.24xlarge", 2, 24, "hyperpod-cluster", None, None),
    SearchRequest("ml.trn2.48xlarge", 8, 24 * 14, "training-job", None, None),
]


@cache
def demo() -> Fleet:
    return parse_fleet(resources.files("hyperplan.fleet").joinpath("demo.toml").read_text())


def busy_calendar(now: datetime) -> CapacityCalendar:
    calendar = CapacityCalendar(demo().pools)
    for booking in background_bookings(demo(), now, seed=0):
        calendar.book(booking.pool_key, booking.start, booking.end, booking.count)
    return calendar


def check_rules_of_time(offering: Offering, request: SearchRequest, now: datetime) -> None:
    soonest = now + timedelta(minutes=30)
    days = -(-request.duration_hours // 24)
    first, *later = offering.segments
    assert first.start >= soonest
    assert first.start.time() == BOUNDARY or first.start - soonest < timedelta(minutes=1)
    assert all(segment.start.time() == BOUNDARY for segment in later)
    assert all(
        segment.end.time() == BOUNDARY and segment.end.tzinfo is not None for segment in offering.segments
    )
    whole_days = sum((segment.end - max(segment.start, _boundary_at_or_after(segment.start))) // DAY
                     for segment in offering.segments)  # fmt: skip
    assert whole_days == days
    assert offering.start <= now + demo().policy.horizon
    assert all(a.end <= b.start for a, b in zip(offering.segments, later, strict=False))
    pools = {pool.key: pool for pool in demo().pools}
    fee = sum(segment_price(pools[s.pool_key], s.start, s.end, s.count) for s in offering.segments)
    assert offering.upfront_fee == fee


def _boundary_at_or_after(moment: datetime) -> datetime:
    boundary = datetime.combine(moment.astimezone(UTC).date(), BOUNDARY, tzinfo=UTC)
    return boundary if boundary >= moment else boundary + DAY


@at_awkward_instants
@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r.instance_count}x{r.instance_type}")
def test_every_offering_keeps_the_rules_of_time(start_instant: datetime, request_: SearchRequest) -> None:
    offerings = search(demo(), busy_calendar(start_instant), request_, start_instant)
    assert offerings, "the demo calendar is busy, never full"
    for offering in offerings:
        check_rules_of_time(offering, request_, start_instant)
