"""The pure rules of reclaim warnings and the extension policy's choice (core/reclaim_warnings.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from hyperplan.core import reclaim_warnings as rules
from hyperplan.core.reclaim_warnings import Price, Warning
from hyperplan.errors import ValidationError

RECLAIM = datetime(2027, 3, 10, 11, 0, tzinfo=UTC)
H = timedelta(hours=1)


def test_lead_hours_are_checked_and_kept_longest_first() -> None:
    assert rules.lead_hours([1, 24, 24]) == (24, 1)
    assert rules.lead_hours([]) == ()
    for bad, named in (([0], "not 0"), ([169], "not 169"), ([True], "True"), ("24", "list"), ([1] * 9, "8")):
        with pytest.raises(ValidationError, match="ReclaimWarningHours") as caught:
            rules.lead_hours(bad)
        assert named in str(caught.value)


def test_each_lead_time_is_due_once_at_its_instant_and_the_next_is_planned() -> None:
    leads = (24, 1)
    bought = RECLAIM - 100 * H
    # the first check: the first whole-hour lead time's instant after the purchase, at most a week ahead
    assert rules.first_check(RECLAIM, bought - timedelta(minutes=1)) == RECLAIM - 100 * H
    assert rules.first_check(RECLAIM, bought) == RECLAIM - 99 * H
    assert rules.first_check(RECLAIM, RECLAIM - 400 * H) == RECLAIM - 168 * H
    assert rules.first_check(RECLAIM, RECLAIM - H) is None  # no lead time is left
    assert rules.due_lead(leads, RECLAIM, bought, bought) is None
    assert rules.next_check(leads, RECLAIM, bought) == RECLAIM - 24 * H
    assert rules.due_lead(leads, RECLAIM, bought, RECLAIM - 24 * H) == 24
    assert rules.next_check(leads, RECLAIM, RECLAIM - 24 * H) == RECLAIM - H
    assert rules.due_lead(leads, RECLAIM, RECLAIM - 24 * H, RECLAIM - H) == 1
    assert rules.next_check(leads, RECLAIM, RECLAIM - H) is None


def test_a_lead_time_past_when_the_check_was_planned_is_not_sent_late() -> None:
    planned = RECLAIM - 10 * H  # bought 10 hours before the reclaim: no 24-hour warning
    assert rules.due_lead((24, 1), RECLAIM, planned, RECLAIM - 5 * H) is None
    assert rules.due_lead((24, 1), RECLAIM, planned, RECLAIM - H) == 1
    # two lead times fallen at once (a late run): one warning, the nearer one
    assert rules.due_lead((24, 12), RECLAIM, RECLAIM - 30 * H, RECLAIM - 6 * H) == 12


def _warning(**changes: object) -> Warning:
    base = Warning(
        "soft",
        "arn:aws:sagemaker:us-west-2:123456789012:training-plan/soft",
        2,
        RECLAIM + timedelta(minutes=30),
        RECLAIM,
        24,
        [("train", "Training")],
        [("c1", "workers", 4)],
        None,
        [Price(1, Decimal("4800.00"), "USD"), Price(7, Decimal("33600.00"), "USD")],
    )
    return Warning(**{**base.__dict__, **changes})


def test_the_last_segments_warning_gives_prices_and_the_search_command_not_ids() -> None:
    text = rules.warning_message(_warning())
    assert "Segment 2 of plan soft ends at 2027-03-10 11:30 UTC" in text
    assert "taken back at 2027-03-10 11:00 UTC (in 24 h)" in text
    assert "training job train (Training), cluster c1 group workers (4 nodes)" in text
    assert "1 day 4800.00 USD, 7 days 33600.00 USD" in text
    assert "--training-plan-arn arn:aws:sagemaker:us-west-2:123456789012:training-plan/soft" in text
    assert "hyperplan plans extend-search soft" in text


def test_an_earlier_segments_warning_names_the_next_start_instead() -> None:
    text = rules.warning_message(_warning(next_start=RECLAIM + 48 * H, jobs=[], groups=[]))
    assert "next segment starts at 2027-03-12 11:00 UTC" in text
    assert "Nothing runs on it" in text and "USD" not in text and "search" not in text


def test_no_free_extension_says_why() -> None:
    text = rules.warning_message(_warning(prices=[], no_extension="extensions must be bought 1 hour before"))
    assert "No extension is free now: extensions must be bought 1 hour before." in text


PRICES = [Price(d, Decimal(100 * d), "USD") for d in (1, 2, 7)]


def test_the_policy_buys_the_longest_within_its_price_and_the_budget() -> None:
    assert rules.choose(PRICES, None, None, 7).buy == PRICES[2]
    assert rules.choose(PRICES, Decimal(250), None, 7).buy == PRICES[1]
    assert rules.choose(PRICES, None, Decimal(150), 7).buy == PRICES[0]


def test_the_policy_says_why_it_buys_nothing() -> None:
    assert rules.choose([], None, None, 3).reason == "no extension of 1 to 3 days is free in the plan's pool"
    over_price = rules.choose(PRICES, Decimal(50), None, 7).reason
    assert over_price == "the cheapest, 1 day, costs 100 USD, over MaxPrice 50 USD"
    over_budget = rules.choose(PRICES, None, Decimal("99.99"), 7).reason
    assert over_budget == "the cheapest, 1 day, costs 100 USD, over the account's budget of 99.99 USD"
    assert rules.choose(PRICES, None, None, 0).buy is None


def test_the_lengths_left_follow_the_extension_steps_and_max_days_in_all() -> None:
    assert rules.policy_lengths(3, 0) == [3, 2, 1]
    assert rules.policy_lengths(30, 2)[:3] == [28, 21, 14]
    assert rules.policy_lengths(5, 5) == []
