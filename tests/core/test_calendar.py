import functools
from datetime import datetime, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.calendar import (
    _DERIVED,
    SLOT,
    CapacityCalendar,
    peak_booked,
    peak_booked_slots,
    slot_after,
    slot_of,
    slot_start,
)
from hyperplan.errors import ResourceLimitExceeded

from .support import pool, utc

P5A = ("ml.p5.48xlarge", "us-west-2a")
ORIGIN = utc(2026, 3, 1, 11, 30)


def calendar(reservable: int = 8) -> CapacityCalendar:
    return CapacityCalendar([pool("a", reservable)])


def at(minutes: int) -> datetime:
    return ORIGIN + timedelta(minutes=minutes)


# -- slots --------------------------------------------------------------------------------------------


def test_slots_are_half_hours_aligned_to_the_epoch_so_1130_utc_is_a_boundary() -> None:
    assert slot_start(slot_of(ORIGIN)) == ORIGIN
    assert slot_of(at(9)) == slot_of(ORIGIN)
    assert slot_after(at(9)) == slot_of(ORIGIN) + 1
    assert slot_after(ORIGIN) == slot_of(ORIGIN)
    assert slot_start(slot_of(ORIGIN) + 1) - ORIGIN == SLOT


def test_naive_times_are_refused() -> None:
    with pytest.raises(ValueError, match="naive"):
        slot_of(datetime(2026, 3, 1))


# -- booking --------------------------------------------------------------------------------------------


def test_a_booking_holds_every_slot_it_touches() -> None:
    cal = calendar()
    cal.book(P5A, at(9), at(24 * 60), 3)  # from 11:39
    assert cal.booked(P5A, at(0), at(30)).tolist() == [3]  # the 11:30-12:00 slot is held whole
    assert cal.booked(P5A, at(-30), at(0)).tolist() == [0]
    assert cal.booked(P5A, at(24 * 60), at(24 * 60 + 30)).tolist() == [0]  # the end is exclusive


def test_never_above_reservable() -> None:
    cal = calendar(8)
    cal.book(P5A, at(0), at(120), 6)
    assert cal.can_book(P5A, at(120), at(240), 8)
    assert cal.can_book(P5A, at(60), at(180), 2)
    assert not cal.can_book(P5A, at(60), at(180), 3)
    assert not cal.can_book(P5A, at(119), at(180), 3)  # touches the last booked slot
    with pytest.raises(ResourceLimitExceeded, match="has 2 of 8 instances free"):
        cal.book(P5A, at(60), at(180), 3)
    assert cal.booked(P5A, at(0), at(180)).tolist() == [6, 6, 6, 6, 0, 0]


def test_release_is_the_inverse_of_book() -> None:
    cal = calendar()
    cal.book(P5A, at(9), at(100), 2)
    cal.book(P5A, at(0), at(60), 1)
    cal.release(P5A, at(9), at(100), 2)
    assert cal.booked(P5A, at(0), at(120)).tolist() == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="not booked"):
        cal.release(P5A, at(0), at(120), 1)


def test_free_profile_and_unknown_pools() -> None:
    cal = calendar(8)
    cal.book(P5A, at(30), at(90), 5)
    assert cal.free(P5A, at(0), at(120)).tolist() == [8, 3, 3, 8]
    unknown = ("ml.p5.48xlarge", "us-west-2z")
    assert cal.reservable(unknown) == 0
    assert not cal.can_book(unknown, at(0), at(30), 1)
    assert cal.free(unknown, at(0), at(60)).tolist() == [0, 0]
    with pytest.raises(ResourceLimitExceeded):
        cal.book(unknown, at(0), at(30), 1)


def test_restore_accepts_what_a_shrunk_pool_no_longer_could() -> None:
    cal = calendar(4)
    cal.restore(P5A, at(0), at(60), 6)
    assert cal.free(P5A, at(0), at(60)).tolist() == [0, 0]
    assert not cal.can_book(P5A, at(0), at(30), 1)


def test_bad_bookings_are_bugs() -> None:
    cal = calendar()
    with pytest.raises(ValueError, match="empty"):
        cal.book(P5A, at(30), at(30), 1)
    with pytest.raises(ValueError, match="at least one"):
        cal.can_book(P5A, at(0), at(30), 0)


def test_booked_profile_is_runs() -> None:
    cal = calendar()
    cal.book(P5A, at(60), at(180), 2)
    cal.book(P5A, at(120), at(240), 3)
    assert cal.booked_profile(P5A, at(10), at(300)) == [
        (at(0), 0), (at(60), 2), (at(120), 5), (at(180), 3), (at(240), 0),
    ]  # fmt: skip
    assert cal.booked_profile(P5A, at(60), at(60)) == []


def test_grows_both_ways_without_losing_anything() -> None:
    cal = calendar(64)
    cal.book(P5A, at(0), at(60), 1)
    cal.book(P5A, at(400 * 24 * 60), at(401 * 24 * 60), 2)  # far ahead
    cal.book(P5A, at(-300 * 24 * 60), at(-299 * 24 * 60), 3)  # far back
    assert cal.booked(P5A, at(0), at(60)).tolist() == [1, 1]
    assert cal.booked(P5A, at(400 * 24 * 60), at(400 * 24 * 60 + 30)).tolist() == [2]
    assert cal.booked(P5A, at(-300 * 24 * 60), at(-300 * 24 * 60 + 30)).tolist() == [3]


def test_memory_stays_modest_for_ten_thousand_plans_on_twelve_pools() -> None:
    pools = [pool(zone, 64, kind=f"ml.p{n}.48xlarge") for n in range(4) for zone in "abc"]
    cal = CapacityCalendar(pools)
    rng = np.random.default_rng(1)
    for i in range(10_000):
        key = pools[i % 12].key
        start = ORIGIN + timedelta(days=int(rng.integers(0, 240)))
        end = start + timedelta(days=int(rng.integers(1, 15)))
        if cal.can_book(key, start, end, 1):
            cal.book(key, start, end, 1)
    assert cal.nbytes < 2 * 1024 * 1024  # a year of slots for 12 pools is ~0.8 MB


# -- properties against brute force --------------------------------------------------------------------

Rows = list[tuple[datetime, datetime, int]]
minutes = st.integers(min_value=-600, max_value=3000)


@st.composite
def intervals(draw: st.DrawFn, max_size: int = 12) -> Rows:
    result = []
    for _ in range(draw(st.integers(0, max_size))):
        start = draw(minutes)
        length = draw(st.integers(1, 900))
        result.append((at(start), at(start + length), draw(st.integers(1, 5))))
    return result


def brute_peak(rows: Rows, start: datetime, end: datetime) -> int:
    peak, moment = 0, start
    while moment < end:
        peak = max(peak, sum(n for s, e, n in rows if s <= moment < e))
        moment += timedelta(minutes=1)
    return peak


@settings(max_examples=60, deadline=None)
@given(intervals(), minutes, st.integers(1, 600))
def test_peak_booked_agrees_with_a_minute_by_minute_count(rows: Rows, start: int, length: int) -> None:
    assert peak_booked(rows, at(start), at(start + length)) == brute_peak(rows, at(start), at(start + length))


@settings(max_examples=100, deadline=None)
@given(intervals(), minutes, st.integers(1, 600), st.integers(1, 20), st.integers(1, 5))
def test_the_store_check_accepts_exactly_what_the_calendar_accepts(
    rows: Rows, start: int, length: int, reservable: int, count: int
) -> None:
    cal = calendar(reservable)
    for s, e, n in rows:
        cal.restore(P5A, s, e, n)  # the store's rows, whether or not they fit
    window = (at(start), at(start + length))
    assert peak_booked_slots(rows, *window) == int(cal.booked(P5A, *window).max())
    assert peak_booked_slots(rows, *window) >= peak_booked(rows, *window)
    assert (peak_booked_slots(rows, *window) + count <= reservable) == cal.can_book(P5A, *window, count)


@settings(max_examples=100, deadline=None)
@given(intervals(), intervals(max_size=4), st.lists(minutes, max_size=3), minutes, st.integers(1, 600))
def test_the_purchase_check_on_the_stores_microseconds_agrees_with_the_datetime_check(
    rows: Rows, elsewhere: Rows, released_early: list[int], start: int, length: int
) -> None:
    """purchase_reads.Holdings weighs the store's rows in microseconds: the same peak as
    peak_booked_slots on those of the pool that overlap the window, as datetimes (rows of another pool,
    and segments released before they began, count for nothing)."""
    from hyperplan.core.calendar import micros
    from hyperplan.store.purchase_reads import Holdings

    ended = [(at(m + 30), at(m), 2) for m in released_early]  # released_at before start
    mine = [(*P5A, micros(s), micros(e), n) for s, e, n in [*rows, *ended]]
    other = [("ml.p4d.24xlarge", "us-west-2a", micros(s), micros(e), n) for s, e, n in elsewhere]
    window = (at(start), at(start + length))
    overlapping = [(s, e, n) for s, e, n in [*rows, *ended] if s < window[1] and e > window[0] and e > s]
    holdings = Holdings(pools=[*other, *mine], account=[])
    assert holdings.booked_in_pool(pool("a", 8), *window) == peak_booked_slots(overlapping, *window)


@settings(max_examples=80, deadline=None)
@given(intervals(max_size=20), st.data())
def test_free_profile_matches_a_recount_of_the_bookings(rows: Rows, data: st.DataObject) -> None:
    reservable = 8
    cal = calendar(reservable)
    kept: Rows = []
    for s, e, n in rows:
        if cal.can_book(P5A, s, e, n):
            cal.book(P5A, s, e, n)
            kept.append((s, e, n))
        elif data.draw(st.booleans()):
            with pytest.raises(ResourceLimitExceeded):
                cal.book(P5A, s, e, n)
    release_one = data.draw(st.booleans())
    if kept and release_one:
        released = kept.pop(data.draw(st.integers(0, len(kept) - 1)))
        cal.release(P5A, *released)
    first, stop = slot_of(at(-700)), slot_after(at(4000))
    for slot in range(first, stop):
        moment = slot_start(slot)
        held = sum(n for s, e, n in kept if slot_of(s) <= slot < slot_after(e))
        assert held <= reservable
        assert cal.free(P5A, moment, moment + SLOT).tolist() == [reservable - held]


@settings(max_examples=60, deadline=None)
@given(intervals(max_size=10), st.data())
def test_free_days_read_between_changes_match_the_slots_of_each_day(rows: Rows, data: st.DataObject) -> None:
    """Searches read whole days (remembered between changes): every read, made after each booking,
    release or change of the reservable count, equals the fewest free slots of each day as it stands."""
    cal = calendar(8)
    origin = ORIGIN + timedelta(minutes=30 * data.draw(st.integers(-60, 60)))  # any slot of the day
    days = data.draw(st.integers(1, 6))

    def check() -> None:
        free = cal.free(P5A, origin, origin + timedelta(days=days))
        assert cal.free_days(P5A, origin, days).tolist() == free.reshape(days, 48).min(axis=1).tolist()

    check()
    for s, e, n in rows:
        cal.restore(P5A, s, e, n)
        check()
        if data.draw(st.booleans()):
            cal.set_reservable(P5A, data.draw(st.integers(0, 10)))
            check()
        if data.draw(st.booleans()):
            cal.release(P5A, s, e, n)
            check()


def test_derived_values_asked_for_again_are_kept_longest_and_dropped_at_a_change() -> None:
    a = pool("a", reservable=4)
    calendar = CapacityCalendar([a])
    made: list[int] = []

    def make(n: int) -> int:
        made.append(n)
        return n

    for n in range(_DERIVED):
        calendar.derived(n, functools.partial(make, n))
    assert calendar.derived(0, lambda: make(-1)) == 0  # kept, and now the most recently asked for
    calendar.derived(_DERIVED, lambda: make(_DERIVED))  # one too many: the least recently asked goes
    assert calendar.derived(0, lambda: make(-1)) == 0
    assert calendar.derived(1, lambda: make(1)) == 1 and made.count(1) == 2
    calendar.book(a.key, utc(2030, 1, 1), utc(2030, 1, 2), 1)
    assert calendar.derived(0, lambda: make(-1)) == -1  # a change drops them all
