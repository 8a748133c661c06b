"""An offering's length in words, and the note that says why it is longer than asked (console/lengths.py):
values in, values out, no server."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from hyperplan.console.lengths import duration, offering_length

BOUNDARY = time(11, 30)
DAY = timedelta(days=1)


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2027, 1, day, hour, minute, tzinfo=UTC)


def test_a_length_reads_in_days_hours_and_minutes() -> None:
    assert duration(4 * DAY) == "4 days"
    assert duration(DAY + timedelta(hours=2)) == "1 day 2 h"
    assert duration(3 * DAY + timedelta(hours=23, minutes=30)) == "3 days 23 h 30 min"
    assert duration(timedelta(minutes=45)) == "45 min"
    assert duration(timedelta()) == "0 min"


def test_whole_days_as_asked_need_no_note() -> None:
    length = offering_length([(at(2, 11, 30), at(5, 11, 30))], BOUNDARY, 3 * DAY)
    assert (length.text, length.note) == ("3 days", "")


def test_a_partial_first_day_is_said_with_its_start_and_length() -> None:
    length = offering_length([(at(1, 12), at(5, 11, 30))], BOUNDARY, 3 * DAY)
    assert length.text == "3 days 23 h 30 min"
    assert length.note == (
        "3 days asked; the first segment starts at 12:00 UTC, between two daily boundaries (11:30 UTC), "
        "and also holds the 23 h 30 min up to the next one: segments end on a boundary, and the price "
        "counts the real length."
    )


def test_segments_add_up_without_their_gap() -> None:
    segments = [(at(1, 18), at(3, 11, 30)), (at(10, 11, 30), at(12, 11, 30))]
    length = offering_length(segments, BOUNDARY, 3 * DAY)
    assert length.text == "3 days 17 h 30 min"
    assert "starts at 18:00 UTC" in length.note and "the 17 h 30 min" in length.note


def test_hours_rounded_up_to_whole_days_are_said_so() -> None:
    length = offering_length([(at(2, 11, 30), at(4, 11, 30))], BOUNDARY, timedelta(hours=36))
    assert length.text == "2 days"
    assert length.note == (
        "1 day 12 h asked; segments hold whole days, from one 11:30 UTC boundary to the next."
    )


def test_without_a_request_only_a_partial_day_is_noted() -> None:
    on_boundary = offering_length([(at(2, 11, 30), at(4, 11, 30))], BOUNDARY)
    assert on_boundary.note == ""
    partial = offering_length([(at(1, 23, 50), at(4, 11, 30))], BOUNDARY)
    assert partial.note.startswith("The first segment starts at 23:50 UTC")
    assert "the 11 h 40 min up to the next one" in partial.note
