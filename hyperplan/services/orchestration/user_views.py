"""What the native API does with users and access keys, for the caller who asks: each function decides
who may ask, owns its transaction and returns frozen views (or a new key's secret, once).

Who may do what:
- every user manages their own keys (create, list, activate, deactivate, delete);
- an account's owners also manage its users and every user's keys;
- administrators do all of it for any account (naming it).
A caller who names another account without being an administrator is refused before the name is looked
up, and another account's key is "not found" to them: nobody learns which names or keys exist elsewhere.
A change that stops a key signing (deactivated, deleted, its user deleted) is forgotten by this
server's key cache before the answer is sent, so the key's next request is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.errors import AccessDenied, ResourceNotFound
from hyperplan.services.accounts import accounts, audit, users
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.accounts.users import ACTIVE, INACTIVE, NewKey
from hyperplan.services.runtime import console_sessions
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import AccessKey, Account, User


@dataclass(frozen=True)
class UserView:
    account_id: str
    account_name: str
    name: str
    is_owner: bool
    created_at: datetime
    active_keys: int
    inactive_keys: int
    deleted_at: datetime | None = None


@dataclass(frozen=True)
class AccessKeyView:
    access_key_id: str
    account_id: str
    account_name: str
    user_name: str
    status: str
    created_at: datetime
    deleted_at: datetime | None = None


@dataclass(frozen=True)
class NewUser:
    user: UserView
    key: NewKey


# -- who may ---------------------------------------------------------------------------------------------


def _account_for(session: Session, caller: Caller, account_ref: str | None, *, lock: bool = True) -> Account:
    """The caller's own account, or (administrators) the one named; locked for a change."""
    if not account_ref or account_ref in (caller.account_id, caller.account_name):
        account_ref = caller.account_id
    elif not caller.is_admin:
        raise AccessDenied(
            f"Only administrators manage other accounts' users and keys; account {caller.account_name!r} "
            "is not one."
        )
    account = accounts.get_account(session, account_ref)
    if account.deleted_at is not None:
        raise ResourceNotFound(f"No account {account_ref!r}.")
    return users.lock_account(session, account.id) if lock else account


def _require_owner(caller: Caller, account: Account, what: str) -> None:
    if caller.is_admin or (caller.account_id == account.id and caller.is_owner):
        return
    raise AccessDenied(
        f"Only the owners of account {account.name!r} {what}; user {caller.user_name!r} is not one."
    )


def _user_for(session: Session, caller: Caller, account: Account, user_name: str | None) -> User:
    """The caller themselves, or a user an owner (or an administrator) names."""
    if not user_name or (account.id == caller.account_id and user_name == caller.user_name):
        if account.id != caller.account_id:
            return users.first_owner(session, account)  # an administrator adding to another account
        return _caller_user(session, caller)
    _require_owner(caller, account, "manage other users' keys")
    return users.get_user(session, account, user_name)


def _caller_user(session: Session, caller: Caller) -> User:
    user = session.get(User, caller.user_id) if caller.user_id is not None else None
    if user is None or user.deleted_at is not None:
        raise ResourceNotFound(f"User {caller.user_name!r} has been deleted.")
    return user


def _key_for(session: Session, caller: Caller, access_key_id: str) -> tuple[Account, User, AccessKey]:
    """A key the caller may manage: their own, their account's (owners), any (administrators)."""
    key = session.get(AccessKey, access_key_id)
    if key is None or key.revoked_at is not None or key.user_id is None:
        raise ResourceNotFound(f"No access key {access_key_id}.")
    if key.account_id != caller.account_id and not caller.is_admin:
        raise ResourceNotFound(f"No access key {access_key_id}.")  # another account's: not to be known
    account = users.lock_account(session, key.account_id)
    user = session.get(User, key.user_id)
    assert user is not None  # a foreign key
    if user.id != caller.user_id:
        _require_owner(caller, account, "manage other users' keys")
    return account, user, key


# -- users -----------------------------------------------------------------------------------------------


def create_user(
    runtime: ServiceContext, caller: Caller, name: str, *, owner: bool, account_ref: str | None = None
) -> NewUser:
    """A new user of the account, with a first access key whose secret is returned this once."""
    users.check_user_name(name)
    now = utcnow()
    with runtime.db.write() as session:
        account = _account_for(session, caller, account_ref)
        _require_owner(caller, account, "create users")
        user = users.add_user(session, account, name, owner=owner, now=now)
        key = users.add_key(session, account, user, box=runtime.secret_box, now=now)
        detail = {"Owner": owner, "AccessKeyId": key.access_key_id}
        _audit(session, runtime, caller, "user.create", account, name, detail)
        return NewUser(_user_view(session, account, user), key)


def list_users(runtime: ServiceContext, caller: Caller, account_ref: str | None = None) -> list[UserView]:
    with runtime.db.read() as session:
        account = _account_for(session, caller, account_ref, lock=False)
        _require_owner(caller, account, "list its users")
        return [_user_view(session, account, user) for user in users.list_users(session, account.id)]


def delete_user(
    runtime: ServiceContext, caller: Caller, name: str, account_ref: str | None = None
) -> UserView:
    """Delete a user and their keys (refused for the last owner, or the holder of the last active key)."""
    users.check_user_name(name)
    with runtime.db.write() as session:
        account = _account_for(session, caller, account_ref)
        _require_owner(caller, account, "delete users")
        user = users.get_user(session, account, name)
        view = _user_view(session, account, user)
        deleted = users.delete_user(session, account, user, now=utcnow())
        _audit(session, runtime, caller, "user.delete", account, name, {"KeysDeleted": deleted})
    for key_id in deleted:
        runtime.keys.forget(key_id)  # their next request is refused
    return view


def _user_view(session: Session, account: Account, user: User) -> UserView:
    keys = users.user_keys(session, user.id)
    active = sum(1 for key in keys if key.status == ACTIVE)
    return UserView(
        account.id, account.name, user.name, user.is_owner, user.created_at, active, len(keys) - active
    )


# -- keys ------------------------------------------------------------------------------------------------


def create_key(
    runtime: ServiceContext, caller: Caller, user_name: str | None = None, account_ref: str | None = None
) -> NewKey:
    """A new key for the caller (or the user named); its secret is returned this once."""
    if user_name:
        users.check_user_name(user_name)
    with runtime.db.write() as session:
        account = _account_for(session, caller, account_ref)
        user = _user_for(session, caller, account, user_name)
        key = users.add_key(session, account, user, box=runtime.secret_box, now=utcnow())
        _audit(session, runtime, caller, "key.create", account, key.access_key_id, {"UserName": user.name})
        return key


def list_keys(
    runtime: ServiceContext, caller: Caller, user_name: str | None = None, account_ref: str | None = None
) -> list[AccessKeyView]:
    """The caller's keys (or the named user's), never their secrets."""
    if user_name:
        users.check_user_name(user_name)
    with runtime.db.read() as session:
        account = _account_for(session, caller, account_ref, lock=False)
        if account.id != caller.account_id and not user_name:
            holders = users.list_users(session, account.id)  # an administrator: every user's
        else:
            holders = [_user_for(session, caller, account, user_name)]
        return [
            _key_view(account, user, key) for user in holders for key in users.user_keys(session, user.id)
        ]


def set_key_status(
    runtime: ServiceContext, caller: Caller, access_key_id: str, *, active: bool
) -> AccessKeyView:
    """Activate or deactivate a key; the account's last active key is never deactivated."""
    with runtime.db.write() as session:
        account, user, key = _key_for(session, caller, access_key_id)
        before = key.status
        users.set_status(session, account, key, ACTIVE if active else INACTIVE)
        if not active:  # its console sessions end for good, not only while it is inactive
            console_sessions.end_for_key(session, access_key_id)
        view = _key_view(account, user, key)
        detail = {"UserName": user.name, "Status": {"From": before, "To": key.status}}
        _audit(
            session,
            runtime,
            caller,
            "key.activate" if active else "key.deactivate",
            account,
            access_key_id,
            detail,
        )
    runtime.keys.forget(access_key_id)  # inactive: its next request is refused
    return view


def delete_key(runtime: ServiceContext, caller: Caller, access_key_id: str) -> AccessKeyView:
    """Delete a key for good; the account's last active key is never deleted."""
    now = utcnow()
    with runtime.db.write() as session:
        account, user, key = _key_for(session, caller, access_key_id)
        users.delete_key(session, account, key, now=now)
        view = _key_view(account, user, key)
        _audit(session, runtime, caller, "key.delete", account, access_key_id, {"UserName": user.name})
    runtime.keys.forget(access_key_id)  # its next request is refused
    return view


def _audit(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    action: str,
    account: Account,
    target: str,
    detail: Mapping[str, object],
) -> None:
    audit.record(
        session, runtime.clock.now(), caller, action, account_id=account.id, target=target, detail=detail
    )


def _key_view(account: Account, user: User, key: AccessKey) -> AccessKeyView:
    return AccessKeyView(
        key.access_key_id, account.id, account.name, user.name, key.status, key.created_at, key.revoked_at
    )
