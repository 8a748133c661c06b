"""The packing ranking told how far ahead a window opens (docs/PLANNING.md, issue 54's grid): a window
that opens more than a week after the search is filled from its front when the load is close, one that
opens sooner is ranked as before; either way only placements that fit are offered, the earliest
ranking's first among them, the same each time."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import BookingPolicy, Fleet
from hyperplan.core.search import DaysRead, _offering, read_days
from hyperplan.core.search_plan import _Candidate, _Planner
from hyperplan.core.search_rank import _FAR_AHEAD_DAYS, _Packer
from hyperplan.core.search_request import SearchRequest
from tests.core.support import fleet, pool
from tests.core.test_packing import BOUNDARY, DAY, NOW, Booking, calendar_of, check_placeable, situations


def ranked(read: DaysRead, days_ahead: int | None) -> list[_Candidate]:
    return _Packer(_Planner(read.query, read.grids), days_ahead).best()


def first_start(read: DaysRead, days_ahead: int | None) -> int:
    return ranked(read, days_ahead)[0].segments[0][1]


def three_days_ten_days_ahead() -> DaysRead:
    """One pool of 8; 2 instances for 3 days in a window of 12 days that opens 10 days ahead, whose first
    2 days have 2 instances booked: those days are a little busier than the 10 after them."""
    the_fleet = fleet(pool("a", 8), policy=BookingPolicy(allowed_counts=None))
    calendar = CapacityCalendar(the_fleet.pools)
    opens = BOUNDARY + 10 * DAY
    calendar.book(the_fleet.pools[0].key, opens, opens + 2 * DAY, 2)
    request = SearchRequest("ml.p5.48xlarge", 2, 72, "training-job", opens, opens + 12 * DAY)
    return read_days(the_fleet, calendar, request, NOW)


def test_a_window_far_ahead_is_filled_from_its_front() -> None:
    read = three_days_ten_days_ahead()
    assert first_start(read, 10) == 0  # the window's first days, though a little busier
    assert first_start(read, _FAR_AHEAD_DAYS) == 0


def test_a_window_that_opens_within_a_week_is_ranked_as_before() -> None:
    read = three_days_ten_days_ahead()
    assert first_start(read, None) == 2  # the least loaded days, flush against the busier ones
    assert ranked(read, _FAR_AHEAD_DAYS - 1) == ranked(read, None)
    assert ranked(read, 0) == ranked(read, None)


@settings(max_examples=30, deadline=None)
@given(situations(), st.integers(0, 3 * _FAR_AHEAD_DAYS))
def test_far_ahead_offers_only_what_fits_with_the_earliest_first_among_them(
    situation: tuple[Fleet, list[Booking], SearchRequest], days_ahead: int
) -> None:
    the_fleet, bookings, request = situation
    read = read_days(the_fleet, calendar_of(the_fleet, bookings), request, NOW)
    planner = _Planner(read.query, read.grids)
    earliest = planner.best() if planner.fits is not None else []
    chosen = ranked(read, days_ahead) if planner.fits is not None else []
    if chosen:
        assert ranked(read, days_ahead) == chosen  # deterministic
    assert bool(chosen) == bool(earliest)
    assert len(chosen) <= the_fleet.policy.max_offerings
    if earliest:
        assert earliest[0] in chosen
        assert len(chosen[0].segments) == len(earliest[0].segments)  # fewest segments still first
    for candidate in chosen:
        check_placeable(the_fleet, bookings, request, _offering(read, candidate))
