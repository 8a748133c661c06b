"""Returning a plan's capacity (core/returns.py): what each scope gives back and keeps, every refusal,
the refund's arithmetic, the cap, the tiers across their thresholds, and properties over many plans."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.returns import (
    FLEXIBLE,
    STRICT,
    CancellationPolicy,
    RefundTier,
    ReturnPlan,
    Scope,
    Segment,
    Window,
    capped,
    fingerprint,
    plan_return,
    refund,
)
from hyperplan.errors import ValidationError

BOUNDARY = time(11, 30)
COUNTS = (1, 2, 4, 8, 16, 32, 64)
# A fixed day on a boundary: nothing here depends on today's date.
DAY0 = datetime(2031, 3, 3, 11, 30, tzinfo=UTC)
DAY = timedelta(days=1)
P5 = ("ml.p5.48xlarge", "us-west-2a")


def segment(ordinal: int, first_day: int, days: int, count: int = 8) -> Segment:
    """Segment ``ordinal``: ``count`` instances from day ``first_day``'s boundary for ``days`` days."""
    return Segment(ordinal, *P5, count, DAY0 + first_day * DAY, DAY0 + (first_day + days) * DAY)


def window(first_day: float, last_day: float, count: int) -> Window:
    return Window(*P5, DAY0 + first_day * DAY, DAY0 + last_day * DAY, count)


def returned(
    segments: Sequence[Segment],
    scope: Scope,
    now: datetime,
    policy: CancellationPolicy = FLEXIBLE,
    allowed: Sequence[int] | None = COUNTS,
) -> ReturnPlan:
    return plan_return(segments, scope, now, BOUNDARY, allowed, policy)


def refusal(
    segments: Sequence[Segment],
    scope: Scope,
    now: datetime,
    policy: CancellationPolicy = FLEXIBLE,
    allowed: Sequence[int] | None = COUNTS,
) -> str:
    with pytest.raises(ValidationError) as caught:
        returned(segments, scope, now, policy, allowed)
    return caught.value.message


TWO = (segment(1, 10, 3), segment(2, 20, 2, count=4))
NOON = timedelta(minutes=30)  # after a boundary: 12:00 UTC


# -- the scopes --------------------------------------------------------------------------------------


def test_a_whole_plan_not_started_goes_back_whole() -> None:
    plan = returned(TWO, Scope("plan"), DAY0)
    assert plan.kept == ()
    assert plan.windows == (window(10, 13, 8), window(20, 22, 4))
    assert plan.refund_fraction_by_window == (Decimal(1), Decimal(1))


def test_a_whole_plan_started_keeps_its_running_day() -> None:
    near = (segment(1, 10, 3), segment(2, 15, 2, count=4))
    now = DAY0 + 11 * DAY + NOON  # segment 1 (days 10-13) started, segment 2 starts in 3.5 days
    plan = returned(near, Scope("plan"), now)
    assert plan.kept == (segment(1, 10, 2),)  # cut at the next boundary, its ordinal kept
    assert plan.windows == (window(12, 13, 8), window(15, 17, 4))
    assert plan.refund_fraction_by_window == (Decimal(0), Decimal("0.5"))


def test_a_whole_plan_keeps_its_ended_segments() -> None:
    now = DAY0 + 14 * DAY
    plan = returned(TWO, Scope("plan"), now)
    assert plan.kept == (TWO[0],)
    assert plan.windows == (window(20, 22, 4),)


def test_a_whole_plan_in_its_last_day_has_nothing_to_return() -> None:
    message = refusal(TWO, Scope("plan"), DAY0 + 21 * DAY + NOON)
    assert message.startswith("nothing left to return: every segment has ended or is in its last day")


def test_a_segment_not_started_goes_back_whole() -> None:
    plan = returned(TWO, Scope("segment", ordinal=2), DAY0)
    assert plan.kept == (TWO[0],)
    assert plan.windows == (window(20, 22, 4),)


def test_a_started_segment_goes_back_from_the_next_boundary() -> None:
    plan = returned(TWO, Scope("segment", ordinal=1), DAY0 + 10 * DAY + NOON)
    assert plan.kept == (segment(1, 10, 1), TWO[1])
    assert plan.windows == (window(11, 13, 8),)
    assert plan.refund_fraction_by_window == (Decimal(0),)


def test_a_segment_started_this_very_boundary_keeps_one_day() -> None:
    plan = returned(TWO, Scope("segment", ordinal=1), DAY0 + 10 * DAY)  # now == its start
    assert plan.kept[0] == segment(1, 10, 1)
    assert plan.refund_fraction_by_window == (Decimal(0),)


def test_a_segment_in_its_last_day_or_ended_has_nothing_to_return() -> None:
    last_day = refusal(TWO, Scope("segment", ordinal=1), DAY0 + 12 * DAY + NOON)
    assert last_day == (
        "nothing left to return: segment 1 has started and ends at its next boundary, 2031-03-16 11:30 UTC"
    )
    ended = refusal(TWO, Scope("segment", ordinal=1), DAY0 + 13 * DAY)
    assert ended == "segment 1 has ended: nothing left to return"


def test_instances_of_a_segment_not_started_change_its_count() -> None:
    plan = returned(TWO, Scope("instances", ordinal=1, instances=4), DAY0)
    assert plan.kept == (segment(1, 10, 3, count=4), TWO[1])
    assert plan.windows == (window(10, 13, 4),)
    assert plan.refund_fraction_by_window == (Decimal(1),)


def test_all_instances_of_a_segment_take_it_away() -> None:
    plan = returned(TWO, Scope("instances", ordinal=2, instances=4), DAY0)
    assert plan.kept == (TWO[0],)
    assert plan.windows == (window(20, 22, 4),)


def test_instances_of_a_started_segment_split_it_at_the_next_boundary() -> None:
    now = DAY0 + 10 * DAY + NOON
    plan = returned(TWO, Scope("instances", ordinal=1, instances=6), now)
    later = Segment(3, *P5, 2, DAY0 + 11 * DAY, DAY0 + 13 * DAY)  # a new segment, numbered after the last
    assert plan.kept == (segment(1, 10, 1), TWO[1], later)
    assert plan.windows == (window(11, 13, 6),)
    assert plan.refund_fraction_by_window == (Decimal(0),)


def test_all_instances_of_a_started_segment_leave_its_first_part() -> None:
    plan = returned(TWO, Scope("instances", ordinal=1, instances=8), DAY0 + 10 * DAY + NOON)
    assert plan.kept == (segment(1, 10, 1), TWO[1])
    assert plan.windows == (window(11, 13, 8),)


def test_instances_must_leave_a_count_the_fleet_allows() -> None:
    message = refusal(TWO, Scope("instances", ordinal=1, instances=3), DAY0)
    assert message == (
        "instances: returning 3 of segment 1's 8 would leave 5, a count the fleet does not allow "
        "(it allows 1, 2, 4, or all 8 returned)"
    )
    assert returned(TWO, Scope("instances", ordinal=1, instances=3), DAY0, allowed=None).kept[0].count == 5


@pytest.mark.parametrize("instances", [None, 0, 9, -1])
def test_instances_must_be_some_of_the_segments(instances: int | None) -> None:
    message = refusal(TWO, Scope("instances", ordinal=1, instances=instances), DAY0)
    assert message == f"instances: {instances} is not between 1 and segment 1's count, 8"


def test_instances_of_a_segment_in_its_last_day_are_refused() -> None:
    message = refusal(TWO, Scope("instances", ordinal=1, instances=4), DAY0 + 12 * DAY + NOON)
    assert message.startswith("nothing left to return: segment 1 has started")


def test_a_tail_from_a_boundary_keeps_what_lies_before() -> None:
    plan = returned(TWO, Scope("tail", ordinal=1, start=DAY0 + 12 * DAY), DAY0)
    assert plan.kept == (segment(1, 10, 2), TWO[1])
    assert plan.windows == (window(12, 13, 8),)
    assert plan.refund_fraction_by_window == (Decimal(1),)  # priced by the segment's start, 10 days off


def test_a_tail_of_a_started_segment_defaults_to_the_next_boundary() -> None:
    plan = returned(TWO, Scope("tail", ordinal=1), DAY0 + 10 * DAY + NOON)
    assert plan.windows == (window(11, 13, 8),)
    assert plan.kept[0].end == DAY0 + 11 * DAY


def test_a_tail_of_a_segment_not_started_defaults_to_its_first_boundary_inside() -> None:
    plan = returned(TWO, Scope("tail", ordinal=1), DAY0)
    assert plan.kept[0] == segment(1, 10, 1)
    assert plan.windows == (window(11, 13, 8),)


def test_a_tail_of_a_one_day_segment_has_nothing_to_return() -> None:
    one_day = (segment(1, 10, 1),)
    assert refusal(one_day, Scope("tail", ordinal=1), DAY0).startswith("nothing left to return: segment 1")


@pytest.mark.parametrize(
    ("start", "message"),
    [
        (DAY0 + 11 * DAY + NOON, "from: 2031-03-14 12:00 UTC is not on a segment boundary (11:30 UTC)"),
        (DAY0 + 10 * DAY, "from: 2031-03-13 11:30 UTC is not inside segment 1 (2031-03-13 11:30 UTC to "),
        (DAY0 + 13 * DAY, "from: 2031-03-16 11:30 UTC is not inside segment 1"),
        (DAY0 + 15 * DAY, "from: 2031-03-18 11:30 UTC is not inside segment 1"),
        (datetime(2031, 3, 14, 11, 30), "from: 2031-03-14T11:30:00 names no time zone (give UTC)"),
    ],
)
def test_a_tail_must_start_on_a_boundary_inside_the_segment(start: datetime, message: str) -> None:
    assert refusal(TWO, Scope("tail", ordinal=1, start=start), DAY0).startswith(message)


def test_a_tail_must_start_after_now() -> None:
    now = DAY0 + 11 * DAY + NOON
    message = refusal(TWO, Scope("tail", ordinal=1, start=DAY0 + 11 * DAY), now)
    assert message == "from: 2031-03-14 11:30 UTC is not after now (2031-03-14 12:00 UTC)"


def test_a_tail_may_be_named_in_another_time_zone() -> None:
    elsewhere = (DAY0 + 12 * DAY).astimezone(timezone(timedelta(hours=-7)))
    plan = returned(TWO, Scope("tail", ordinal=1, start=elsewhere), DAY0)
    assert plan.windows == (window(12, 13, 8),)


# -- the refusals ------------------------------------------------------------------------------------


def test_the_strict_policy_allows_no_returns() -> None:
    for scope in (Scope("plan"), Scope("segment", ordinal=1), Scope("instances", ordinal=1, instances=4)):
        assert refusal(TWO, scope, DAY0, STRICT) == (
            "this fleet's cancellation policy, strict, allows no returns"
        )


def test_an_unknown_segment_is_named() -> None:
    assert refusal(TWO, Scope("segment", ordinal=7), DAY0) == (
        "segment: the plan has no segment 7 (it has 1, 2)"
    )
    assert refusal(TWO, Scope("tail"), DAY0) == "a tail return names a segment"


def test_an_unknown_scope_is_named() -> None:
    assert refusal(TWO, Scope("everything"), DAY0) == (
        "'everything' is not a return scope (one of: plan, segment, instances, tail)"
    )


# -- the policy --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before_start", "fraction"),
    [
        (timedelta(days=30), Decimal(1)),
        (timedelta(days=7), Decimal(1)),  # "at least this long before": the threshold itself
        (timedelta(days=7) - timedelta(seconds=1), Decimal("0.5")),
        (timedelta(seconds=1), Decimal("0.5")),
        (timedelta(0), Decimal(0)),  # started
        (-timedelta(hours=1), Decimal(0)),
    ],
)
def test_flexible_tiers_across_their_thresholds(before_start: timedelta, fraction: Decimal) -> None:
    start = DAY0 + 40 * DAY
    assert FLEXIBLE.fraction_at(start - before_start, start) == fraction


def test_a_policy_whose_last_tier_ends_before_the_start_refunds_nothing_after_it() -> None:
    policy = CancellationPolicy("custom", (RefundTier(timedelta(days=2), Decimal("0.8")),))
    start = DAY0 + 40 * DAY
    assert policy.fraction_at(start - 2 * DAY, start) == Decimal("0.8")
    assert policy.fraction_at(start - DAY, start) == Decimal(0)
    assert policy.describe() == "80% refunded up to 2 days before a segment starts, nothing later"


def test_the_refund_follows_the_clock_across_each_threshold() -> None:
    plan_segments = (segment(1, 10, 3),)
    paid = Decimal("31703.04")  # 8 x 72 h x 55.04
    held = 8 * 72.0

    def refund_at(now: datetime) -> Decimal:
        return refund(paid, held, returned(plan_segments, Scope("plan"), now), 2)

    start = DAY0 + 10 * DAY
    assert refund_at(start - 7 * DAY) == paid
    assert refund_at(start - 7 * DAY + timedelta(seconds=1)) == Decimal("15851.52")
    assert refund_at(start - timedelta(seconds=1)) == Decimal("15851.52")
    assert refund_at(start + NOON) == Decimal(0)  # started: days 11-13 go back, unrefunded


def test_the_policy_in_words() -> None:
    assert STRICT.describe() == "No returns (strict)"
    assert FLEXIBLE.describe() == (
        "Full refund up to 7 days before a segment starts, 50% up to its start, nothing once started; "
        "50% of resold instance-hours credited"
    )
    capped_policy = CancellationPolicy(
        "custom",
        (
            RefundTier(timedelta(days=1, hours=12), Decimal(1)),
            RefundTier(timedelta(hours=1), Decimal("0.25")),
        ),
        refund_cap=Decimal("50000.00"),
    )
    assert capped_policy.describe() == (
        "Full refund up to 1 day 12 hours before a segment starts, 25% up to 1 hour before, nothing later; "
        "at most 50000 refunded per account in 30 days"
    )


def test_the_policy_for_machines() -> None:
    assert FLEXIBLE.as_json() == {
        "Name": "flexible",
        "Tiers": [{"BeforeSeconds": 604800, "Fraction": "1"}, {"BeforeSeconds": 0, "Fraction": "0.5"}],
        "ResaleShare": "0.5",
        "ResaleDiscount": "0",
        "QuoteValiditySeconds": 600,
        "RefundCap": None,
        "CapPeriodSeconds": 2592000,
        "Description": FLEXIBLE.describe(),
    }
    assert STRICT.as_json()["Tiers"] == []
    assert CancellationPolicy(refund_cap=Decimal("50000.00")).as_json()["RefundCap"] == "50000"


# -- what it is worth --------------------------------------------------------------------------------


def test_a_windows_value_is_its_share_of_what_was_paid() -> None:
    plan = returned(TWO, Scope("segment", ordinal=2), DAY0)  # 4 x 48 of 8 x 72 + 4 x 48 instance-hours
    assert refund(Decimal("768.00"), 8 * 72 + 4 * 48, plan, 2) == Decimal("192.00")


def test_a_refund_is_rounded_down_to_the_minor_unit() -> None:
    thirds = (segment(1, 10, 1, count=1), segment(2, 20, 2, count=1))
    plan = returned(thirds, Scope("segment", ordinal=1), DAY0)
    assert refund(Decimal("100.00"), 72.0, plan, 2) == Decimal("33.33")  # 33.333...
    assert refund(Decimal("200.00"), 72.0, plan, 2) == Decimal("66.66")  # 66.666..., not 66.67
    assert refund(Decimal("200"), 72.0, plan, 0) == Decimal(66)  # a currency without cents


def test_a_whole_plan_at_full_refund_returns_exactly_what_was_paid() -> None:
    odd = Segment(1, *P5, 3, DAY0 + 10 * DAY + timedelta(minutes=17), DAY0 + 13 * DAY)  # not on a boundary
    held = 3 * (odd.end - odd.start).total_seconds() / 3600  # a float that is not exact
    plan = returned((odd,), Scope("plan"), DAY0)
    assert refund(Decimal("12345.67"), held, plan, 2) == Decimal("12345.67")


def test_a_refund_is_never_more_than_was_paid() -> None:
    plan = returned(TWO, Scope("plan"), DAY0)
    assert refund(Decimal("100.00"), 10.0, plan, 2) == Decimal("100.00")  # windows worth more than held
    assert refund(Decimal("0.00"), 8 * 72 + 4 * 48, plan, 2) == Decimal("0.00")


def test_the_cap_leaves_what_the_period_has_room_for() -> None:
    policy = CancellationPolicy(refund_cap=Decimal(1000))
    assert capped(Decimal(300), Decimal(0), policy) == Decimal(300)
    assert capped(Decimal(300), Decimal(800), policy) == Decimal(200)
    assert capped(Decimal(300), Decimal(1000), policy) == Decimal(0)
    assert capped(Decimal(300), Decimal(1200), policy) == Decimal(0)
    assert capped(Decimal(300), Decimal(10**9), FLEXIBLE) == Decimal(300)  # no cap


def test_the_fingerprint_changes_with_the_segments_and_only_with_them() -> None:
    first = fingerprint(TWO)
    assert len(first) == 64
    assert fingerprint(tuple(reversed(TWO))) == first
    assert fingerprint((segment(1, 10, 3), segment(2, 20, 2, count=4))) == first
    assert fingerprint((segment(1, 10, 2), TWO[1])) != first
    assert fingerprint((TWO[0], segment(2, 20, 2, count=2))) != first
    assert fingerprint(returned(TWO, Scope("segment", ordinal=2), DAY0).kept) != first


# -- properties over many plans and instants ---------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> tuple[Segment, ...]:
    """1-3 segments on a boundary (the first maybe half a day early, as a search's soonest start is)."""
    segments = []
    for ordinal in range(1, draw(st.integers(1, 3)) + 1):
        first_day = draw(st.integers(0, 20))
        start = DAY0 + first_day * DAY - draw(st.sampled_from([0, 0, 1, 13])) * timedelta(minutes=30)
        end = DAY0 + (first_day + draw(st.integers(1, 5))) * DAY
        pool = draw(st.sampled_from([P5, ("ml.p5.48xlarge", "us-west-2b")]))
        segments.append(Segment(ordinal, *pool, draw(st.sampled_from(COUNTS[:4])), start, end))
    return tuple(segments)


@st.composite
def scopes(draw: st.DrawFn) -> Scope:
    kind = draw(st.sampled_from(["plan", "segment", "instances", "tail"]))
    if kind == "plan":
        return Scope("plan")
    ordinal = draw(st.integers(1, 3))
    if kind == "instances":
        return Scope(kind, ordinal, instances=draw(st.integers(1, 8)))
    if kind == "tail":
        start = draw(st.none() | st.integers(0, 26).map(lambda day: DAY0 + day * DAY))
        return Scope(kind, ordinal, start=start)
    return Scope(kind, ordinal)


instants = st.integers(0, 26 * 48).map(lambda half_hours: DAY0 + half_hours * timedelta(minutes=30))
jitter = st.sampled_from([timedelta(0), timedelta(minutes=7), timedelta(minutes=29, seconds=59)])


def held_at(moment: datetime, pool: tuple[str, str], parts: Sequence[Segment | Window]) -> int:
    return sum(
        part.count
        for part in parts
        if (part.instance_type, part.availability_zone) == pool and part.start <= moment < part.end
    )


def instance_seconds_from(now: datetime, parts: Sequence[Segment | Window]) -> float:
    return sum(part.count * max((part.end - max(part.start, now)).total_seconds(), 0) for part in parts)


@settings(max_examples=300, deadline=None)
@given(plans(), scopes(), instants, jitter)
def test_kept_and_returned_hold_exactly_what_the_plan_held(
    segments: tuple[Segment, ...], scope: Scope, slot: datetime, offset: timedelta
) -> None:
    now = slot + offset
    try:
        plan = returned(segments, scope, now)
    except ValidationError:
        return
    assert plan.windows, "a return gives something back"
    assert instance_seconds_from(now, segments) == instance_seconds_from(now, [*plan.kept, *plan.windows])
    first, last = min(s.start for s in segments), max(s.end for s in segments)
    moment = first + timedelta(minutes=1)
    while moment < last:
        for pool in {(s.instance_type, s.availability_zone) for s in segments}:
            kept, back = held_at(moment, pool, plan.kept), held_at(moment, pool, plan.windows)
            assert kept + back == held_at(moment, pool, segments)
            if moment < now:
                assert back == 0
        moment += timedelta(minutes=30)


@settings(max_examples=300, deadline=None)
@given(plans(), scopes(), instants, jitter)
def test_nothing_goes_back_before_now_and_every_kept_count_is_allowed(
    segments: tuple[Segment, ...], scope: Scope, slot: datetime, offset: timedelta
) -> None:
    now = slot + offset
    try:
        plan = returned(segments, scope, now)
    except ValidationError:
        return
    assert all(now < w.start < w.end and w.count > 0 for w in plan.windows)
    assert all(s.count in COUNTS and s.start < s.end for s in plan.kept)
    assert len({s.ordinal for s in plan.kept}) == len(plan.kept)
    assert len(plan.refund_fraction_by_window) == len(plan.windows)
    assert all(Decimal(0) <= f <= Decimal(1) for f in plan.refund_fraction_by_window)
    held = sum(s.count * (s.end - s.start).total_seconds() / 3600 for s in segments)
    assert Decimal(0) <= refund(Decimal("1000.00"), held, plan, 2) <= Decimal("1000.00")


@settings(max_examples=200, deadline=None)
@given(plans(), st.decimals(Decimal("0.01"), Decimal(10**7), places=2))
def test_a_whole_plan_returned_in_time_refunds_all_of_it(
    segments: tuple[Segment, ...], paid: Decimal
) -> None:
    now = min(s.start for s in segments) - 7 * DAY
    plan = returned(segments, Scope("plan"), now)
    held = sum(s.count * (s.end - s.start).total_seconds() / 3600 for s in segments)
    assert plan.kept == ()
    assert refund(paid, held, plan, 2) == paid
