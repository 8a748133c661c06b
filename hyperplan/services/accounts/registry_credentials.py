"""Registry credentials: the user name and password a container runtime logs in to a registry with.

Administrators set them (`hyperplan registries set-credentials HOST --username U --password-stdin`); the
fleet file never holds them. The password is sealed under the master key as it is stored, as access-key
and webhook secrets are (sealed_secrets.py re-seals it at a rotation), and no answer ever carries it:
only :func:`login_for`, for the runtime that pulls an image, opens it. Each change is recorded in the
audit trail in its own transaction, without the password.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from hyperplan.backends.base import Login
from hyperplan.core.image_refs import Registry, parse_registry_host
from hyperplan.errors import ResourceNotFound, ValidationError
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.store.db import Database
from hyperplan.store.master_key import SecretBox
from hyperplan.store.schema import RegistryCredential

MAX_USERNAME = 255
# A registry token can be long: an ECR authorization token's password is a few kilobytes.
MAX_PASSWORD = 16_384


# What the runtime pulls with (backends/images.py): the password stays out of reprs, so out of logs.
RegistryLogin = Login


@dataclass(frozen=True)
class StoredCredentials:
    """Credentials just stored: the registry and who logs in (the password is never given back)."""

    host: str
    username: str
    set_at: datetime


@dataclass(frozen=True)
class RegistryView:
    """A registry as `registries list` shows it: the fleet file's settings and who logs in, if anyone."""

    host: str
    insecure: bool  # from the fleet file's [registries]
    in_fleet: bool  # the fleet file has a table for it
    username: str | None  # None: no credentials stored
    set_at: datetime | None


def set_credentials(
    db: Database, box: SecretBox, caller: Caller, host: str, username: str, password: str, now: datetime
) -> StoredCredentials:
    """Store (or replace) a registry's credentials, the password sealed; refused, naming what is wrong,
    before anything is written."""
    host = parse_registry_host(host)
    _check_username(username)
    _check_password(password)
    with db.write() as session:
        row = session.get(RegistryCredential, host)
        replaced = row is not None
        if row is None:
            row = RegistryCredential(host=host)
            session.add(row)
        row.username, row.password, row.set_at = username, box.seal(password), now
        audit.record(
            session,
            now,
            caller,
            "registry.set-credentials",
            target=host,
            detail={"Username": username, "Replaced": replaced},
        )
    return StoredCredentials(host, username, now)


def delete_credentials(db: Database, caller: Caller, host: str, now: datetime) -> str:
    """Forget a registry's credentials; ResourceNotFound when none are stored. Returns the host."""
    host = parse_registry_host(host)
    with db.write() as session:
        row = session.get(RegistryCredential, host)
        if row is None:
            raise ResourceNotFound(f"No credentials are stored for registry {host}.")
        audit.record(
            session,
            now,
            caller,
            "registry.delete-credentials",
            target=host,
            detail={"Username": row.username},
        )
        session.delete(row)
    return host


def list_registries(db: Database, registries: Mapping[str, Registry]) -> list[RegistryView]:
    """Every registry the fleet file describes or credentials are stored for, by host; no password."""
    with db.read() as session:
        stored = {row.host: (row.username, row.set_at) for row in session.scalars(select(RegistryCredential))}
    views = []
    for host in sorted(set(registries) | set(stored)):
        registry = registries.get(host)
        username, set_at = stored.get(host, (None, None))
        views.append(
            RegistryView(
                host=host,
                insecure=registry is not None and registry.insecure,
                in_fleet=registry is not None,
                username=username,
                set_at=set_at,
            )
        )
    return views


def login_for(db: Database, box: SecretBox, host: str) -> RegistryLogin | None:
    """The credentials a runtime pulls from `host` (HOST[:PORT], as an image reference names it) with;
    None when none are stored (the registry is then pulled from anonymously)."""
    with db.read() as session:
        row = session.get(RegistryCredential, host.lower())
        if row is None:
            return None
        return RegistryLogin(row.username, box.open(row.password))


def _check_username(username: str) -> None:
    if not username or len(username) > MAX_USERNAME:
        raise ValidationError(f"Username must be 1-{MAX_USERNAME} characters, not {len(username)}.")
    if any(c.isspace() or not c.isprintable() for c in username):
        raise ValidationError("Username must not hold a space or a control character.")


def _check_password(password: str) -> None:
    if not password:
        raise ValidationError("Password is empty: give the registry's password or token.")
    if len(password) > MAX_PASSWORD:
        raise ValidationError(f"Password is {len(password)} characters long; at most {MAX_PASSWORD}.")
    if any(c in "\r\n\0" for c in password):
        raise ValidationError("Password must be one line (no newline, carriage return or NUL).")
