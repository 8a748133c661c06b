"""Native routes for webhooks (administrators): register, list, delete, and see how deliveries went.

docs/WEBHOOKS.md documents the routes and what receivers get. Handlers translate; the rules live in
hyperplan.services.webhooks.webhooks.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.webhooks import webhook_admin, webhooks
from hyperplan.services.webhooks.webhooks import DeliveryView, WebhookView

DEFAULT_DELIVERIES = 50
MAX_DELIVERIES = 500


def _webhook_json(view: WebhookView) -> dict[str, Any]:
    return {
        "WebhookId": view.webhook_id,
        "AccountId": view.account_id,
        "AccountName": view.account_name,
        "Url": view.url,
        "CreatedAt": view.created_at,
        "PendingDeliveries": view.pending,
    }


def _delivery_json(view: DeliveryView) -> dict[str, Any]:
    return {
        "DeliveryId": view.delivery_id,
        "EventId": view.event_id,
        "Kind": view.kind,
        "At": view.at,
        "TrainingPlanName": view.plan_name,
        "Status": view.status,
        "Attempts": view.attempts,
        "LastError": view.last_error,
        "NextAttemptAt": view.next_attempt_at,
        "DeliveredAt": view.delivered_at,
    }


def _webhook_id(request: NativeRequest) -> int:
    return fields.row_id(request.path["webhook"], "Webhook id")


def _limit(request: NativeRequest) -> int:
    return fields.query_whole(request.query, "limit", 1, MAX_DELIVERIES) or DEFAULT_DELIVERIES


def create_webhook(request: NativeRequest) -> dict[str, Any]:
    account = fields.required_text(request.body, "Account")
    url = fields.required_text(request.body, "Url", max_length=webhooks.MAX_URL_LENGTH)
    view = webhook_admin.register(request.runtime, account, url)
    # The only answer that carries the secret: it is not shown again.
    return {**_webhook_json(view), "Secret": view.secret}


def list_webhooks(request: NativeRequest) -> dict[str, Any]:
    found = webhook_admin.list_webhooks(request.runtime, fields.query_text(request.query, "account"))
    return {"Webhooks": [_webhook_json(view) for view in found]}


def delete_webhook(request: NativeRequest) -> dict[str, Any]:
    webhook_id = _webhook_id(request)
    webhook_admin.delete(request.runtime, webhook_id)
    return {"WebhookId": webhook_id, "Deleted": True}


def list_deliveries(request: NativeRequest) -> dict[str, Any]:
    webhook_id, limit = _webhook_id(request), _limit(request)
    found = webhook_admin.recent_deliveries(request.runtime, webhook_id, limit)
    return {"WebhookId": webhook_id, "Deliveries": [_delivery_json(view) for view in found]}


def routes() -> list[Route]:
    return [
        NativeRoute("POST", "/api/v1/webhooks", create_webhook, admin=True, body=("Account", "Url")),
        NativeRoute("GET", "/api/v1/webhooks", list_webhooks, admin=True, query=("account",)),
        NativeRoute("DELETE", "/api/v1/webhooks/{webhook}", delete_webhook, admin=True),
        NativeRoute(
            "GET", "/api/v1/webhooks/{webhook}/deliveries", list_deliveries, admin=True, query=("limit",)
        ),
    ]
