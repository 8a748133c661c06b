"""One search across instance types (core/search_across.py): the merged order, the requests it takes, and
how a type's refusal names the type. Values in, values out."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.offerings import Offering, Segment
from hyperplan.core.search_across import MAX_TYPES, check_requests, merged, naming_type
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import Conflict, ResourceLimitExceeded, ValidationError

from .support import utc

DAY0 = utc(2027, 3, 1, 11, 30)
DAY = timedelta(days=1)


def offering(kind: str, *days: tuple[int, int], fee: str = "100.00") -> Offering:
    """An offering of `kind` whose segments run over the given (first day, stop day) pairs."""
    segments = tuple(Segment((kind, "us-west-2a"), DAY0 + a * DAY, DAY0 + b * DAY, 8) for a, b in days)
    return Offering("training-job", segments, Decimal(fee), "USD")


def identity(found: Offering) -> Offering:
    return found


def names(found: list[Offering], answers: list[list[Offering]]) -> list[str]:
    """Each merged offering as TYPE#POSITION in its own type's answer, to read the order at a glance."""
    where = {id(o): f"{o.instance_type}#{answer.index(o)}" for answer in answers for o in answer}
    return [where[id(o)] for o in found]


# -- the order -------------------------------------------------------------------------------------------


def test_fewest_segments_come_first_whatever_their_place_in_their_own_answer() -> None:
    split = [offering("A", (0, 2), (3, 5))]  # A fits only in two segments: its best is a split
    whole = [offering("B", (0, 4)), offering("B", (1, 5)), offering("B", (2, 6))]
    assert names(merged([split, whole], identity), [split, whole]) == ["B#0", "B#1", "B#2", "A#0"]


def test_within_a_number_of_segments_each_types_ranking_comes_before_finish_and_price() -> None:
    # C's best finishes later and costs more than B's second: it still comes first, as each type's own
    # ranking (its first offering before its second) decides before the finish and the price.
    b = [offering("B", (0, 4), fee="240.00"), offering("B", (1, 5), fee="240.00")]
    c = [offering("C", (2, 6), fee="320.00")]
    assert names(merged([b, c], identity), [b, c]) == ["B#0", "C#0", "B#1"]


def test_at_the_same_place_the_earliest_finish_then_the_lowest_price_wins() -> None:
    late_cheap = [offering("A", (1, 5), fee="100.00")]
    early_dear = [offering("B", (0, 4), fee="900.00")]
    dear = [offering("C", (0, 4), fee="950.00")]
    answers = [late_cheap, early_dear, dear]
    assert names(merged(answers, identity), answers) == ["B#0", "C#0", "A#0"]


def test_offerings_equal_in_every_way_keep_the_order_the_types_were_given() -> None:
    first, second = [offering("B", (0, 4))], [offering("A", (0, 4))]
    assert names(merged([first, second], identity), [first, second]) == ["B#0", "A#0"]
    assert names(merged([second, first], identity), [second, first]) == ["A#0", "B#0"]


def test_a_type_with_nothing_free_adds_nothing() -> None:
    found = [offering("B", (0, 4))]
    assert merged([[], found, []], identity) == found
    assert merged([[], []], identity) == []


def test_items_are_read_through_the_given_function() -> None:
    # The services merge signed offerings: (id, offering) pairs here.
    a = [("id-a", offering("A", (0, 2), (3, 5)))]
    b = [("id-b", offering("B", (0, 4)))]
    assert [i for i, _ in merged([a, b], lambda pair: pair[1])] == ["id-b", "id-a"]


# -- properties --------------------------------------------------------------------------------------------


@st.composite
def offerings(draw: st.DrawFn, kind: str) -> Offering:
    count = draw(st.integers(1, 3))
    starts = sorted(draw(st.lists(st.integers(0, 40), min_size=count, max_size=count, unique=True)))
    days = [(start, start + draw(st.integers(1, 3))) for start in starts]
    fee = draw(st.sampled_from(["100.00", "150.00", "99.99", "240.00"]))
    return offering(kind, *days, fee=fee)


@st.composite
def answers(draw: st.DrawFn) -> list[list[Offering]]:
    kinds = draw(st.integers(1, MAX_TYPES))
    return [draw(st.lists(offerings(f"T{k}"), max_size=4)) for k in range(kinds)]


def rank(found: Offering, answers: list[list[Offering]]) -> tuple[int, int, datetime, Decimal, int]:
    kind = next(k for k, answer in enumerate(answers) if any(found is o for o in answer))
    place = next(p for p, o in enumerate(answers[kind]) if o is found)
    return (len(found.segments), place, found.end, found.upfront_fee, kind)


@given(answers())
def test_every_offering_is_answered_once(given_answers: list[list[Offering]]) -> None:
    found = merged(given_answers, identity)
    assert sorted(map(id, found)) == sorted(id(o) for answer in given_answers for o in answer)


@given(answers())
def test_the_answer_is_in_the_documented_order(given_answers: list[list[Offering]]) -> None:
    ranks = [rank(o, given_answers) for o in merged(given_answers, identity)]
    assert ranks == sorted(ranks)
    assert len(set(ranks)) == len(ranks)  # the type's index makes every key distinct: one order only


@given(answers())
def test_each_types_own_order_is_kept_where_its_segments_allow(given_answers: list[list[Offering]]) -> None:
    # A search's answer has its fewest segments first; a type so ranked keeps its own order in the merge.
    ranked = [sorted(answer, key=lambda o: len(o.segments)) for answer in given_answers]
    found = merged(ranked, identity)
    for answer in ranked:
        assert [o for o in found if any(o is mine for mine in answer)] == answer


@given(answers())
def test_nothing_with_fewer_segments_follows_something_with_more(given_answers: list[list[Offering]]) -> None:
    counts = [len(o.segments) for o in merged(given_answers, identity)]
    assert counts == sorted(counts)


# -- the requests --------------------------------------------------------------------------------------


def search(
    kind: str,
    count: int = 8,
    *,
    duration_hours: int = 72,
    target: str = "training-job",
    start_after: datetime | None = DAY0,
    end_before: datetime | None = DAY0 + 14 * DAY,
) -> SearchRequest:
    return SearchRequest(kind, count, duration_hours, target, start_after, end_before)


def test_types_each_with_its_own_count_are_taken() -> None:
    check_requests([search("ml.p5.48xlarge", 8), search("ml.p4d.24xlarge", 16)])
    check_requests([search(f"ml.t{n}", 1) for n in range(MAX_TYPES)])


@pytest.mark.parametrize(
    ("requests", "said"),
    [
        ([], "InstanceTypes must hold 1 to 8 instance types; it holds 0."),
        ([search(f"ml.t{n}") for n in range(MAX_TYPES + 1)], "it holds 9."),
        (
            [search("ml.p5.48xlarge"), search("ml.p4d.24xlarge"), search("ml.p5.48xlarge", 16)],
            "InstanceTypes: ml.p5.48xlarge is given twice",
        ),
        ([search("A"), search("B", duration_hours=96)], "the same DurationHours, TargetResources"),
        ([search("A"), search("B", target="hyperpod-cluster")], "the same DurationHours, TargetResources"),
        ([search("A"), search("B", start_after=None)], "StartTimeAfter and EndTimeBefore"),
        ([search("A"), search("B", end_before=DAY0 + DAY)], "StartTimeAfter and EndTimeBefore"),
    ],
    ids=["none", "nine", "twice", "durations", "targets", "starts", "ends"],
)
def test_requests_no_search_across_types_takes_are_refused(requests: list[SearchRequest], said: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_requests(requests)
    assert said in refused.value.message


# -- refusals --------------------------------------------------------------------------------------------


def test_a_refusal_that_does_not_name_its_type_is_given_it() -> None:
    refusal = naming_type(ValidationError("InstanceCount: 3 is not allowed; plans hold 1, 2, 4."), "ml.p5")
    assert isinstance(refusal, ValidationError)
    assert refusal.message == "For ml.p5: InstanceCount: 3 is not allowed; plans hold 1, 2, 4."


def test_a_refusal_that_names_its_type_is_kept_as_it_is() -> None:
    quota = ResourceLimitExceeded("Quota reserved-capacity-ml.p5 is 4 instances for account a.")
    assert naming_type(quota, "ml.p5") is quota
    unknown = ValidationError("InstanceType: this fleet has no ml.p5.")
    assert naming_type(unknown, "ml.p5") is unknown


def test_a_quota_refusal_keeps_its_kind() -> None:
    refusal = naming_type(ResourceLimitExceeded("Quota training-plan-total_count is 2."), "ml.p5")
    assert isinstance(refusal, ResourceLimitExceeded)
    assert refusal.message == "For ml.p5: Quota training-plan-total_count is 2."


def test_errors_that_are_no_search_refusal_are_left_alone() -> None:
    other = Conflict("something else")
    assert naming_type(other, "ml.p5") is other
