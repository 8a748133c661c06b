"""The pure rules of managed spot training on lent capacity (core/spot.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core import spot as rules
from hyperplan.core.fleet import SpotPolicy
from hyperplan.core.spot import LENDING_TAG, Lending, Loan
from hyperplan.errors import ValidationError

FLEET = SpotPolicy()
NOW = datetime(2027, 3, 10, 9, 0, tzinfo=UTC)
RECLAIM = datetime(2027, 3, 10, 11, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)
LENDING = Lending(notice=120 * S, min_run=5 * M, stop_margin=15 * M)
TAG = "Tag hyperplan:lending: "  # how every refusal of the tag begins


def refusal(call: object, *args: object, **kwargs: object) -> str:
    assert callable(call)
    with pytest.raises(ValidationError) as caught:
        call(*args, **kwargs)
    return caught.value.message


# -- a plan's lending policy ---------------------------------------------------------------------------


def test_the_fleets_defaults_fill_in_what_is_not_given() -> None:
    assert rules.lending_from(FLEET) == Lending(FLEET.notice, FLEET.min_run, FLEET.stop_margin)
    assert rules.lending_from(FLEET, notice=30) == Lending(30 * S, FLEET.min_run, FLEET.stop_margin)
    assert rules.lending_from(FLEET, min_run=0, stop_margin=3600) == Lending(FLEET.notice, 0 * S, 60 * M)
    assert rules.lending_from(FLEET, notice=600) == Lending(600 * S, FLEET.min_run, FLEET.stop_margin)
    assert rules.lending_from(FLEET, min_run=7 * 86_400).min_run == timedelta(days=7)


def test_lending_bounds_name_the_value_as_the_caller_calls_it() -> None:
    assert (
        refusal(rules.lending_from, FLEET, notice=601)
        == "notice (601) is longer than the fleet's longest notice, 600 seconds."
    )
    assert refusal(rules.lending_from, FLEET, notice=0) == "notice (0) must be at least 1 second."
    assert refusal(rules.lending_from, FLEET, min_run=-1) == "min_run (-1) must be at least 0 seconds."
    assert (
        refusal(rules.lending_from, FLEET, stop_margin=7 * 86_400 + 1)
        == "stop_margin (604801) is longer than the longest allowed, 604800 seconds."
    )
    names = {"notice": "NoticeSeconds", "min_run": "MinRunSeconds", "stop_margin": "StopMarginSeconds"}
    assert (
        refusal(rules.lending_from, FLEET, notice=900, names=names)
        == "NoticeSeconds (900) is longer than the fleet's longest notice, 600 seconds."
    )
    assert refusal(rules.lending_from, FLEET, min_run=10**30, names=names).startswith("MinRunSeconds (1000")
    longer = SpotPolicy(max_notice=timedelta(hours=1))
    assert rules.lending_from(longer, notice=3600, stop_margin=3600).notice == timedelta(hours=1)
    # The margin must hold the notice: borrowers told at the stop-lending point are gone by the reclaim.
    assert refusal(rules.lending_from, longer, notice=3600) == (
        "stop_margin (900) is shorter than notice (3600): the borrowers' notice at the stop-lending point "
        "must end by the segment's reclaim time."
    )


def test_the_tag_says_none_or_idle_with_settings_in_any_order() -> None:
    assert LENDING_TAG == "hyperplan:lending"
    assert rules.parse_lending_tag("none", FLEET) is None
    assert rules.parse_lending_tag(" none ", FLEET) is None
    assert rules.parse_lending_tag("idle", FLEET) == rules.lending_from(FLEET)
    assert rules.parse_lending_tag("idle margin=60 notice=30", FLEET) == Lending(30 * S, FLEET.min_run, M)
    assert rules.parse_lending_tag("idle  min-run=0", FLEET) == Lending(
        FLEET.notice, 0 * S, FLEET.stop_margin
    )
    assert rules.parse_lending_tag("idle notice=007", FLEET) == rules.lending_from(FLEET, notice=7)


def test_the_tag_value_is_written_in_whole_seconds() -> None:
    assert LENDING.tag_value() == "idle notice=120 min-run=300 margin=900"
    assert Lending(S, 0 * S, timedelta(days=7)).tag_value() == "idle notice=1 min-run=0 margin=604800"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", TAG + "the value is empty; write none, or idle with optional notice=SECONDS"),
        ("lend", TAG + "'lend' is not a lending mode; write none, or idle"),
        ("Idle", TAG + "'Idle' is not a lending mode"),
        ("none notice=5", TAG + "none takes no settings (found 'notice=5')."),
        ("idle notice", TAG + "'notice' is not a setting; write none, or idle"),
        ("idle grace=5", TAG + "'grace' is not a setting (the settings are notice, min-run and margin)."),
        ("idle min_run=5", TAG + "'min_run' is not a setting"),
        ("idle notice=2m", TAG + "notice=2m is not a whole number of seconds."),
        ("idle notice=-5", TAG + "notice=-5 is not a whole number of seconds."),
        ("idle notice=", TAG + "notice= is not a whole number of seconds."),
        ("idle notice=5;margin=5", TAG + "notice=5;margin=5 is not a whole number of seconds."),
        ("idle notice=5 notice=6", TAG + "notice is given twice (notice=5 and notice=6)."),
        ("idle notice=900", TAG + "notice=900 is longer than the fleet's longest notice, 600 seconds."),
        ("idle notice=0", TAG + "notice=0 must be at least 1 second."),
        ("idle margin=604801", TAG + "margin=604801 is longer than the longest allowed, 604800 seconds."),
        ("idle min-run=9999999", TAG + "min-run=9999999 is longer than the longest allowed"),
        ("idle notice=" + "9" * 40, TAG + "notice=999999999999...: the number is too long."),
    ],
)  # fmt: skip
def test_a_bad_tag_is_refused_naming_the_tag_and_the_fault(value: str, message: str) -> None:
    assert refusal(rules.parse_lending_tag, value, FLEET).startswith(message)


# -- what may be lent, and when ------------------------------------------------------------------------


def test_lendable_instances_are_those_neither_used_nor_lent_and_never_fewer_than_none() -> None:
    assert rules.lendable(8, 0, 0) == 8
    assert rules.lendable(8, 3, 2) == 3
    assert rules.lendable(8, 6, 2) == 0
    assert rules.lendable(8, 8, 2) == 0  # the owner took them back while the loans are being reclaimed


def test_lending_stops_a_margin_before_the_reclaim() -> None:
    assert rules.stop_lending_at(RECLAIM, LENDING) == RECLAIM - 15 * M
    stop = RECLAIM - 15 * M
    assert rules.may_start_loan(stop - 5 * M, RECLAIM, LENDING)  # exactly its minimum run is left
    assert not rules.may_start_loan(stop - 5 * M + S, RECLAIM, LENDING)
    assert not rules.may_start_loan(stop + M, RECLAIM, LENDING)  # within the margin
    no_minimum = Lending(120 * S, 0 * S, 15 * M)
    assert rules.may_start_loan(stop - S, RECLAIM, no_minimum)
    assert not rules.may_start_loan(stop, RECLAIM, no_minimum)  # at the stop point itself: nothing to run


# -- reclaims ------------------------------------------------------------------------------------------


def loan(run_id: int, count: int, minutes_ago: int, reclaiming: bool = False) -> Loan:
    return Loan(run_id, count, NOW - minutes_ago * M, reclaiming)


def test_runs_past_their_minimum_run_are_reclaimed_first_the_longest_running_first() -> None:
    loans = [loan(1, 1, 2), loan(2, 1, 10), loan(3, 1, 60), loan(4, 1, 4)]
    assert rules.choose_reclaims(loans, 1, NOW, LENDING) == [3]
    assert rules.choose_reclaims(loans, 2, NOW, LENDING) == [3, 2]
    assert rules.choose_reclaims(loans, 3, NOW, LENDING) == [3, 2, 4]  # then the younger, oldest first
    assert rules.choose_reclaims(loans, 4, NOW, LENDING) == [3, 2, 4, 1]


def test_a_run_exactly_at_its_minimum_run_is_past_it() -> None:
    loans = [loan(1, 1, 4), loan(2, 1, 5)]
    assert rules.choose_reclaims(loans, 1, NOW, LENDING) == [2]


def test_instances_already_coming_back_count_and_are_not_chosen_again() -> None:
    loans = [loan(1, 2, 60, reclaiming=True), loan(2, 2, 30), loan(3, 2, 20)]
    assert rules.choose_reclaims(loans, 2, NOW, LENDING) == []
    assert rules.choose_reclaims(loans, 3, NOW, LENDING) == [2]
    assert rules.choose_reclaims(loans, 0, NOW, LENDING) == []


def test_a_large_run_may_bring_back_more_than_needed_and_too_few_loans_are_all_taken() -> None:
    loans = [loan(1, 4, 60), loan(2, 1, 30)]
    assert rules.choose_reclaims(loans, 1, NOW, LENDING) == [1]
    assert rules.choose_reclaims(loans, 9, NOW, LENDING) == [1, 2]


def test_ties_go_to_the_lower_run_id() -> None:
    assert rules.choose_reclaims([loan(7, 1, 30), loan(3, 1, 30)], 1, NOW, LENDING) == [3]


def test_the_deadline_is_the_notice_away_but_never_after_the_hard_end() -> None:
    assert rules.reclaim_deadline(NOW, LENDING, None) == NOW + 120 * S
    assert rules.reclaim_deadline(NOW, LENDING, NOW + M) == NOW + M
    assert rules.reclaim_deadline(NOW, LENDING, NOW + 10 * M) == NOW + 120 * S
    assert rules.reclaim_deadline(NOW, LENDING, NOW - M) == NOW - M  # already past: kill at once


def test_a_promise_is_kept_within_the_notice_and_the_kill_grace() -> None:
    deadline = NOW + 120 * S
    grace = 10 * S
    assert rules.promise_kept(NOW, NOW + 30 * S, deadline, grace)
    assert rules.promise_kept(NOW, deadline + grace, deadline, grace)
    assert not rules.promise_kept(NOW, deadline + grace + timedelta(microseconds=1), deadline, grace)
    assert not rules.promise_kept(NOW, deadline + M, deadline, grace)


# -- money ---------------------------------------------------------------------------------------------


def test_the_spot_price_is_the_fleets_fraction_of_on_demand() -> None:
    assert rules.spot_price(Decimal("55.04"), FLEET) == Decimal("19.264")
    assert rules.spot_price(Decimal("10"), SpotPolicy(price_fraction=Decimal("1"))) == Decimal("10")


def test_a_run_is_charged_per_second_rounded_half_up_to_the_minor_unit() -> None:
    assert rules.run_charge(Decimal("36"), 2, 3600, 2) == Decimal("72.00")
    assert rules.run_charge(Decimal("36"), 1, 1, 2) == Decimal("0.01")  # exactly 0.01
    assert rules.run_charge(Decimal("18"), 1, 1, 2) == Decimal("0.01")  # 0.005 rounds up
    assert rules.run_charge(Decimal("17.99"), 1, 1, 2) == Decimal("0.00")  # 0.004997 rounds down
    assert rules.run_charge(Decimal("19.264"), 2, 90.5, 2) == Decimal("0.97")  # 0.96853...
    assert rules.run_charge(Decimal("1000"), 1, 1, 0) == Decimal("0")  # 0.28 of a yen
    assert rules.run_charge(Decimal("36"), 3, 0, 2) == Decimal("0.00")
    with pytest.raises(ValueError):
        rules.run_charge(Decimal("36"), 1, -1, 2)


def test_the_owner_is_credited_its_share_rounded_down() -> None:
    assert rules.owner_credit(Decimal("72.00"), Decimal("0.8"), 2) == Decimal("57.60")
    assert rules.owner_credit(Decimal("0.01"), Decimal("0.8"), 2) == Decimal("0.00")
    assert rules.owner_credit(Decimal("0.97"), Decimal("0.8"), 2) == Decimal("0.77")  # 0.776
    assert rules.owner_credit(Decimal("0.97"), Decimal("1"), 2) == Decimal("0.97")
    assert rules.owner_credit(Decimal("0.97"), Decimal("0"), 2) == Decimal("0.00")
    for charge, share in ((Decimal("-1"), Decimal("0.8")), (Decimal("1"), Decimal("1.1"))):
        with pytest.raises(ValueError):
            rules.owner_credit(charge, share, 2)


# -- the request and the reported times ----------------------------------------------------------------


def test_a_spot_request_gives_its_wait_at_least_its_runtime() -> None:
    assert (
        rules.check_spot_request({"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}, False) == 7200
    )
    assert (
        rules.check_spot_request({"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 3600}, False) == 3600
    )
    assert rules.check_spot_request({"MaxWaitTimeInSeconds": 86_400}, False) == 86_400


def test_spot_request_refusals_name_the_field() -> None:
    assert refusal(
        rules.check_spot_request, {"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 3600}, False
    ) == (
        "StoppingCondition.MaxWaitTimeInSeconds (3600) must be at least MaxRuntimeInSeconds (7200): "
        "it bounds the wait for spot capacity plus the run."
    )
    assert refusal(rules.check_spot_request, {"MaxWaitTimeInSeconds": 86_399}, False) == (
        "StoppingCondition.MaxWaitTimeInSeconds (86399) must be at least MaxRuntimeInSeconds (86400): it "
        "bounds the wait for spot capacity plus the run."
    )
    assert refusal(rules.check_spot_request, {"MaxRuntimeInSeconds": 60}, False) == (
        "StoppingCondition.MaxWaitTimeInSeconds is required with EnableManagedSpotTraining: it bounds the "
        "wait for spot capacity plus the run."
    )
    assert refusal(rules.check_spot_request, {}, False).startswith(
        "StoppingCondition.MaxWaitTimeInSeconds is"
    )
    assert refusal(rules.check_spot_request, {"MaxWaitTimeInSeconds": 7200}, True) == (
        "ResourceConfig.TrainingPlanArn: a managed spot training job runs on idle or on-demand capacity and "
        "names no plan; leave out EnableManagedSpotTraining to run on the plan."
    )


def test_training_time_spans_the_first_start_to_the_end_and_billable_time_the_runs() -> None:
    assert rules.training_seconds(None, None, NOW) == 0
    assert rules.training_seconds(NOW - 10 * M, None, NOW) == 600
    assert rules.training_seconds(NOW - 10 * M, NOW - 4 * M, NOW) == 360
    assert rules.training_seconds(NOW - timedelta(seconds=1.9), None, NOW) == 1
    runs = [(NOW - 10 * M, NOW - 8 * M), (NOW - 5 * M, NOW - 4 * M), (NOW - M, None)]
    assert rules.billable_seconds(runs, NOW) == 240
    assert rules.billable_seconds([], NOW) == 0
    halves = [
        (NOW - timedelta(seconds=1.5), NOW - timedelta(seconds=1)),
        (NOW - timedelta(seconds=0.5), None),
    ]
    assert rules.billable_seconds(halves, NOW) == 1  # the sum's whole seconds, not each run's


# -- properties ----------------------------------------------------------------------------------------

seconds_ = st.integers(min_value=0, max_value=7 * 86_400)
lendings = st.builds(
    # The margin is at least the notice (a policy is refused otherwise): margin = notice + extra.
    lambda notice, min_run, extra: rules.lending_from(FLEET, notice, min_run, min(notice + extra, 604_800)),
    st.integers(min_value=1, max_value=600),
    seconds_,
    seconds_,
)
loan_lists = st.lists(
    st.builds(
        lambda count, age, reclaiming: (count, age, reclaiming),
        st.integers(min_value=1, max_value=8),
        st.integers(min_value=0, max_value=86_400),
        st.booleans(),
    ),
    max_size=12,
).map(
    lambda rows: [
        Loan(i, count, NOW - age * S, reclaiming) for i, (count, age, reclaiming) in enumerate(rows)
    ]
)


@given(loan_lists, st.integers(min_value=0, max_value=100), lendings)
def test_reclaims_bring_back_enough_pick_no_run_twice_and_prefer_runs_past_their_minimum(
    loans: list[Loan], needed: int, lending: Lending
) -> None:
    chosen = rules.choose_reclaims(loans, needed, NOW, lending)
    by_id = {loan.run_id: loan for loan in loans}
    assert len(chosen) == len(set(chosen))
    assert not any(by_id[run_id].reclaiming for run_id in chosen)
    back = sum(loan.count for loan in loans if loan.reclaiming) + sum(
        by_id[run_id].count for run_id in chosen
    )
    if sum(loan.count for loan in loans) >= needed:
        assert back >= needed
        # and no more runs than needed: without the last one chosen it would not be enough
        if chosen:
            assert back - by_id[chosen[-1]].count < needed
    else:
        assert set(chosen) == {loan.run_id for loan in loans if not loan.reclaiming}
    past = [NOW - by_id[run_id].started_at >= lending.min_run for run_id in chosen]
    assert past == sorted(past, reverse=True)  # every run past its minimum before any younger one
    if any(not p for p in past):
        skipped = [
            loan
            for loan in loans
            if not loan.reclaiming and loan.run_id not in chosen and NOW - loan.started_at >= lending.min_run
        ]
        assert not skipped  # a younger run is taken only once every older-than-minimum one is


@given(
    st.decimals(min_value=Decimal("0.001"), max_value=Decimal("500"), places=3),
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=0, max_value=30 * 86_400, allow_nan=False),
    st.decimals(min_value=Decimal("0"), max_value=Decimal("1"), places=3),
    st.sampled_from([0, 2, 3]),
)
def test_the_charge_is_the_exact_cost_rounded_and_the_credit_never_exceeds_it(
    price: Decimal, count: int, seconds: float, share: Decimal, places: int
) -> None:
    unit = Decimal(1).scaleb(-places)
    charge = rules.run_charge(price, count, seconds, places)
    exact = price * count * Decimal(repr(seconds)) / 3600
    assert abs(charge - exact) <= unit / 2
    assert charge.as_tuple().exponent == -places
    credit = rules.owner_credit(charge, share, places)
    assert Decimal(0) <= credit <= charge
    assert charge * share - unit < credit <= charge * share
    rest = charge - credit  # the operator's part: whole minor units, so the ledger adds up
    assert rest == rest.quantize(unit)
    assert credit + rest == charge


@given(
    st.integers(min_value=-86_400, max_value=86_400),
    lendings,
    st.one_of(st.none(), st.integers(min_value=-86_400, max_value=86_400)),
)
def test_the_deadline_is_never_after_the_hard_end_nor_the_notice(
    offset: int, lending: Lending, hard_end_offset: int | None
) -> None:
    now = NOW + offset * S
    hard_end = None if hard_end_offset is None else NOW + hard_end_offset * S
    deadline = rules.reclaim_deadline(now, lending, hard_end)
    assert deadline <= now + lending.notice
    assert hard_end is None or deadline <= hard_end
    assert deadline in {now + lending.notice, hard_end}


@given(lendings)
def test_the_tag_value_reads_back_as_the_same_policy(lending: Lending) -> None:
    assert rules.parse_lending_tag(lending.tag_value(), FLEET) == lending


@given(st.text(alphabet="abcdefgilmnortu-=0123456789 ", max_size=40))
def test_any_tag_value_is_read_or_refused_naming_the_tag(value: str) -> None:
    try:
        rules.parse_lending_tag(value, FLEET)
    except ValidationError as error:
        assert error.message.startswith(TAG)
