"""The monthly books (hyperplan/core/usage.py, `months`): an account's days folded into calendar months,
idle time that is never negative, and the net cost's arithmetic; a refund split over pools to the unit."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.usage import NOTHING, DayBooks, MonthBooks, months, split

HOUR = timedelta(hours=1)


def test_days_fold_into_each_accounts_calendar_months() -> None:
    days = [
        DayBooks("vision", date(2027, 1, 31), reserved=24 * HOUR, used=10 * HOUR, lent=2 * HOUR),
        DayBooks("vision", date(2027, 1, 2), reserved=12 * HOUR, used=12 * HOUR, paid=Decimal("960.00")),
        DayBooks("vision", date(2027, 2, 1), reserved=24 * HOUR, returned=48 * HOUR, refunded=Decimal("80")),
        DayBooks("speech", date(2027, 1, 15), credited=Decimal("4.00"), paid=Decimal("5.01")),
    ]
    assert months(days) == [
        MonthBooks("speech", date(2027, 1, 1), credited=Decimal("4.00"), paid=Decimal("5.01")),
        MonthBooks(
            "vision",
            date(2027, 1, 1),
            reserved=36 * HOUR,
            used=22 * HOUR,
            lent=2 * HOUR,
            paid=Decimal("960.00"),
        ),
        MonthBooks(
            "vision", date(2027, 2, 1), reserved=24 * HOUR, returned=48 * HOUR, refunded=Decimal("80")
        ),
    ]
    january = months(days)[1]
    assert january.idle == 12 * HOUR  # 36 reserved - 22 used - 2 lent


def test_idle_is_never_below_zero() -> None:
    # Lent and used overlapping at an instant (an open spot run counted until now) can exceed reserved.
    [month] = months([DayBooks("vision", date(2027, 3, 9), reserved=4 * HOUR, used=3 * HOUR, lent=2 * HOUR)])
    assert month.idle == NOTHING
    [empty] = months([DayBooks("vision", date(2027, 3, 9), paid=Decimal("1.00"))])
    assert empty.idle == NOTHING


def test_net_cost_is_paid_less_refunded_less_credited() -> None:
    days = [
        DayBooks("vision", date(2027, 1, 2), paid=Decimal("960.00")),
        DayBooks("vision", date(2027, 1, 20), refunded=Decimal("480.00")),
        DayBooks("vision", date(2027, 1, 21), credited=Decimal("120.50")),
        DayBooks("vision", date(2027, 1, 22), paid=Decimal("5.01"), credited=Decimal("4.00")),
    ]
    [month] = months(days)
    assert (month.paid, month.refunded, month.credited) == (
        Decimal("965.01"),
        Decimal("480.00"),
        Decimal("124.50"),
    )
    assert month.net_cost == Decimal("360.51")
    # A month of refunds and credits only costs less than nothing: money came back.
    [back] = months([DayBooks("vision", date(2027, 2, 1), refunded=Decimal("10"), credited=Decimal("2"))])
    assert back.net_cost == Decimal("-12")


def test_a_refund_split_over_pools_adds_up_to_the_unit() -> None:
    assert split(Decimal("100.00"), [Decimal(1), Decimal(1), Decimal(1)], 2) == [
        Decimal("33.33"),
        Decimal("33.33"),
        Decimal("33.34"),
    ]
    assert split(Decimal("7"), [Decimal(3)], 0) == [Decimal("7")]
    assert split(Decimal("10.00"), [Decimal(0), Decimal(4)], 2) == [Decimal("0.00"), Decimal("10.00")]


@settings(max_examples=100, deadline=None)
@given(
    st.integers(0, 10**9).map(lambda cents: Decimal(cents).scaleb(-2)),
    st.lists(st.integers(0, 10**6), min_size=1, max_size=6).filter(any),
)
def test_split_shares_are_in_the_minor_unit_and_add_up_exactly(amount: Decimal, weights: list[int]) -> None:
    shares = split(amount, [Decimal(w) for w in weights], 2)
    assert sum(shares) == amount
    assert all(share >= 0 and share == share.quantize(Decimal("0.01")) for share in shares)
    assert all(share == 0 for share, weight in zip(shares, weights, strict=True) if weight == 0)
