"""Multipart upload ids: what the aws CLI can take as an argument."""

from __future__ import annotations

from hyperplan.objects.served import _UPLOAD_ID, new_upload_id


def test_upload_ids_never_start_with_a_dash_and_are_all_different() -> None:
    # One random URL-safe id in 64 starts with '-', which the aws CLI reads as an option: in 3,000 ids
    # the old way, one would almost surely (1 - (63/64)**3000) have been there.
    ids = [new_upload_id() for _ in range(3000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(_UPLOAD_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
