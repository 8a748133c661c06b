"""What the native API does with accounts, keys, invoices, ledgers and plan events: each function owns
its transaction and returns frozen views (or a new key), so that no handler touches the store."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.core.page_bytes import fitting, utf8_bytes
from hyperplan.core.rate_limits import RateLimit, RequestClass, effective
from hyperplan.services.accounts import accounts, acting, audit, os_ids, os_users
from hyperplan.services.accounts.accounts import Caller, NewKey
from hyperplan.services.clusters import metering
from hyperplan.services.orchestration import account_files, demo_load
from hyperplan.services.plans import payments, plans, quotas
from hyperplan.services.plans.quotas import Limits
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, Invoice, PlanEvent, TrainingPlan, User

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyView:
    access_key_id: str
    created_at: datetime
    revoked_at: datetime | None
    status: str = "Active"  # or Inactive (services/accounts/users.py)
    user_name: str = ""


@dataclass(frozen=True)
class AccountView:
    id: str
    name: str
    is_admin: bool
    limits: Limits
    payment_mode: str
    budget: Decimal
    spend: Decimal
    created_at: datetime
    keys: tuple[KeyView, ...]
    os_user: str | None = None
    os_ids: tuple[int, int] | None = None  # the OS user's uid and gid
    # Every class's limit in force (the fleet's, or the account's own), and which classes are its own.
    rate_limits: Mapping[RequestClass, RateLimit] = field(default_factory=lambda: MappingProxyType({}))
    own_rate_limits: frozenset[RequestClass] = frozenset()


@dataclass(frozen=True)
class InvoiceView:
    id: int
    account_id: str
    account_name: str
    plan_name: str
    amount: Decimal
    currency: str
    status: str
    created_at: datetime
    due_at: datetime
    settled_at: datetime | None
    note: str


@dataclass(frozen=True)
class LedgerLine:
    at: datetime
    amount: Decimal
    budget_after: Decimal
    invoice_id: int | None
    description: str


@dataclass(frozen=True)
class PlanEventView:
    at: datetime
    kind: str
    status: str
    message: str
    # Who acted (services/accounts/acting.py): the user's name and their account's; None for the service
    # itself.
    user_name: str | None = None
    user_account: str | None = None


# -- accounts and keys ------------------------------------------------------------------------------


def caller_for_key(runtime: ServiceContext, access_key_id: str) -> tuple[str, Caller] | None:
    """The secret of a live access key and who signs with it (None for an unknown or revoked key)."""
    with runtime.db.read() as session:
        return accounts.caller_for_key(session, runtime.secret_box, access_key_id)


def list_accounts(runtime: ServiceContext) -> list[AccountView]:
    with runtime.db.read() as session:
        return [_account_view(runtime, session, account) for account in accounts.list_accounts(session)]


def create_account(
    runtime: ServiceContext,
    name: str,
    *,
    is_admin: bool,
    payment_mode: str | None,
    os_user: str | None = None,
    caller: Caller | None = None,
) -> NewKey:
    """A new account. Its OS user: the one named (an existing user, not root nor the server's), or in
    isolation mode `users` a new `hp-<id>`; in mode `none` it gets one at the next `users` start."""
    if os_user is not None:
        os_users.check_named_user(os_user)
    with runtime.db.write() as session:
        key = accounts.create_account(
            session,
            name,
            box=runtime.secret_box,
            now=utcnow(),
            is_admin=is_admin,
            payment_mode=payment_mode or runtime.fleet.default_payment_mode,
            os_user=_os_user_choice(runtime, os_user),
        )
        detail = {"Name": name, "Admin": is_admin, "AccessKeyId": key.access_key_id}
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "account.create",
            account_id=key.account_id,
            target=name,
            detail=detail,
        )
        return key


def _os_user_choice(runtime: ServiceContext, named: str | None) -> accounts.OsUserChoice | None:
    if named is not None:
        return lambda _session, _account_id: (named, False)
    if not runtime.settings.isolated:
        return None

    def make(session: Session, account_id: str) -> tuple[str, bool]:
        return _make_os_user(runtime, session, account_id), True

    return make


def _make_os_user(runtime: ServiceContext, session: Session, account_id: str) -> str:
    """The account's own OS user, ``hp-<id>``: with the uid (and gid) recorded for it, if it has one that
    nobody took since (its user was removed by hand), else with one of the fleet's range that no account
    ever had, recorded first (within the caller's write): a user made then lost to a failed commit holds
    its id on the system, so the next allocation skips it."""
    user = os_users.user_name_for(account_id)
    with os_users.making_users():
        uid = os_ids.user_id_of(session, account_id)
        if uid is None or os_ids.in_use(uid, but=user):
            uid = os_ids.allocate_user_id(session, account_id, runtime.fleet.os_ids, runtime.clock.now())
        os_users.create_user(user, uid)
    return user


def delete_account(runtime: ServiceContext, caller: Caller, account_ref: str) -> AccountView:
    """Delete an account with nothing open (accounts.delete_account), then remove what it left on the
    machines and the OS user the server made for it (account_files; a user an administrator named
    stays)."""
    with runtime.db.write() as session:
        account = accounts.delete_account(session, caller, account_ref, now=utcnow())
        view = _account_view(runtime, session, account)
        revoked = [key.access_key_id for key in view.keys]
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "account.delete",
            account_id=account.id,
            target=account.name,
            detail={"KeysRevoked": revoked},
        )
    for key_id in revoked:
        runtime.keys.forget(key_id)
    account_files.clear_deleted_account(runtime, view.id)
    return view


def ensure_os_users(runtime: ServiceContext) -> int:
    """At a start in isolation mode `users`: a deletion cut short is finished (account_files.py), and
    every account has its OS user, made now if needed (an account created in mode `none`, a user removed
    by hand), with an id recorded. Returns how many users were made."""
    for account_id in account_files.pending(runtime):
        account_files.clear_deleted_account(runtime, account_id)
    made = 0
    with runtime.db.write() as session:
        for account in accounts.list_accounts(session):
            if _runs_no_work(runtime, account.name):
                continue
            if account.os_user is None:
                account.os_user, account.os_user_made = os_users.user_name_for(account.id), True
            if os_users.exists(account.os_user):
                if account.os_user_made and os_ids.user_id_of(session, account.id) is None:
                    # made before ids were recorded (by useradd's own pick): recorded now, kept
                    found = os_users.run_as(account.os_user).uid
                    os_ids.record(session, account.id, found, runtime.clock.now())
                continue
            if not account.os_user_made:
                log.warning(
                    "account %s: its OS user %s does not exist; its work will fail until it does",
                    account.name,
                    account.os_user,
                )
                continue
            _make_os_user(runtime, session, account.id)
            made += 1
    return made


def _runs_no_work(runtime: ServiceContext, account_name: str) -> bool:
    """The demo's background load holds plans and runs nothing: it gets no OS user (whose uid would be
    spent for good)."""
    return runtime.fleet.background_load is not None and account_name == demo_load.ACCOUNT_NAME


def add_key(runtime: ServiceContext, account_ref: str, caller: Caller | None = None) -> NewKey:
    with runtime.db.write() as session:
        account = accounts.get_account(session, account_ref)
        key = accounts.add_key(session, account.id, box=runtime.secret_box, now=utcnow())
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "key.create",
            account_id=account.id,
            target=key.access_key_id,
            detail={"UserName": key.user_name},
        )
        return key


def update_account(
    runtime: ServiceContext,
    account_ref: str,
    *,
    max_plans: int | None,
    max_instances: int | None,
    mode: str | None,
    max_instance_hours: int | None = None,
    max_on_demand_instances: int | None = None,
    budget: Decimal | None,
    add_budget: Decimal | None,
    rate_limits: Mapping[RequestClass, RateLimit | None] | None = None,
    caller: Caller | None = None,
) -> AccountView:
    with runtime.db.write() as session:
        before = _audited(_account_view(runtime, session, accounts.get_account(session, account_ref)))
        quotas.set_limits(
            session,
            account_ref,
            max_plans=max_plans,
            max_instances=max_instances,
            max_instance_hours=max_instance_hours,
            max_on_demand_instances=max_on_demand_instances,
        )
        if rate_limits:
            accounts.set_rate_limits(session, account_ref, rate_limits)
        account = payments.update_account(
            session, account_ref, mode=mode, budget=budget, add_budget=add_budget, now=runtime.clock.now()
        )
        view = _account_view(runtime, session, account)
        after = _audited(view)
        changed = {
            name: {"From": before[name], "To": after[name]} for name in after if before[name] != after[name]
        }
        audit.record(
            session,
            runtime.clock.now(),
            caller,
            "account.update",
            account_id=account.id,
            target=account.name,
            detail=changed,
        )
    if rate_limits:
        runtime.keys.forget()  # cached callers carry the old limits: their next request reads the new
    return view


def _audited(view: AccountView) -> dict[str, object]:
    """What an account update may change, as the audit trail compares it before and after."""
    limits = view.limits
    return {
        "MaxActivePlans": limits.max_active_plans,
        "MaxReservedInstancesPerType": limits.max_reserved_instances_per_type,
        "MaxReservedInstanceHoursPer30Days": limits.max_reserved_instance_hours_per_30_days,
        "MaxOnDemandInstancesPerType": limits.max_on_demand_instances_per_type,
        "PaymentMode": view.payment_mode,
        "Budget": str(view.budget),
        "RateLimits": {
            c.value: {"Rate": limit.rate, "Burst": limit.burst}
            for c, limit in sorted(view.rate_limits.items())
            if c in view.own_rate_limits
        },
    }


def _account_view(runtime: ServiceContext, session: Session, account: Account) -> AccountView:
    own = accounts.rate_limit_overrides(account)
    return AccountView(
        id=account.id,
        name=account.name,
        is_admin=account.is_admin,
        limits=quotas.limits(runtime, account),
        payment_mode=account.payment_mode,
        budget=account.budget,
        spend=payments.spend(session, account.id) + metering.charged(session, account.id),
        created_at=account.created_at,
        keys=_key_views(session, account),
        os_user=account.os_user,
        os_ids=_os_ids_of(session, account),
        rate_limits=effective(runtime.fleet.rate_limits, own),
        own_rate_limits=frozenset(own),
    )


def _os_ids_of(session: Session, account: Account) -> tuple[int, int] | None:
    """The uid and gid of the account's OS user: the ones the server handed out for a user it made,
    else (a named user) what this machine says; None when neither is known."""
    if account.os_user_made:
        uid = os_ids.user_id_of(session, account.id)
        if uid is not None:
            return uid, uid
    if account.os_user is not None and os_users.exists(account.os_user):
        found = os_users.run_as(account.os_user)
        return found.uid, found.gid
    return None


def _key_views(session: Session, account: Account) -> tuple[KeyView, ...]:
    rows = session.execute(select(User.id, User.name).where(User.account_id == account.id))
    holders: dict[int | None, str] = {user_id: name for user_id, name in rows}
    return tuple(
        KeyView(key.access_key_id, key.created_at, key.revoked_at, key.status, holders.get(key.user_id, ""))
        for key in accounts.list_keys(session, account.id)
    )


def ledger(runtime: ServiceContext, account_ref: str) -> tuple[str, list[LedgerLine]]:
    """The account's id and its ledger, oldest entry first."""
    with runtime.db.read() as session:
        account = accounts.get_account(session, account_ref)
        return account.id, [
            LedgerLine(e.at, e.amount, e.budget_after, e.invoice_id, e.description)
            for e in payments.ledger(session, account.id)
        ]


# -- invoices -----------------------------------------------------------------------------------------


def invoice_scope(runtime: ServiceContext, caller: Caller, account_ref: str | None) -> str | None:
    """Whose invoices the caller lists: administrators every account's (None) or the one they name;
    others their own."""
    if not caller.is_admin:
        return caller.account_id
    if not account_ref:
        return None
    with runtime.db.read() as session:
        return accounts.get_account(session, account_ref).id


def list_invoices(runtime: ServiceContext, account_id: str | None, status: str | None) -> list[InvoiceView]:
    """The invoices of one account (every account's for None), oldest first."""
    with runtime.db.read() as session:
        found = payments.list_invoices(session, account_id=account_id, status=status)
        return [_invoice_view(session, invoice) for invoice in found]


def approve_invoice(runtime: ServiceContext, invoice_id: int, caller: Caller | None = None) -> InvoiceView:
    with runtime.db.write() as session:
        acting.act(session, caller.user_id if caller else None)
        invoice = payments.approve(session, runtime.lifecycle, invoice_id, runtime.clock.now())
        view = _invoice_view(session, invoice)
        _audit_invoice(session, runtime, caller, "invoice.approve", view, {})
    runtime.wakes.lifecycle.notify()
    return view


def reject_invoice(
    runtime: ServiceContext, invoice_id: int, reason: str, caller: Caller | None = None
) -> InvoiceView:
    with runtime.db.write() as session:
        acting.act(session, caller.user_id if caller else None)
        invoice = payments.reject(session, runtime.lifecycle, invoice_id, reason, runtime.clock.now())
        view = _invoice_view(session, invoice)
        _audit_invoice(session, runtime, caller, "invoice.reject", view, {"Reason": reason})
        return view


def _audit_invoice(
    session: Session,
    runtime: ServiceContext,
    caller: Caller | None,
    action: str,
    view: InvoiceView,
    extra: dict[str, object],
) -> None:
    detail = {"Plan": view.plan_name, "Amount": str(view.amount), "Status": view.status, **extra}
    audit.record(
        session,
        runtime.clock.now(),
        caller,
        action,
        account_id=view.account_id,
        target=f"invoice {view.id}",
        detail=detail,
    )


def _invoice_view(session: Session, invoice: Invoice) -> InvoiceView:
    plan = session.get(TrainingPlan, invoice.plan_id)
    account = accounts.get_account(session, invoice.account_id)
    return InvoiceView(
        id=invoice.id,
        account_id=invoice.account_id,
        account_name=account.name,
        plan_name=plan.name if plan else "",
        amount=invoice.amount,
        currency=invoice.currency,
        status=invoice.status,
        created_at=invoice.created_at,
        due_at=invoice.due_at,
        settled_at=invoice.settled_at,
        note=invoice.note,
    )


# -- plan events --------------------------------------------------------------------------------------


PLAN_EVENTS_PAGE = 1000
"""A plan's events one page holds at most; and at most 1 MiB of them (core/page_bytes.py): a plan's
history only grows (each segment, reminder, payment and Slurm note adds to it), and a message may carry
text of a person's (a cancellation's reason, up to 1,024 characters)."""
PLAN_EVENT_OVERHEAD = 256
"""What an event weighs beyond its message: its time, kind, status and who acted (names of at most 64
characters), and the answer's names for them."""


@dataclass(frozen=True)
class PlanEventsPage:
    plan_name: str
    events: list[PlanEventView]  # oldest first
    before: int  # the plan's events before this page
    next_cursor: int | None  # where the next page starts (`start`); None: this page is the last


def plan_events(
    runtime: ServiceContext, caller: Caller, owner: str | None, name: str, *, start: int | None = 0
) -> PlanEventsPage:
    """A page of the plan's events, oldest first: from its `start`-th event (0: the first), or with
    `start` None the newest page; an administrator may name the account that owns it."""
    with runtime.db.read() as session:
        if owner and caller.is_admin:
            account = accounts.get_account(session, owner)
            caller = Caller(account.id, account.name, False, caller.access_key_id)
        plan = plans.get(session, runtime, caller, name)
        if start is None:
            events, before, more = _newest_events(session, plan.id)
        else:
            events, before, more = _events_from(session, plan.id, start)
        actors = _actors(session, {e.actor_user_id for e in events if e.actor_user_id is not None})
        views = [
            PlanEventView(e.at, e.kind, e.status, e.message, *actors.get(e.actor_user_id, (None, None)))
            for e in events
        ]
        return PlanEventsPage(plan.name, views, before, before + len(views) if more else None)


def _event_bytes(event: PlanEvent) -> int:
    return utf8_bytes(event.message) + PLAN_EVENT_OVERHEAD


def _events_from(session: Session, plan_id: int, start: int) -> tuple[list[PlanEvent], int, bool]:
    """The events one page holds from the `start`-th on, `start`, and whether more follow them."""
    rows = list(
        session.scalars(
            select(PlanEvent)
            .where(PlanEvent.plan_id == plan_id)
            .order_by(PlanEvent.id)
            .offset(start)
            .limit(PLAN_EVENTS_PAGE + 1)
        )
    )
    held = min(PLAN_EVENTS_PAGE, fitting(_event_bytes(row) for row in rows))
    return rows[:held], start, held < len(rows)


def _newest_events(session: Session, plan_id: int) -> tuple[list[PlanEvent], int, bool]:
    """The newest events one page holds, the number of events before them, and False (none follow)."""
    rows = list(
        session.scalars(
            select(PlanEvent)
            .where(PlanEvent.plan_id == plan_id)
            .order_by(PlanEvent.id.desc())
            .limit(PLAN_EVENTS_PAGE)
        )
    )
    rows = rows[: fitting(_event_bytes(row) for row in rows)][::-1]
    if not rows:
        return [], 0, False
    before = session.scalar(
        select(func.count())
        .select_from(PlanEvent)
        .where(PlanEvent.plan_id == plan_id, PlanEvent.id < rows[0].id)
    )
    return rows, int(before or 0), False


def _actors(session: Session, user_ids: set[int]) -> dict[int | None, tuple[str, str]]:
    """Each user's name and their account's name."""
    if not user_ids:
        return {}
    rows = session.execute(
        select(User.id, User.name, Account.name)
        .join(Account, Account.id == User.account_id)
        .where(User.id.in_(user_ids))
    )
    return {user_id: (user, account) for user_id, user, account in rows}
