"""Webhooks: an account's plan events, POSTed as signed JSON to URLs an administrator registers.

A delivery is a row written in the same transaction as the plan event it carries (`enqueue`), so an
event that happened is an event that will be sent, and one that was rolled back never is. Sending is
the dispatcher's job (`hyperplan.notify.dispatcher`), outside every transaction. This module holds the
rules both sides share: what a body says, how it is signed, and how a receiver checks the signature.

Times here are of two kinds: an event's `At` is service time (what the plan's history says); a
webhook's creation and a delivery's attempts are real time, because receivers live in real time.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.core.webhook_targets import IPAddress, WebhookTargets
from hyperplan.errors import ResourceNotFound, ValidationError
from hyperplan.services.accounts.accounts import get_account
from hyperplan.services.accounts.sealed_secrets import open_secret
from hyperplan.store.master_key import SecretBox
from hyperplan.store.schema import Account, PlanEvent, TrainingPlan, Webhook, WebhookDelivery

SIGNATURE_HEADER = "X-Hyperplan-Signature"
EVENT_HEADER = "X-Hyperplan-Event"
DELIVERY_HEADER = "X-Hyperplan-Delivery"
SIGNATURE_PREFIX = "sha256="
USER_AGENT = "hyperplan-webhooks/1"

MAX_URL_LENGTH = 2048
_SCHEMES = ("http", "https")


# -- signing (pure; receivers may copy these two functions) ------------------------------------------


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: `sha256=` and the hex HMAC-SHA256 of the raw body under the secret."""
    digest = hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True if `header` is the signature of exactly these bytes; compared in constant time."""
    if not header:
        return False
    return hmac.compare_digest(sign(secret, body).encode("ascii"), header.strip().encode("utf-8"))


# -- what a delivery says ----------------------------------------------------------------------------


def iso(moment: datetime) -> str:
    """ISO 8601 in UTC with a `Z`, as everywhere in the native API."""
    return moment.isoformat().replace("+00:00", "Z")


def payload(
    event: PlanEvent, plan: TrainingPlan, plan_arn: str, delivery_id: int, attempt: int
) -> dict[str, Any]:
    return {
        "EventId": event.id,
        "Kind": event.kind,
        "Status": event.status,
        "Message": event.message,
        "At": iso(event.at),
        "TrainingPlanName": plan.name,
        "TrainingPlanArn": plan_arn,
        "AccountId": plan.account_id,
        "DeliveryId": delivery_id,
        "Attempt": attempt,
    }


def encode(body: Mapping[str, Any]) -> bytes:
    """Compact, key-sorted JSON: the bytes that are signed are the bytes that are sent."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def headers(secret: str, body: bytes, kind: str, delivery_id: int) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(secret, body),
        EVENT_HEADER: kind,
        DELIVERY_HEADER: str(delivery_id),
    }


# -- enqueue (inside the transaction that appends the event) ------------------------------------------


def enqueue(session: Session, event: PlanEvent, plan: TrainingPlan) -> int:
    """One delivery per live webhook of the plan's account; returns how many were queued.

    Called for every plan event, so the common case (no webhooks) costs one query on the indexed
    `webhooks.account_id` and nothing else.
    """
    # Read once per transaction and account: a purchase records three or four events.
    known: dict[str, list[int]] = session.info.setdefault("webhook_ids", {})
    hook_ids = known.get(plan.account_id)
    if hook_ids is None:
        hook_ids = known[plan.account_id] = list(
            session.scalars(
                select(Webhook.id).where(Webhook.account_id == plan.account_id, Webhook.deleted_at.is_(None))
            )
        )
    if not hook_ids:
        return 0
    if event.id is None:
        session.flush()  # the delivery points at the event row, which needs its id
    now = utcnow()  # real time: the first attempt is due at once, whatever the service clock says
    for hook_id in hook_ids:
        session.add(
            WebhookDelivery(
                webhook_id=hook_id,
                plan_id=plan.id,
                plan_event_id=event.id,
                attempts=0,
                next_attempt_at=now,
                last_error="",
            )
        )
    return len(hook_ids)


# -- administration ----------------------------------------------------------------------------------


def validate_url(url: str, targets: WebhookTargets) -> str:
    """An absolute http(s) URL with a host that `targets` allows; anything else is refused, naming Url.
    A host written as an address (in any form the system reads as one, such as 2130706433 or 0x7f.1) is
    checked here; a host name is checked each time a delivery connects (`hyperplan.notify.guard`),
    since what it resolves to may change."""
    text = url.strip()
    if not text or len(text) > MAX_URL_LENGTH:
        raise ValidationError(f"Url must be 1 to {MAX_URL_LENGTH} characters.")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValidationError("Url must not contain spaces or control characters.")
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError as exc:
        raise ValidationError(f"Url {text!r} is not a valid URL: {exc}.") from None
    if parts.scheme.lower() not in _SCHEMES:
        raise ValidationError(f"Url must start with http:// or https://, not {text!r}.")
    if not parts.hostname:
        raise ValidationError(f"Url {text!r} has no host.")
    for address in _written_addresses(parts.hostname):
        reason = targets.refusal(address)
        if reason is not None:
            raise ValidationError(
                f"Url {text!r}: {reason}. Webhooks go to public addresses unless the fleet file's "
                "[webhooks] allowed_networks allows others."
            )
    return text


def _written_addresses(host: str) -> list[IPAddress]:
    """The addresses a host stands for when it is an address, not a name; no name is looked up."""
    try:
        return [ipaddress.ip_address(host.split("%", 1)[0])]
    except ValueError:
        pass
    try:  # the forms inet_aton also reads: 2130706433, 0x7f000001, 127.1, 0177.0.0.1
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return []  # a name
    return [ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]) for *_, sockaddr in found]


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class WebhookView:
    """A webhook as its readers see it: plain values, read inside the transaction."""

    webhook_id: int
    account_id: str
    account_name: str
    url: str
    created_at: datetime
    pending: int  # deliveries not yet made
    secret: str | None = None  # the signing secret in plain text: only in the answer to register()

    @classmethod
    def of(cls, hook: Webhook, account_name: str, pending: int, secret: str | None = None) -> WebhookView:
        return cls(hook.id, hook.account_id, account_name, hook.url, hook.created_at, pending, secret)


def register(
    session: Session,
    account_ref: str,
    url: str,
    now: datetime,
    *,
    targets: WebhookTargets,
    box: SecretBox,
) -> WebhookView:
    """A new webhook for an account (by name or id), to a URL `targets` allows (the fleet's). Its secret
    is stored sealed under the master key, and readable in plain text from the result once."""
    checked = validate_url(url, targets)
    account = get_account(session, account_ref)
    secret = new_secret()
    hook = Webhook(
        account_id=account.id, url=checked, secret=box.seal(secret), secret_sealed=True, created_at=now
    )
    session.add(hook)
    session.flush()
    return WebhookView.of(hook, account.name, 0, secret)


def signing_secret(hook: Webhook, box: SecretBox) -> str:
    """The webhook's signing secret in plain text, to sign a delivery."""
    return open_secret(box, hook.secret, hook.secret_sealed)


def list_webhooks(session: Session, account_ref: str | None = None) -> list[WebhookView]:
    """Live webhooks, oldest first: one account's, or everyone's when `account_ref` is None."""
    query = (
        select(Webhook, Account.name)
        .join(Account, Account.id == Webhook.account_id)
        .where(Webhook.deleted_at.is_(None))
        .order_by(Webhook.id)
    )
    if account_ref is not None:
        query = query.where(Webhook.account_id == get_account(session, account_ref).id)
    rows = session.execute(query).all()
    pending = _pending_counts(session, [hook.id for hook, _ in rows])
    return [WebhookView.of(hook, name, pending.get(hook.id, 0)) for hook, name in rows]


def _pending_counts(session: Session, hook_ids: list[int]) -> dict[int, int]:
    if not hook_ids:
        return {}
    rows = session.execute(
        select(WebhookDelivery.webhook_id, func.count())
        .where(WebhookDelivery.delivered_at.is_(None), WebhookDelivery.webhook_id.in_(hook_ids))
        .group_by(WebhookDelivery.webhook_id)
    ).all()
    return {hook_id: int(count) for hook_id, count in rows}


def get_live(session: Session, webhook_id: int) -> Webhook:
    hook = session.get(Webhook, webhook_id)
    if hook is None or hook.deleted_at is not None:
        raise ResourceNotFound(f"No webhook {webhook_id}.")
    return hook


def delete(session: Session, webhook_id: int, now: datetime) -> Webhook:
    """Stop sending to a webhook. Its undelivered deliveries are abandoned (kept as rows, never sent)."""
    hook = get_live(session, webhook_id)
    hook.deleted_at = now
    return hook


@dataclass(frozen=True)
class DeliveryView:
    """One delivery of a plan event to a webhook, as plain values read inside the transaction."""

    delivery_id: int
    event_id: int
    kind: str
    at: datetime
    plan_name: str
    status: str  # Delivered, Abandoned (its webhook was deleted first), Pending or Retrying
    attempts: int
    last_error: str | None
    next_attempt_at: datetime | None  # None once delivered
    delivered_at: datetime | None

    @classmethod
    def of(
        cls, delivery: WebhookDelivery, event: PlanEvent, plan_name: str, webhook_deleted: bool
    ) -> DeliveryView:
        if delivery.delivered_at is not None:
            status = "Delivered"
        elif webhook_deleted:
            status = "Abandoned"
        else:
            status = "Pending" if delivery.attempts == 0 else "Retrying"
        next_attempt = None if delivery.delivered_at else delivery.next_attempt_at
        return cls(
            delivery.id, event.id, event.kind, event.at, plan_name, status, delivery.attempts,
            delivery.last_error, next_attempt, delivery.delivered_at,
        )  # fmt: skip


def recent_deliveries(session: Session, webhook_id: int, limit: int = 50) -> list[DeliveryView]:
    """A webhook's latest deliveries, newest first (deleted webhooks too: that is when one asks why)."""
    hook = session.get(Webhook, webhook_id)
    if hook is None:
        raise ResourceNotFound(f"No webhook {webhook_id}.")
    rows = session.execute(
        select(WebhookDelivery, PlanEvent, TrainingPlan.name)
        .join(PlanEvent, PlanEvent.id == WebhookDelivery.plan_event_id)
        .join(TrainingPlan, TrainingPlan.id == WebhookDelivery.plan_id)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.id.desc())
        .limit(limit)
    ).all()
    deleted = hook.deleted_at is not None
    return [DeliveryView.of(delivery, event, name, deleted) for delivery, event, name in rows]
