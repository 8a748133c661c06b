"""`hyperplan invoices`: list invoices; administrators approve or reject them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    console,
    emit,
    native_client,
    print_table,
    reporting_errors,
)
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Invoices of plan purchases.", no_args_is_help=True)


def _render(invoices: list[dict[str, Any]]) -> None:
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
        for i in invoices
    ]
    print_table("Invoices", ["Id", "Account", "Plan", "Amount", "Status", "Due", "Settled", "Note"], rows)


@app.command("list")
def list_invoices(
    status: Annotated[str | None, typer.Option(help="Pending, Paid, Rejected or Failed.")] = None,
    account: Annotated[str | None, typer.Option(help="One account (administrators).")] = None,
) -> None:
    """List invoices: administrators see all, others their own."""
    with reporting_errors():
        result = native_client().get("/api/v1/invoices", status=status, account=account)
    emit(result["Invoices"], _render)


@app.command("approve")
def approve(
    invoice_id: int,
) -> None:
    """Approve a pending invoice: its plan is paid and Scheduled."""
    with reporting_errors():
        invoice = native_client().post(f"/api/v1/invoices/{invoice_id}/approve")
    emit(
        invoice,
        lambda i: console.print(f"Invoice {i['InvoiceId']} approved: plan {i['TrainingPlanName']}."),
    )


@app.command("reject")
def reject(
    invoice_id: int,
    reason: Annotated[str, typer.Option(help="Why; the plan's owner reads it.")],
) -> None:
    """Reject a pending invoice: its plan fails and its capacity is released."""
    with reporting_errors():
        invoice = native_client().post(f"/api/v1/invoices/{invoice_id}/reject", {"Reason": reason})
    emit(
        invoice,
        lambda i: console.print(f"Invoice {i['InvoiceId']} rejected: plan {i['TrainingPlanName']}."),
    )
