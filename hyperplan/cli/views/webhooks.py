"""Views of webhooks and their deliveries."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView


@dataclass(frozen=True)
class NewWebhook:
    """A new webhook with its signing secret, which the server shows only this once."""

    hook: dict[str, Any]

    def __rich__(self) -> Group:
        hook = self.hook
        return Group(
            Text.assemble(
                f"Webhook {hook['WebhookId']} sends plan events of ",
                (hook["AccountName"], "bold"),
                f" to {hook['Url']}",
            ),
            Text(f"  secret = {hook['Secret']}"),
            Text(
                "The secret is shown once; keep it now. Receivers check X-Hyperplan-Signature with it "
                "(docs/WEBHOOKS.md).",
                style="dim",
            ),
        )


@dataclass(frozen=True)
class WebhooksTable:
    hooks: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [h["WebhookId"], h["AccountName"], h["Url"], h["CreatedAt"], h["PendingDeliveries"]]
            for h in self.hooks
        ]
        return TableView("Webhooks", ["Id", "Account", "Url", "Created", "Pending"], rows)


@dataclass(frozen=True)
class DeliveriesTable:
    result: dict[str, Any]

    def __rich__(self) -> TableView:
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
            for d in self.result["Deliveries"]
        ]
        return TableView(
            f"Deliveries of webhook {self.result['WebhookId']} (newest first)",
            ["Id", "Plan", "Kind", "Status", "Attempts", "Delivered / next try", "Last error"],
            rows,
        )


@dataclass(frozen=True)
class WebhookDeleted:
    result: dict[str, Any]

    def __rich__(self) -> Text:
        return Text(f"Webhook {self.result['WebhookId']} deleted.")
