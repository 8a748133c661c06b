"""The fleet file's ``[buckets]``: each a directory on the server or an S3-compatible endpoint, and the
accounts that own it."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hyperplan.core.buckets import bucket_name_problem
from hyperplan.core.fleet import Bucket, DirectoryBucket, S3Bucket
from hyperplan.core.fleet_values import Table
from hyperplan.errors import ValidationError

_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_S3_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_ACCOUNT = re.compile(r"[a-z0-9](-?[a-z0-9]){0,62}")  # an account's name, or its twelve-digit id
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def read_buckets(values: Mapping[str, Any]) -> Mapping[str, Bucket]:
    buckets: dict[str, Bucket] = {}
    for name, value in values.items():
        problem = bucket_name_problem(name)
        if problem is not None:
            raise ValidationError(f"buckets.{name}: not a valid bucket name: {problem}")
        if isinstance(value, dict) and "path" in value:
            if "endpoint_url" in value:
                raise ValidationError(
                    f"buckets.{name}: give path (a directory) or endpoint_url (an S3-compatible endpoint), "
                    "not both"
                )
            table = Table(value, f"buckets.{name}", ("path", "accounts"))
            path = table.text("path")
            if not path:
                raise table.fail("path", "is empty; give the bucket's directory")
            buckets[name] = DirectoryBucket(path, _bucket_accounts(table))
        elif isinstance(value, dict):  # a directory's table has a path; any other is an endpoint's
            buckets[name] = _s3_bucket(Table(value, f"buckets.{name}", _S3_BUCKET_KEYS), name)
        elif isinstance(value, str) and value:
            buckets[name] = DirectoryBucket(value)
        else:
            raise ValidationError(
                f"buckets.{name}: {value!r} is not a directory or a table with a path or an endpoint_url"
            )
    return MappingProxyType(buckets)


def _bucket_accounts(table: Table) -> tuple[str, ...]:
    """The accounts (names or twelve-digit ids) that own a bucket; none listed: the administrators."""
    listed = table.get("accounts", list, [], "a list of account names or ids")
    if "accounts" in table.values and not listed:
        raise table.fail("accounts", "is empty; leave it out for a bucket only administrators use")
    seen: set[str] = set()
    for index, account in enumerate(listed):
        where = f"accounts[{index}]"
        if account == "*":
            raise table.fail(
                where,
                "'*' cannot own a bucket; share it read-only with every account through "
                '`hyperplan buckets grant BUCKET "*"`',
            )
        if not isinstance(account, str) or not _ACCOUNT.fullmatch(account):
            raise table.fail(where, f"{account!r} is not an account name or a twelve-digit account id")
        if account in seen:
            raise table.fail(where, f"{account!r} is listed twice")
        seen.add(account)
    return tuple(listed)


_S3_BUCKET_KEYS = (
    "endpoint_url", "region", "bucket", "access_key_id", "secret_access_key", "access_key_id_env",
    "secret_access_key_env", "accounts",
)  # fmt: skip


def _s3_bucket(table: Table, name: str) -> S3Bucket:
    access_key_id, access_key_id_env = _credential(table, "access_key_id")
    secret_access_key, secret_access_key_env = _credential(table, "secret_access_key")
    has_key_id = access_key_id is not None or access_key_id_env is not None
    has_secret = secret_access_key is not None or secret_access_key_env is not None
    # Half a key pair is refused here: the client would otherwise fail later, on the first transfer.
    if has_key_id and not has_secret:
        raise table.fail("secret_access_key_env", "required with access_key_id (or secret_access_key)")
    if has_secret and not has_key_id:
        raise table.fail("access_key_id_env", "required with secret_access_key (or access_key_id)")
    return S3Bucket(
        endpoint_url=_endpoint_url(table),
        region=table.text("region", "us-east-1", pattern=_S3_REGION, hint=" (such as us-east-1)"),
        remote_bucket=table.text("bucket", name, pattern=_BUCKET, hint=" (3-63 of a-z 0-9 . -)"),
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        access_key_id_env=access_key_id_env,
        secret_access_key_env=secret_access_key_env,
        accounts=_bucket_accounts(table),
    )


def _endpoint_url(table: Table) -> str:
    url = table.text("endpoint_url")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.fail("endpoint_url", f"{url!r} is not an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise table.fail("endpoint_url", "credentials go in access_key_id_env and secret_access_key_env")
    if parts.query or parts.fragment:
        raise table.fail("endpoint_url", f"{url!r} has a query or fragment, which an endpoint cannot")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise table.fail("endpoint_url", f"{url!r} has an invalid port") from None
    return url


def _credential(table: Table, key: str) -> tuple[str | None, str | None]:
    """One half of the key pair: (inline value, environment variable name); at most one of them."""
    if key in table.values and f"{key}_env" in table.values:
        raise table.fail(key, f"give {key} or {key}_env, not both")
    inline = table.text(key, None)
    if inline is not None and not inline:
        raise table.fail(key, "is empty")
    variable = table.text(f"{key}_env", None)
    if variable is not None and not _ENV_NAME.fullmatch(variable):
        raise table.fail(f"{key}_env", f"{variable!r} is not an environment variable name")
    return inline, variable
