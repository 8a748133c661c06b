"""One page of S3's ListObjectsV2 over a bucket's keys, as values.

Keys are ordered as S3 orders them, by their UTF-8 bytes. A page holds up to ``max_keys`` entries,
objects and common prefixes counted alike: with a delimiter, every key whose rest after the prefix holds
the delimiter is rolled up into the prefix up to and including its first delimiter, listed once. A page
starts after the continuation token's position, or after ``start_after``; the next page's token is the
last entry of this one (an object's key, or a common prefix: after a prefix, every key under it is
skipped).

A page also ends at 1 MiB of entries (core/page_bytes.py), truncated as by its count, so that an answer
stays near that size whatever the keys (up to 1,024 bytes each, more once escaped): an entry weighs what
the caller's ``weigh`` says of its key (by default its UTF-8 bytes) and ENTRY_OVERHEAD for the rest of it.
S3's clients follow a page that holds fewer entries than asked for like any other truncated one.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hyperplan.core.page_bytes import MAX_PAGE_BYTES, PageBytes, utf8_bytes

T = TypeVar("T")

MAX_KEYS = 1000
ENTRY_OVERHEAD = 512
"""What an entry weighs beyond its key: the rest of its XML (an object's date, ETag, size and storage
class, about 170 bytes; an upload's id, initiator, owner, storage class and date, about 400)."""


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


def entry_bytes(key: str, weigh: Callable[[str], int] = utf8_bytes) -> int:
    """What an entry listing `key` (an object, an upload or a common prefix) weighs on a page."""
    return weigh(key) + ENTRY_OVERHEAD


def page(
    entries: Iterable[tuple[str, T]],
    *,
    prefix: str = "",
    delimiter: str = "",
    after: str = "",
    max_keys: int = MAX_KEYS,
    weigh: Callable[[str], int] = utf8_bytes,
    max_bytes: int = MAX_PAGE_BYTES,
) -> Page[T]:
    """The page of `entries` (key, value) that starts after the position `after` ("" for the first):
    at most `max_keys` entries, weighing at most `max_bytes` (`weigh`: a key's bytes in the answer)."""
    ordered = sorted((item for item in entries if item[0].startswith(prefix)), key=lambda e: sort_key(e[0]))
    start = sort_key(after)
    contents: list[tuple[str, T]] = []
    prefixes: list[str] = []
    weight = PageBytes(max_bytes)
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
        listed = key if rolled is None else rolled
        if len(contents) + len(prefixes) >= max_keys or not weight.take(entry_bytes(listed, weigh)):
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
    weigh: Callable[[str], int] = utf8_bytes,
    max_bytes: int = MAX_PAGE_BYTES,
) -> UploadsPage[T]:
    """ListMultipartUploads' page of `entries` (key, upload id, value), given in S3's order: by key (its
    UTF-8 bytes), then as the uploads were started. After ``key_marker`` alone: the keys after it; with
    ``upload_id_marker`` too: that key's uploads after that one, then the keys after it. A common prefix
    counts as one entry and is listed once, as in ListObjectsV2. A page ends at `max_uploads` entries or
    `max_bytes` of them, as ``page``'s."""
    uploads: list[tuple[str, str, T]] = []
    prefixes: list[str] = []
    weight = PageBytes(max_bytes)
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
        listed = key if rolled is None else rolled
        if len(uploads) + len(prefixes) >= max_uploads or not weight.take(entry_bytes(listed, weigh)):
            return UploadsPage(tuple(uploads), tuple(prefixes), True, next_key, next_id)
        if rolled is not None:
            prefixes.append(rolled)
            next_key, next_id = rolled, ""
        else:
            uploads.append((key, upload_id, value))
            next_key, next_id = key, upload_id
    return UploadsPage(tuple(uploads), tuple(prefixes), False, "", "")
