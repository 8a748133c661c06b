"""Human-written durations: ``90m``, ``6h``, ``2d``, ``1d12h``, ``45s``.

The fleet file's policy values and the CLI (``hyperplan clock advance 1d12h``) share this one syntax:
one or more parts, each a whole number and a unit, units in the order d, h, m, s and each at most once.
A duration is at most MAX_DURATION (36500 days, about a century): longer ones are refused by name rather
than left to overflow the date arithmetic of whoever adds them to a time.
"""

from __future__ import annotations

import re
from datetime import timedelta

from hyperplan.errors import ValidationError

_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_PATTERN = re.compile(r"\s*".join(rf"(?:(?P<{unit}>[0-9]+)\s*{unit})?" for unit, _ in _UNITS))
_EXAMPLES = "e.g. 90m, 6h, 2d, 1d12h or 45s"
MAX_DURATION = timedelta(days=36_500)
# More digits than this cannot be within MAX_DURATION in any unit; checked before int() reads them.
_MAX_DIGITS = len(str(int(MAX_DURATION.total_seconds())))


def parse_duration(text: str) -> timedelta:
    """Parse ``text`` into a timedelta; a ValidationError says what a duration looks like."""
    if not isinstance(text, str):
        raise ValidationError(f"{text!r} is not a duration; write a number and a unit ({_EXAMPLES})")
    match = _PATTERN.fullmatch(text.strip().lower())
    if match is None or not text.strip() or not any(match.groups()):
        raise ValidationError(f"{text!r} is not a duration; write a number and a unit ({_EXAMPLES})")
    numbers = [(match[unit] or "0").lstrip("0") for unit, _ in _UNITS]
    too_long = f"{text.strip()!r} is too long; a duration is at most {MAX_DURATION.days}d"
    if any(len(number) > _MAX_DIGITS for number in numbers):
        raise ValidationError(too_long)
    seconds = sum(int(number or 0) * size for number, (_, size) in zip(numbers, _UNITS, strict=True))
    if seconds > MAX_DURATION.total_seconds():
        raise ValidationError(too_long)
    return timedelta(seconds=seconds)


def format_duration(duration: timedelta) -> str:
    """The shortest text that :func:`parse_duration` reads back as ``duration`` (whole seconds)."""
    seconds = int(duration.total_seconds())
    if seconds < 0:
        raise ValueError(f"negative duration {duration}")
    parts = []
    for unit, size in _UNITS:
        amount, seconds = divmod(seconds, size)
        if amount:
            parts.append(f"{amount}{unit}")
    return "".join(parts) or "0s"
