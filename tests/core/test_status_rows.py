"""The rows a status move writes and the messages people read in a plan's history (core/status_rows.py):
values in, rows out. Both write paths, the ORM's and a purchase's few statements, build theirs here, so
what these tests pin is what every plan's history, status events, timed events, invoices and ledger
lines hold."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

import hyperplan
from hyperplan.core import status_rows
from hyperplan.core.lifecycle import RESERVED_CAPACITY_LIFECYCLE, PlanStatus
from hyperplan.core.status import INVOICE_LIFECYCLE, IllegalTransition, InvoiceStatus
from hyperplan.core.status_rows import Entry

NOW = datetime(2026, 12, 31, 23, 50, tzinfo=UTC)
DUE = datetime(2027, 1, 1, 11, 50, tzinfo=UTC)


def test_a_history_entry_is_the_plans_row_of_a_move() -> None:
    entry = status_rows.invoiced(7, Decimal("492.00"), "USD", "the plan")
    assert status_rows.plan_event(3, NOW, entry, PlanStatus.PENDING, 12) == {
        "plan_id": 3,
        "at": NOW,
        "kind": "invoiced",
        "status": "Pending",
        "message": "Invoice 7 for 492.00 USD (the plan).",
        "actor_user_id": 12,
    }
    assert status_rows.plan_event(3, NOW, Entry("note", "x"), "Active", None)["actor_user_id"] is None


def test_a_status_event_records_a_move_its_lifecycle_allows() -> None:
    row = status_rows.status_event(
        INVOICE_LIFECYCLE, 7, InvoiceStatus.PENDING, InvoiceStatus.PAID, NOW, "paid automatically"
    )
    assert row == {
        "entity_kind": "invoice",
        "entity_id": 7,
        "from_status": "Pending",
        "to_status": "Paid",
        "at": NOW,
        "message": "paid automatically",
    }
    segment = status_rows.status_event(
        RESERVED_CAPACITY_LIFECYCLE, 4, PlanStatus.PENDING, PlanStatus.ACTIVE, NOW, "m"
    )
    assert (segment["entity_kind"], segment["from_status"], segment["to_status"]) == (
        "reserved-capacity",
        "Pending",
        "Active",
    )


def test_a_move_the_lifecycle_does_not_list_has_no_row() -> None:
    with pytest.raises(IllegalTransition, match="cannot go from Paid to Pending"):
        status_rows.status_event(INVOICE_LIFECYCLE, 7, InvoiceStatus.PAID, InvoiceStatus.PENDING, NOW, "")
    with pytest.raises(IllegalTransition):  # staying put is no move either
        status_rows.status_event(
            RESERVED_CAPACITY_LIFECYCLE, 4, PlanStatus.ACTIVE, PlanStatus.ACTIVE, NOW, ""
        )


def test_timed_events_wait_undone_with_their_payload() -> None:
    payload = json.dumps({"segment": 1})
    assert status_rows.timed_event(status_rows.SEGMENT_START, DUE, "3", payload) == {
        "due_at": DUE,
        "kind": "segment.start",
        "subject": "3",
        "payload": '{"segment": 1}',
        "done": False,
        "ran_at": None,
    }
    assert status_rows.payment_deadline(3, 7, DUE) == {
        "due_at": DUE,
        "kind": "payment.deadline",
        "subject": "3",
        "payload": '{"invoice": 7}',
        "done": False,
        "ran_at": None,
    }


def test_a_new_invoice_is_pending_and_unsettled() -> None:
    assert status_rows.invoice("123456789012", 3, None, Decimal("492.00"), "USD", NOW, DUE) == {
        "account_id": "123456789012",
        "plan_id": 3,
        "extension_id": None,
        "amount": Decimal("492.00"),
        "currency": "USD",
        "status": "Pending",
        "created_at": NOW,
        "due_at": DUE,
        "settled_at": None,
        "note": "",
    }


def test_ledger_lines() -> None:
    line = status_rows.payment_line(7, "team-plan", status_rows.paid_for(None), status_rows.PAID_FROM_BUDGET)
    assert line == "Invoice 7, plan team-plan, the plan: paid from the budget"
    assert status_rows.ledger_entry("123456789012", 7, NOW, Decimal("-492.00"), Decimal("508.00"), line) == {
        "account_id": "123456789012",
        "invoice_id": 7,
        "at": NOW,
        "amount": Decimal("-492.00"),
        "budget_after": Decimal("508.00"),
        "description": "Invoice 7, plan team-plan, the plan: paid from the budget",
    }
    extension = status_rows.paid_for(2)
    assert status_rows.payment_line(8, "p", extension, status_rows.APPROVED) == (
        "Invoice 8, plan p, extension 2: approved by an administrator"
    )
    assert [status_rows.budget_line(True), status_rows.budget_line(False)] == ["budget grant", "budget set"]


def test_the_messages_of_a_purchase_and_its_payment() -> None:
    assert status_rows.AWAITING_PAYMENT == "Awaiting payment of the upfront fee."
    assert status_rows.bought("tpo-abc", Decimal("3690.00"), "USD") == Entry(
        "created", "Bought offering tpo-abc for 3690.00 USD."
    )
    assert status_rows.invoiced(16, Decimal("492.00"), "USD", status_rows.paid_for(1)) == Entry(
        "invoiced", "Invoice 16 for 492.00 USD (extension 1)."
    )
    assert status_rows.paid(status_rows.invoice_paid(1, status_rows.PAID_AUTOMATICALLY)) == Entry(
        "paid", "Invoice 1 paid automatically."
    )
    assert status_rows.awaiting_approval(10, Decimal("492.00"), "USD", "the plan", DUE) == Entry(
        "awaiting-approval",
        "Awaiting an administrator's approval of invoice 10 (492.00 USD, the plan); unpaid at 2027-01-01 "
        "11:50 UTC, the plan fails and its capacity is released.",
    )
    assert status_rows.awaiting_approval(17, Decimal("492.00"), "USD", "extension 2", DUE).message.endswith(
        "unpaid at 2027-01-01 11:50 UTC, extension 2 fails and its capacity is released."
    )


def test_the_messages_of_a_failed_payment() -> None:
    assert status_rows.budget_short(Decimal("1"), Decimal("492.00"), "USD", "the plan") == Entry(
        "payment-failed",
        "Payment failed: the account's budget of 1 USD is short of the 492.00 USD fee for the plan. Its "
        "capacity was released; ask an administrator to raise the budget, then search and buy again.",
    )
    assert status_rows.not_approved(12, "the plan", DUE) == Entry(
        "payment-failed",
        "Payment failed: invoice 12 (the plan) was not approved by its deadline, 2027-01-01 11:50 UTC (5 "
        "minutes before the start, or 12 hours after purchase). Its capacity was released; search and buy "
        "again.",
    )
    assert status_rows.rejected("too dear", "the plan") == Entry(
        "payment-rejected",
        "Payment rejected by an administrator: too dear. The capacity of the plan was released.",
    )
    assert (status_rows.BUDGET_SHORT, status_rows.NOT_APPROVED_IN_TIME) == (
        "budget short",
        "not approved in time",
    )


def test_the_messages_of_a_segment_and_an_extension() -> None:
    end = datetime(2027, 1, 4, 11, 30, tzinfo=UTC)
    how = status_rows.invoice_paid(16, status_rows.PAID_AUTOMATICALLY)
    assert status_rows.extended(end, how, "auto-0", 1) == Entry(
        "extended",
        "Extended to 2027-01-04 11:30 UTC (Invoice 16 paid automatically); reserved capacity auto-0-rc1 now "
        "ends then.",
    )
    assert status_rows.start_reminder("auto-0", 1, DUE) == Entry(
        "start-reminder", "Reserved capacity auto-0-rc1 starts at 2027-01-01 11:50 UTC."
    )
    assert status_rows.reclaim_reminder("auto-0", 1, "2027-01-04T11:00:00+00:00", end) == Entry(
        "reclaim-reminder",
        "Capacity of reserved capacity auto-0-rc1 will be taken back from 2027-01-04 11:00 UTC; it ends at "
        "2027-01-04 11:30 UTC. Checkpoint your work.",
    )
    assert status_rows.reclaim_begins("auto-0", 2) == Entry(
        "reclaim-begins", "Capacity of reserved capacity auto-0-rc2 is being taken back before it ends."
    )


# Words of each message above: each appears in one module of the package, this one's (the purchase's few
# statements and the step-by-step path write the same history because they share it).
PHRASES = (
    "Awaiting payment of the upfront fee",
    "Awaiting an administrator's approval",
    "Bought offering",
    "paid automatically",
    "paid from the budget",
    "approved by an administrator",
    "Payment failed:",
    "Payment rejected by an administrator",
    "not approved in time",
    "now ends then",
    "Checkpoint your work",
    "is being taken back before it ends",
)


def test_each_message_is_worded_in_one_place() -> None:
    package = Path(hyperplan.__file__).parent
    found: dict[str, set[str]] = {phrase: set() for phrase in PHRASES}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = _docstrings(tree)
        texts = [
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
        ]
        for phrase in PHRASES:
            if any(phrase in text for text in texts):
                found[phrase].add(str(path.relative_to(package)))
    assert found == {phrase: {"core/status_rows.py"} for phrase in PHRASES}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstrings' nodes: the words above may explain, in prose, where they are written."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
