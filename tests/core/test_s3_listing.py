"""ListObjectsV2's pages over a bucket's keys (hyperplan/core/s3_listing.py): S3's order, prefixes,
delimiters, and continuation that neither repeats nor skips an entry."""

from __future__ import annotations

from hyperplan.core import s3_listing

KEYS = ["a/1", "a/2", "a-b", "b", "c/d/e", "c/d/f", "c/g", "é"]


def _walk(max_keys: int, **options: str) -> tuple[list[str], list[str], int]:
    entries = [(key, None) for key in reversed(KEYS)]
    keys: list[str] = []
    prefixes: list[str] = []
    after, pages = "", 0
    while True:
        page = s3_listing.page(entries, after=after, max_keys=max_keys, **options)
        pages += 1
        keys += [key for key, _ in page.contents]
        prefixes += list(page.common_prefixes)
        if not page.truncated:
            return keys, prefixes, pages
        assert page.next_token is not None
        after = s3_listing.decode_token(page.next_token) or ""


def test_pages_follow_s3_order_and_roll_keys_up_under_a_delimiter() -> None:
    assert _walk(1000) == (["a-b", "a/1", "a/2", "b", "c/d/e", "c/d/f", "c/g", "é"], [], 1)
    for size in (1, 2, 3):
        assert _walk(size)[0] == ["a-b", "a/1", "a/2", "b", "c/d/e", "c/d/f", "c/g", "é"]
        assert _walk(size, delimiter="/") == (["a-b", "b", "é"], ["a/", "c/"], _walk(size, delimiter="/")[2])
        assert _walk(size, prefix="c/", delimiter="/")[:2] == (["c/g"], ["c/d/"])
    assert _walk(2, delimiter="/")[2] == 3
    assert _walk(1000, prefix="a")[0] == ["a-b", "a/1", "a/2"]
    assert s3_listing.decode_token("not base64 at all!") is None
