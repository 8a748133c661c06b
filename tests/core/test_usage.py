"""The usage report's arithmetic (hyperplan/core/usage.py): instance-time per pool and UTC day, a
plan's use counted as the lesser of what its consumers held and what it reserved, at each instant, and
money counted whole on the UTC day it was written."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.usage import (
    NOTHING,
    Amount,
    PlanDay,
    Pool,
    Span,
    Window,
    amounts_per_day,
    day_parts,
    instance_time,
    plan_days,
)

P5_B: Pool = ("ml.p5.48xlarge", "us-west-2b")
P5_A: Pool = ("ml.p5.48xlarge", "us-west-2a")
DAY1 = datetime(2026, 12, 7, tzinfo=UTC)
HOUR = timedelta(hours=1)
WIDE = Window(DAY1 - 10 * HOUR * 24, DAY1 + 10 * HOUR * 24)


def _hours(days: dict[tuple[Pool, date], PlanDay]) -> dict[tuple[Pool, date], tuple[float, float]]:
    return {key: (day.reserved / HOUR, day.used / HOUR) for key, day in days.items()}


def test_a_plan_used_past_its_segment_is_used_only_as_long_as_it_reserved() -> None:
    """The issue's day: one instance reserved for 23 h of a day, and records that say two instances were
    held for 48 h (a consumer recorded past the segment after the clock jumped)."""
    segment = Span(P5_B, DAY1 + HOUR / 2, DAY1 + 23.5 * HOUR, 1)
    recorded = Span(P5_B, DAY1 + HOUR / 2, DAY1 + 48.5 * HOUR, 2)
    assert _hours(plan_days([segment], [recorded], WIDE)) == {(P5_B, DAY1.date()): (23.0, 23.0)}


def test_use_is_the_lesser_count_at_each_instant_and_cut_at_midnights() -> None:
    # Two instances from 18:00 to 06:00 the next day; one consumer holds one of them from 20:00 on,
    # another two more from 22:00 to 02:00: held 3 there, of which only 2 count.
    segment = Span(P5_A, DAY1 + 18 * HOUR, DAY1 + 30 * HOUR, 2)
    group = Span(P5_A, DAY1 + 20 * HOUR, DAY1 + 30 * HOUR, 1)
    job = Span(P5_A, DAY1 + 22 * HOUR, DAY1 + 26 * HOUR, 2)
    assert _hours(plan_days([segment], [group, job], WIDE)) == {
        # day 1: reserved 6 h x 2; used 20-22 one, 22-24 two
        (P5_A, DAY1.date()): (12.0, 2.0 + 4.0),
        # day 2: reserved 6 h x 2; used 00-02 two, 02-06 one
        (P5_A, DAY1.date() + timedelta(days=1)): (12.0, 4.0 + 4.0),
    }


def test_use_counts_in_the_pool_of_the_reservation_and_inside_the_window_only() -> None:
    segment = Span(P5_A, DAY1, DAY1 + 24 * HOUR, 2)
    elsewhere = Span(P5_B, DAY1, DAY1 + 24 * HOUR, 2)
    assert _hours(plan_days([segment], [elsewhere], WIDE)) == {(P5_A, DAY1.date()): (48.0, 0.0)}
    window = Window(DAY1 + 6 * HOUR, DAY1 + 9 * HOUR)
    inside = Span(P5_A, DAY1 + 8 * HOUR, DAY1 + 12 * HOUR, 1)
    assert _hours(plan_days([segment], [inside], window)) == {(P5_A, DAY1.date()): (6.0, 1.0)}
    # Nothing held and nothing reserved in the window: no row at all.
    assert plan_days([segment], [inside], Window(DAY1 - 5 * HOUR, DAY1)) == {}


def test_on_demand_time_is_count_times_length_per_day() -> None:
    node = Span(P5_B, DAY1 + 22 * HOUR, DAY1 + 25 * HOUR, 1)
    job = Span(P5_B, DAY1 + 23 * HOUR, DAY1 + 24 * HOUR, 4)
    assert instance_time([node, job], WIDE) == {
        (P5_B, DAY1.date()): 2 * HOUR + 4 * HOUR,
        (P5_B, DAY1.date() + timedelta(days=1)): 1 * HOUR,
    }
    assert list(day_parts(DAY1 + HOUR, DAY1 + HOUR)) == []  # an empty span has no day


def test_money_counts_whole_on_the_utc_day_it_was_written_and_inside_the_window_only() -> None:
    # A spot run's charge at 23:59 UTC, and one written at 01:00 in UTC+2 (23:00 UTC the day before).
    late = Amount(P5_B, DAY1 + 23 * HOUR + 59 * HOUR / 60, Decimal("5.01"))
    eastern = Amount(P5_B, (DAY1 + 23 * HOUR).astimezone(timezone(2 * HOUR)), Decimal("0.43"))
    next_day = Amount(P5_B, DAY1 + 24 * HOUR, Decimal("14.00"))
    other_pool = Amount(P5_A, DAY1 + HOUR, Decimal("1.00"))
    assert amounts_per_day([late, eastern, next_day, other_pool], WIDE) == {
        (P5_B, DAY1.date()): Decimal("5.44"),
        (P5_B, DAY1.date() + timedelta(days=1)): Decimal("14.00"),
        (P5_A, DAY1.date()): Decimal("1.00"),
    }
    # The window is [start, end): an amount at its end belongs to the next report.
    window = Window(DAY1 + 23 * HOUR, DAY1 + 24 * HOUR)
    assert amounts_per_day([late, eastern, next_day], window) == {(P5_B, DAY1.date()): Decimal("5.44")}
    assert amounts_per_day([next_day], Window(DAY1, DAY1 + 24 * HOUR)) == {}


# -- any interleaving ----------------------------------------------------------------------------------

STEP = timedelta(minutes=20)  # spans start and end on this grid, so a slot-by-slot count is exact
SLOTS = 3 * 24 * 3  # three days
POOLS = (P5_A, P5_B)


@st.composite
def spans(draw: st.DrawFn) -> Span:
    first = draw(st.integers(0, SLOTS - 1))
    last = draw(st.integers(first, SLOTS))  # first == last: an empty span
    return Span(
        draw(st.sampled_from(POOLS)), DAY1 + first * STEP, DAY1 + last * STEP, draw(st.integers(0, 4))
    )


def _count(chosen: list[Span], pool: Pool, moment: datetime) -> int:
    return sum(s.count for s in chosen if s.pool == pool and s.start <= moment < s.end)


def _slot_by_slot(reserved: list[Span], held: list[Span], window: Window) -> dict[tuple[Pool, date], PlanDay]:
    """The oracle: every slot of the grid looked at on its own."""
    found: dict[tuple[Pool, date], PlanDay] = defaultdict(PlanDay)
    for pool in POOLS:
        for slot in range(SLOTS):
            moment = DAY1 + slot * STEP
            if not window.start <= moment < window.end:
                continue
            r, h = _count(reserved, pool, moment), _count(held, pool, moment)
            if r:
                before = found[(pool, moment.date())]
                found[(pool, moment.date())] = PlanDay(
                    before.reserved + r * STEP, before.used + min(r, h) * STEP
                )
    return dict(found)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(spans(), max_size=4),
    st.lists(spans(), max_size=6),
    st.integers(0, SLOTS // 2),
    st.integers(SLOTS // 2 + 1, SLOTS),
)
def test_used_never_exceeds_reserved_for_any_interleaving(
    reserved: list[Span], held: list[Span], first: int, last: int
) -> None:
    window = Window(DAY1 + first * STEP, DAY1 + last * STEP)
    days = plan_days(reserved, held, window)
    assert days == _slot_by_slot(reserved, held, window)
    reserved_time, held_time = instance_time(reserved, window), instance_time(held, window)
    for key, day in days.items():
        assert day.used <= day.reserved == reserved_time[key]
        assert day.used <= held_time.get(key, NOTHING)
    # A day with reserved time has its row; no other does.
    assert set(days) == {key for key, time in reserved_time.items() if time > NOTHING}
