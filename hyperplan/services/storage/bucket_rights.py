"""Buckets' owners and grants in the store, checked when a request names a URI and at every transfer.

The rules are hyperplan/core/bucket_rights.py's; this module reads the facts they need (the recorded
owners, the fleet file's ``accounts``, the grants) and applies them:

- **At create time** (:func:`require`, inside CreateTrainingJob's and Create/UpdateCluster's
  transaction): a URI the caller may not use is refused with AccessDeniedException naming the member and
  the URI. An output or checkpoint URI naming a free bucket (no owner, not there yet) claims it for the
  caller in the same transaction: the bucket is the caller's from then on, although its directory is
  made by the first write.
- **At transfer time** (:func:`storage_for`): the Storage a launch, a sync, a finish or a node's
  provisioning uses carries the account's rights as read at its start, and refuses any bucket they do
  not cover with the same words (a :class:`~hyperplan.objects.uris.BucketAccessError`), so rights revoked
  after a job was created stop its transfers. A free bucket written to is claimed then, in a
  transaction of its own.
- **Administration**: ``buckets create``, ``grant``, ``revoke`` and ``list`` (the native routes under
  /api/v1/buckets), each in its own transaction, returning frozen views.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from hyperplan.core.bucket_rights import EVERYONE, AccountRights, Decision, Right, denial
from hyperplan.core.buckets import bucket_name_problem
from hyperplan.core.fleet import Bucket, DirectoryBucket, S3Bucket
from hyperplan.errors import (
    BucketAccessDenied,
    BucketAlreadyExists,
    BucketAlreadyYours,
    BucketNotEmpty,
    InvalidBucketName,
    InvalidS3Request,
    NoSuchBucket,
    ResourceNotFound,
    ValidationError,
)
from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import SCHEME, TEMP_PREFIX, BucketAccessError, parse_s3_uri
from hyperplan.services.accounts import accounts, audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, BucketGrant, BucketOwner, Cluster

Use = tuple[str, str, Right]
"""(the request member that names it, the URI, what the request does with it)."""


def storage(runtime: ServiceContext) -> Storage:
    """The fleet's buckets, unchecked: for the rules' own look at what is there."""
    return Storage.in_data_dir(runtime.data_dir, runtime.fleet.buckets)


# -- the facts ----------------------------------------------------------------------------------------


def load_rights(session: Session, runtime: ServiceContext, account_id: str) -> AccountRights:
    """The account's rights as the store and the fleet file say now."""
    account = session.get(Account, account_id)
    if account is None:
        raise ResourceNotFound(f"No account {account_id!r}.")
    granted: dict[str, Right] = {}
    for grant in session.scalars(select(BucketGrant).where(BucketGrant.grantee.in_((account_id, EVERYONE)))):
        right = Right(grant.access)
        if grant.bucket not in granted or right is Right.WRITE:
            granted[grant.bucket] = right
    return AccountRights(
        account.id, account.name, account.is_admin, MappingProxyType(_owners(session, runtime)), granted
    )


def _owners(session: Session, runtime: ServiceContext) -> dict[str, frozenset[str]]:
    """Every owned bucket's owners (account ids): the fleet file decides for the buckets it maps."""
    mapped = runtime.fleet.buckets
    owners = {
        row.bucket: frozenset({row.account_id})
        for row in session.scalars(select(BucketOwner))
        if row.bucket not in mapped
    }
    named = {name for where in mapped.values() for name in where.accounts}
    if named:
        found = session.scalars(select(Account).where(or_(Account.id.in_(named), Account.name.in_(named))))
        ids = {ref: account.id for account in found for ref in (account.id, account.name) if ref in named}
        for bucket, where in mapped.items():
            listed = frozenset(ids[ref] for ref in where.accounts if ref in ids)
            if listed:
                owners[bucket] = listed
    return owners


# -- create time --------------------------------------------------------------------------------------


def require(session: Session, runtime: ServiceContext, caller: Caller, uses: Iterable[Use]) -> None:
    """Refuse the first URI the caller may not use (AccessDeniedException naming the member and the URI);
    claim for the caller every free bucket it writes to, in the caller's transaction."""
    rights = load_rights(session, runtime, caller.account_id)
    buckets = storage(runtime)
    for where, uri, need in uses:
        bucket, _ = parse_s3_uri(uri)  # checked when the request was decoded
        decision = rights.decide(bucket, need, held=buckets.holds(bucket))
        if decision is Decision.DENIED:
            raise BucketAccessDenied(f"{where}: {denial(uri, bucket, rights.account_name, need)}.")
        if decision is Decision.CLAIM:
            session.add(
                BucketOwner(bucket=bucket, account_id=caller.account_id, created_at=runtime.clock.now())
            )
            session.flush()
            rights = _with_owner(rights, bucket)


def _with_owner(rights: AccountRights, bucket: str) -> AccountRights:
    return replace(rights, owners=MappingProxyType({**rights.owners, bucket: frozenset({rights.account_id})}))


# -- transfer time ------------------------------------------------------------------------------------


class _Guard:
    """The rights of one account, read when a transfer starts; claims a free bucket it writes to."""

    def __init__(self, runtime: ServiceContext, rights: AccountRights) -> None:
        self.runtime = runtime
        self.rights = rights

    def check(self, uri: str, bucket: str, need: Right, *, held: bool) -> None:
        decision = self.rights.decide(bucket, need, held=held)
        if decision is Decision.CLAIM:
            decision = self._claim(bucket, need)
        if decision is Decision.DENIED:
            raise BucketAccessError(uri, denial(uri, bucket, self.rights.account_name, need))

    def _claim(self, bucket: str, need: Right) -> Decision:
        """The first write to a free bucket makes it the account's, unless another claimed it first."""
        with self.runtime.db.write() as session:
            claimed = session.get(BucketOwner, bucket) is None and not storage(self.runtime).holds(bucket)
            if claimed:
                now = self.runtime.clock.now()
                session.add(BucketOwner(bucket=bucket, account_id=self.rights.account_id, created_at=now))
                session.flush()
            rights = load_rights(session, self.runtime, self.rights.account_id)
        self.rights = rights
        decision = rights.decide(bucket, need, held=True)
        return Decision.DENIED if decision is Decision.CLAIM else decision


def storage_for(runtime: ServiceContext, account_id: str) -> Storage:
    """The Storage for transfers made for the account: its rights read now, checked at every bucket."""
    with runtime.db.read() as session:
        rights = load_rights(session, runtime, account_id)
    return storage(runtime).for_account(_Guard(runtime, rights))


def storage_for_cluster(runtime: ServiceContext, cluster_id: int) -> Storage:
    """The Storage for a node of the cluster (its row id): the cluster's account's rights."""
    with runtime.db.read() as session:
        cluster = session.get(Cluster, cluster_id)
        if cluster is None:
            raise ResourceNotFound(f"No cluster {cluster_id}.")
        rights = load_rights(session, runtime, cluster.account_id)
    return storage(runtime).for_account(_Guard(runtime, rights))


# -- administration -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrantView:
    grantee: str  # an account id, or "*"
    account_name: str  # "*" for every account
    access: str


@dataclass(frozen=True)
class BucketView:
    name: str
    kind: str  # "directory" or "s3"
    location: str  # administrators only: the directory or the endpoint ("" for others)
    owners: tuple[tuple[str, str], ...]  # (account id, name); none: the administrators
    grants: tuple[GrantView, ...]
    access: str  # the caller's: "write" or "read"


def _check_name(bucket: str) -> None:
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise ValidationError(f"Bucket: {problem}.")


def create_bucket(runtime: ServiceContext, caller: Caller, bucket: str) -> BucketView:
    """An empty directory bucket under the default root, owned by the caller."""
    _check_name(bucket)
    buckets = storage(runtime)
    with runtime.db.write() as session:
        owner = session.get(BucketOwner, bucket)
        if owner is not None or buckets.holds(bucket):
            mine = owner is not None and owner.account_id == caller.account_id
            raise (BucketAlreadyYours if mine else BucketAlreadyExists)(
                f"Bucket {bucket!r} already exists"
                + (" and is yours." if mine else "; bucket names are shared by every account, pick another.")
            )
        session.add(BucketOwner(bucket=bucket, account_id=caller.account_id, created_at=runtime.clock.now()))
        session.flush()
        buckets.default_directory(bucket).mkdir(parents=True, exist_ok=False)
        return _views(session, runtime, caller, [bucket])[0]


def grant(
    runtime: ServiceContext, bucket: str, account_ref: str, *, read_only: bool, caller: Caller | None = None
) -> BucketView:
    """Give an account (or every account, read-only) a right on an existing bucket; replaces its grant."""
    _check_name(bucket)
    access = Right.READ if read_only or account_ref == EVERYONE else Right.WRITE
    with runtime.db.write() as session:
        _require_bucket(session, runtime, bucket)
        grantee, name = _grantee(session, account_ref)
        if grantee in _owners(session, runtime).get(bucket, ()):
            raise ValidationError(
                f"Account {name!r} owns bucket {bucket!r}: owners may read and write it already."
            )
        row = session.scalar(
            select(BucketGrant).where(BucketGrant.bucket == bucket, BucketGrant.grantee == grantee)
        )
        if row is None:
            session.add(
                BucketGrant(bucket=bucket, grantee=grantee, access=access, created_at=runtime.clock.now())
            )
        else:
            row.access = access
        session.flush()
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "bucket.grant",
            account_id=None if grantee == EVERYONE else grantee,
            target=bucket,
            detail={"Grantee": name, "Access": str(access)},
        )
        return _views(session, runtime, None, [bucket])[0]


def revoke(
    runtime: ServiceContext, bucket: str, account_ref: str, caller: Caller | None = None
) -> BucketView:
    """Take back an account's (or everyone's) grant on a bucket; transfers already started keep their
    rights, every later one is refused."""
    _check_name(bucket)
    with runtime.db.write() as session:
        grantee, name = _grantee(session, account_ref)
        row = session.scalar(
            select(BucketGrant).where(BucketGrant.bucket == bucket, BucketGrant.grantee == grantee)
        )
        if row is None:
            who = "Every account has" if grantee == EVERYONE else f"Account {name!r} has"
            raise ResourceNotFound(f"{who} no grant on bucket {bucket!r}.")
        session.delete(row)
        session.flush()
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "bucket.revoke",
            account_id=None if grantee == EVERYONE else grantee,
            target=bucket,
            detail={"Grantee": name, "Access": row.access},
        )
        return _views(session, runtime, None, [bucket])[0]


def list_buckets(runtime: ServiceContext, caller: Caller) -> list[BucketView]:
    """Administrators: every bucket (mapped, owned, granted, or a directory under the default root).
    Others: the buckets they may read."""
    buckets = storage(runtime)
    with runtime.db.read() as session:
        names = set(buckets.mapped()) | set(buckets.default_buckets())
        names |= set(session.scalars(select(BucketOwner.bucket)))
        names |= set(session.scalars(select(BucketGrant.bucket)))
        return _views(session, runtime, caller, sorted(names))


def _require_bucket(session: Session, runtime: ServiceContext, bucket: str) -> None:
    if session.get(BucketOwner, bucket) is None and not storage(runtime).holds(bucket):
        raise ResourceNotFound(
            f"No bucket {bucket!r}: it is neither in the fleet file's [buckets], nor created by a request, "
            "nor a directory under the default root."
        )


def _grantee(session: Session, account_ref: str) -> tuple[str, str]:
    if account_ref == EVERYONE:
        return EVERYONE, EVERYONE
    account = accounts.get_account(session, account_ref)
    return account.id, account.name


def _views(
    session: Session, runtime: ServiceContext, caller: Caller | None, names: Iterable[str]
) -> list[BucketView]:
    """Views of the named buckets; with a caller who is not an administrator, only those it may read,
    and of their grants only its own and everyone's (all of them on the buckets it owns)."""
    owners = _owners(session, runtime)
    account_names = {a.id: a.name for a in session.scalars(select(Account))}
    grants: dict[str, list[BucketGrant]] = {}
    for row in session.scalars(select(BucketGrant).order_by(BucketGrant.bucket, BucketGrant.grantee)):
        grants.setdefault(row.bucket, []).append(row)
    rights = None if caller is None else load_rights(session, runtime, caller.account_id)
    mapped = runtime.fleet.buckets
    views = []
    for name in names:
        owned_by = owners.get(name, frozenset())
        access = Right.WRITE
        if rights is not None and not rights.is_admin:
            if not rights.may_see(name):
                continue
            access = Right.WRITE if rights.account_id in owned_by else rights.granted[name]
        shown = grants.get(name, [])
        if rights is not None and not rights.is_admin and rights.account_id not in owned_by:
            shown = [g for g in shown if g.grantee in (rights.account_id, EVERYONE)]
        where = mapped.get(name)
        kind = "directory" if where is None or isinstance(where, DirectoryBucket) else "s3"
        location = _location(runtime, name, where) if rights is None or rights.is_admin else ""
        views.append(
            BucketView(
                name=name,
                kind=kind,
                location=location,
                owners=tuple(sorted((i, account_names.get(i, i)) for i in owned_by)),
                grants=tuple(
                    GrantView(g.grantee, account_names.get(g.grantee, g.grantee), g.access) for g in shown
                ),
                access=str(access),
            )
        )
    return views


def _location(runtime: ServiceContext, name: str, where: Bucket | None) -> str:
    if isinstance(where, DirectoryBucket):
        return where.path
    if isinstance(where, S3Bucket):
        return f"{where.endpoint_url.rstrip('/')}/{where.remote_bucket}"
    return str(storage(runtime).default_directory(name))


# -- S3's own API (server/s3): the directory buckets, served ------------------------------------------


@dataclass(frozen=True)
class ServedBucket:
    """A directory bucket an S3 request may use: its directory (made by the first write if it is a
    default-root bucket owned but not there yet)."""

    name: str
    root: Path
    created_on_write: bool


def _s3_name(bucket: str) -> None:
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise InvalidBucketName(f"The specified bucket is not valid: {problem}.")


def _not_proxied(bucket: str, where: S3Bucket) -> InvalidS3Request:
    return InvalidS3Request(
        f"Bucket {bucket!r} is kept on the S3-compatible endpoint {where.endpoint_url} (the fleet file's "
        "[buckets]); this endpoint serves only directory buckets and does not proxy it: send its requests "
        f"there (AWS_ENDPOINT_URL_S3={where.endpoint_url})."
    )


def served_bucket(runtime: ServiceContext, caller: Caller, bucket: str, need: Right) -> ServedBucket:
    """The bucket for an S3 request that needs `need` of it: NoSuchBucket if it is not there (S3 makes
    buckets with CreateBucket, never by a first write), AccessDenied if another account's."""
    _s3_name(bucket)
    where = runtime.fleet.buckets.get(bucket)
    if isinstance(where, S3Bucket):
        raise _not_proxied(bucket, where)
    buckets = storage(runtime)
    with runtime.db.read() as session:
        rights = load_rights(session, runtime, caller.account_id)
        recorded = session.get(BucketOwner, bucket) is not None
    if not recorded and not buckets.holds(bucket):
        raise NoSuchBucket(f"The specified bucket does not exist: {bucket!r}.")
    if rights.decide(bucket, need, held=True) is Decision.DENIED:
        raise BucketAccessDenied(denial(f"{SCHEME}{bucket}", bucket, rights.account_name, need))
    if isinstance(where, DirectoryBucket):
        if need is Right.WRITE and not Path(where.path).is_dir():
            raise InvalidS3Request(
                f"Bucket {bucket!r} is mapped to {where.path}, which is not a directory; the fleet file's "
                "administrator makes it."
            )
        return ServedBucket(bucket, Path(where.path), created_on_write=False)
    return ServedBucket(bucket, buckets.default_directory(bucket), created_on_write=True)


def create_served_bucket(runtime: ServiceContext, caller: Caller, bucket: str) -> None:
    """S3's CreateBucket: a directory bucket under the default root, the caller's."""
    _s3_name(bucket)
    where = runtime.fleet.buckets.get(bucket)
    if isinstance(where, S3Bucket):
        raise _not_proxied(bucket, where)
    create_bucket(runtime, caller, bucket)


@dataclass(frozen=True)
class ListedBucket:
    name: str
    created: datetime


def served_buckets(runtime: ServiceContext, caller: Caller) -> list[ListedBucket]:
    """S3's ListBuckets: the directory buckets the caller may read that are there (owned or held);
    another account's are not listed, nor buckets kept on an S3-compatible endpoint."""
    buckets = storage(runtime)
    views = [view for view in list_buckets(runtime, caller) if view.kind == "directory"]
    with runtime.db.read() as session:
        created = {row.bucket: row.created_at for row in session.scalars(select(BucketOwner))}
    listed = []
    for view in views:
        when = created.get(view.name)
        if when is None:
            where = runtime.fleet.buckets.get(view.name)
            root = (
                Path(where.path)
                if isinstance(where, DirectoryBucket)
                else buckets.default_directory(view.name)
            )
            try:
                when = datetime.fromtimestamp(root.stat().st_mtime, UTC)
            except OSError:
                continue  # neither recorded nor there
        listed.append(ListedBucket(view.name, when))
    return listed


def delete_served_bucket(runtime: ServiceContext, caller: Caller, bucket: str) -> None:
    """S3's DeleteBucket: an empty default-root bucket, by one of its owners or an administrator; its
    owner and grants are forgotten with it. A bucket the fleet file maps is the fleet file's to remove."""
    served = served_bucket(runtime, caller, bucket, Right.WRITE)
    if not served.created_on_write:
        raise InvalidS3Request(f"Bucket {bucket!r} is mapped by the fleet file's [buckets]; remove it there.")
    with runtime.db.write() as session:
        owners = _owners(session, runtime).get(bucket, frozenset())
        if not caller.is_admin and caller.account_id not in owners:
            raise BucketAccessDenied(
                f"Access Denied: account {caller.account_name!r} does not own bucket {bucket!r}; "
                "only its owners and administrators may delete it."
            )
        root = served.root
        if root.is_dir():
            for _directory, _subdirs, files in os.walk(root):
                if any(not name.startswith(TEMP_PREFIX) for name in files):
                    raise BucketNotEmpty(f"The bucket you tried to delete is not empty: {bucket!r}.")
            # Out of the way first, in one rename: an upload racing the delete finds no bucket.
            doomed = root.with_name(f"{TEMP_PREFIX}deleted-{uuid.uuid4().hex}")
            root.rename(doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        owner = session.get(BucketOwner, bucket)
        if owner is not None:
            session.delete(owner)
        for row in session.scalars(select(BucketGrant).where(BucketGrant.bucket == bucket)):
            session.delete(row)
        session.flush()


def known_bucket(runtime: ServiceContext, bucket: str) -> bool:
    """Whether a bucket of that name is there (recorded, mapped, or a directory under the default root):
    what tells ``Host: BUCKET.HOST`` (S3's virtual-hosted style) from a host name with dots."""
    if bucket_name_problem(bucket) is not None:
        return False
    if bucket in runtime.fleet.buckets or storage(runtime).holds(bucket):
        return True
    with runtime.db.read() as session:
        return session.get(BucketOwner, bucket) is not None
