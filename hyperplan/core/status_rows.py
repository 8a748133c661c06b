"""The rows a status move writes, and the messages they carry: values in, values out.

A move is recorded in a plan's history (a plan_events row: `plan_event`) or, for every other entity, as
a status event (a status_events row: `status_event`, which checks the move against its Lifecycle); what
a move makes due later is a timed event (a scheduled_events row: `timed_event`); money moves as an
invoice and a ledger line. Each row is a dict of its table's columns but the id, each history entry an
`Entry` (its kind and message), each message written once, here, from its values.

Two paths write them: the ORM's, one row at a time (services/runtime/status.py, services/plans/lifecycle.py
and payments.py build `Model(**row)`), and a purchase's few Core statements (services/plans/plan_purchase.py
hands the same dicts to store/purchase_rows.py). Nothing here reads a clock or a store.
"""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

from hyperplan.core.status import InvoiceStatus, Lifecycle

S = TypeVar("S", bound=StrEnum)

Row = dict[str, Any]
"""One row of a table: its columns (but the id) by name."""


class Entry(NamedTuple):
    """What a plan's history says of a move: its kind and the message a person reads."""

    kind: str
    message: str


# -- the kinds of a plan's timed events -----------------------------------------------------------------

SEGMENT_START = "segment.start"
SEGMENT_RECLAIM = "segment.reclaim"
SEGMENT_END = "segment.end"
PAYMENT_DEADLINE = "payment.deadline"
START_REMINDER = "reminder.start"
RECLAIM_REMINDER = "reminder.reclaim"


# -- rows -----------------------------------------------------------------------------------------------


def plan_event(plan_id: int, at: datetime, entry: Entry, status: str, actor_user_id: int | None) -> Row:
    """An entry of a plan's history (plan_events): `status` is the plan's once the move is made; the
    actor the user whose request made it (None: the service by itself)."""
    return {
        "plan_id": plan_id,
        "at": at,
        "kind": entry.kind,
        "status": status,
        "message": entry.message,
        "actor_user_id": actor_user_id,
    }


def status_event(lifecycle: Lifecycle[S], entity_id: int, old: S, new: S, at: datetime, message: str) -> Row:
    """The record of one entity's move from `old` to `new` (status_events), the move checked first:
    one its Lifecycle does not list raises IllegalTransition."""
    lifecycle.check(old, new)
    return {
        "entity_kind": lifecycle.kind,
        "entity_id": entity_id,
        "from_status": old,
        "to_status": new,
        "at": at,
        "message": message,
    }


def timed_event(kind: str, due_at: datetime, subject: str, payload: str) -> Row:
    """A timed event (scheduled_events) still to run; `payload`: its JSON text."""
    return {
        "due_at": due_at,
        "kind": kind,
        "subject": subject,
        "payload": payload,
        "done": False,
        "ran_at": None,
    }


def payment_deadline(plan_id: int, invoice_id: int, due_at: datetime) -> Row:
    """The timed event that fails an invoice (and what it pays for) still unpaid at `due_at`."""
    return timed_event(PAYMENT_DEADLINE, due_at, str(plan_id), json.dumps({"invoice": invoice_id}))


def invoice(
    account_id: str,
    plan_id: int,
    extension_id: int | None,
    amount: Decimal,
    currency: str,
    created_at: datetime,
    due_at: datetime,
) -> Row:
    """A new invoice, Pending (a purchase paid at once writes it settled: status, settled_at, note)."""
    return {
        "account_id": account_id,
        "plan_id": plan_id,
        "extension_id": extension_id,
        "amount": amount,
        "currency": currency,
        "status": InvoiceStatus.PENDING,
        "created_at": created_at,
        "due_at": due_at,
        "settled_at": None,
        "note": "",
    }


def ledger_entry(
    account_id: str,
    invoice_id: int | None,
    at: datetime,
    amount: Decimal,
    budget_after: Decimal,
    description: str,
) -> Row:
    """A line of an account's money (ledger_entries): `amount` negative for money out of the budget."""
    return {
        "account_id": account_id,
        "invoice_id": invoice_id,
        "at": at,
        "amount": amount,
        "budget_after": budget_after,
        "description": description,
    }


# -- a plan's history: its entries and messages ---------------------------------------------------------

AWAITING_PAYMENT = "Awaiting payment of the upfront fee."
"""A new plan's status message until its payment settles."""

SCHEDULED = "scheduled"
"""The kind of the entry that moves a paid plan out of Pending (its message: its new status's)."""

# How an invoice was paid or failed: its note, and the end of the history's and the ledger's lines.
PAID_AUTOMATICALLY = "paid automatically"
PAID_FROM_BUDGET = "paid from the budget"
APPROVED = "approved by an administrator"
BUDGET_SHORT = "budget short"
NOT_APPROVED_IN_TIME = "not approved in time"


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M} UTC"


def paid_for(extension_id: int | None) -> str:
    """What an invoice pays for, as messages name it: the plan, or one of its extensions."""
    return "the plan" if extension_id is None else f"extension {extension_id}"


def bought(offering_id: str, fee: Decimal, currency: str) -> Entry:
    return Entry("created", f"Bought offering {offering_id} for {fee} {currency}.")


def invoiced(invoice_id: int, amount: Decimal, currency: str, what: str) -> Entry:
    return Entry("invoiced", f"Invoice {invoice_id} for {amount} {currency} ({what}).")


def awaiting_approval(invoice_id: int, amount: Decimal, currency: str, what: str, due_at: datetime) -> Entry:
    """An invoice left to an administrator (its message is also the plan's status message)."""
    return Entry(
        "awaiting-approval",
        f"Awaiting an administrator's approval of invoice {invoice_id} ({amount} {currency}, {what}); "
        f"unpaid at {_when(due_at)}, {what} fails and its capacity is released.",
    )


def invoice_paid(invoice_id: int, how: str) -> str:
    """How an invoice was paid, as the history and an extension's move say it."""
    return f"Invoice {invoice_id} {how}."


def paid(message: str) -> Entry:
    """A plan's payment settled; `message`: how (`invoice_paid`)."""
    return Entry("paid", message)


def payment_line(invoice_id: int, plan_name: str, what: str, how: str) -> str:
    """A payment's ledger line."""
    return f"Invoice {invoice_id}, plan {plan_name}, {what}: {how}"


def budget_line(adding: bool) -> str:
    """A budget's ledger line: a grant added to it, or a new value set."""
    return f"budget {'grant' if adding else 'set'}"


def budget_short(budget: Decimal, amount: Decimal, currency: str, what: str) -> Entry:
    return Entry(
        "payment-failed",
        f"Payment failed: the account's budget of {budget} {currency} is short of the {amount} {currency} "
        f"fee for {what}. Its capacity was released; ask an administrator to raise the budget, then search "
        "and buy again.",
    )


def not_approved(invoice_id: int, what: str, due_at: datetime) -> Entry:
    return Entry(
        "payment-failed",
        f"Payment failed: invoice {invoice_id} ({what}) was not approved by its deadline, {_when(due_at)} "
        "(5 minutes before the start, or 12 hours after purchase). Its capacity was released; search and "
        "buy again.",
    )


def rejected(reason: str, what: str) -> Entry:
    return Entry(
        "payment-rejected",
        f"Payment rejected by an administrator: {reason}. The capacity of {what} was released.",
    )


def extended(end: datetime, how: str, plan_name: str, ordinal: int) -> Entry:
    """A paid extension; `how`: its invoice's `invoice_paid`."""
    return Entry(
        "extended",
        f"Extended to {_when(end)} ({how.rstrip('.')}); reserved capacity {plan_name}-rc{ordinal} now ends "
        "then.",
    )


def start_reminder(plan_name: str, ordinal: int, start: datetime) -> Entry:
    return Entry("start-reminder", f"Reserved capacity {plan_name}-rc{ordinal} starts at {_when(start)}.")


def reclaim_reminder(plan_name: str, ordinal: int, reclaim_at: str, end: datetime) -> Entry:
    """`reclaim_at`: the instant as its timed event's payload has it (ISO 8601)."""
    return Entry(
        "reclaim-reminder",
        f"Capacity of reserved capacity {plan_name}-rc{ordinal} will be taken back from "
        f"{reclaim_at[:16].replace('T', ' ')} UTC; it ends at {_when(end)}. Checkpoint your work.",
    )


def reclaim_begins(plan_name: str, ordinal: int) -> Entry:
    return Entry(
        "reclaim-begins",
        f"Capacity of reserved capacity {plan_name}-rc{ordinal} is being taken back before it ends.",
    )
