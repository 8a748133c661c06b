"""Times a person types: the one syntax of the CLI's time options and the console's forms.

- a date, ``2026-12-07``: midnight UTC that day;
- a date and time, ``2026-12-07T10:00`` or ``2026-12-07 10:00`` (seconds and a fraction optional), in
  UTC unless a zone follows: ``Z``, ``UTC`` (as the CLI's tables print times, so they can be pasted
  back), or an offset such as ``+02:00``;
- ``now``, and a time from now, ``+3d``, ``+12h``, ``+30m``, ``+1d12h`` (``-2d`` for the past), in the
  duration syntax of core/durations.py.

"Now" is the service's: the caller gives it (the CLI asks the server, the console has it), so that a
relative time means the same under a manual or accelerated clock as under the wall clock. Reading the
text (`read_time`) needs no clock, so a bad value is refused before anything is asked of a server.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from hyperplan.core.durations import MAX_DURATION, parse_duration
from hyperplan.errors import ValidationError

FORMS = (
    "a date (2026-12-07, midnight UTC), a date and time (2026-12-07T10:00 or '2026-12-07 10:00', "
    "UTC unless a zone such as Z or +02:00 follows), now, or a time from now (+3d, +12h, +30m, "
    "+1d12h; -2d for the past)"
)
_ABSOLUTE = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]{1,6}))?)?"
    r" ?(?P<zone>[Zz]|UTC|utc|[+-][0-9]{2}:?[0-9]{2})?)?"
)
_RELATIVE = re.compile(r"(?P<sign>[+-])(?P<duration>.+)")
_DURATION_LIKE = re.compile(r"[0-9dhms ]+", re.IGNORECASE)


@dataclass(frozen=True)
class GivenTime:
    """A time as typed: an instant, or an offset from the service's now (`instant` None)."""

    text: str
    instant: datetime | None = None
    offset: timedelta = timedelta(0)

    @property
    def relative(self) -> bool:
        """Whether it needs the service's now (`now`, `+3d`, ...)."""
        return self.instant is None

    def at(self, now: datetime) -> datetime:
        """The instant, in UTC; a relative time counted from `now` (the service clock's)."""
        if self.instant is not None:
            return self.instant
        try:
            return (now + self.offset).astimezone(UTC)
        except OverflowError:
            raise ValidationError(f"{self.text!r} is out of range: it falls outside the calendar.") from None


def read_time(text: str) -> GivenTime:
    """`text` in the one syntax (see the module); a ValidationError names it and shows the forms."""
    given = text.strip()
    if given.lower() == "now":
        return GivenTime(given)
    relative = _RELATIVE.fullmatch(given)
    if relative is not None:
        return GivenTime(given, offset=_offset(given, relative["sign"], relative["duration"]))
    absolute = _ABSOLUTE.fullmatch(given)
    if absolute is None:
        raise ValidationError(f"{given!r} is not a time; give {FORMS}.")
    return GivenTime(given, instant=_instant(given, absolute))


def parse_time(text: str, now: datetime) -> datetime:
    """`text` as an instant in UTC, a relative one counted from `now` (the service clock's)."""
    return read_time(text).at(now)


def _offset(given: str, sign: str, duration: str) -> timedelta:
    try:
        length = parse_duration(duration)
    except ValidationError:
        if _DURATION_LIKE.fullmatch(duration) and any(c.isdigit() for c in duration):
            raise ValidationError(
                f"{given!r} is too far: a time from now is at most {MAX_DURATION.days}d away."
            ) from None
        raise ValidationError(f"{given!r} is not a time; give {FORMS}.") from None
    return -length if sign == "-" else length


def _instant(given: str, parts: re.Match[str]) -> datetime:
    fraction = (parts["fraction"] or "").ljust(6, "0")
    try:
        local = datetime(
            int(parts["year"]),
            int(parts["month"]),
            int(parts["day"]),
            int(parts["hour"] or 0),
            int(parts["minute"] or 0),
            int(parts["second"] or 0),
            int(fraction),
            tzinfo=_zone(parts["zone"]),
        )
    except ValueError as exc:  # a day, hour or offset that does not exist: 2026-02-30, 25:00, +24:00
        raise ValidationError(f"{given!r} is not a real date and time ({exc}).") from None
    try:
        return local.astimezone(UTC)
    except OverflowError:  # such as the year 9999 moved into UTC from a zone behind it
        raise ValidationError(f"{given!r} is out of range once moved into UTC.") from None


def _zone(zone: str | None) -> timezone:
    if zone is None or zone.upper() in ("Z", "UTC"):
        return UTC
    sign = -1 if zone[0] == "-" else 1
    digits = zone[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours >= 24 or minutes >= 60:
        raise ValueError(f"a zone is less than 24 hours from UTC, its minutes 00 to 59, not {zone}")
    return timezone(sign * timedelta(hours=hours, minutes=minutes))
