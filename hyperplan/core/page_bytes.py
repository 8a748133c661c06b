"""How large one page of a listing may be, in bytes, and the one rule that cuts a page to it.

Every answer listing things a tenant can make large (log events, S3 keys, a plan's events, audit
records) stops at :data:`MAX_PAGE_BYTES` of its items, as CloudWatch Logs stops GetLogEvents and
FilterLogEvents at 1 MB, and its token or marker goes on from the first item left out. Bounds in items
(10,000 events, 1,000 keys) stay as they were: a page ends at whichever comes first.

Each reader says what an item weighs (its text's UTF-8 bytes, plus a fixed allowance for the fields
around it where the answer has them) and takes items in page order through :class:`PageBytes`. The
first item of a page is always taken, however large, so that a page is never empty while items remain
and paging always moves on: a page holds at most :data:`MAX_PAGE_BYTES`, or one item alone (no item
the server lists is near that size: a log record is at most 64 KiB of text, a key 1 KiB).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_PAGE_BYTES = 1 << 20
"""1 MiB: what one page's items may weigh at most (AWS's 1 MB of log events)."""


@dataclass
class PageBytes:
    """The weight of a page being filled, item by item, in page order."""

    limit: int = MAX_PAGE_BYTES
    used: int = 0
    items: int = 0

    def fits(self, size: int) -> bool:
        """Whether an item of `size` bytes still goes in: the first one always does."""
        return self.items == 0 or self.used + size <= self.limit

    def take(self, size: int) -> bool:
        """Count the item in if it fits; False (and nothing counted) if the page ends before it."""
        if not self.fits(size):
            return False
        self.used += size
        self.items += 1
        return True


def fitting(sizes: Iterable[int], limit: int = MAX_PAGE_BYTES) -> int:
    """How many of the leading items (of these sizes, in page order) one page holds."""
    page = PageBytes(limit)
    for size in sizes:
        if not page.take(size):
            break
    return page.items


def utf8_bytes(text: str) -> int:
    """A text's length in UTF-8 (a lone surrogate, which no answer should carry, counted as three
    bytes rather than refused: never less than the answer holds)."""
    return len(text.encode("utf-8", "surrogatepass"))
