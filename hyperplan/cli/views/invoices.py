"""Invoices of plan purchases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

from hyperplan.cli.views.base import TableView


@dataclass(frozen=True)
class InvoicesTable:
    invoices: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                i["InvoiceId"],
                i["AccountName"],
                i["TrainingPlanName"],
                f"{i['Amount']} {i['CurrencyCode']}",
                i["Status"],
                i["DueAt"],
                i["SettledAt"] or "",
                i["Note"],
            ]
            for i in self.invoices
        ]
        return TableView(
            "Invoices", ["Id", "Account", "Plan", "Amount", "Status", "Due", "Settled", "Note"], rows
        )


@dataclass(frozen=True)
class InvoiceDecided:
    """One line: an invoice approved or rejected, and its plan."""

    invoice: dict[str, Any]
    decision: str  # "approved" or "rejected"

    def __rich__(self) -> Text:
        i = self.invoice
        return Text(f"Invoice {i['InvoiceId']} {self.decision}: plan {i['TrainingPlanName']}.")
