"""`hyperplan webhooks`: administrators register URLs that receive an account's plan events."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Webhooks: plan events POSTed, signed, to your URLs.", no_args_is_help=True)


@app.command("add")
def add(
    account: Annotated[str, typer.Argument(help="The account (name or id) whose plan events are sent.")],
    url: Annotated[str, typer.Argument(help="An http:// or https:// URL that accepts POSTs.")],
) -> None:
    """Register a webhook and print its signing secret, once."""
    from hyperplan.cli.views.webhooks import NewWebhook

    with reporting_errors():
        hook = native_client().post("/api/v1/webhooks", {"Account": account, "Url": url})
    emit(hook, NewWebhook)


@app.command("list")
def list_webhooks(
    account: Annotated[str | None, typer.Option(help="One account (name or id).")] = None,
) -> None:
    """List webhooks, with how many deliveries each still has to make."""
    from hyperplan.cli.views.webhooks import WebhooksTable

    with reporting_errors():
        result = native_client().get("/api/v1/webhooks", account=account)
    emit(result["Webhooks"], WebhooksTable)


@app.command("remove")
def remove(webhook_id: int) -> None:
    """Delete a webhook: nothing more is sent to it, including deliveries still pending."""
    from hyperplan.cli.views.webhooks import WebhookDeleted

    with reporting_errors():
        result = native_client().delete(f"/api/v1/webhooks/{webhook_id}")
    emit(result, WebhookDeleted)


@app.command("deliveries")
def deliveries(
    webhook_id: int,
    limit: Annotated[int, typer.Option(help="How many of the latest deliveries (1-500).")] = 50,
) -> None:
    """Show a webhook's latest deliveries: attempts, last error, when delivered or next tried."""
    from hyperplan.cli.views.webhooks import DeliveriesTable

    with reporting_errors():
        result = native_client().get(f"/api/v1/webhooks/{webhook_id}/deliveries", limit=limit)
    emit(result, DeliveriesTable)
