"""Who may use a bucket: owners, grants and the administrators, as values (no store, no filesystem).

Every bucket has owners. A bucket a request created belongs to the account that made the request; one
the fleet file maps belongs to the accounts its entry lists; any other (a directory made by hand, a
mapped bucket without ``accounts``) belongs to the administrators. Owners may read and write; others
only what an administrator granted them: ``read`` or ``write`` (write implies read), to one account or,
read-only, to every account (``"*"``). Administrators may do everything.

A bucket no one owns and that is not there yet is *free*: reading it finds nothing, and the first
request that writes to it claims it (:attr:`Decision.CLAIM`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

EVERYONE = "*"
"""The grantee that stands for every account: read-only."""


class Right(StrEnum):
    READ = "read"
    WRITE = "write"

    def covers(self, need: Right) -> bool:
        return self is Right.WRITE or need is Right.READ


class Decision(StrEnum):
    ALLOWED = "allowed"
    CLAIM = "claim"  # a write to a free bucket: allowed, and the bucket becomes the account's
    DENIED = "denied"


def _empty() -> Mapping[str, frozenset[str]]:
    return MappingProxyType({})


@dataclass(frozen=True)
class AccountRights:
    """What one account may do with buckets, as the store and the fleet file said when it was read.

    ``owners`` maps each owned bucket to its owners' account ids (recorded owners, or the accounts a
    fleet-file entry lists); ``granted`` maps buckets to the best right granted to this account or to
    every account. ``held`` is asked, bucket by bucket, whether a bucket is there (mapped, or a
    directory under the default root) when it has no owner."""

    account_id: str
    account_name: str
    is_admin: bool
    owners: Mapping[str, frozenset[str]] = field(default_factory=_empty)
    granted: Mapping[str, Right] = field(default_factory=lambda: MappingProxyType({}))

    def decide(self, bucket: str, need: Right, *, held: bool) -> Decision:
        owners = self.owners.get(bucket)
        if not owners and not held:  # free: nothing to read, and the first writer claims it
            return Decision.CLAIM if need is Right.WRITE else Decision.ALLOWED
        if self.is_admin or (owners and self.account_id in owners):
            return Decision.ALLOWED
        right = self.granted.get(bucket)
        return Decision.ALLOWED if right is not None and right.covers(need) else Decision.DENIED

    def may_see(self, bucket: str) -> bool:
        """Whether `buckets list` shows the bucket to this account: it may read it."""
        return self.is_admin or self.account_id in self.owners.get(bucket, ()) or bucket in self.granted


def denial(uri: str, bucket: str, account_name: str, need: Right) -> str:
    """The one wording of a refusal, at create time and at transfer time alike; it starts with the URI."""
    verb = "write to" if need is Right.WRITE else "read"
    return (
        f"{uri}: Access Denied: account {account_name!r} may not {verb} bucket {bucket!r} "
        "(its owners and administrators decide: `hyperplan buckets grant`)"
    )
