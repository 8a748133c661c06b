"""The webhook routes of the native API (administrators), each in a transaction of its own, so that no
handler touches the store. The rules live in services/webhooks/webhooks.py; the views it returns hold rows
read in the transaction, which the handlers only read."""

from __future__ import annotations

from hyperplan.clock import utcnow
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.webhooks import webhooks
from hyperplan.services.webhooks.webhooks import DeliveryView, WebhookView


def register(runtime: ServiceContext, account_ref: str, url: str) -> WebhookView:
    with runtime.db.write() as session:
        return webhooks.register(
            session, account_ref, url, utcnow(), targets=runtime.fleet.webhooks, box=runtime.secret_box
        )


def list_webhooks(runtime: ServiceContext, account_ref: str | None) -> list[WebhookView]:
    with runtime.db.read() as session:
        return webhooks.list_webhooks(session, account_ref)


def delete(runtime: ServiceContext, webhook_id: int) -> None:
    with runtime.db.write() as session:
        webhooks.delete(session, webhook_id, utcnow())


def recent_deliveries(runtime: ServiceContext, webhook_id: int, limit: int) -> list[DeliveryView]:
    with runtime.db.read() as session:
        return webhooks.recent_deliveries(session, webhook_id, limit)
