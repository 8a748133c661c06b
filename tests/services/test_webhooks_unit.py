"""Webhooks without a server: signatures, URL rules, the delivery queue on a real SQLite store, and the
dispatcher against an in-process HTTP transport (no sockets)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from hyperplan.clock import utcnow
from hyperplan.core.webhook_targets import WebhookTargets, parse_networks
from hyperplan.errors import ResourceNotFound, ValidationError
from hyperplan.notify.dispatcher import Dispatcher, DispatcherConfig, backoff
from hyperplan.notify.guard import GuardedBackend, TargetRefused, guarded_client
from hyperplan.services.accounts import accounts, sealed_secrets
from hyperplan.services.webhooks import webhooks
from hyperplan.store.db import Database
from hyperplan.store.master_key import KEY_FILE_NAME, SecretBox
from hyperplan.store.schema import PlanEvent, TrainingPlan, Webhook, WebhookDelivery
from hyperplan.store.urls import sqlite_url

T0 = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
PUBLIC_ONLY = WebhookTargets()  # the default: no [webhooks] table in the fleet file
LOOPBACK = WebhookTargets(parse_networks(["127.0.0.0/8", "::1"], "allowed_networks"))

# -- sign and verify ----------------------------------------------------------------------------------


def test_sign_is_hmac_sha256_over_the_raw_body() -> None:
    # RFC 4231, test case 2.
    expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert webhooks.sign("Jefe", b"what do ya want for nothing?") == "sha256=" + expected


def test_verify_accepts_only_the_exact_body_under_the_right_secret() -> None:
    body = b'{"EventId":1,"Kind":"created"}'
    header = webhooks.sign("s3cret", body)
    assert webhooks.verify("s3cret", body, header)
    assert webhooks.verify("s3cret", body, f"  {header} ")  # whitespace a proxy may add
    assert not webhooks.verify("s3cret", body + b"\n", header)
    assert not webhooks.verify("other", body, header)
    assert not webhooks.verify("s3cret", body, header.removeprefix("sha256="))
    assert not webhooks.verify("s3cret", body, header.upper())
    assert not webhooks.verify("s3cret", body, None)
    assert not webhooks.verify("s3cret", body, "")
    assert not webhooks.verify("s3cret", body, "sha256=ünïcode")


def test_the_receiver_snippet_in_the_docs_agrees_with_verify() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "WEBHOOKS.md").read_text()
    snippet = docs.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(snippet, namespace)
    body = b'{"Kind":"paid"}'
    good = webhooks.sign("k", body)
    for secret, sent, header in [
        ("k", body, good),
        ("k", body + b"x", good),
        ("j", body, good),
        ("k", body, None),
    ]:
        assert namespace["verify"](secret, sent, header) == webhooks.verify(secret, sent, header)


def test_headers_carry_signature_event_and_delivery() -> None:
    body = webhooks.encode({"b": 1, "a": "é"})
    assert body == '{"a":"é","b":1}'.encode()  # compact, sorted, UTF-8: what is signed is what is sent
    sent = webhooks.headers("k", body, "segment-started", 42)
    assert sent["X-Hyperplan-Signature"] == "sha256=" + hmac.new(b"k", body, hashlib.sha256).hexdigest()
    assert (sent["X-Hyperplan-Event"], sent["X-Hyperplan-Delivery"]) == ("segment-started", "42")
    assert sent["Content-Type"] == "application/json"


# -- URLs ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9000/hooks",
        "https://hooks.example.com/hyperplan?team=ml",
        "HTTPS://EXAMPLE.COM",
        "http://[::1]:8080/",
        " https://example.com/padded ",
    ],
)
def test_http_and_https_urls_with_a_host_are_accepted(url: str) -> None:
    assert webhooks.validate_url(url, LOOPBACK) == url.strip()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://example.com/hook",
        "file:///etc/passwd",
        "javascript:alert(1)",
        "example.com/hook",
        "//example.com/hook",
        "http://",
        "http:///path-only",
        "http://exa mple.com/",
        "http://example.com/\nX-Injected: 1",
        "http://example.com:99999/",
        "http://[::1/",
        "https://example.com/" + "a" * 2048,
    ],
)
def test_other_urls_are_refused_naming_url(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        webhooks.validate_url(url, LOOPBACK)
    assert "Url" in refused.value.message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9000/hooks", "127.0.0.1 is a loopback address"),
        ("http://[::1]:8080/", "::1 is a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a link-local address"),
        ("http://[fe80::1]/", "fe80::1 is a link-local address"),
        ("http://10.0.0.1/", "10.0.0.1 is a private address"),
        ("https://192.168.1.20/", "192.168.1.20 is a private address"),
        ("http://172.16.0.1/", "172.16.0.1 is a private address"),
        ("http://[fd00::1]/", "fd00::1 is a private address"),
        ("http://100.64.0.1/", "100.64.0.1 is not a public address"),
        ("http://0.0.0.0:8080/", "0.0.0.0 is the unspecified address"),
        ("http://[::]/", ":: is the unspecified address"),
        ("http://[::ffff:127.0.0.1]/", "(that is 127.0.0.1) is a loopback address"),
        ("http://[::ffff:169.254.169.254]/", "(that is 169.254.169.254) is a link-local address"),
        ("http://[2002:7f00:1::]/", "(that is 127.0.0.1) is a loopback address"),
        ("http://[64:ff9b::a9fe:a9fe]/", "(that is 169.254.169.254) is a link-local address"),
        ("http://2130706433/", "127.0.0.1 is a loopback address"),  # 127.0.0.1 as one number
        ("http://0x7f000001/", "127.0.0.1 is a loopback address"),
        ("http://127.1/", "127.0.0.1 is a loopback address"),
        ("http://0251.0376.0251.0376/", "169.254.169.254 is a link-local address"),  # octal
        ("http://224.0.0.1/", "224.0.0.1 is a multicast address"),
    ],
)
def test_non_public_addresses_are_refused_at_registration_naming_the_url(url: str, why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        webhooks.validate_url(url, PUBLIC_ONLY)
    message = refused.value.message
    assert message.startswith(f"Url {url!r}: ") and why in message and "allowed_networks" in message


def test_allowed_networks_let_exactly_those_through() -> None:
    assert webhooks.validate_url("http://127.0.0.1:9000/", LOOPBACK)
    assert webhooks.validate_url("http://[::ffff:127.0.0.1]/", LOOPBACK)
    for url in ("http://169.254.169.254/", "http://10.0.0.1/", "http://0.0.0.0/"):
        with pytest.raises(ValidationError, match="allowed_networks"):
            webhooks.validate_url(url, LOOPBACK)
    internal = WebhookTargets(parse_networks(["10.20.0.0/16"], "allowed_networks"))
    assert webhooks.validate_url("https://10.20.3.4/hook", internal)
    with pytest.raises(ValidationError, match=r"10\.21\.0\.1 is a private address"):
        webhooks.validate_url("https://10.21.0.1/hook", internal)


def test_public_addresses_and_names_are_accepted_at_registration() -> None:
    # Names are not looked up here (they are checked when a delivery connects): nothing leaves the machine.
    for url in (
        "https://8.8.8.8/",
        "https://[2606:4700::1111]/",
        "https://hooks.example.com/",
        "http://localhost/",
    ):
        assert webhooks.validate_url(url, PUBLIC_ONLY) == url


def test_the_delivery_client_refuses_before_connecting() -> None:
    """A name or address that is loopback, while loopback is not allowed: refused by the connection
    itself, so no packet is sent (a listener would not be reached even if one were there)."""
    backend = GuardedBackend(PUBLIC_ONLY)
    for host in ("localhost", "127.0.0.1", "::1", "2130706433"):
        with pytest.raises(TargetRefused, match=rf"refused to connect to {host}: .* is a loopback address"):
            backend.connect_tcp(host, 9)
    with guarded_client(PUBLIC_ONLY) as client, pytest.raises(httpx.ConnectError, match="loopback"):
        client.post("http://localhost:9/hook", content=b"{}")


# -- backoff and settings ------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    waits = [backoff(n, 1.0, 300.0).total_seconds() for n in range(1, 11)]
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert backoff(10_000, 0.2, 300.0) == timedelta(seconds=300)  # no overflow, however long it failed
    assert backoff(1, 0.2, 300.0) == timedelta(seconds=0.2)


def test_config_from_the_environment() -> None:
    assert DispatcherConfig.from_env({}) == DispatcherConfig()
    config = DispatcherConfig.from_env(
        {"HYPERPLAN_WEBHOOK_RETRY_BASE": "0.2", "HYPERPLAN_WEBHOOK_WORKERS": "8", "OTHER": "x"}
    )
    assert (config.retry_base, config.workers, config.timeout) == (0.2, 8, 10.0)
    for bad in ("0", "-1", "soon", "nan", "inf"):
        with pytest.raises(ValidationError, match="HYPERPLAN_WEBHOOK_TIMEOUT"):
            DispatcherConfig.from_env({"HYPERPLAN_WEBHOOK_TIMEOUT": bad})


# -- the queue on a real store -------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    box = sealed_secrets.unlock(database, tmp_path / KEY_FILE_NAME)
    with database.write() as session:
        for name in ("team", "quiet"):
            accounts.create_account(session, name, box=box, now=T0, access_key_id=f"AKHP{name.upper():0<16}")
    yield database
    database.close()


def _box(db: Database) -> SecretBox:
    """The master key the `db` fixture made beside its database file."""
    database = db.engine.url.database
    assert database is not None
    return SecretBox.load(Path(database).parent / KEY_FILE_NAME)


def _account_id(db: Database, name: str) -> str:
    with db.read() as session:
        return accounts.get_account(session, name).id


def _plan(db: Database, account: str, name: str) -> int:
    with db.write() as session:
        plan = TrainingPlan(
            account_id=_account_id(db, account),
            name=name,
            offering_id=f"offering-{name}",
            target="training-job",
            instance_type="ml.p5.48xlarge",
            status="Pending",
            upfront_fee=Decimal("1.00"),
            currency="USD",
            created_at=T0,
            updated_at=T0,
        )
        session.add(plan)
        session.flush()
        return plan.id


def _event(db: Database, plan_id: int, kind: str, minutes: int = 0) -> int:
    """What lifecycle.record does once wired: append the event and enqueue it, in one transaction."""
    with db.write() as session:
        plan = session.get(TrainingPlan, plan_id)
        assert plan is not None
        at = T0 + timedelta(minutes=minutes)
        event = PlanEvent(plan_id=plan_id, at=at, kind=kind, status="Pending", message=f"{kind} happened")
        session.add(event)
        return webhooks.enqueue(session, event, plan)


def _register(db: Database, account: str, url: str = "http://receiver.test/hook") -> webhooks.WebhookView:
    with db.write() as session:
        return webhooks.register(session, account, url, T0, targets=LOOPBACK, box=_box(db))


def test_enqueue_without_webhooks_queues_nothing(db: Database) -> None:
    plan = _plan(db, "quiet", "alone")
    _register(db, "team")
    assert _event(db, plan, "created") == 0
    with db.read() as session:
        assert session.scalars(select(WebhookDelivery)).all() == []


def test_enqueue_queues_one_delivery_per_live_webhook_of_the_account(db: Database) -> None:
    plan = _plan(db, "team", "p")
    first, second = _register(db, "team"), _register(db, "team", "https://other.test/")
    _register(db, "quiet")
    with db.write() as session:
        webhooks.delete(session, second.webhook_id, T0)
    assert _event(db, plan, "created") == 1
    with db.read() as session:
        (delivery,) = session.scalars(select(WebhookDelivery)).all()
        assert (delivery.webhook_id, delivery.plan_id, delivery.attempts) == (first.webhook_id, plan, 0)
        listed = webhooks.list_webhooks(session, "team")
        assert [(v.webhook_id, v.pending) for v in listed] == [(first.webhook_id, 1)]
        assert len(webhooks.list_webhooks(session)) == 2  # administrators see every account's


def test_register_checks_the_url_and_the_account(db: Database) -> None:
    with pytest.raises(ValidationError, match="Url"), db.write() as session:
        webhooks.register(session, "team", "gopher://old.test/", T0, targets=LOOPBACK, box=_box(db))
    with pytest.raises(ResourceNotFound, match="No account"), db.write() as session:
        webhooks.register(session, "nobody", "http://ok.test/", T0, targets=LOOPBACK, box=_box(db))
    view = _register(db, "team")
    assert view.secret is not None and view.secret.startswith("whsec_") and len(view.secret) > 40
    assert _register(db, "team").secret != view.secret
    with db.read() as session:
        row = session.get(Webhook, view.webhook_id)
        assert row is not None
        assert view.secret not in row.secret  # the row holds it sealed
        assert webhooks.signing_secret(row, _box(db)) == view.secret


# -- the dispatcher, in process ------------------------------------------------------------------------


class FakeReceivers:
    """An httpx transport standing in for receivers: fails the first N requests for chosen plans."""

    def __init__(self, fail_first: dict[str, int] | None = None) -> None:
        self.fail_first = dict(fail_first or {})
        self.requests: list[tuple[httpx.Request, int]] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        with self.lock:
            left = self.fail_first.get(body["TrainingPlanName"], 0)
            status = 503 if left > 0 else 200
            self.fail_first[body["TrainingPlanName"]] = left - 1
            self.requests.append((request, status))
        return httpx.Response(status)

    def delivered(self, plan: str) -> list[dict[str, object]]:
        with self.lock:
            bodies = [(json.loads(r.content), s) for r, s in self.requests]
        return [b for b, s in bodies if s == 200 and b["TrainingPlanName"] == plan]


def _dispatcher(db: Database, fake: FakeReceivers, now: Callable[[], datetime] = utcnow) -> Dispatcher:
    config = DispatcherConfig(retry_base=0.02, retry_max=0.05, poll=0.05, timeout=2)
    return Dispatcher(
        db,
        lambda account, resource: f"arn:aws:sagemaker:us-west-2:{account}:{resource}",
        http=lambda: httpx.Client(transport=httpx.MockTransport(fake)),
        config=config,
        now=now,
        box=_box(db),
    )


def _until(condition: object, timeout: float = 10) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_only_the_oldest_undelivered_delivery_of_a_pair_is_due(db: Database) -> None:
    a, b = _plan(db, "team", "a"), _plan(db, "team", "b")
    hook = _register(db, "team")
    for n, kind in enumerate(("created", "invoiced", "paid")):
        _event(db, a, kind, n)
    _event(db, b, "created")
    fake = FakeReceivers({"a": 1})
    frozen = datetime.now(UTC)  # real time stands still here, so the 20 ms retry cannot come due
    dispatcher = _dispatcher(db, fake, now=lambda: frozen)
    heads = dispatcher._heads()
    assert [(h.plan_id, h.webhook_id) for h in heads] == [(a, hook.webhook_id), (b, hook.webhook_id)]
    assert dispatcher.attempt(heads[0].delivery_id) is False  # 503: recorded, retried later
    assert dispatcher.attempt(heads[1].delivery_id) is True
    with db.read() as session:
        failed = session.get(WebhookDelivery, heads[0].delivery_id)
        assert failed is not None and failed.attempts == 1 and "503" in failed.last_error
        assert failed.next_attempt_at > frozen
    assert [h.delivery_id for h in dispatcher._heads()] == [heads[0].delivery_id]  # b is done; a waits


def test_the_dispatcher_delivers_in_order_per_plan_through_failures(db: Database) -> None:
    a, b = _plan(db, "team", "a"), _plan(db, "team", "b")
    hook = _register(db, "team")
    kinds = ["created", "invoiced", "paid", "scheduled", "segment-started", "segment-ended"]
    fake = FakeReceivers({"a": 3})
    dispatcher = _dispatcher(db, fake)
    dispatcher.start()
    try:
        for n, kind in enumerate(kinds):
            _event(db, a, kind, n)
            _event(db, b, kind, n)
            dispatcher.wake()
        _until(lambda: len(fake.delivered("a")) == len(kinds) and len(fake.delivered("b")) == len(kinds))
    finally:
        dispatcher.stop()
    for plan in ("a", "b"):
        bodies = fake.delivered(plan)
        assert [body["Kind"] for body in bodies] == kinds
        assert [body["At"] for body in bodies] == [f"2026-12-01T11:{30 + n}:00Z" for n in range(len(kinds))]
    assert [body["Attempt"] for body in fake.delivered("a")][:1] == [4]
    for request, _ in fake.requests:
        assert webhooks.verify(hook.secret or "", request.content, request.headers["X-Hyperplan-Signature"])
        assert request.headers["X-Hyperplan-Delivery"] == str(json.loads(request.content)["DeliveryId"])
    with db.read() as session:
        rows = session.scalars(select(WebhookDelivery)).all()
        assert all(row.delivered_at is not None for row in rows)
        assert len(rows) == 2 * len(kinds)


def test_a_deleted_webhook_is_sent_nothing_more(db: Database) -> None:
    plan = _plan(db, "team", "p")
    hook = _register(db, "team")
    _event(db, plan, "created")
    with db.write() as session:
        webhooks.delete(session, hook.webhook_id, T0)
    fake = FakeReceivers()
    dispatcher = _dispatcher(db, fake)
    assert dispatcher._heads() == []
    with db.read() as session:
        (view,) = webhooks.recent_deliveries(session, hook.webhook_id)
        assert view.status == "Abandoned"
    with pytest.raises(ResourceNotFound, match="No webhook"), db.write() as session:
        webhooks.delete(session, hook.webhook_id, T0)


def test_a_receiver_that_cannot_be_reached_is_retried_not_fatal(db: Database) -> None:
    plan = _plan(db, "team", "p")
    _register(db, "team", "http://127.0.0.1:9/nothing-listens-here")
    _event(db, plan, "created")
    dispatcher = Dispatcher(
        db,
        lambda a, r: f"arn:{a}:{r}",
        config=DispatcherConfig(retry_base=30, timeout=2),
        targets=LOOPBACK,
        box=_box(db),
    )
    (head,) = dispatcher._heads()
    assert dispatcher.attempt(head.delivery_id) is False
    with db.read() as session:
        delivery = session.get(WebhookDelivery, head.delivery_id)
        assert delivery is not None and delivery.attempts == 1 and delivery.delivered_at is None
        assert "Connect" in delivery.last_error
        assert delivery.next_attempt_at - datetime.now(UTC) > timedelta(seconds=25)
    assert dispatcher.dispatch_due() > 0  # nothing due: it only says how long to sleep
