"""Quota arithmetic: share caps, the busiest 30 days of instance-hours against a brute-force count, the
on-demand cap, and the instance-hours an on-demand holder has started."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.metering import hour_start, hours_started
from hyperplan.core.quotas import Interval, busiest_window, instance_hours, on_demand_cap, share_cap

T0 = datetime(2027, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)
WINDOW = timedelta(days=30)


def test_a_share_rounds_down_but_never_closes_a_pool() -> None:
    assert share_cap(176, 0.5) == 88
    assert share_cap(5, 0.5) == 2
    assert share_cap(1, 0.5) == 1
    assert share_cap(10, 1.0) == 10
    assert share_cap(3, 1 / 3) == 1  # no float shortfall below a whole instance


def test_instance_hours_count_only_the_overlap() -> None:
    held: Interval = (T0, T0 + 2 * DAY, 4)
    assert instance_hours(held, T0 + DAY, T0 + 10 * DAY) == 96
    assert instance_hours(held, T0 + 3 * DAY, T0 + 10 * DAY) == 0


def test_the_busiest_window_finds_two_plans_a_month_apart_only_when_they_fit_in_30_days() -> None:
    first: Interval = (T0, T0 + 10 * DAY, 2)  # 480 instance-hours
    near: Interval = (T0 + 25 * DAY, T0 + 27 * DAY, 1)  # 48, within 30 days of the first's start
    far: Interval = (T0 + 45 * DAY, T0 + 47 * DAY, 1)  # 48, more than 30 days after the first's end
    assert busiest_window([first, near], WINDOW, [near]) == 528
    assert busiest_window([first, far], WINDOW, [far]) == 48
    assert busiest_window([first], WINDOW, []) == 0


def test_a_span_between_two_far_apart_added_intervals_that_meets_neither_is_not_counted() -> None:
    # Found by the property below: 20 days held between two added half-days 41 days apart. Every span
    # that meets an added half-day holds at most 19.5 of those days; a span meeting neither holds 20.
    held: Interval = (T0 + 11 * DAY, T0 + 31 * DAY, 1)
    early: Interval = (T0, T0 + DAY / 2, 1)
    late: Interval = (T0 + 41.5 * DAY, T0 + 42 * DAY, 1)
    assert busiest_window([held, early, late], WINDOW, [early, late]) == 468


intervals = st.lists(
    st.tuples(st.integers(0, 120), st.integers(1, 40), st.integers(1, 8)).map(
        lambda t: (T0 + t[0] * DAY / 2, T0 + (t[0] + t[1]) * DAY / 2, t[2])
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(held=intervals, added=intervals)
def test_the_busiest_window_is_the_most_any_30_days_touching_the_new_intervals_hold(
    held: list[Interval], added: list[Interval]
) -> None:
    everything = [*held, *added]
    found = busiest_window(everything, WINDOW, added)
    # Brute force: every span start on a 12-hour grid (every edge above lies on it) that meets an added one.
    brute = 0.0
    for step in range(-80, 260):
        start = T0 + step * DAY / 2
        end = start + WINDOW
        if any(s < end and e > start for s, e, _ in added) or any(
            e == start or s == end for s, e, _ in added
        ):
            brute = max(brute, sum(instance_hours(i, start, end) for i in everything))
    assert abs(found - brute) < 1e-6


minute_intervals = st.lists(
    st.tuples(st.integers(0, 90 * 24 * 60), st.integers(0, 40 * 24 * 60), st.integers(1, 8)).map(
        lambda t: (T0 + timedelta(minutes=t[0]), T0 + timedelta(minutes=t[0] + t[1]), t[2])
    ),
    max_size=40,
)


def _weighed_at_every_breakpoint(held: list[Interval], added: list[Interval]) -> float:
    """The definition, directly: every interval weighed at every breakpoint that lies where a span
    meets an added interval (O(n²); busiest_window sweeps them once)."""
    reaches = [(s - WINDOW, e) for s, e, _ in added]
    starts = {edge for reach in reaches for edge in reach}
    for s, e, _ in held:
        starts.update((s, e, s - WINDOW, e - WINDOW))
    return max(
        (
            sum(instance_hours(i, start, start + WINDOW) for i in held)
            for start in starts
            if any(first <= start <= last for first, last in reaches)
        ),
        default=0.0,
    )


@settings(max_examples=200, deadline=None)
@given(held=minute_intervals, added=minute_intervals)
def test_the_busiest_window_of_intervals_at_any_minute_is_the_most_weighed_at_any_breakpoint(
    held: list[Interval], added: list[Interval]
) -> None:
    everything = [*held, *added]
    assert (
        abs(busiest_window(everything, WINDOW, added) - _weighed_at_every_breakpoint(everything, added))
        < 1e-6
    )


def test_the_on_demand_cap_is_the_accounts_own_else_the_fleets_count_and_share() -> None:
    assert on_demand_cap(8, None, None, None) is None  # the built-in default: no quota
    assert on_demand_cap(8, None, None, 0.5) == 4
    assert on_demand_cap(8, None, 3, 0.5) == 3  # the smaller of the fleet's two
    assert on_demand_cap(8, None, 6, 0.5) == 4
    assert on_demand_cap(8, 7, 3, 0.5) == 7  # an administrator's number replaces both
    assert on_demand_cap(1, None, None, 0.5) == 1  # never closes a pool
    assert on_demand_cap(0, None, None, 0.5) is None  # a type with no on-demand instances: nothing to share


HOUR = timedelta(hours=1)


def test_hours_are_charged_whole_from_the_start_and_none_from_the_end() -> None:
    assert hours_started(T0, T0) == 1  # the first hour starts with the holder
    assert hours_started(T0, T0 + 59 * timedelta(minutes=1)) == 1
    assert hours_started(T0, T0 + HOUR) == 2
    assert hours_started(T0, T0 + 90 * timedelta(minutes=1), T0 + 90 * timedelta(minutes=1)) == 2
    assert hours_started(T0, T0 + 5 * HOUR, T0 + 2 * HOUR) == 2  # hour 3 would start at its end
    assert hours_started(T0, T0 + 5 * HOUR, T0) == 1  # ended at once: its first hour is still charged
    assert hours_started(T0, T0 + HOUR / 2, T0 + 3 * HOUR) == 1  # by now, not by its end
    assert hour_start(T0, 3) == T0 + 2 * HOUR
