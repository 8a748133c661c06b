"""One page of S3's ListObjectsV2 over a bucket's keys, as values.

Keys are ordered as S3 orders them, by their UTF-8 bytes. A page holds up to ``max_keys`` entries,
objects and common prefixes counted alike: with a delimiter, every key whose rest after the prefix holds
the delimiter is rolled up into the prefix up to and including its first delimiter, listed once. A page
starts after the continuation token's position, or after ``start_after``; the next page's token is the
last entry of this one (an object's key, or a common prefix: after a prefix, every key under it is
skipped).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_KEYS = 1000


@dataclass(frozen=True)
class Page(Generic[T]):
    contents: tuple[tuple[str, T], ...]  # (key, what the caller keeps with it), in key order
    common_prefixes: tuple[str, ...]
    truncated: bool
    next_token: str | None  # opaque; None unless truncated


def sort_key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


def encode_token(position: str) -> str:
    return base64.urlsafe_b64encode(position.encode("utf-8", "surrogateescape")).decode("ascii")


def decode_token(token: str) -> str | None:
    """The position a continuation token stands for, or None if it is not one this server gave."""
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError):
        return None


def page(
    entries: Iterable[tuple[str, T]],
    *,
    prefix: str = "",
    delimiter: str = "",
    after: str = "",
    max_keys: int = MAX_KEYS,
) -> Page[T]:
    """The page of `entries` (key, value) that starts after the position `after` ("" for the first)."""
    ordered = sorted((item for item in entries if item[0].startswith(prefix)), key=lambda e: sort_key(e[0]))
    start = sort_key(after)
    contents: list[tuple[str, T]] = []
    prefixes: list[str] = []
    last = ""
    for key, value in ordered:
        if after and sort_key(key) <= start:
            continue
        rolled = _rolled_up(key, prefix, delimiter)
        if rolled is not None:
            if rolled == last or (after and rolled == after):
                continue  # a prefix already listed, on this page or an earlier one
            if after and after.startswith(rolled):
                continue
        if len(contents) + len(prefixes) >= max_keys:
            return Page(tuple(contents), tuple(prefixes), True, encode_token(last))
        if rolled is not None:
            prefixes.append(rolled)
            last = rolled
        else:
            contents.append((key, value))
            last = key
    return Page(tuple(contents), tuple(prefixes), False, None)


def _rolled_up(key: str, prefix: str, delimiter: str) -> str | None:
    if not delimiter:
        return None
    at = key.find(delimiter, len(prefix))
    return None if at < 0 else key[: at + len(delimiter)]
