"""Human-written durations: ``90m``, ``6h``, ``2d``, ``1d12h``, ``45s``.

The fleet file's policy values and the CLI (``hyperplan clock advance 1d12h``) share this one syntax:
one or more parts, each a whole number and a unit, units in the order d, h, m, s and each at most once.
"""

from __future__ import annotations

import re
from datetime import timedelta

from hyperplan.errors import ValidationError

_UNITS = (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1))
_PATTERN = re.compile(r"\s*".join(rf"(?:(?P<{unit}>\d+)\s*{unit})?" for unit, _ in _UNITS))
_EXAMPLES = "e.g. 90m, 6h, 2d, 1d12h or 45s"


def parse_duration(text: str) -> timedelta:
    """Parse ``text`` into a timedelta; a ValidationError says what a duration looks like."""
    if not isinstance(text, str):
        raise ValidationError(f"{text!r} is not a duration; write a number and a unit ({_EXAMPLES})")
    match = _PATTERN.fullmatch(text.strip().lower())
    if match is None or not text.strip() or not any(match.groups()):
        raise ValidationError(f"{text!r} is not a duration; write a number and a unit ({_EXAMPLES})")
    seconds = sum(int(match[unit] or 0) * size for unit, size in _UNITS)
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
