"""The webhook dispatcher: sends queued deliveries from its own threads, in order per (webhook, plan).

The lifecycle loop never waits on a receiver: it only writes `webhook_deliveries` rows with the events
(`hyperplan.services.webhooks.webhooks.enqueue`). This dispatcher finds the rows that are due and POSTs them:

- Order. Of a (webhook, plan) pair, only the oldest undelivered delivery is ever attempted; the later
  ones wait until it succeeds. Other pairs go on independently, so one plan's failing head, or one
  webhook's slow receiver, holds up nothing else.
- Fairness. A small pool of worker threads sends; each webhook has at most `per_webhook` requests in
  flight, so a slow receiver occupies that many workers, not the pool.
- Retries. A failure (connection error, timeout, any status outside 2xx, redirects included) records
  the attempt and its error and waits `retry_base * 2**(attempts-1)` seconds of real time, capped at
  `retry_max`. There is no last attempt: a delivery is retried until it succeeds or its webhook is
  deleted, because events must arrive eventually.
- Transactions. Each attempt reads what it sends in one short read transaction and records the outcome
  in one short write transaction; the HTTP request happens between the two, never inside either.
- Durability. Everything is in rows, so a restart resumes where the last run stopped. A crash after a
  receiver answered and before the outcome was written sends that delivery again: delivery is
  at-least-once, and receivers dedupe by DeliveryId (or EventId).

The loop that finds due rows is a worker (`hyperplan.worker`): woken by `wake()` after a commit that
queued something, and polling every `poll` seconds (cheap on the `ix_delivery_queue` index) for the
retries that come due and for rows queued by another process. The HTTP client (and httpx with it) is
made at the first delivery, not at start: most servers never send one, and making it loads the system's
CA certificates.

Targets. Requests go through `hyperplan.notify.guard`: a connection to an address the fleet file's
`[webhooks] allowed_networks` does not allow (loopback, private, link-local, ...) is refused when it is
made, whatever the URL's host resolves to at that moment, and recorded as the attempt's error.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from hyperplan import metrics
from hyperplan.clock import utcnow
from hyperplan.core.webhook_targets import WebhookTargets
from hyperplan.errors import ValidationError
from hyperplan.services.webhooks import webhooks
from hyperplan.store.db import Database
from hyperplan.store.master_key import SecretBox
from hyperplan.store.schema import PlanEvent, TrainingPlan, Webhook, WebhookDelivery
from hyperplan.worker import Wake, Worker

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

HttpFactory = Callable[[], "httpx.Client"]
ArnOf = Callable[[str, str], str]  # (account id, resource) -> ARN, as Runtime.arn
RealClock = Callable[[], datetime]

ENV_PREFIX = "HYPERPLAN_WEBHOOK_"
MAX_ERROR_LENGTH = 1000


@dataclass(frozen=True)
class DispatcherConfig:
    workers: int = 4
    per_webhook: int = 1
    timeout: float = 10.0  # seconds per connect, read and write of one request
    retry_base: float = 1.0
    retry_max: float = 300.0
    poll: float = 0.5  # seconds between looks when nobody calls wake()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> DispatcherConfig:
        """Defaults, overridden by HYPERPLAN_WEBHOOK_<FIELD> (e.g. HYPERPLAN_WEBHOOK_RETRY_BASE=0.2)."""
        defaults = cls()
        values: dict[str, float] = {}
        for name in ("workers", "per_webhook", "timeout", "retry_base", "retry_max", "poll"):
            text = env.get(ENV_PREFIX + name.upper())
            if text is not None:
                values[name] = _positive(ENV_PREFIX + name.upper(), text)
        return cls(
            workers=int(values.get("workers", defaults.workers)),
            per_webhook=int(values.get("per_webhook", defaults.per_webhook)),
            timeout=values.get("timeout", defaults.timeout),
            retry_base=values.get("retry_base", defaults.retry_base),
            retry_max=values.get("retry_max", defaults.retry_max),
            poll=values.get("poll", defaults.poll),
        )


def _positive(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValidationError(f"{name} must be a positive number of seconds (or a count), not {text!r}.")
    return value


def backoff(attempts: int, base: float, cap: float) -> timedelta:
    """The wait after the `attempts`-th failure: base, 2 base, 4 base, ... never more than cap."""
    exponent = min(max(attempts - 1, 0), 40)  # 2**40 base is past any cap; no float overflow
    return timedelta(seconds=min(cap, base * 2**exponent))


@dataclass(frozen=True)
class Head:
    """The oldest undelivered delivery of one (webhook, plan) pair."""

    delivery_id: int
    webhook_id: int
    plan_id: int
    next_attempt_at: datetime

    @property
    def key(self) -> tuple[int, int]:
        return (self.webhook_id, self.plan_id)


@dataclass(frozen=True)
class Outgoing:
    url: str
    body: bytes
    headers: dict[str, str]


class Dispatcher:
    def __init__(
        self,
        db: Database,
        arn: ArnOf,
        http: HttpFactory | None = None,
        now: RealClock = utcnow,
        config: DispatcherConfig | None = None,
        targets: WebhookTargets | None = None,
        wake: Wake | None = None,
        *,
        box: SecretBox,
    ) -> None:
        """`targets`: the fleet's allowed networks, for the default client (a given `http` factory is
        used as it is: tests give one that sends nowhere)."""
        self.db = db
        self.arn = arn
        self.box = box  # opens the webhooks' signing secrets
        allowed = targets or WebhookTargets()
        self.http = http or (lambda: _guarded_client(allowed))
        self.now = now
        self.config = config or DispatcherConfig()
        # The loop that finds due heads: a worker woken after a commit that queued deliveries and when a
        # worker thread frees a pair; it polls every `poll` seconds for retries that come due.
        poll = self.config.poll
        self.loop = Worker("webhooks", self.dispatch_due, poll=poll, backoff_base=poll, wake=wake)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._in_flight: set[tuple[int, int]] = set()
        self._per_webhook: Counter[int] = Counter()
        self._cooling: dict[tuple[int, int], float] = {}  # pair -> monotonic time it may run again
        self._jobs: queue.Queue[Head | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._client: httpx.Client | None = None  # the workers' client: made at the first delivery
        self._client_lock = threading.Lock()

    # -- start, stop, wake ----------------------------------------------------------------------

    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        # Fresh bookkeeping: a worker abandoned by a timed-out stop() must not hold a pair forever.
        self._jobs = queue.Queue()
        with self._lock:
            self._in_flight.clear()
            self._per_webhook.clear()
        # Daemon threads: a receiver that hangs must never keep the process from exiting.
        self._threads = [
            threading.Thread(target=self._work, name=f"webhook-{n}", daemon=True)
            for n in range(self.config.workers)
        ]
        for thread in self._threads:
            thread.start()
        self.loop.start()

    def stop(self) -> None:
        """Stop taking work; wait (up to one request's timeout) for requests in flight to be recorded."""
        if not self._threads:
            return
        self._stop.set()
        self.loop.stop()
        for _ in range(self.config.workers):
            self._jobs.put(None)
        deadline = time.monotonic() + self.config.timeout + 2
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = []
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def wake(self) -> None:
        """Look for due deliveries now, not at the next poll (call it after a commit that queued some)."""
        self.loop.wake()

    # -- the loop: find due heads, hand them to workers -------------------------------------------

    def dispatch_due(self) -> float:
        """Hand every due head that may run to the workers; return seconds until there may be more."""
        now = self.now()
        wait = self.config.poll
        for head in self._heads():
            if head.next_attempt_at > now:
                wait = min(wait, (head.next_attempt_at - now).total_seconds())
                break  # heads come in next_attempt_at order: the rest are later still
            if not self._stop.is_set() and self._claim(head):
                self._jobs.put(head)
        return max(0.01, wait)

    def _heads(self) -> list[Head]:
        oldest = (
            select(func.min(WebhookDelivery.id).label("id"))
            .where(WebhookDelivery.delivered_at.is_(None))
            .group_by(WebhookDelivery.webhook_id, WebhookDelivery.plan_id)
            .subquery()
        )
        query = (
            select(
                WebhookDelivery.id,
                WebhookDelivery.webhook_id,
                WebhookDelivery.plan_id,
                WebhookDelivery.next_attempt_at,
            )
            .join(oldest, oldest.c.id == WebhookDelivery.id)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(Webhook.deleted_at.is_(None))
            .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id)
        )
        with self.db.read() as session:
            return [Head(*row) for row in session.execute(query).all()]

    def _claim(self, head: Head) -> bool:
        """Reserve a worker for the head unless its pair, its webhook (at its cap) or the pool is busy."""
        with self._lock:
            if (
                head.key in self._in_flight
                or self._per_webhook[head.webhook_id] >= self.config.per_webhook
                or len(self._in_flight) >= self.config.workers
                or self._cooling.get(head.key, 0.0) > time.monotonic()
            ):
                return False
            self._in_flight.add(head.key)
            self._per_webhook[head.webhook_id] += 1
            return True

    def _release(self, head: Head, cool: bool) -> None:
        with self._lock:
            self._in_flight.discard(head.key)
            self._per_webhook[head.webhook_id] -= 1
            if self._per_webhook[head.webhook_id] <= 0:
                del self._per_webhook[head.webhook_id]
            if cool:
                self._cooling[head.key] = time.monotonic() + self.config.poll
            else:
                self._cooling.pop(head.key, None)
        self.loop.wake()  # the pair's next delivery, or another webhook's, may go now

    # -- the workers: one attempt each ------------------------------------------------------------

    def _work(self) -> None:
        while (head := self._jobs.get()) is not None:
            cool = False
            if self._stop.is_set():  # stopping: finish what is in flight, start nothing new
                self._release(head, cool)
                continue
            try:
                self.attempt(head.delivery_id)
            except Exception:
                # The outcome could not be read or recorded (a database problem): the delivery stays due.
                # Cooling the pair for a poll keeps that from turning into a stream of duplicate POSTs.
                log.exception("webhook delivery %d: attempt failed", head.delivery_id)
                cool = True
            finally:
                self._release(head, cool)

    def attempt(self, delivery_id: int) -> bool | None:
        """One attempt at one delivery: True if delivered, False if it failed, None if nothing to send."""
        outgoing = self._prepare(delivery_id)
        if outgoing is None:
            return None
        error = self._post(outgoing)  # no transaction is open here
        self._record(delivery_id, error)
        if error is not None:
            log.info("webhook delivery %d to %s failed: %s", delivery_id, outgoing.url, error)
        return error is None

    def _prepare(self, delivery_id: int) -> Outgoing | None:
        with self.db.read() as session:
            delivery = session.get(WebhookDelivery, delivery_id)
            if delivery is None or delivery.delivered_at is not None:
                return None
            hook = session.get(Webhook, delivery.webhook_id)
            event = session.get(PlanEvent, delivery.plan_event_id)
            plan = session.get(TrainingPlan, delivery.plan_id)
            if hook is None or hook.deleted_at is not None or event is None or plan is None:
                return None
            arn = self.arn(plan.account_id, f"training-plan/{plan.name}")
            body = webhooks.encode(webhooks.payload(event, plan, arn, delivery.id, delivery.attempts + 1))
            return Outgoing(
                hook.url,
                body,
                webhooks.headers(webhooks.signing_secret(hook, self.box), body, event.kind, delivery.id),
            )

    def _post(self, outgoing: Outgoing) -> str | None:
        """None if the receiver answered 2xx; otherwise what went wrong, for `last_error`."""
        import httpx  # loaded with the first client (_shared_client)

        client = self._shared_client() or self.http()
        try:
            # Streamed and never read: a receiver's answer body is not ours to download.
            with client.stream(
                "POST",
                outgoing.url,
                content=outgoing.body,
                headers=outgoing.headers,
                timeout=self.config.timeout,
                follow_redirects=False,
            ) as response:
                if 200 <= response.status_code < 300:
                    return None
                return f"HTTP {response.status_code} {response.reason_phrase}".strip()
        except httpx.TimeoutException:
            return f"timed out after {self.config.timeout:g} s"
        except Exception as exc:  # connection refused, bad TLS, an unusable URL: all retried alike
            return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_LENGTH]
        finally:
            if client is not self._client:
                client.close()

    def _shared_client(self) -> httpx.Client | None:
        """The workers' client, made by the first delivery of a run; None when not running (a worker
        still sending once stopped, or a direct `attempt`, then uses a client of its own)."""
        with self._client_lock:
            if self._client is None and self._threads and not self._stop.is_set():
                self._client = self.http()
            return self._client

    def _record(self, delivery_id: int, error: str | None) -> None:
        with self.db.write() as session:
            delivery = session.get(WebhookDelivery, delivery_id)
            if delivery is None or delivery.delivered_at is not None:
                return  # another dispatcher on the same store got there first
            now = self.now()
            delivery.attempts += 1
            metrics.WEBHOOK_DELIVERIES.labels("delivered" if error is None else "failed").inc()
            if error is None:
                delivery.delivered_at = now
                return
            delivery.last_error = error[:MAX_ERROR_LENGTH]
            delivery.next_attempt_at = now + backoff(
                delivery.attempts, self.config.retry_base, self.config.retry_max
            )


def _guarded_client(targets: WebhookTargets) -> httpx.Client:
    from hyperplan.notify.guard import guarded_client  # httpx with it, at the first delivery

    return guarded_client(targets)
