"""CloudWatch Logs' reading rules over a stream's events, pure: paging tokens and filter patterns.

A stream here only grows at its end, so a position in it (a ref's index in the stream and a line's number
in that ref: services/jobs/log_reading.py) stays valid, and a token carries one: ``f/REF/LINE/MAC`` reads
forward from that line, ``b/REF/LINE/MAC`` backward from it (the events before it). FilterLogEvents'
token carries each stream's position. AWS's tokens are opaque too, and clients only hand back what they
were given; these are signed (MAC: an HMAC under the server's key of the token and of the account, group
and stream it was given for), so a token cannot be forged, altered, or used on another stream or by
another account: a position read from one is one the server handed out for that stream.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from hyperplan.core.page_bytes import utf8_bytes
from hyperplan.errors import InvalidParameter

T = TypeVar("T")

MAX_EVENTS = 10_000
"""GetLogEvents' and FilterLogEvents' most events an answer (AWS: 10,000 or 1 MB: core/page_bytes.py)."""
EVENT_OVERHEAD = 26
"""What an event weighs beyond its message: AWS's own allowance for the fields around a message when it
counts a batch of events (PutLogEvents: the messages' UTF-8 bytes plus 26 bytes an event)."""

Position = tuple[int, int]

_TOKEN = re.compile(r"([fb])/([0-9]{1,9})/([0-9]{1,15})/([0-9a-f]{32})")
_INVALID = "The specified nextToken is invalid."


def event_bytes(message: str) -> int:
    """An event's weight on a page: its message's UTF-8 bytes and EVENT_OVERHEAD."""
    return utf8_bytes(message) + EVENT_OVERHEAD


def token_key(server_key: bytes) -> bytes:
    """The key tokens are signed with, derived from a key every server of the store shares."""
    return hmac.new(server_key, b"hyperplan: CloudWatch Logs paging tokens", hashlib.sha256).digest()


def _mac(key: bytes, scope: Sequence[str], body: str) -> str:
    message = "\n".join([*scope, body]).encode("utf-8", "surrogateescape")
    return hmac.new(key, message, hashlib.sha256).hexdigest()[:32]


def position_token(key: bytes, scope: Sequence[str], direction: str, position: Position) -> str:
    """GetLogEvents' token: read forward (``f``) or backward (``b``) from `position`, for `scope`
    (the account, the group and the stream)."""
    body = f"{direction}/{position[0]}/{position[1]}"
    return f"{body}/{_mac(key, scope, body)}"


def read_position_token(key: bytes, scope: Sequence[str], token: str) -> tuple[str, Position]:
    """(direction, position) of a token this server gave for `scope`; InvalidParameter for any other."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise InvalidParameter(_INVALID)
    body = f"{match[1]}/{match[2]}/{match[3]}"
    if not hmac.compare_digest(_mac(key, scope, body), match[4]):
        raise InvalidParameter(_INVALID)
    return match[1], (int(match[2]), int(match[3]))


def streams_token(key: bytes, scope: Sequence[str], positions: Mapping[str, Position]) -> str:
    """FilterLogEvents' token: where each stream's reading goes on."""
    payload = json.dumps({name: list(at) for name, at in sorted(positions.items())}, separators=(",", ":"))
    body = base64.urlsafe_b64encode(payload.encode()).decode().rstrip("=")
    return f"{body}.{_mac(key, scope, body)}"


def read_streams_token(key: bytes, scope: Sequence[str], token: str) -> dict[str, Position]:
    body, _, mac = token.rpartition(".")
    if not body or not hmac.compare_digest(_mac(key, scope, body), mac):
        raise InvalidParameter(_INVALID)
    try:
        decoded = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        return {str(name): (int(at[0]), int(at[1])) for name, at in decoded.items()}
    except (binascii.Error, ValueError, TypeError, AttributeError, IndexError):
        raise InvalidParameter(_INVALID) from None


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
