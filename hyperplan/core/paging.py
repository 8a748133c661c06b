"""NextToken paging over a list the handler already holds (small lists: a plan's extensions)."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any, TypeVar

from hyperplan.errors import ValidationError

T = TypeVar("T")


def paginate(
    items: Sequence[T], max_results: int, token: str | None, scope: str
) -> tuple[list[T], str | None]:
    """One page, and the token of the next (None on the last). A token only works for its own scope."""
    offset = decode_token(token, scope) if token else 0
    page = list(items[offset : offset + max_results])
    more = offset + max_results < len(items)
    return page, (encode_token(offset + max_results, scope) if more else None)


def encode_token(offset: int, scope: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset, "s": scope}).encode()).decode()


def decode_token(token: str, scope: str) -> int:
    """The offset a token carries; a token made for another scope (another query) is refused."""
    try:
        data: Any = json.loads(base64.urlsafe_b64decode(token.encode()))
        offset, same = int(data["o"]), data["s"] == scope
    except (ValueError, KeyError, TypeError):
        raise ValidationError("NextToken is not a token this operation returned.") from None
    if not same or offset < 0:
        raise ValidationError("NextToken was returned for a different request; start again without it.")
    return offset
