"""CloudWatch Logs' reading rules over a stream's events, pure: paging tokens and filter patterns.

A stream here only grows at its end, so a position in it (the index of an event) stays valid: tokens
carry one. ``f/N`` reads forward from event N, ``b/N`` backward from it (the events before N); AWS's
tokens are opaque too, and clients only hand back what they were given.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from hyperplan.errors import InvalidParameter

T = TypeVar("T")

MAX_EVENTS = 10_000
"""GetLogEvents' and FilterLogEvents' most events an answer (AWS: 10,000 or 1 MB)."""

_TOKEN = re.compile(r"([fb])/([0-9]{1,12})")


@dataclass(frozen=True)
class EventPage:
    start: int
    end: int
    """The events [start, end) of the stream."""
    forward_token: str
    backward_token: str


def page(count: int, limit: int | None, token: str | None, from_head: bool) -> EventPage:
    """Which of ``count`` events one GetLogEvents answer holds. Without a token: the first ``limit``
    (``startFromHead``) or the last ``limit`` (the default, as AWS). At either end the token given back
    is the one that was passed, so that a client that stops when the token repeats stops there."""
    limit = MAX_EVENTS if limit is None else limit
    if token:
        match = _TOKEN.fullmatch(token)
        if match is None or int(match[2]) > count:
            raise InvalidParameter("The specified nextToken is invalid.")
        direction, position = match[1], int(match[2])
        if direction == "f":
            start, end = position, min(count, position + limit)
        else:
            start, end = max(0, position - limit), position
    elif from_head:
        start, end = 0, min(count, limit)
    else:
        start, end = max(0, count - limit), count
    return EventPage(start, end, f"f/{end:012d}", f"b/{start:012d}")


def index_token(token: str | None, count: int) -> int:
    """The position an index token (DescribeLogGroups', DescribeLogStreams', FilterLogEvents') names."""
    if not token:
        return 0
    if not token.isdigit() or int(token) > count:
        raise InvalidParameter("The specified nextToken is invalid.")
    return int(token)


def slice_with_token(items: Sequence[T], token: str | None, limit: int) -> tuple[list[T], str | None]:
    start = index_token(token, len(items))
    end = min(len(items), start + limit)
    return list(items[start:end]), (str(end) if end < len(items) else None)


@dataclass(frozen=True)
class FilterPattern:
    """A filter pattern's terms for unstructured log events: every plain term must occur, at least one
    ``?term`` (when there are any), no ``-term``; a quoted term is one phrase. Case-sensitive."""

    required: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    def matches(self, message: str) -> bool:
        if not all(term in message for term in self.required):
            return False
        if self.any_of and not any(term in message for term in self.any_of):
            return False
        return not any(term in message for term in self.excluded)


def filter_pattern(text: str | None) -> FilterPattern:
    if not text or not text.strip():
        return FilterPattern()
    stripped = text.strip()
    if stripped.startswith(("{", "[")) or stripped.startswith("%"):
        raise InvalidParameter(
            'Invalid filter pattern: hyperplan matches terms in unstructured events (words, "phrases", '
            "?either, -not); JSON, space-delimited and regular-expression patterns are not supported."
        )
    try:
        terms = shlex.split(stripped)
    except ValueError:
        raise InvalidParameter("Invalid filter pattern: a quoted term is not closed.") from None
    required: list[str] = []
    any_of: list[str] = []
    excluded: list[str] = []
    for term in terms:
        if term.startswith("?") and len(term) > 1:
            any_of.append(term[1:])
        elif term.startswith("-") and len(term) > 1:
            excluded.append(term[1:])
        elif term:
            required.append(term)
    return FilterPattern(tuple(required), tuple(any_of), tuple(excluded))
