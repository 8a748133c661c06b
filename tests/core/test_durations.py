from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.durations import MAX_DURATION, format_duration, parse_duration
from hyperplan.errors import ValidationError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90m", timedelta(minutes=90)),
        ("6h", timedelta(hours=6)),
        ("2d", timedelta(days=2)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("45s", timedelta(seconds=45)),
        ("1d 2h 3m 4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        (" 30M ", timedelta(minutes=30)),
        ("0s", timedelta()),
    ],
)
def test_reads_a_number_and_a_unit_or_several(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", " ", "30", "m", "1x", "-5m", "1.5h", "1h1d", "2d2d", "1 day"])
def test_refuses_anything_else_and_says_what_a_duration_looks_like(text: str) -> None:
    with pytest.raises(ValidationError, match=r"is not a duration; .*e\.g\. 90m, 6h, 2d, 1d12h or 45s"):
        parse_duration(text)


def test_refuses_a_non_string() -> None:
    with pytest.raises(ValidationError, match="is not a duration"):
        parse_duration(30)  # type: ignore[arg-type]


@given(st.integers(min_value=0, max_value=10**8))
def test_formatting_reads_back(seconds: int) -> None:
    duration = timedelta(seconds=seconds)
    assert parse_duration(format_duration(duration)) == duration


def test_formats_shortest() -> None:
    assert format_duration(timedelta(days=1, hours=12)) == "1d12h"
    assert format_duration(timedelta(minutes=30)) == "30m"
    assert format_duration(timedelta()) == "0s"


@pytest.mark.parametrize("text", ["36501d", "99999999999999d", "876001h", "9" * 5000 + "s", "36500d1s"])
def test_refuses_a_duration_longer_than_the_limit_by_name_not_by_overflow(text: str) -> None:
    with pytest.raises(ValidationError, match=r"is too long; a duration is at most 36500d"):
        parse_duration(text)


def test_the_limit_itself_and_leading_zeros_are_fine() -> None:
    assert parse_duration("36500d") == MAX_DURATION
    assert parse_duration("000000000000000000000000001d") == timedelta(days=1)
