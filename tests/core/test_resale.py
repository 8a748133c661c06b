"""The rules of resale (core/resale.py): which returned instances a new booking needed, per slot, and
what the returning account earns for them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.calendar import slot_of
from hyperplan.core.resale import Span, credit, free_of_its_own, resold, room, spans

SLOTS = 6


@st.composite
def pools(draw: st.DrawFn) -> tuple[int, list[int], list[list[int]], int]:
    """A pool's reservable count, what other bookings hold per slot, the returned windows' unsold
    instances per slot (never more than the pool has room for), and a new booking's count that fits."""
    reservable = draw(st.integers(min_value=1, max_value=12))
    held = draw(st.lists(st.integers(0, reservable), min_size=SLOTS, max_size=SLOTS))
    windows = draw(st.integers(min_value=0, max_value=3))
    unsold: list[list[int]] = [[0] * SLOTS for _ in range(windows)]
    for i in range(SLOTS):
        space = reservable - held[i]
        for window in unsold:
            window[i] = draw(st.integers(0, space))
            space -= window[i]
    fits = min(reservable - h for h in held)
    count = draw(st.integers(0, fits))
    return reservable, held, unsold, count


@given(pools())
def test_never_more_resold_than_the_window_held_unsold(
    pool: tuple[int, list[int], list[list[int]], int],
) -> None:
    reservable, held, unsold, count = pool
    taken = resold(count, free_of_its_own(reservable, held, unsold), unsold)
    for window, took in zip(unsold, taken, strict=True):
        assert all(0 <= t <= u for t, u in zip(took, window, strict=True))


@given(pools())
def test_never_more_resold_than_the_booking_holds(pool: tuple[int, list[int], list[list[int]], int]) -> None:
    reservable, held, unsold, count = pool
    taken = resold(count, free_of_its_own(reservable, held, unsold), unsold)
    assert all(sum(window[i] for window in taken) <= count for i in range(SLOTS))


@given(pools())
def test_nothing_resold_where_the_pool_had_room_of_its_own(
    pool: tuple[int, list[int], list[list[int]], int],
) -> None:
    reservable, held, unsold, count = pool
    free = free_of_its_own(reservable, held, unsold)
    taken = resold(count, free, unsold)
    for i in range(SLOTS):
        # Exactly what the booking could not have had from the pool's own free instances.
        assert sum(window[i] for window in taken) == max(0, count - free[i])


def test_a_full_pool_resells_what_the_booking_took_and_the_earliest_window_first() -> None:
    # 8 reservable, 4 held by others, two windows returned 2 each: nothing else is free.
    unsold = [[2, 2, 0], [2, 2, 2]]
    free = free_of_its_own(8, [4, 4, 6], unsold)
    assert free == [0, 0, 0]
    assert resold(3, free, unsold) == [[2, 2, 0], [1, 1, 2]]


def test_a_pool_with_room_of_its_own_resells_nothing() -> None:
    unsold = [[2, 2]]
    free = free_of_its_own(10, [2, 2], unsold)
    assert free == [6, 6]
    assert resold(6, free, unsold) == [[0, 0]]
    assert resold(7, free, unsold) == [[1, 1]]


T0 = datetime(2030, 1, 7, 11, 30, tzinfo=UTC)
SLOT = timedelta(minutes=30)


def test_spans_are_runs_of_one_count_clipped_to_the_overlap() -> None:
    first = slot_of(T0)
    found = spans(first, [0, 2, 2, 1, 0, 1], T0, T0 + 6 * SLOT)
    assert found == [
        Span(T0 + SLOT, T0 + 3 * SLOT, 2),
        Span(T0 + 3 * SLOT, T0 + 4 * SLOT, 1),
        Span(T0 + 5 * SLOT, T0 + 6 * SLOT, 1),
    ]
    # A booking that starts inside a slot is resold only from its start.
    assert spans(first, [3], T0 + timedelta(minutes=10), T0 + SLOT) == [
        Span(T0 + timedelta(minutes=10), T0 + SLOT, 3)
    ]
    assert found[0].instance_hours() == Decimal(2)


def test_credit_is_the_share_of_what_was_paid_rounded_down() -> None:
    assert credit(Decimal(3), Decimal("40.00"), Decimal("0.5"), 2) == Decimal("60.00")
    assert credit(Decimal(1) / 3, Decimal("10"), Decimal("0.5"), 2) == Decimal("1.66")
    assert credit(Decimal(1), Decimal("999"), Decimal("0.5"), 0) == Decimal("499")
    with pytest.raises(ValueError):
        credit(Decimal(1), Decimal(1), Decimal("1.5"), 2)


@given(
    st.decimals(min_value=0, max_value=10_000, places=2),
    st.decimals(min_value=0, max_value=10_000, places=2),
    st.decimals(min_value=0, max_value=10_000, places=2),
    st.decimals(min_value=0, max_value=10_000, places=2),
)
def test_refunds_and_credits_never_add_up_to_more_than_was_paid(
    amount: Decimal, paid: Decimal, refunded: Decimal, credited: Decimal
) -> None:
    """Whatever a resale earns, only the room left is credited."""
    allowed = min(amount, room(paid, refunded, credited))
    assert 0 <= allowed <= amount
    if refunded + credited <= paid:
        assert refunded + credited + allowed <= paid
    else:
        assert allowed == 0
