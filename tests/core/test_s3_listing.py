"""ListObjectsV2's pages over a bucket's keys (hyperplan/core/s3_listing.py): S3's order, prefixes,
delimiters, and continuation that neither repeats nor skips an entry."""

from __future__ import annotations

from hyperplan.core import s3_listing
from hyperplan.core.page_bytes import MAX_PAGE_BYTES

KEYS = ["a/1", "a/2", "a-b", "b", "c/d/e", "c/d/f", "c/g", "é"]


def _walk(max_keys: int, *, prefix: str = "", delimiter: str = "") -> tuple[list[str], list[str], int]:
    entries = [(key, None) for key in reversed(KEYS)]
    keys: list[str] = []
    prefixes: list[str] = []
    after, pages = "", 0
    while True:
        page = s3_listing.page(entries, after=after, max_keys=max_keys, prefix=prefix, delimiter=delimiter)
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


def test_uploads_pages_follow_key_and_upload_markers_and_roll_up_prefixes() -> None:
    entries = [
        ("a/1", "u1", None),
        ("a/2", "u2", None),
        ("b", "u3", None),
        ("b", "u4", None),
        ("c", "u5", None),
    ]
    seen: list[str] = []
    key_marker, id_marker = "", ""
    while True:
        page = s3_listing.uploads_page(
            entries, key_marker=key_marker, upload_id_marker=id_marker, max_uploads=2
        )
        seen += [upload_id for _key, upload_id, _ in page.uploads]
        if not page.truncated:
            break
        key_marker, id_marker = page.next_key_marker, page.next_upload_id_marker
    assert seen == ["u1", "u2", "u3", "u4", "u5"]
    assert [u for _k, u, _ in s3_listing.uploads_page(entries, key_marker="b").uploads] == ["u5"]
    rolled = s3_listing.uploads_page(entries, delimiter="/", max_uploads=1)
    assert rolled.common_prefixes == ("a/",) and rolled.truncated and rolled.next_key_marker == "a/"
    after = s3_listing.uploads_page(entries, delimiter="/", key_marker="a/")
    assert [u for _k, u, _ in after.uploads] == ["u3", "u4", "u5"] and after.common_prefixes == ()


def _long_keys(count: int) -> list[str]:
    """Keys of about 1,000 bytes (S3's keys are at most 1,024), some under a common directory."""
    return [f"{n:05d}/" + ("é" if n % 2 else "k") * (490 if n % 2 else 990) for n in range(count)]


def test_a_page_of_long_keys_ends_at_1_mib_and_goes_on_exactly_after_it() -> None:
    keys = _long_keys(3000)
    entries = [(key, None) for key in reversed(keys)]
    listed: list[str] = []
    after, pages = "", 0
    while True:
        page = s3_listing.page(entries, after=after)
        weights = [s3_listing.entry_bytes(key) for key, _ in page.contents]
        assert sum(weights) <= MAX_PAGE_BYTES and len(weights) < s3_listing.MAX_KEYS
        listed += [key for key, _ in page.contents]
        pages += 1
        if not page.truncated:
            break
        following = keys[len(listed)]
        assert sum(weights) + s3_listing.entry_bytes(following) > MAX_PAGE_BYTES  # cut where the bound fell
        assert page.next_token is not None
        after = s3_listing.decode_token(page.next_token) or ""
    assert listed == sorted(keys, key=s3_listing.sort_key) and pages == 5
    # The caller's measure of a key is the one used: written five times longer, five times fewer fit.
    heavy = s3_listing.page(entries, weigh=lambda key: 5 * len(key.encode()))
    assert len(heavy.contents) < len(s3_listing.page(entries).contents) / 2
    # Common prefixes weigh as entries too; a small bound still lists one entry a page.
    rolled = s3_listing.page(entries, delimiter="/", max_bytes=1)
    assert len(rolled.common_prefixes) == 1 and rolled.truncated


def test_a_page_of_uploads_ends_at_1_mib_and_its_markers_go_on_exactly() -> None:
    entries = [(key, f"upload-{n}", None) for n, key in enumerate(_long_keys(2000))]
    seen: list[str] = []
    key_marker, id_marker, pages = "", "", 0
    while True:
        page = s3_listing.uploads_page(entries, key_marker=key_marker, upload_id_marker=id_marker)
        weight = sum(s3_listing.entry_bytes(key) for key, _u, _ in page.uploads)
        assert weight <= MAX_PAGE_BYTES and len(page.uploads) < s3_listing.MAX_KEYS
        seen += [upload_id for _k, upload_id, _ in page.uploads]
        pages += 1
        if not page.truncated:
            break
        key_marker, id_marker = page.next_key_marker, page.next_upload_id_marker
    assert seen == [f"upload-{n}" for n in range(2000)] and pages == 3
