"""Native routes for webhooks (administrators): register, list, delete, and see how deliveries went.

docs/WEBHOOKS.md documents the routes and what receivers get. Handlers translate; the rules live in
hyperplan.services.webhooks.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.clock import utcnow
from hyperplan.errors import ValidationError
from hyperplan.server.native import NativeRequest, endpoint, field
from hyperplan.services import webhooks
from hyperplan.services.webhooks import DeliveryView, WebhookView

DEFAULT_DELIVERIES = 50
MAX_DELIVERIES = 500


def _webhook_json(view: WebhookView) -> dict[str, Any]:
    hook = view.webhook
    return {
        "WebhookId": hook.id,
        "AccountId": hook.account_id,
        "AccountName": view.account_name,
        "Url": hook.url,
        "CreatedAt": hook.created_at,
        "PendingDeliveries": view.pending,
    }


def _delivery_json(view: DeliveryView) -> dict[str, Any]:
    delivery, event = view.delivery, view.event
    return {
        "DeliveryId": delivery.id,
        "EventId": event.id,
        "Kind": event.kind,
        "At": event.at,
        "TrainingPlanName": view.plan_name,
        "Status": view.status,
        "Attempts": delivery.attempts,
        "LastError": delivery.last_error,
        "NextAttemptAt": None if delivery.delivered_at else delivery.next_attempt_at,
        "DeliveredAt": delivery.delivered_at,
    }


def _webhook_id(request: NativeRequest) -> int:
    text = request.path["webhook"]
    if not text.isdigit():
        raise ValidationError(f"Webhook id must be a number, not {text!r}.")
    return int(text)


def _limit(request: NativeRequest) -> int:
    text = request.query.get("limit")
    if text is None:
        return DEFAULT_DELIVERIES
    if not text.isdigit() or not 1 <= int(text) <= MAX_DELIVERIES:
        raise ValidationError(f"limit must be a whole number from 1 to {MAX_DELIVERIES}.")
    return int(text)


def create_webhook(request: NativeRequest) -> dict[str, Any]:
    account = field(request.body, "Account", str)
    url = field(request.body, "Url", str)
    with request.runtime.db.write() as session:
        view = webhooks.register(session, account, url, utcnow())
        # The only answer that carries the secret: it is not shown again.
        return {**_webhook_json(view), "Secret": view.webhook.secret}


def list_webhooks(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.read() as session:
        found = webhooks.list_webhooks(session, request.query.get("account") or None)
        return {"Webhooks": [_webhook_json(view) for view in found]}


def delete_webhook(request: NativeRequest) -> dict[str, Any]:
    webhook_id = _webhook_id(request)
    with request.runtime.db.write() as session:
        webhooks.delete(session, webhook_id, utcnow())
    return {"WebhookId": webhook_id, "Deleted": True}


def list_deliveries(request: NativeRequest) -> dict[str, Any]:
    webhook_id, limit = _webhook_id(request), _limit(request)
    with request.runtime.db.read() as session:
        found = webhooks.recent_deliveries(session, webhook_id, limit)
        return {"WebhookId": webhook_id, "Deliveries": [_delivery_json(view) for view in found]}


def routes() -> list[Route]:
    return [
        Route("/api/v1/webhooks", endpoint(create_webhook, admin=True), methods=["POST"]),
        Route("/api/v1/webhooks", endpoint(list_webhooks, admin=True), methods=["GET"]),
        Route("/api/v1/webhooks/{webhook}", endpoint(delete_webhook, admin=True), methods=["DELETE"]),
        Route(
            "/api/v1/webhooks/{webhook}/deliveries",
            endpoint(list_deliveries, admin=True),
            methods=["GET"],
        ),
    ]
