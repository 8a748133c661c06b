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
