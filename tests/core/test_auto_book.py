"""A training job's auto-book request: the tag grammar, the native structure, the choice among offerings
and how long waiting makes sense (hyperplan/core/auto_book.py; docs/API.md, "Auto-booked training jobs")."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hyperplan.core.auto_book import (
    MAX_TAG_VALUE,
    NEVER,
    TAG_KEY,
    AutoBookRequest,
    Candidate,
    TypeWanted,
    acceptable,
    check_currency,
    choose,
    describe,
    from_native,
    met_until,
    parse_tag,
    why_none,
    window_can_be_met,
)
from hyperplan.errors import ValidationError
from hyperplan.wire.java_regex import compiled_pattern
from hyperplan.wire.model import service_model

P5, P4D, TRN1 = "ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.trn1.32xlarge"
CREATED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
LEAD = timedelta(minutes=30)
EXAMPLE = f"types={P5}:8+{P4D}:16/days=3/within=14d/max-usd=40000/prefer=earliest"


def request(**changes: Any) -> AutoBookRequest:
    fields: dict[str, Any] = {"types": (TypeWanted(P5, 8), TypeWanted(P4D, 16)), "duration_hours": 72}
    return AutoBookRequest(**(fields | changes))


# -- the tag grammar -----------------------------------------------------------------------------------


def test_reads_the_issues_example() -> None:
    assert parse_tag(EXAMPLE) == AutoBookRequest(
        types=(TypeWanted(P5, 8), TypeWanted(P4D, 16)),
        duration_hours=72,
        within=timedelta(days=14),
        start_after=None,
        end_before=None,
        max_price=Decimal("40000"),
        max_segments=None,
        prefer="earliest",
        currency="USD",
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"types={P5}:8/days=3", request(types=(TypeWanted(P5, 8),))),  # prefer defaults to cheapest
        (f"types={P5}:8+{P4D}:16/hours=72", request()),
        (f"types={P5}:8+{P4D}:16/hours=49", request()),  # hours round up to whole days, as a search's
        (f"types={P5}:8+{P4D}:16/hours=1", request(duration_hours=24)),
        (f"days=3/types={P5}:8+{P4D}:16", request()),  # parts in any order
        (f" types = {P5}:8+{P4D}:16 / days = 3 ", request()),  # spaces around parts, keys and values
        (f"types={P5}:8+{P4D}:16/days=1/within=36h", request(duration_hours=24, within=timedelta(hours=36))),
        (
            f"types={P5}:8+{P4D}:16/days=3/max-usd=12.50/max-segments=2",
            request(max_price=Decimal("12.50"), currency="USD", max_segments=2),
        ),
        (f"types={P5}:8+{P4D}:16/days=3/max-eur=0", request(max_price=Decimal(0), currency="EUR")),
        (f"types={P5}:8+{P4D}:16/days=182/prefer=cheapest", request(duration_hours=182 * 24)),
        (f"types={TRN1}:1/days=03", request(types=(TypeWanted(TRN1, 1),))),  # a leading zero is a digit
    ],
)
def test_reads_each_part(value: str, expected: AutoBookRequest) -> None:
    assert parse_tag(value) == expected


TYPES = f"types={P5}:8"
NINE_TYPES = "+".join(f"ml.p{i}.48xlarge:8" for i in range(9))
LONG = f"{TYPES}/days=3/prefer=earliest/{'x' * 250}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "the value is empty; it needs at least types=TYPE:COUNT and days=N"),
        ("   ", "the value is empty; it needs at least types=TYPE:COUNT and days=N"),
        ("days=3", "types is required, such as types=ml.p5.48xlarge:8+ml.p4d.24xlarge:16"),
        (TYPES, "a duration is required: days=N (1 to 182) or hours=N (rounded up to whole days)"),
        (f"{TYPES}/days=3/hours=72", "parts 'days=3' and 'hours=72': give days or hours, not both"),
        (f"{TYPES}/days=3/days=4", "part 'days=4': days is given twice (first as 'days=3')"),
        (
            f"{TYPES}/days=3/max-usd=1/max-eur=1",
            "part 'max-eur=1': a price limit is given twice (first as 'max-usd=1')",
        ),
        (f"{TYPES}//days=3", "an empty part: two '/' in a row, or one at either end"),
        (f"{TYPES}/days=3/", "an empty part: two '/' in a row, or one at either end"),
        (f"{TYPES}/days", "part 'days': a part is key=value, such as days=3"),
        (f"{TYPES}/days=", "part 'days=': days has no value"),
        (
            f"{TYPES}/days=3/colour=red",
            "part 'colour=red': unknown key 'colour'; the keys are types, days, hours, within, "
            "max-<currency> (such as max-usd), max-segments and prefer",
        ),
        (f"{TYPES}/Days=3", "part 'Days=3': unknown key 'Days'"),
        (f"{TYPES}/days=3/max-dollars=5", "part 'max-dollars=5': unknown key 'max-dollars'"),
        (f"types={P5}/days=3", f"part 'types={P5}': types gives '{P5}' without its count: TYPE:COUNT"),
        (f"types={P5}:/days=3", f"part 'types={P5}:': types gives {P5} the count '', which must be a whole"),
        (
            f"types={P5}:0/days=3",
            f"part 'types={P5}:0': types gives {P5} the count '0', "
            "which must be a whole number from 1 to 10000",
        ),
        (f"types={P5}:-1/days=3", f"part 'types={P5}:-1': types gives {P5} the count '-1', which must be"),
        (f"types={P5}:1.5/days=3", f"part 'types={P5}:1.5': types gives {P5} the count '1.5', which must"),
        (f"types={P5}:10001/days=3", f"part 'types={P5}:10001': types gives {P5} the count '10001', which"),
        (
            "types=p5:8/days=3",
            "part 'types=p5:8': types gives 'p5', which must be an instance type, ml.FAMILY.SIZE such as "
            "ml.p5.48xlarge",
        ),
        (
            "types=ML.P5.48XLARGE:8/days=3",
            "part 'types=ML.P5.48XLARGE:8': types gives 'ML.P5.48XLARGE', which",
        ),
        (
            f"types={P5}:8++{P4D}:16/days=3",
            f"part 'types={P5}:8++{P4D}:16': types has an empty type: two '+' in a row, or one at either end",
        ),
        (
            f"types={P5}:8+{P5}:4/days=3",
            f"part 'types={P5}:8+{P5}:4': types gives {P5} twice; give each type once, with its count",
        ),
        (f"types={NINE_TYPES}/days=3", f"part 'types={NINE_TYPES}': types must give 1 to 8 types, not 9"),
        (f"{TYPES}/days=x", "part 'days=x': days must be a whole number from 1 to 182"),
        (f"{TYPES}/days=0", "part 'days=0': days must be a whole number from 1 to 182"),
        (f"{TYPES}/days=183", "part 'days=183': days must be a whole number from 1 to 182"),
        (f"{TYPES}/days=-3", "part 'days=-3': days must be a whole number from 1 to 182"),
        (f"{TYPES}/hours=0", "part 'hours=0': hours must be a whole number from 1 to 4368"),
        (f"{TYPES}/hours=4369", "part 'hours=4369': hours must be a whole number from 1 to 4368"),
        (
            f"{TYPES}/days=3/within=14",
            "part 'within=14': within must be a number of days or hours such as 14d",
        ),
        (f"{TYPES}/days=3/within=2w", "part 'within=2w': within must be a number of days or hours"),
        (f"{TYPES}/days=3/within=0d", "part 'within=0d': within must be a number of days or hours"),
        (f"{TYPES}/days=3/within=367d", "part 'within=367d': within must be a number of days or hours"),
        (
            f"{TYPES}/days=3/within=3d",
            "part 'within=3d': within must be longer than the duration, 3 days: "
            "a plan starts some time after the job is created",
        ),
        (
            f"{TYPES}/hours=36/within=47h",
            "part 'within=47h': within must be longer than the duration, 2 days",
        ),
        (f"{TYPES}/days=3/max-usd=12.345", "part 'max-usd=12.345': max-usd must be a decimal with at most 2"),
        (f"{TYPES}/days=3/max-usd=-1", "part 'max-usd=-1': max-usd must be a decimal"),
        (f"{TYPES}/days=3/max-usd=1e5", "part 'max-usd=1e5': max-usd must be a decimal"),
        (f"{TYPES}/days=3/max-usd=.5", "part 'max-usd=.5': max-usd must be a decimal"),
        (
            f"{TYPES}/days=3/max-usd=1234567890123",
            "part 'max-usd=1234567890123': max-usd must be a decimal with at most 2 places and 12 digits",
        ),
        (
            f"{TYPES}/days=3/max-segments=0",
            "part 'max-segments=0': max-segments must be a whole number from 1",
        ),
        (f"{TYPES}/days=3/max-segments=two", "part 'max-segments=two': max-segments must be a whole number"),
        (f"{TYPES}/days=3/prefer=fastest", "part 'prefer=fastest': prefer must be cheapest or earliest"),
        (f"{TYPES}/days=3/prefer=Cheapest", "part 'prefer=Cheapest': prefer must be cheapest or earliest"),
        (LONG, f"the value is {len(LONG)} characters; a tag value holds at most 256"),
    ],
)
def test_refuses_a_malformed_value_naming_the_part(value: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_tag(value)
    assert refused.value.message.startswith(f"{TAG_KEY}: {message}")


def test_a_value_of_the_full_length_is_read() -> None:
    value = f"types={P5}:8/days=3/prefer=earliest"
    value += "/" + " " * (MAX_TAG_VALUE - len(value) - 1)  # spaces around a part are ignored...
    with pytest.raises(ValidationError, match="an empty part"):  # ...but a part of spaces is empty
        parse_tag(value)
    padded = f"types={P5}:8/days=3/prefer=earliest".ljust(MAX_TAG_VALUE)
    assert len(padded) == MAX_TAG_VALUE
    assert parse_tag(padded).prefer == "earliest"


# -- the native structure ------------------------------------------------------------------------------

NATIVE: dict[str, Any] = {
    "InstanceTypes": [{"InstanceType": P5, "InstanceCount": 8}, {"InstanceType": P4D, "InstanceCount": 16}],
    "DurationHours": 72,
}


def test_reads_a_full_native_structure() -> None:
    body = NATIVE | {
        "StartTimeAfter": "2026-12-02T11:30:00+02:00",
        "EndTimeBefore": "2026-12-20T00:00:00Z",
        "MaxPrice": "40000.00",
        "Currency": "USD",
        "MaxSegments": 2,
        "Prefer": "earliest",
    }
    assert from_native(body) == request(
        start_after=datetime(2026, 12, 2, 9, 30, tzinfo=UTC),
        end_before=datetime(2026, 12, 20, tzinfo=UTC),
        max_price=Decimal("40000"),
        currency="USD",
        max_segments=2,
        prefer="earliest",
    )
    assert from_native(body).start_after.tzinfo == UTC  # type: ignore[union-attr]


def test_native_defaults_and_rounding() -> None:
    assert from_native(NATIVE) == request()
    assert from_native(NATIVE | {"DurationHours": 25, "Within": "3d"}) == request(
        duration_hours=48, within=timedelta(days=3)
    )
    assert from_native(NATIVE | {"Within": None, "MaxPrice": None}) == request()  # null: absent


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"Colour": "red", "Size": 1},
            "AutoBook: unknown member(s) 'Colour', 'Size'; it takes InstanceTypes, ",
        ),
        (
            {"InstanceTypes": None},
            "AutoBook.InstanceTypes is required: a list of {InstanceType, InstanceCount}.",
        ),
        (
            {"InstanceTypes": P5},
            f"AutoBook.InstanceTypes must be a list of {{InstanceType, InstanceCount}}, not '{P5}'.",
        ),
        ({"InstanceTypes": []}, "AutoBook.InstanceTypes must give 1 to 8 types, not 0."),
        (
            {"InstanceTypes": [P5]},
            "AutoBook.InstanceTypes[0] must be an object {InstanceType, InstanceCount}.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5, "InstanceCount": 8, "Zone": "a"}]},
            "AutoBook.InstanceTypes[0]: unknown member(s) 'Zone'; it takes InstanceType, InstanceCount.",
        ),
        (
            {
                "InstanceTypes": [
                    {"InstanceType": P5, "InstanceCount": 8},
                    {"InstanceType": "p4d", "InstanceCount": 1},
                ]
            },
            "AutoBook.InstanceTypes[1].InstanceType must be an instance type, ml.FAMILY.SIZE such as "
            "ml.p5.48xlarge, not 'p4d'.",
        ),
        (
            {"InstanceTypes": [{"InstanceCount": 8}]},
            "AutoBook.InstanceTypes[0].InstanceType must be an instance type, ml.FAMILY.SIZE such as "
            "ml.p5.48xlarge, not None.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5}]},
            "AutoBook.InstanceTypes[0].InstanceCount is required: it must be a whole number from 1 to 10000.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5, "InstanceCount": 0}]},
            "AutoBook.InstanceTypes[0].InstanceCount must be a whole number from 1 to 10000, not 0.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5, "InstanceCount": "8"}]},
            "AutoBook.InstanceTypes[0].InstanceCount must be a whole number from 1 to 10000, not '8'.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5, "InstanceCount": True}]},
            "AutoBook.InstanceTypes[0].InstanceCount must be a whole number from 1 to 10000, not True.",
        ),
        (
            {"InstanceTypes": [{"InstanceType": P5, "InstanceCount": Decimal("8.0")}]},
            "AutoBook.InstanceTypes[0].InstanceCount must be a whole number from 1 to 10000, "
            "not Decimal('8.0').",
        ),
        (
            {
                "InstanceTypes": [
                    {"InstanceType": P5, "InstanceCount": 8},
                    {"InstanceType": P5, "InstanceCount": 4},
                ]
            },
            f"AutoBook.InstanceTypes gives {P5} twice; give each type once, with its count.",
        ),
        (
            {"DurationHours": None},
            "AutoBook.DurationHours is required: it must be a whole number from 1 to 4368.",
        ),
        ({"DurationHours": 0}, "AutoBook.DurationHours must be a whole number from 1 to 4368, not 0."),
        ({"DurationHours": 4369}, "AutoBook.DurationHours must be a whole number from 1 to 4368, not 4369."),
        ({"DurationHours": 72.0}, "AutoBook.DurationHours must be a whole number from 1 to 4368, not 72.0."),
        ({"Within": 14}, 'AutoBook.Within must be a string such as "14d" or "36h", not 14.'),
        (
            {"Within": "2w"},
            "AutoBook.Within must be a number of days or hours such as 14d or 36h, at most 366d, not '2w'.",
        ),
        (
            {"Within": "72h"},
            "AutoBook.Within must be longer than the duration, 3 days: a plan starts some time",
        ),
        (
            {"Within": "14d", "EndTimeBefore": "2026-12-20T00:00:00Z"},
            "AutoBook: give Within or EndTimeBefore, not both: each ends the window.",
        ),
        (
            {"StartTimeAfter": "2026-12-02T11:30:00"},
            "AutoBook.StartTimeAfter must be an ISO 8601 time with a zone",
        ),
        ({"StartTimeAfter": "2026-12-02"}, "AutoBook.StartTimeAfter must be an ISO 8601 time with a zone"),
        (
            {"StartTimeAfter": "next week"},
            "AutoBook.StartTimeAfter must be an ISO 8601 time with a zone, such as",
        ),
        (
            {"EndTimeBefore": 1796000000},
            "AutoBook.EndTimeBefore must be an ISO 8601 time with a zone, such as ",
        ),
        (
            {"EndTimeBefore": "9999-12-31T23:00:00-05:00"},
            "AutoBook.EndTimeBefore must be an ISO 8601 time with",
        ),
        (
            {"StartTimeAfter": "2026-12-10T00:00:00Z", "EndTimeBefore": "2026-12-12T23:59:59Z"},
            "AutoBook.EndTimeBefore: 2026-12-12T23:59:59Z is less than the duration (3 days) after "
            "StartTimeAfter, 2026-12-10T00:00:00Z; no plan fits between them.",
        ),
        ({"MaxPrice": 40000}, 'AutoBook.MaxPrice must be a decimal string such as "40000.00", not 40000.'),
        (
            {"MaxPrice": "4e4"},
            "AutoBook.MaxPrice must be a decimal with at most 2 places and 12 digits before",
        ),
        ({"MaxPrice": "1.001"}, "AutoBook.MaxPrice must be a decimal with at most 2 places"),
        (
            {"MaxPrice": "1", "Currency": "usd"},
            "AutoBook.Currency must be three capital letters, such as USD, not",
        ),
        ({"Currency": "USD"}, "AutoBook.Currency is the currency of MaxPrice; it means nothing without it."),
        ({"MaxSegments": 0}, "AutoBook.MaxSegments must be a whole number from 1 to 100, not 0."),
        ({"MaxSegments": "2"}, "AutoBook.MaxSegments must be a whole number from 1 to 100, not '2'."),
        ({"Prefer": "soonest"}, "AutoBook.Prefer must be cheapest or earliest, not 'soonest'."),
        ({"Prefer": 1}, 'AutoBook.Prefer must be "cheapest" or "earliest", not 1.'),
    ],
)
def test_refuses_a_native_structure_naming_the_member(changes: dict[str, Any], message: str) -> None:
    body = {
        name: value for name, value in (NATIVE | changes).items() if value is not None or name not in NATIVE
    }
    with pytest.raises(ValidationError) as refused:
        from_native(body)
    assert refused.value.message.startswith(message)


def test_refusals_name_where_the_structure_is() -> None:
    with pytest.raises(ValidationError, match=r"^TrainingJob\.AutoBook\.DurationHours must be"):
        from_native(NATIVE | {"DurationHours": -1}, where="TrainingJob.AutoBook")
    with pytest.raises(
        ValidationError, match=r"^AutoBook must be an object with the members InstanceTypes, "
    ):
        from_native([NATIVE])  # type: ignore[arg-type]


# -- storing ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        parse_tag(EXAMPLE),
        request(),
        from_native(
            NATIVE
            | {
                "StartTimeAfter": "2026-12-02T11:30:00Z",
                "EndTimeBefore": "2026-12-20T00:00:00+01:00",
                "MaxSegments": 1,
            }
        ),
        request(within=timedelta(hours=100), max_price=Decimal("0.05")),
    ],
)
def test_stores_and_reads_back_equal(stored: AutoBookRequest) -> None:
    text = stored.to_json()
    assert json.loads(text)["DurationHours"] == stored.duration_hours
    assert AutoBookRequest.from_json(text) == stored


def test_the_stored_form_is_the_native_structure() -> None:
    assert json.loads(parse_tag(EXAMPLE).to_json()) == {
        "InstanceTypes": [
            {"InstanceType": P5, "InstanceCount": 8},
            {"InstanceType": P4D, "InstanceCount": 16},
        ],
        "DurationHours": 72,
        "Within": "14d",
        "MaxPrice": "40000",
        "Currency": "USD",
        "Prefer": "earliest",
    }


def test_a_tag_is_rendered_only_where_the_grammar_has_a_part_for_it() -> None:
    assert parse_tag(EXAMPLE).to_tag() == EXAMPLE
    with pytest.raises(ValueError, match="StartTimeAfter or EndTimeBefore"):
        request(end_before=CREATED + timedelta(days=9)).to_tag()
    with pytest.raises(ValueError, match="without its currency"):
        request(max_price=Decimal(100)).to_tag()


# -- the window ------------------------------------------------------------------------------------------


def test_the_window_counts_within_from_the_jobs_creation() -> None:
    assert request().window(CREATED) == (None, None)
    assert request(within=timedelta(days=14)).window(CREATED) == (None, CREATED + timedelta(days=14))
    start, end = CREATED + timedelta(days=2), CREATED + timedelta(days=9)
    assert request(start_after=start, end_before=end).window(CREATED) == (start, end)
    assert request(start_after=start, within=timedelta(days=5)).window(CREATED) == (
        start,
        CREATED + timedelta(days=5),
    )


def test_window_can_be_met_until_a_plan_starting_at_the_soonest_would_end_too_late() -> None:
    wanted = request(within=timedelta(days=5))  # 3 days, ending by CREATED + 5 days
    last_chance = CREATED + timedelta(days=2) - LEAD
    assert window_can_be_met(wanted, CREATED, CREATED, LEAD)
    assert window_can_be_met(wanted, CREATED, last_chance, LEAD)  # ends exactly at the window's end
    assert not window_can_be_met(wanted, CREATED, last_chance + timedelta(seconds=1), LEAD)
    assert window_can_be_met(request(), CREATED, CREATED + timedelta(days=400), LEAD)  # no end: always


def test_window_can_be_met_counts_from_a_later_start_after() -> None:
    start = CREATED + timedelta(days=3)
    wanted = request(start_after=start, end_before=start + timedelta(days=3))
    assert window_can_be_met(wanted, CREATED, CREATED, LEAD)  # the window opens later: it fits exactly
    assert not window_can_be_met(wanted, CREATED, start - LEAD + timedelta(minutes=1), LEAD)
    assert not window_can_be_met(
        wanted, CREATED, CREATED, timedelta(days=3, minutes=1)
    )  # a fleet's long lead


def test_window_can_be_met_with_segments_ending_at_a_time_of_day() -> None:
    # Segments end at 11:30: a plan whose soonest start is past 11:30 runs on to 11:30 of its last day.
    wanted = request(end_before=datetime(2026, 12, 4, 12, 0, tzinfo=UTC))  # half an hour after a boundary
    at_1130 = time(11, 30)
    assert window_can_be_met(
        wanted, CREATED, CREATED, LEAD, segment_end=at_1130
    )  # starts 09:30, ends Dec 4 11:30
    assert window_can_be_met(
        wanted, CREATED, CREATED.replace(hour=11), LEAD, segment_end=at_1130
    )  # starts 11:30
    late = CREATED.replace(hour=11, minute=1)  # starts 11:31: ends at 11:30 on Dec 5
    assert not window_can_be_met(wanted, CREATED, late, LEAD, segment_end=at_1130)
    assert window_can_be_met(wanted, CREATED, late, LEAD)  # without the boundary only the hours count


# -- choosing --------------------------------------------------------------------------------------------


def offering(
    key: str,
    price: str,
    end_day: int,
    *,
    kind: str = P5,
    count: int = 8,
    segments: int = 1,
    rank: int = 0,
    start_day: int | None = None,
) -> Candidate:
    end = datetime(2026, 12, end_day, 11, 30, tzinfo=UTC)
    start = (
        end - timedelta(days=3) if start_day is None else datetime(2026, 12, start_day, 11, 30, tzinfo=UTC)
    )
    return Candidate(key, kind, count, segments, start, end, Decimal(price), rank)


CHEAP_LATE = offering("cheap-late", "30000", 20, rank=2)
DEAR_EARLY = offering("dear-early", "45000", 5, kind=P4D, count=16, rank=0)
MIDDLE = offering("middle", "38000", 10, rank=1)


def test_cheapest_takes_the_lowest_price() -> None:
    assert choose([DEAR_EARLY, MIDDLE, CHEAP_LATE], request()) == CHEAP_LATE


def test_earliest_takes_the_earliest_end() -> None:
    assert choose([CHEAP_LATE, MIDDLE, DEAR_EARLY], request(prefer="earliest")) == DEAR_EARLY


def test_ties_go_to_the_next_rule_then_to_the_search_rank() -> None:
    same_price_later = offering("later", "30000", 22, rank=0)
    same_price_sooner = offering("sooner", "30000", 12, rank=5)
    assert choose([same_price_later, same_price_sooner], request()) == same_price_sooner
    same_end_dearer = offering("dearer", "39000", 10, rank=0)
    assert choose([same_end_dearer, MIDDLE], request(prefer="earliest")) == MIDDLE
    twin = offering("twin", "38000", 10, kind=P4D, count=16, rank=0)
    assert choose([MIDDLE, twin], request()) == twin
    assert choose([MIDDLE, twin], request(prefer="earliest")) == twin


def test_limits_leave_out_what_breaks_them() -> None:
    offers = [CHEAP_LATE, MIDDLE, DEAR_EARLY]
    assert choose(offers, request(max_price=Decimal("37999.99"))) == CHEAP_LATE
    assert (
        choose(offers, request(max_price=Decimal(38000), prefer="earliest")) == MIDDLE
    )  # the limit is inclusive
    split = offering("split", "100", 6, segments=2)
    assert choose([split, MIDDLE], request(max_segments=1)) == MIDDLE
    assert choose([split, MIDDLE], request(max_segments=2)) == split
    assert choose([split, MIDDLE], request()) == split  # no limit: the fleet's own
    within_nine_days = request(within=timedelta(days=9))
    assert choose(offers, within_nine_days, created_at=CREATED) == DEAR_EARLY  # ends by Dec 10 09:00
    assert choose(offers, within_nine_days) == CHEAP_LATE  # without the creation, within is not known


def test_only_the_types_and_counts_asked_for_are_taken() -> None:
    wrong_count = offering("wrong-count", "1", 5, count=4)
    other_type = offering("other-type", "1", 5, kind=TRN1)
    assert choose([wrong_count, other_type, MIDDLE], request()) == MIDDLE
    assert acceptable(wrong_count, request()) == (
        f"{P5} x4 is not one of the types asked for ({P5} x8 or {P4D} x16)"
    )


def test_acceptable_says_the_first_rule_broken() -> None:
    wanted = request(
        start_after=datetime(2026, 12, 3, tzinfo=UTC),
        end_before=datetime(2026, 12, 15, tzinfo=UTC),
        max_price=Decimal(40000),
        max_segments=1,
        currency="USD",
    )
    assert acceptable(MIDDLE, wanted) is None
    assert acceptable(DEAR_EARLY, wanted) == "it starts at 2026-12-02T11:30:00Z, before 2026-12-03T00:00:00Z"
    assert acceptable(CHEAP_LATE, wanted) == "it ends at 2026-12-20T11:30:00Z, after 2026-12-15T00:00:00Z"
    split = offering("split", "50000", 12, segments=2)
    assert acceptable(split, wanted) == "it has 2 segments, more than max-segments 1"
    assert acceptable(offering("dear", "52000.5", 12), wanted) == "it costs 52,000.50, above max-usd 40000"
    assert acceptable(offering("dear", "52000.5", 12), request(max_price=Decimal(1))) == (
        "it costs 52,000.50, above the price limit 1"
    )


def test_nothing_acceptable_chooses_nothing() -> None:
    assert choose([], request()) is None
    assert choose([CHEAP_LATE, MIDDLE, DEAR_EARLY], request(max_price=Decimal(100))) is None


# -- why nothing was chosen ------------------------------------------------------------------------------


def test_why_none_with_no_offering_names_what_was_asked() -> None:
    assert why_none([], parse_tag(EXAMPLE), created_at=CREATED) == (
        f"no offering of {P5} x8 or {P4D} x16 for 3 days before 2026-12-15T09:00:00Z"
    )
    assert why_none([], parse_tag(EXAMPLE)) == (
        f"no offering of {P5} x8 or {P4D} x16 for 3 days within 14 days of the job's creation"
    )
    three = request(types=(TypeWanted(P5, 8), TypeWanted(P4D, 16), TypeWanted(TRN1, 4)), duration_hours=24)
    assert why_none([], three) == f"no offering of {P5} x8, {P4D} x16 or {TRN1} x4 for 1 day"
    start, end = datetime(2026, 12, 3, tzinfo=UTC), datetime(2026, 12, 15, tzinfo=UTC)
    assert why_none([], request(start_after=start)) == (
        f"no offering of {P5} x8 or {P4D} x16 for 3 days after 2026-12-03T00:00:00Z"
    )
    assert describe(request(start_after=start, end_before=end)) == (
        f"{P5} x8 or {P4D} x16 for 3 days between 2026-12-03T00:00:00Z and 2026-12-15T00:00:00Z"
    )
    assert describe(request(start_after=start, within=timedelta(hours=100))).endswith(
        "after 2026-12-03T00:00:00Z within 100 hours of the job's creation"
    )


def test_why_none_when_every_offering_is_too_dear() -> None:
    offers = [offering("a", "52000", 9), offering("b", "60000", 8), offering("c", "75000.5", 7)]
    assert (
        why_none(offers, parse_tag(EXAMPLE))
        == "3 offerings found, all above max-usd 40000 (cheapest 52,000.00)"
    )
    assert why_none(offers[:1], parse_tag(EXAMPLE)) == "1 offering found, above max-usd 40000 (52,000.00)"


def test_why_none_counts_each_reason() -> None:
    wanted = request(max_price=Decimal(40000), currency="USD", max_segments=1, within=timedelta(days=10))
    offers = [
        offering("dear", "52000", 6),
        offering("dearer", "61000", 7),
        offering("split", "100", 6, segments=3),
        offering("late", "100", 25),
        offering("small", "100", 6, count=1),
    ]
    assert why_none(offers, wanted, created_at=CREATED) == (
        "5 offerings found, none acceptable: 1 of other types or counts than "
        f"{P5} x8 or {P4D} x16, 1 outside the window before 2026-12-11T09:00:00Z, 1 in more segments than "
        "max-segments 1 (3), 2 above max-usd 40000 (cheapest 52,000.00)"
    )
    assert why_none(offers[2:3] * 2, wanted) == (
        "2 offerings found, all in more segments than max-segments 1 (fewest 3)"
    )
    with_one_fine = [*offers, offering("fine", "100", 6)]
    assert why_none(with_one_fine, wanted, created_at=CREATED) == "6 offerings found, 1 of them acceptable"


# -- the currency ----------------------------------------------------------------------------------------


def test_a_price_limit_in_another_currency_than_the_fleets_is_refused() -> None:
    check_currency(parse_tag(EXAMPLE), "USD")
    check_currency(request(max_price=Decimal(5)), "EUR")  # natively without Currency: the fleet's
    in_euros = parse_tag(f"{TYPES}/days=3/max-eur=900.5")
    with pytest.raises(ValidationError) as refused:
        check_currency(in_euros, "USD")
    assert refused.value.message == (
        f"{TAG_KEY}: part 'max-eur=900.5': this fleet's prices are in USD; give the limit as max-usd"
    )
    native = from_native(NATIVE | {"MaxPrice": "900.50", "Currency": "EUR"})
    with pytest.raises(ValidationError) as refused:
        check_currency(native, "USD", where="AutoBook")
    assert refused.value.message == "AutoBook.Currency: EUR is not this fleet's currency; prices are in USD."


# -- every request the grammar can say --------------------------------------------------------------------

_TAG_VALUE = compiled_pattern(service_model().shape_for("TagValue").metadata["pattern"])
_KNOWN_TYPES = (P5, P4D, TRN1, "ml.p5e.48xlarge", "ml.p5en.48xlarge", "ml.p4de.24xlarge", "ml.trn2.48xlarge")
_type_names = st.sampled_from(_KNOWN_TYPES) | st.from_regex(
    r"ml\.[a-z0-9-]{1,8}\.[a-z0-9-]{1,8}", fullmatch=True
)
_requests = st.builds(
    AutoBookRequest,
    types=st.lists(
        st.builds(TypeWanted, _type_names, st.integers(1, 10_000)),
        min_size=1,
        max_size=8,
        unique_by=lambda wanted: wanted.instance_type,
    ).map(tuple),
    duration_hours=st.integers(1, 182).map(lambda days: days * 24),
    within=st.none() | st.integers(1, 366 * 24).map(lambda hours: timedelta(hours=hours)),
    max_price=st.none() | st.decimals(0, Decimal("999999999999.99"), places=2),
    max_segments=st.none() | st.integers(1, 100),
    prefer=st.sampled_from(["cheapest", "earliest"]),
    currency=st.sampled_from(["USD", "EUR", "JPY"]),
).map(
    lambda made: (
        made if made.max_price is not None else AutoBookRequest(**{**made.__dict__, "currency": None})
    )
)


@given(_requests)
def test_any_request_rendered_to_the_tag_grammar_reads_back_equal(wanted: AutoBookRequest) -> None:
    assume(wanted.within is None or wanted.within > timedelta(hours=wanted.duration_hours))
    tag = wanted.to_tag()
    assume(len(tag) <= MAX_TAG_VALUE)
    assert _TAG_VALUE is not None and _TAG_VALUE.fullmatch(tag)  # AWS would take it as a tag value
    assert parse_tag(tag) == wanted
    assert AutoBookRequest.from_json(wanted.to_json()) == wanted


_instants = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


@given(_requests, _instants, st.integers(0, 400 * 24))
def test_any_native_request_is_stored_and_read_back_equal(
    wanted: AutoBookRequest, start: datetime, hours: int
) -> None:
    end = start + timedelta(hours=wanted.duration_hours + hours)
    absolute = AutoBookRequest(**{**wanted.__dict__, "within": None, "start_after": start, "end_before": end})
    assert AutoBookRequest.from_json(absolute.to_json()) == absolute
    assert from_native(absolute.to_native()) == absolute


# -- what docs/API.md says -------------------------------------------------------------------------------

_DOCS = Path(__file__).resolve().parents[2] / "docs" / "API.md"
_REFUSED_IN_THE_DOCS = [
    f"{TYPES}/days=x",
    f"types={P5}/days=3",
    f"{TYPES}/days=3/hours=72",
    f"{TYPES}/days=3/days=4",
    f"{TYPES}/days=3/colour=red",
    f"{TYPES}/days=3/within=3d",
    f"{TYPES}//days=3",
    "days=3",
]


def _documented() -> str:
    text = _DOCS.read_text()
    return text[text.index("## Auto-booked training jobs") : text.index("## The AWS endpoint")]


def test_the_documented_examples_read_as_documented() -> None:
    section = _documented()
    tags = re.findall(r"`(types=ml\.[^`]+)`", section)
    assert EXAMPLE in section and len(tags) >= 2  # the example in the aws command, then the list's
    for tag in tags:
        parse_tag(tag)
    structure = re.search(r'^"AutoBook": (\{.*?\})\n```', section, re.DOTALL | re.MULTILINE)
    assert structure is not None
    assert from_native(json.loads(structure[1])) == parse_tag(f"{EXAMPLE}/max-segments=2")


def test_the_documented_refusals_are_the_ones_given() -> None:
    documented = re.findall(rf"^({TAG_KEY}: .*)$", _documented(), re.MULTILINE)
    assert len(documented) == len(_REFUSED_IN_THE_DOCS)
    for value, message in zip(_REFUSED_IN_THE_DOCS, documented, strict=True):
        with pytest.raises(ValidationError) as refused:
            parse_tag(value)
        assert refused.value.message == message


@given(
    within_hours=st.integers(1, 24 * 60),
    days=st.integers(1, 5),
    start_after_hours=st.none() | st.integers(0, 24 * 20),
    now_minutes=st.integers(-60, 60 * 24 * 70),
    lead_minutes=st.integers(0, 24 * 60),
    segment_end=st.none() | st.sampled_from([time(11, 30), time(0, 0), time(23, 59)]),
)
def test_met_until_is_the_last_instant_the_window_can_be_met(
    within_hours: int,
    days: int,
    start_after_hours: int | None,
    now_minutes: int,
    lead_minutes: int,
    segment_end: time | None,
) -> None:
    """A waiting job's look is planned at `met_until`: it must agree with `window_can_be_met` everywhere."""
    start_after = None if start_after_hours is None else CREATED + timedelta(hours=start_after_hours)
    end = CREATED + timedelta(hours=within_hours)
    assume(start_after is None or start_after < end)
    wanted = request(duration_hours=24 * days, start_after=start_after, end_before=end)
    now, lead = CREATED + timedelta(minutes=now_minutes), timedelta(minutes=lead_minutes)
    until = met_until(wanted, CREATED, lead, segment_end=segment_end)
    assert until is not None
    assert window_can_be_met(wanted, CREATED, now, lead, segment_end=segment_end) == (now <= until)
    if until is not NEVER:
        assert window_can_be_met(wanted, CREATED, until, lead, segment_end=segment_end)
    assert met_until(request(), CREATED, lead) is None  # no end: never too late
