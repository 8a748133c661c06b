"""How long an offering lasts, in words, and why when it is longer than what was asked.

Presentation only, values in and values out. The search's rule (core/search.py, docs/DECISIONS.md
"Booking policy"): segments hold whole days from one daily boundary (11:30 UTC) to the next, except
that a segment starting at the soonest start, when that falls between two boundaries, also holds the
partial day up to the next one; its length and its price count that real length. A "3 days" search
made at 12:00 UTC can so be offered 3 days 23 h 30 min, and a reader must be told why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

DAY = timedelta(days=1)


def duration(length: timedelta) -> str:
    """A length as a reader says it: "4 days", "1 day 2 h", "3 days 23 h 30 min", "23 h 30 min"."""
    minutes = int(length // timedelta(minutes=1))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = []
    if days:
        parts.append(f"{days} day{'s' if days != 1 else ''}")
    if hours:
        parts.append(f"{hours} h")
    if minutes:
        parts.append(f"{minutes} min")
    return " ".join(parts) or "0 min"


@dataclass(frozen=True)
class OfferingLength:
    total: timedelta  # the segments' lengths added up (gaps between them not counted)
    note: str  # why it is longer than asked, or "" when it is not

    @property
    def text(self) -> str:
        return duration(self.total)


def offering_length(
    segments: Sequence[tuple[datetime, datetime]], boundary: time, asked: timedelta | None = None
) -> OfferingLength:
    """The length of an offering of `segments` ((start, end), in order), and a note saying why it is
    longer than `asked` (or, when nothing was asked, that its first segment holds a partial day)."""
    total = sum((end - start for start, end in segments), timedelta())
    if asked is not None and total <= asked:
        return OfferingLength(total, "")
    first_start = segments[0][0].astimezone(UTC)
    partial = _partial_day(first_start, boundary)
    at = f"{boundary:%H:%M} UTC"
    if partial:
        note = (
            f"the first segment starts at {first_start:%H:%M} UTC, between two daily boundaries ({at}), "
            f"and also holds the {duration(partial)} up to the next one: segments end on a boundary, and "
            "the price counts the real length."
        )
        note = "T" + note[1:] if asked is None else f"{duration(asked)} asked; {note}"
        return OfferingLength(total, note)
    if asked is None:
        return OfferingLength(total, "")
    note = f"{duration(asked)} asked; segments hold whole days, from one {at} boundary to the next."
    return OfferingLength(total, note)


def _partial_day(start: datetime, boundary: time) -> timedelta:
    """From `start` to the next boundary, when `start` is not on one (else nothing)."""
    on_day = datetime.combine(start.date(), boundary, tzinfo=UTC)
    next_boundary = on_day if on_day >= start else on_day + DAY
    return timedelta() if next_boundary == start else next_boundary - start
