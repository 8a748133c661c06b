"""An account's users and their access keys: the rules, on a session the caller owns.

An account has named users, the people of its team. Each user holds at most two access keys, as IAM
allows a user, each Active or Inactive; a deleted key keeps its row (revoked_at) so that its id is never
given twice. Owners manage the account's users, and its first user is one. Whatever request makes the
change, an account keeps at least one active key and at least one owner: a key, a user or an account
can be locked out only by deleting the account. Who may ask for what (a user, an owner, an
administrator) is decided in services/orchestration/user_views.py, which owns the transactions.
"""

from __future__ import annotations

import re
import secrets
import string
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.status import KEY_LIFECYCLE, KeyStatus
from hyperplan.errors import Conflict, ResourceInUse, ResourceLimitExceeded, ResourceNotFound, ValidationError
from hyperplan.store.master_key import SecretBox
from hyperplan.store.schema import AccessKey, Account, User

MAX_KEYS_PER_USER = 2  # IAM's limit of access keys per user
ACTIVE, INACTIVE = KeyStatus.ACTIVE, KeyStatus.INACTIVE  # a key's statuses: core/status.py KEY_LIFECYCLE
# IAM's user names: letters, digits and + = , . @ _ -, at most 64 characters.
_USER_NAME = re.compile(r"[A-Za-z0-9+=,.@_-]{1,64}")
_KEY_ALPHABET = string.ascii_uppercase + "234567"


@dataclass(frozen=True)
class NewKey:
    """A new access key and its secret, which is shown this once."""

    account_id: str
    account_name: str
    access_key_id: str
    secret_access_key: str
    user_name: str = ""


def new_access_key_id() -> str:
    return "AKHP" + "".join(secrets.choice(_KEY_ALPHABET) for _ in range(16))


def new_secret_access_key() -> str:
    return secrets.token_urlsafe(30)[:40]


def check_user_name(name: str) -> None:
    if not _USER_NAME.fullmatch(name):
        raise ValidationError(
            f"User name {name!r} must be 1-64 letters, digits or any of + = , . @ _ - (IAM's rule)."
        )


def lock_account(session: Session, account_id: str) -> Account:
    """The account's row, locked for the rest of the transaction where the database can (SQLite's write
    transactions are serial already): two requests never both take the last active key or owner away."""
    account = session.get(Account, account_id, with_for_update=True)
    if account is None or account.deleted_at is not None:
        raise ResourceNotFound(f"No account {account_id!r}.")
    return account


# -- users ----------------------------------------------------------------------------------------------


def add_user(session: Session, account: Account, name: str, *, owner: bool, now: datetime) -> User:
    check_user_name(name)
    if find_user(session, account.id, name) is not None:
        raise ResourceInUse(f"Account {account.name!r} already has a user named {name!r}.")
    user = User(account_id=account.id, name=name, is_owner=owner, created_at=now)
    session.add(user)
    session.flush()
    return user


def find_user(session: Session, account_id: str, name: str) -> User | None:
    return session.scalar(
        select(User).where(User.account_id == account_id, User.name == name, User.deleted_at.is_(None))
    )


def get_user(session: Session, account: Account, name: str) -> User:
    user = find_user(session, account.id, name)
    if user is None:
        raise ResourceNotFound(f"Account {account.name!r} has no user {name!r}.")
    return user


def first_owner(session: Session, account: Account) -> User:
    """The account's oldest live owner: who holds a key an administrator adds to the account."""
    user = session.scalar(
        select(User)
        .where(User.account_id == account.id, User.is_owner.is_(True), User.deleted_at.is_(None))
        .order_by(User.id)
        .limit(1)
    )
    if user is None:
        raise ResourceNotFound(f"Account {account.name!r} has no owner.")
    return user


def list_users(session: Session, account_id: str) -> list[User]:
    return list(
        session.scalars(
            select(User).where(User.account_id == account_id, User.deleted_at.is_(None)).order_by(User.id)
        )
    )


def delete_user(session: Session, account: Account, user: User, *, now: datetime) -> list[str]:
    """Delete a user and their keys; returns the ids of the keys deleted. Refused for the account's last
    owner, and for a user whose keys are the account's only active ones."""
    if user.is_owner:
        owners = session.scalar(
            select(func.count(User.id)).where(
                User.account_id == account.id, User.is_owner.is_(True), User.deleted_at.is_(None)
            )
        )
        if (owners or 0) <= 1:
            raise Conflict(
                f"User {user.name!r} is the last owner of account {account.name!r}: make another owner "
                "(hyperplan users create NAME --owner) before deleting this one."
            )
    keys = user_keys(session, user.id)
    own_active = sum(1 for key in keys if key.status == ACTIVE)
    if own_active and own_active >= active_key_count(session, account.id):
        raise Conflict(
            f"User {user.name!r} holds the last active access key of account {account.name!r}: another "
            "user needs an active key before this one is deleted."
        )
    for key in keys:
        key.revoked_at = now
    user.deleted_at = now
    return [key.access_key_id for key in keys]


# -- keys -----------------------------------------------------------------------------------------------


def user_keys(session: Session, user_id: int) -> list[AccessKey]:
    """A user's keys that are not deleted, oldest first."""
    return list(
        session.scalars(
            select(AccessKey)
            .where(AccessKey.user_id == user_id, AccessKey.revoked_at.is_(None))
            .order_by(AccessKey.created_at, AccessKey.access_key_id)
        )
    )


def active_key_count(session: Session, account_id: str) -> int:
    count = session.scalar(
        select(func.count(AccessKey.access_key_id)).where(
            AccessKey.account_id == account_id, AccessKey.revoked_at.is_(None), AccessKey.status == ACTIVE
        )
    )
    return int(count or 0)


def add_key(
    session: Session,
    account: Account,
    user: User,
    *,
    box: SecretBox,
    now: datetime,
    access_key_id: str | None = None,
    secret: str | None = None,
) -> NewKey:
    """A new active key for the user; its secret is stored sealed under the master key and returned
    here once. Refused when the user already holds two."""
    held = len(user_keys(session, user.id))
    if held >= MAX_KEYS_PER_USER:
        raise ResourceLimitExceeded(
            f"User {user.name!r} of account {account.name!r} already has {held} access keys, the most a "
            f"user may hold ({MAX_KEYS_PER_USER}, as IAM allows): delete one first "
            "(hyperplan keys delete ACCESS_KEY_ID)."
        )
    key_id = access_key_id or new_access_key_id()
    if session.get(AccessKey, key_id) is not None:
        raise ResourceInUse(f"Access key {key_id} already exists.")
    plain = secret or new_secret_access_key()
    session.add(
        AccessKey(
            access_key_id=key_id,
            secret_access_key=box.seal(plain),
            secret_sealed=True,
            account_id=account.id,
            user_id=user.id,
            status=KEY_LIFECYCLE.initial,
            created_at=now,
        )
    )
    return NewKey(account.id, account.name, key_id, plain, user.name)


def live_key(session: Session, access_key_id: str) -> AccessKey:
    """A key that is not deleted (active or inactive)."""
    key = session.get(AccessKey, access_key_id)
    if key is None or key.revoked_at is not None:
        raise ResourceNotFound(f"No access key {access_key_id}.")
    return key


def set_status(session: Session, account: Account, key: AccessKey, status: str) -> None:
    """Activate or deactivate a key (a move of KEY_LIFECYCLE; asking for the status it has already
    changes nothing); the account's last active key is never deactivated."""
    old, new = KeyStatus(key.status), KeyStatus(status)
    if new == old:
        return
    KEY_LIFECYCLE.check(old, new)
    if new == INACTIVE:
        _keep_one_active(session, account, key, "deactivated")
    key.status = new


def delete_key(session: Session, account: Account, key: AccessKey, *, now: datetime) -> None:
    if key.status == ACTIVE:
        _keep_one_active(session, account, key, "deleted")
    key.revoked_at = now


def _keep_one_active(session: Session, account: Account, key: AccessKey, what: str) -> None:
    if active_key_count(session, account.id) <= 1:
        raise Conflict(
            f"Access key {key.access_key_id} is the last active key of account {account.name!r} and cannot "
            f"be {what}: nobody could sign for the account again. Create another key first "
            "(hyperplan keys create)."
        )
