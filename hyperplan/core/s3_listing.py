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


@dataclass(frozen=True)
class UploadsPage(Generic[T]):
    uploads: tuple[tuple[str, str, T], ...]  # (key, upload id, what the caller keeps with it)
    common_prefixes: tuple[str, ...]
    truncated: bool
    next_key_marker: str
    next_upload_id_marker: str


def uploads_page(
    entries: Iterable[tuple[str, str, T]],
    *,
    prefix: str = "",
    delimiter: str = "",
    key_marker: str = "",
    upload_id_marker: str = "",
    max_uploads: int = MAX_KEYS,
) -> UploadsPage[T]:
    """ListMultipartUploads' page of `entries` (key, upload id, value), given in S3's order: by key (its
    UTF-8 bytes), then as the uploads were started. After ``key_marker`` alone: the keys after it; with
    ``upload_id_marker`` too: that key's uploads after that one, then the keys after it. A common prefix
    counts as one entry and is listed once, as in ListObjectsV2."""
    uploads: list[tuple[str, str, T]] = []
    prefixes: list[str] = []
    marker = sort_key(key_marker)
    passed_id = False  # with an upload id marker: whether the marker's upload has gone by
    next_key, next_id = "", ""
    for key, upload_id, value in entries:
        if not key.startswith(prefix):
            continue
        if key_marker and sort_key(key) <= marker:
            if sort_key(key) < marker or not upload_id_marker:
                continue
            if not passed_id:
                passed_id = upload_id == upload_id_marker
                continue
        rolled = _rolled_up(key, prefix, delimiter)
        if rolled is not None and (rolled in prefixes[-1:] or (key_marker and key_marker.startswith(rolled))):
            continue
        if len(uploads) + len(prefixes) >= max_uploads:
            return UploadsPage(tuple(uploads), tuple(prefixes), True, next_key, next_id)
        if rolled is not None:
            prefixes.append(rolled)
            next_key, next_id = rolled, ""
        else:
            uploads.append((key, upload_id, value))
            next_key, next_id = key, upload_id
    return UploadsPage(tuple(uploads), tuple(prefixes), False, "", "")
