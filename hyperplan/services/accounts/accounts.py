"""Accounts and their access keys.

An account owns everything its keys create; its twelve-digit id is the account in every ARN. The
first start of a data directory creates the administrator account and writes its keys where the
`aws` CLI and `hyperplan` can read them.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from hyperplan.core.jobs import FINAL as JOB_FINAL
from hyperplan.core.lifecycle import FINAL as PLAN_FINAL
from hyperplan.core.rate_limits import RateLimit, RequestClass
from hyperplan.errors import ResourceInUse, ResourceNotFound, ValidationError
from hyperplan.services.accounts import users
from hyperplan.services.accounts.sealed_secrets import open_secret
from hyperplan.services.accounts.users import NewKey, new_access_key_id, new_secret_access_key
from hyperplan.store.master_key import SecretBox
from hyperplan.store.schema import AccessKey, Account, Cluster, RateBucket, TrainingJob, TrainingPlan, User

__all__ = ["NewKey", "new_access_key_id", "new_secret_access_key"]  # kept here for their callers

PAYMENT_MODES = ("auto", "budget", "approval")
ADMIN_NAME = "admin"
CREDENTIALS_PROFILE = "hyperplan"
_NAME = re.compile(r"[a-z0-9](-?[a-z0-9]){0,62}")


@dataclass(frozen=True)
class Caller:
    """Who signed the request."""

    account_id: str
    account_name: str
    is_admin: bool
    access_key_id: str
    # An administrator's overrides of the fleet's request rate limits for this account (core/rate_limits).
    rate_limits: Mapping[RequestClass, RateLimit] = field(default_factory=lambda: MappingProxyType({}))
    # The user who holds the key (services/accounts/users.py): who acted, for plan events and the audit trail.
    user_id: int | None = None
    user_name: str = ""
    is_owner: bool = False
    # Where the request came from (its peer's address), for the audit trail (services/accounts/audit.py).
    remote_address: str = ""


# (the creating write, the new account's id) -> (its OS user, whether the server made it); may record
# the user's ids and run useradd, inside the transaction that creates the account, so that a failure
# leaves no account behind.
OsUserChoice = Callable[[Session, str], tuple[str, bool]]


def _new_account_id(session: Session) -> str:
    while True:
        candidate = str(secrets.randbelow(9 * 10**11) + 10**11)
        if session.get(Account, candidate) is None:
            return candidate


def create_account(
    session: Session,
    name: str,
    *,
    box: SecretBox,
    now: datetime,
    is_admin: bool = False,
    payment_mode: str = "auto",
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    os_user: OsUserChoice | None = None,
) -> NewKey:
    """A new account, its first user (an owner named after the account) and that user's first key.
    ``os_user`` says which OS user its work runs as (None: none yet; a start in isolation mode `users`
    gives it one)."""
    if not _NAME.fullmatch(name):
        raise ValidationError(
            f"Account name {name!r} must be 1-63 lowercase letters, digits or single hyphens, "
            "starting and ending with a letter or digit."
        )
    if session.scalar(select(Account).where(Account.name == name)) is not None:
        raise ResourceInUse(f"An account named {name!r} already exists.")
    set_payment_mode_check(payment_mode)
    account = Account(
        id=_new_account_id(session),
        name=name,
        is_admin=is_admin,
        created_at=now,
        payment_mode=payment_mode,
        budget=Decimal("0"),
    )
    session.add(account)
    session.flush()
    if os_user is not None:
        account.os_user, account.os_user_made = os_user(session, account.id)
    owner = users.add_user(session, account, name, owner=True, now=now)
    return users.add_key(
        session, account, owner, box=box, now=now, access_key_id=access_key_id, secret=secret_access_key
    )


def set_payment_mode_check(mode: str) -> None:
    if mode not in PAYMENT_MODES:
        raise ValidationError(f"Payment mode must be one of {', '.join(PAYMENT_MODES)}, not {mode!r}.")


def add_key(
    session: Session,
    account_id: str,
    *,
    box: SecretBox,
    now: datetime,
    access_key_id: str | None = None,
    secret: str | None = None,
) -> NewKey:
    """A new access key for the account's first owner (an administrator's `accounts add-key`); its
    secret is stored sealed under the master key and returned here once."""
    account = get_account(session, account_id)
    if account.deleted_at is not None:
        raise ResourceNotFound(f"Account {account.name!r} has been deleted.")
    users.lock_account(session, account.id)
    owner = users.first_owner(session, account)
    return users.add_key(
        session, account, owner, box=box, now=now, access_key_id=access_key_id, secret=secret
    )


def get_account(session: Session, account_ref: str) -> Account:
    """An account by id or by name."""
    account = session.get(Account, account_ref) or session.scalar(
        select(Account).where(Account.name == account_ref)
    )
    if account is None:
        raise ResourceNotFound(f"No account {account_ref!r}.")
    # Held for the transaction: the session's identity map keeps rows weakly, and a purchase asks for
    # its account four times (quotas, payment); each would read it again once the last one was dropped.
    session.info.setdefault("accounts_held", {})[account.id] = account
    return account


def list_accounts(session: Session) -> list[Account]:
    """Every account not deleted, oldest first."""
    query = select(Account).where(Account.deleted_at.is_(None))
    return list(session.scalars(query.order_by(Account.created_at, Account.name)))


def still_open(session: Session, account_id: str) -> list[str]:
    """What the account has that has not ended: plans not Expired or Failed, clusters (a cluster's row
    goes when its last node has), training jobs not in a final status. Empty: it may be deleted."""
    plans = session.scalars(
        select(TrainingPlan.name).where(
            TrainingPlan.account_id == account_id, TrainingPlan.status.not_in(list(PLAN_FINAL))
        )
    )
    clusters = session.scalars(select(Cluster.name).where(Cluster.account_id == account_id))
    jobs = session.scalars(
        select(TrainingJob.name).where(
            TrainingJob.account_id == account_id, TrainingJob.secondary_status.not_in(list(JOB_FINAL))
        )
    )
    found = []
    for noun, names in (("plan", plans), ("cluster", clusters), ("training job", jobs)):
        for name in sorted(names):
            found.append(f"{noun} {name}")
    return found


def delete_account(session: Session, caller: Caller, account_ref: str, *, now: datetime) -> Account:
    """Mark the account deleted and revoke its keys; refused while it has work that has not ended, for
    the caller's own account and for the last administrator. The row stays: invoices, ledger entries,
    plans and jobs name it."""
    account = get_account(session, account_ref)
    if account.deleted_at is not None:
        raise ResourceNotFound(f"No account {account_ref!r}.")
    if account.id == caller.account_id:
        raise ValidationError(
            f"Account {account.name!r} signs this request: an account cannot delete itself."
        )
    if account.is_admin:
        admins = session.scalars(
            select(Account.id).where(Account.is_admin.is_(True), Account.deleted_at.is_(None))
        ).all()
        if len(admins) <= 1:
            raise ValidationError(f"Account {account.name!r} is the last administrator.")
    open_work = still_open(session, account.id)
    if open_work:
        shown = ", ".join(open_work[:10]) + (
            f" and {len(open_work) - 10} more" if len(open_work) > 10 else ""
        )
        raise ResourceInUse(
            f"Account {account.name!r} still has work that has not ended: {shown}. Cancel, stop or delete "
            "it first."
        )
    for key in list_keys(session, account.id):
        if key.revoked_at is None:
            key.revoked_at = now
    for user in users.list_users(session, account.id):
        user.deleted_at = now
    session.execute(delete(RateBucket).where(RateBucket.account_id == account.id))  # nothing to limit
    account.deleted_at = now
    return account


def list_keys(session: Session, account_id: str) -> list[AccessKey]:
    return list(
        session.scalars(
            select(AccessKey).where(AccessKey.account_id == account_id).order_by(AccessKey.created_at)
        )
    )


def caller_for_key(session: Session, box: SecretBox, access_key_id: str) -> tuple[str, Caller] | None:
    """The secret and the caller behind an active key, or None for an unknown, inactive or deleted key
    (or one of a deleted user or account)."""
    row = session.execute(
        select(AccessKey, Account, User)
        .join(Account, Account.id == AccessKey.account_id)
        .join(User, User.id == AccessKey.user_id)
        .where(
            AccessKey.access_key_id == access_key_id,
            AccessKey.revoked_at.is_(None),
            AccessKey.status == users.ACTIVE,
            User.deleted_at.is_(None),
            Account.deleted_at.is_(None),
        )
    ).first()
    if row is None:
        return None
    key, account, user = row
    secret = open_secret(box, key.secret_access_key, key.secret_sealed)
    caller = Caller(
        account.id,
        account.name,
        account.is_admin,
        key.access_key_id,
        rate_limit_overrides(account),
        user_id=user.id,
        user_name=user.name,
        is_owner=user.is_owner,
    )
    return secret, caller


def rate_limit_overrides(account: Account) -> Mapping[RequestClass, RateLimit]:
    """The request rate limits an administrator set for this account, over the fleet's."""
    if not account.rate_limits:
        return MappingProxyType({})
    stored = json.loads(account.rate_limits)
    return MappingProxyType(
        {RequestClass(name): RateLimit(float(v["rate"]), int(v["burst"])) for name, v in stored.items()}
    )


def set_rate_limits(
    session: Session, account_ref: str, changes: Mapping[RequestClass, RateLimit | None]
) -> Account:
    """Override the fleet's limits for some classes (a None goes back to the fleet's)."""
    account = get_account(session, account_ref)
    current = dict(rate_limit_overrides(account))
    for request_class, limit in changes.items():
        if limit is None:
            current.pop(request_class, None)
        else:
            current[request_class] = limit
    stored = {c.value: {"rate": limit.rate, "burst": limit.burst} for c, limit in sorted(current.items())}
    account.rate_limits = json.dumps(stored) if stored else None
    return account


def has_accounts(session: Session) -> bool:
    return session.scalar(select(Account.id).limit(1)) is not None


def write_credentials_file(path: Path, key: NewKey, region: str) -> None:
    """The administrator's keys in the AWS credentials-file format, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = (
        f"[{CREDENTIALS_PROFILE}]\n"
        f"aws_access_key_id = {key.access_key_id}\n"
        f"aws_secret_access_key = {key.secret_access_key}\n"
        f"region = {region}\n"
    )
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
