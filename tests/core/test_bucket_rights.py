"""Who may use a bucket, decided from values alone (hyperplan/core/bucket_rights.py)."""

from __future__ import annotations

import pytest

from hyperplan.core.bucket_rights import AccountRights, Decision, Right

OWNERS = {"mine": frozenset({"111111111111"}), "theirs": frozenset({"222222222222"})}
ME = AccountRights("111111111111", "me", False, OWNERS, {"theirs": Right.READ, "admins": Right.WRITE})
ADMIN = AccountRights("999999999999", "admin", True, OWNERS)

R, W = Right.READ, Right.WRITE
ALLOWED, CLAIM, DENIED = Decision.ALLOWED, Decision.CLAIM, Decision.DENIED


@pytest.mark.parametrize(
    ("who", "bucket", "need", "held", "decision"),
    [
        (ME, "mine", W, True, ALLOWED),  # owners write
        (ME, "theirs", R, True, ALLOWED),  # granted read
        (ME, "theirs", W, True, DENIED),  # ... but not write
        (ME, "admins", W, True, ALLOWED),  # no owner, there: the administrators', granted write
        (ME, "hand-made", R, True, DENIED),  # no owner, there, no grant
        (ME, "free", R, False, ALLOWED),  # not there: nothing to read
        (ME, "free", W, False, CLAIM),  # the first writer claims it
        (ME, "mine", W, False, ALLOWED),  # claimed, directory not made yet
        (ME, "theirs", W, False, DENIED),
        (ADMIN, "theirs", W, True, ALLOWED),  # administrators do everything
        (ADMIN, "free", W, False, CLAIM),
    ],
)
def test_owners_grants_and_free_buckets(
    who: AccountRights, bucket: str, need: Right, held: bool, decision: Decision
) -> None:
    assert who.decide(bucket, need, held=held) is decision


def test_an_account_sees_what_it_may_read() -> None:
    assert [b for b in ("mine", "theirs", "admins", "hand-made") if ME.may_see(b)] == [
        "mine",
        "theirs",
        "admins",
    ]
