"""`hyperplan invoices`: list invoices; administrators approve or reject them."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Invoices of plan purchases.", no_args_is_help=True)


@app.command("list")
def list_invoices(
    status: Annotated[str | None, typer.Option(help="Pending, Paid, Rejected or Failed.")] = None,
    account: Annotated[str | None, typer.Option(help="One account (administrators).")] = None,
) -> None:
    """List invoices: administrators see all, others their own."""
    from hyperplan.cli.views.invoices import InvoicesTable

    with reporting_errors():
        result = native_client().get("/api/v1/invoices", status=status, account=account)
    emit(result["Invoices"], InvoicesTable)


@app.command("approve")
def approve(invoice_id: int) -> None:
    """Approve a pending invoice: its plan is paid and Scheduled."""
    from hyperplan.cli.views.invoices import InvoiceDecided

    with reporting_errors():
        invoice = native_client().post(f"/api/v1/invoices/{invoice_id}/approve")
    emit(
        invoice,
        lambda i: InvoiceDecided(i, "approved"),
    )


@app.command("reject")
def reject(
    invoice_id: int,
    reason: Annotated[str, typer.Option(help="Why; the plan's owner reads it.")],
) -> None:
    """Reject a pending invoice: its plan fails and its capacity is released."""
    from hyperplan.cli.views.invoices import InvoiceDecided

    with reporting_errors():
        invoice = native_client().post(f"/api/v1/invoices/{invoice_id}/reject", {"Reason": reason})
    emit(
        invoice,
        lambda i: InvoiceDecided(i, "rejected"),
    )
