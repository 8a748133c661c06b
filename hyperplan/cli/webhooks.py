"""`hyperplan webhooks`: administrators register URLs that receive an account's plan events."""

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

app = ClientTyper(help="Webhooks: plan events POSTed, signed, to your URLs.", no_args_is_help=True)


def _show_new(hook: dict[str, Any]) -> None:
    account = hook["AccountName"]
    console.print(f"Webhook {hook['WebhookId']} sends plan events of [bold]{account}[/bold] to {hook['Url']}")
    console.print(f"  secret = {hook['Secret']}")
    console.print(
        "[dim]The secret is shown once; keep it now. Receivers check X-Hyperplan-Signature with it "
        "(docs/WEBHOOKS.md).[/dim]"
    )


def _render_webhooks(hooks: list[dict[str, Any]]) -> None:
    rows = [
        [h["WebhookId"], h["AccountName"], h["Url"], h["CreatedAt"], h["PendingDeliveries"]] for h in hooks
    ]
    print_table("Webhooks", ["Id", "Account", "Url", "Created", "Pending"], rows)


def _render_deliveries(result: dict[str, Any]) -> None:
    rows = [
        [
            d["DeliveryId"],
            d["TrainingPlanName"],
            d["Kind"],
            d["Status"],
            d["Attempts"],
            d["DeliveredAt"] or d["NextAttemptAt"] or "",
            d["LastError"],
        ]
        for d in result["Deliveries"]
    ]
    print_table(
        f"Deliveries of webhook {result['WebhookId']} (newest first)",
        ["Id", "Plan", "Kind", "Status", "Attempts", "Delivered / next try", "Last error"],
        rows,
    )


@app.command("add")
def add(
    account: Annotated[str, typer.Argument(help="The account (name or id) whose plan events are sent.")],
    url: Annotated[str, typer.Argument(help="An http:// or https:// URL that accepts POSTs.")],
) -> None:
    """Register a webhook and print its signing secret, once."""
    with reporting_errors():
        hook = native_client().post("/api/v1/webhooks", {"Account": account, "Url": url})
    emit(hook, _show_new)


@app.command("list")
def list_webhooks(
    account: Annotated[str | None, typer.Option(help="One account (name or id).")] = None,
) -> None:
    """List webhooks, with how many deliveries each still has to make."""
    with reporting_errors():
        result = native_client().get("/api/v1/webhooks", account=account)
    emit(result["Webhooks"], _render_webhooks)


@app.command("remove")
def remove(
    webhook_id: int,
) -> None:
    """Delete a webhook: nothing more is sent to it, including deliveries still pending."""
    with reporting_errors():
        result = native_client().delete(f"/api/v1/webhooks/{webhook_id}")
    emit(result, lambda r: console.print(f"Webhook {r['WebhookId']} deleted."))


@app.command("deliveries")
def deliveries(
    webhook_id: int,
    limit: Annotated[int, typer.Option(help="How many of the latest deliveries (1-500).")] = 50,
) -> None:
    """Show a webhook's latest deliveries: attempts, last error, when delivered or next tried."""
    with reporting_errors():
        result = native_client().get(f"/api/v1/webhooks/{webhook_id}/deliveries", limit=limit)
    emit(result, _render_deliveries)
