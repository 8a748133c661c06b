"""The one time syntax of the CLI's options and the console's forms (hyperplan/core/user_times.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.clock import parse_instant
from hyperplan.core.user_times import FORMS, parse_time, read_time
from hyperplan.errors import ValidationError

# The service's now in these tests: a manual clock's, late on a year's last day (relative times roll over).
NOW = datetime(2026, 12, 31, 23, 50, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-07", datetime(2026, 12, 7, tzinfo=UTC)),  # a date: midnight UTC
        ("2026-12-07T10:00", datetime(2026, 12, 7, 10, tzinfo=UTC)),
        ("2026-12-07 10:00", datetime(2026, 12, 7, 10, tzinfo=UTC)),
        ("2026-12-07t10:00:30", datetime(2026, 12, 7, 10, 0, 30, tzinfo=UTC)),
        ("2026-12-07T10:00Z", datetime(2026, 12, 7, 10, tzinfo=UTC)),
        ("2026-12-07T10:00+02:00", datetime(2026, 12, 7, 8, tzinfo=UTC)),
        ("2026-12-07T10:00-0330", datetime(2026, 12, 7, 13, 30, tzinfo=UTC)),
        ("2026-12-07 10:00 UTC", datetime(2026, 12, 7, 10, tzinfo=UTC)),  # as the CLI's tables print it
        ("2026-12-01T11:30:00.250000+00:00", datetime(2026, 12, 1, 11, 30, 0, 250_000, tzinfo=UTC)),
        ("  2026-12-07  ", datetime(2026, 12, 7, tzinfo=UTC)),
        ("now", NOW),
        ("NOW", NOW),
        ("+3d", NOW + timedelta(days=3)),
        ("+12h", NOW + timedelta(hours=12)),
        ("+30m", NOW + timedelta(minutes=30)),
        ("+1d12h", datetime(2027, 1, 2, 11, 50, tzinfo=UTC)),
        ("-2d", NOW - timedelta(days=2)),
    ],
)
def test_reads_each_form(text: str, expected: datetime) -> None:
    assert parse_time(text, NOW) == expected
    assert parse_time(text, NOW).tzinfo == UTC


@pytest.mark.parametrize(
    "text", ["tomorrow", "", "2025", "2026-12", "12/07/2026", "2026-12-07T10", "+", "+3x", "3d"]
)
def test_refuses_anything_else_naming_the_value_and_the_forms(text: str) -> None:
    with pytest.raises(ValidationError) as refused:
        read_time(text)
    assert refused.value.message == f"{text.strip()!r} is not a time; give {FORMS}."
    assert "2026-12-07" in FORMS and "+3d" in FORMS and "now" in FORMS


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("2025-13-01", "month must be in 1..12"),
        ("2026-02-29", "day is out of range for month"),
        ("2026-12-07T24:00", "hour must be in 0..23"),
        ("2026-12-07T10:00+24:00", "a zone is less than 24 hours from UTC"),
        ("2026-12-07T10:00+02:75", "its minutes 00 to 59"),
    ],
)
def test_a_date_or_time_that_does_not_exist_is_named(text: str, why: str) -> None:
    with pytest.raises(
        ValidationError, match=f"^{re.escape(repr(text))} is not a real date and time \\(.*{why}"
    ):
        read_time(text)


def test_out_of_range_times_are_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="out of range once moved into UTC"):
        read_time("9999-12-31T23:00-05:00")
    with pytest.raises(ValidationError, match="'-1d' is out of range"):
        parse_time("-1d", datetime(1, 1, 1, tzinfo=UTC))
    with pytest.raises(ValidationError, match=r"'\+99999d' is too far: .* at most 36500d"):
        read_time("+99999d")


def test_reading_needs_no_clock_and_says_whether_one_is_needed() -> None:
    assert read_time("+3d").relative and read_time("now").relative
    assert not read_time("2026-12-07").relative
    assert read_time("2026-12-07").at(NOW) == read_time("2026-12-07").at(NOW + timedelta(days=400))


aware = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.builds(
        timezone, st.integers(-23 * 60 - 59, 23 * 60 + 59).map(lambda m: timedelta(minutes=m))
    ),
)


@given(aware)
def test_every_iso_instant_with_a_zone_reads_as_the_servers_parser_reads_it(when: datetime) -> None:
    # What Python writes (isoformat) and what the API takes (parse_instant) read the same here: a time
    # the CLI prints, or a test sends to the server, means one instant to both.
    text = when.isoformat()
    assert parse_time(text, NOW) == when == parse_instant(text)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)))
def test_a_time_without_a_zone_is_utc(when: datetime) -> None:
    text = when.isoformat(sep=" ", timespec="microseconds")
    assert parse_time(text, NOW) == when.replace(tzinfo=UTC)
    assert parse_time(when.date().isoformat(), NOW) == datetime.combine(when.date(), datetime.min.time(), UTC)


@given(
    st.integers(0, 400),
    st.integers(0, 23),
    st.integers(0, 59),
    st.sampled_from(["+", "-"]),
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_a_relative_time_is_the_services_now_moved_by_the_duration(
    days: int, hours: int, minutes: int, sign: str, now: datetime
) -> None:
    parts = "".join(f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n)
    moved = timedelta(days=days, hours=hours, minutes=minutes)
    assert parse_time(sign + (parts or "0m"), now) == (now + moved if sign == "+" else now - moved)
