"""Paying for plans and extensions: invoices, budgets, approvals, deadlines (docs/DECISIONS.md, "Payment").

Each account has a payment mode:
- `auto`: the invoice is paid when it is issued; the plan is Scheduled before the purchase returns.
- `budget`: the fee is taken from the account's budget; a budget short of the fee fails the purchase.
- `approval`: an administrator approves or rejects the invoice; unpaid 5 minutes before the start, or 12
  hours after purchase (whichever comes first), the purchase fails.
A failed payment fails what it paid for (the plan, or only the extension) and gives its capacity back
at once. Money is Decimal, never float; every movement is a ledger line.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core import status_rows
from hyperplan.core.fleet import Fleet
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.status import INVOICE_LIFECYCLE, InvoiceStatus
from hyperplan.core.status_rows import Entry
from hyperplan.errors import Conflict, ResourceNotFound, ValidationError
from hyperplan.events.loop import DueEvent, EventHandler
from hyperplan.services.accounts.accounts import PAYMENT_MODES, get_account
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime import status
from hyperplan.services.runtime.context import LifecycleContext
from hyperplan.store.schema import (
    Account,
    Invoice,
    LedgerEntry,
    PlanExtension,
    ReservedCapacity,
    TrainingPlan,
)

BEFORE_START = timedelta(minutes=5)
AFTER_PURCHASE = timedelta(hours=12)

MAX_BUDGET = Decimal("1000000000000")
"""A budget (and a grant) is at most a trillion in the fleet's currency: far above any real budget, and
small enough that every sum of budgets and fees stays exact in Decimal's 28 digits."""

# ISO 4217 minor units of the common currencies that do not have two; every other currency has two.
_NO_MINOR_UNIT = frozenset({"CLP", "ISK", "JPY", "KRW", "VND"})
_THREE_MINOR_UNITS = frozenset({"BHD", "JOD", "KWD", "OMR", "TND"})


def currency_places(currency: str) -> int:
    """How many decimal places an amount of `currency` may have."""
    return 0 if currency in _NO_MINOR_UNIT else 3 if currency in _THREE_MINOR_UNITS else 2


def fleet_currency(fleet: Fleet) -> str:
    """A fleet charges in one currency (core/fleet.py checks that every pool has the same)."""
    return fleet.pools[0].currency if fleet.pools else "USD"


def payment_deadline(first_start: datetime, purchased_at: datetime) -> datetime:
    return min(first_start - BEFORE_START, purchased_at + AFTER_PURCHASE)


def issue(
    session: Session,
    ctx: LifecycleContext,
    plan: TrainingPlan,
    now: datetime,
    extension: PlanExtension | None = None,
) -> Invoice:
    """Invoice a new plan's (or extension's) fee and settle it as the account's payment mode says."""
    account = get_account(session, plan.account_id)
    if extension is None:
        starts = select(func.min(ReservedCapacity.start)).where(ReservedCapacity.plan_id == plan.id)
        first_start, amount = session.scalar(starts), plan.upfront_fee
    else:
        first_start, amount = extension.start, extension.upfront_fee
    assert first_start is not None
    extension_id = extension.id if extension else None
    due_at = payment_deadline(first_start, now)
    invoice = Invoice(
        **status_rows.invoice(account.id, plan.id, extension_id, amount, plan.currency, now, due_at)
    )
    session.add(invoice)
    session.flush()
    what = _what(invoice)
    invoiced = status_rows.invoiced(invoice.id, invoice.amount, invoice.currency, what)
    lifecycle.record_entry(session, plan, invoiced, now)
    if account.payment_mode == "auto":
        _pay(session, ctx, account, invoice, plan, now, status_rows.PAID_AUTOMATICALLY)
    elif account.payment_mode == "budget":
        _pay_from_budget(session, ctx, account, invoice, plan, now)
    else:
        waiting = status_rows.awaiting_approval(
            invoice.id, invoice.amount, invoice.currency, what, invoice.due_at
        )
        if extension is None:
            plan.status_message = waiting.message
        lifecycle.record_entry(session, plan, waiting, now)
        lifecycle.schedule_event(session, status_rows.payment_deadline(plan.id, invoice.id, invoice.due_at))
    return invoice


def _settle(session: Session, invoice: Invoice, new: InvoiceStatus, note: str, now: datetime) -> None:
    status.change(session, INVOICE_LIFECYCLE, invoice, new, now, note)
    invoice.settled_at = now
    invoice.note = note


def _what(invoice: Invoice) -> str:
    return status_rows.paid_for(invoice.extension_id)


def _pay(
    session: Session,
    ctx: LifecycleContext,
    account: Account,
    invoice: Invoice,
    plan: TrainingPlan,
    now: datetime,
    how: str,
) -> None:
    _settle(session, invoice, InvoiceStatus.PAID, how, now)
    if account.payment_mode == "budget":
        account.budget -= invoice.amount
    line = status_rows.payment_line(invoice.id, plan.name, _what(invoice), how)
    session.add(
        LedgerEntry(
            **status_rows.ledger_entry(account.id, invoice.id, now, -invoice.amount, account.budget, line)
        )
    )
    note = status_rows.invoice_paid(invoice.id, how)
    if invoice.extension_id is None:
        lifecycle.mark_paid(session, plan, now, note)
    else:
        lifecycle.apply_extension(session, ctx, plan, _extension(session, invoice), now, note)


def _extension(session: Session, invoice: Invoice) -> PlanExtension:
    extension = session.get(PlanExtension, invoice.extension_id)
    assert extension is not None
    return extension


def _fail(
    session: Session,
    ctx: LifecycleContext,
    invoice: Invoice,
    plan: TrainingPlan,
    entry: Entry,
    now: datetime,
) -> None:
    """A failed payment fails what it paid for: the plan, or only the extension."""
    message, kind = entry.message, entry.kind
    if invoice.extension_id is None:
        lifecycle.fail(session, ctx, plan, message, kind, now)
    else:
        lifecycle.fail_extension(session, ctx, plan, _extension(session, invoice), message, kind, now)


def _pay_from_budget(
    session: Session,
    ctx: LifecycleContext,
    account: Account,
    invoice: Invoice,
    plan: TrainingPlan,
    now: datetime,
) -> None:
    if account.budget >= invoice.amount:
        _pay(session, ctx, account, invoice, plan, now, status_rows.PAID_FROM_BUDGET)
        return
    _settle(session, invoice, InvoiceStatus.FAILED, status_rows.BUDGET_SHORT, now)
    short = status_rows.budget_short(account.budget, invoice.amount, invoice.currency, _what(invoice))
    _fail(session, ctx, invoice, plan, short, now)


def approve(session: Session, ctx: LifecycleContext, invoice_id: int, now: datetime) -> Invoice:
    invoice, plan = _pending(session, invoice_id)
    account = get_account(session, invoice.account_id)
    _pay(session, ctx, account, invoice, plan, now, status_rows.APPROVED)
    return invoice


def reject(session: Session, ctx: LifecycleContext, invoice_id: int, reason: str, now: datetime) -> Invoice:
    invoice, plan = _pending(session, invoice_id)
    _settle(session, invoice, InvoiceStatus.REJECTED, reason, now)
    _fail(session, ctx, invoice, plan, status_rows.rejected(reason, _what(invoice)), now)
    return invoice


def _pending(session: Session, invoice_id: int) -> tuple[Invoice, TrainingPlan]:
    invoice = session.get(Invoice, invoice_id)
    if invoice is None:
        raise ResourceNotFound(f"Invoice {invoice_id} does not exist.")
    if invoice.status != InvoiceStatus.PENDING:
        raise Conflict(f"Invoice {invoice_id} is already {invoice.status}.")
    plan = session.get(TrainingPlan, invoice.plan_id)
    assert plan is not None
    if PlanStatus(plan.status).is_final:  # a store from before plans settled their invoices as they ended
        raise Conflict(f"Invoice {invoice_id} is for training plan {plan.name!r}, which is {plan.status}.")
    return invoice, plan


def fail_pending(session: Session, plan_id: int, note: str, now: datetime) -> None:
    """Settle, as failed, every invoice of a plan that still awaits payment: what it would pay for is gone
    (an administrator cancelled the plan), so nobody may approve it any more."""
    pending = select(Invoice).where(Invoice.plan_id == plan_id, Invoice.status == InvoiceStatus.PENDING)
    for invoice in session.scalars(pending):
        _settle(session, invoice, InvoiceStatus.FAILED, note, now)


def event_handlers(ctx: LifecycleContext) -> dict[str, EventHandler]:
    """The payment deadline of a plan awaiting approval, for the lifecycle loop."""

    def payment_deadline(session: Session, event: DueEvent) -> None:
        on_deadline(session, ctx, event.subject, int(event.payload["invoice"]), event.due_at)

    return {lifecycle.PAYMENT_DEADLINE: payment_deadline}


def on_deadline(
    session: Session, ctx: LifecycleContext, plan_id: str, invoice_id: int, now: datetime
) -> None:
    invoice = session.get(Invoice, invoice_id)
    plan = session.get(TrainingPlan, int(plan_id))
    if (
        invoice is None
        or plan is None
        or invoice.status != InvoiceStatus.PENDING
        or PlanStatus(plan.status).is_final
    ):
        return
    _settle(session, invoice, InvoiceStatus.FAILED, status_rows.NOT_APPROVED_IN_TIME, now)
    late = status_rows.not_approved(invoice.id, _what(invoice), invoice.due_at)
    _fail(session, ctx, invoice, plan, late, now)


def list_invoices(session: Session, *, account_id: str | None, status: str | None) -> list[Invoice]:
    stmt = select(Invoice).order_by(Invoice.id)
    if account_id is not None:
        stmt = stmt.where(Invoice.account_id == account_id)
    if status is not None:
        stmt = stmt.where(Invoice.status == status)
    return list(session.scalars(stmt))


def ledger(session: Session, account_id: str) -> list[LedgerEntry]:
    return list(
        session.scalars(
            select(LedgerEntry).where(LedgerEntry.account_id == account_id).order_by(LedgerEntry.id)
        )
    )


def spend(session: Session, account_id: str) -> Decimal:
    """What the account has paid for plans, whatever the payment mode."""
    paid = session.scalars(
        select(Invoice.amount).where(Invoice.account_id == account_id, Invoice.status == InvoiceStatus.PAID)
    )
    return sum(paid, start=Decimal("0"))


def update_account(
    session: Session,
    account_ref: str,
    *,
    mode: str | None,
    budget: Decimal | None,
    add_budget: Decimal | None,
    now: datetime,
) -> Account:
    """Set the payment mode, set the budget, grant more; amounts were checked where they entered (from 0
    to MAX_BUDGET, in the currency's places), and a grant may not take the budget past MAX_BUDGET."""
    account = get_account(session, account_ref)
    if mode is not None:
        if mode not in PAYMENT_MODES:
            raise ValidationError(f"PaymentMode must be one of {', '.join(PAYMENT_MODES)}, not {mode!r}.")
        account.payment_mode = mode
    for name, amount, adding in (("Budget", budget, False), ("AddBudget", add_budget, True)):
        if amount is None:
            continue
        change = amount if adding else amount - account.budget
        if account.budget + change > MAX_BUDGET:
            raise ValidationError(
                f"{name}: the budget would be {account.budget + change}, over the maximum of {MAX_BUDGET}."
            )
        account.budget += change
        line = status_rows.budget_line(adding)
        session.add(
            LedgerEntry(**status_rows.ledger_entry(account.id, None, now, change, account.budget, line))
        )
    return account
