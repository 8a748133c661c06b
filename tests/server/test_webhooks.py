"""Webhooks: a receiver on loopback gets a plan's whole life, in order and signed; a failing receiver
gets everything later; a slow one delays no transition; a restart loses nothing.

The rules run on in-process servers (tests/inprocess.py); the crash and the graceful stop on real ones.
No test sleeps for a fixed time: each waits on the event itself (a request arriving, the server counting
every delivery delivered, a witness webhook served), and a slow receiver is one the test holds."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.services.webhooks.webhooks import verify
from hyperplan.signing import Credentials
from tests.harness import Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"


# -- a receiver on loopback -------------------------------------------------------------------------


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    answered: int
    at: float

    @property
    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """An HTTP server in a thread that records every POST; `fail_first` answers 500, `delay` sleeps, and
    while `gate` is given and not set, each request waits for it (at most a minute) before it is answered."""

    fail_first: int = 0
    delay: float = 0.0
    gate: threading.Event | None = None
    port: int = 0
    arrived: int = 0  # requests whose body has been read, answered or not
    requests: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.arrived += 1
                if receiver.gate is not None:
                    receiver.gate.wait(60)
                if receiver.delay:
                    time.sleep(receiver.delay)
                with receiver._lock:
                    status = 500 if len(receiver.requests) < receiver.fail_first else 204
                    receiver.requests.append(Received(dict(self.headers), body, status, time.monotonic()))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/hyperplan"

    def accepted(self) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if r.answered < 300]


@pytest.fixture
def receivers() -> Iterator[Callable[..., Receiver]]:
    started: list[Receiver] = []

    def make(**options: Any) -> Receiver:
        receiver = Receiver(**options).start()
        started.append(receiver)
        return receiver

    yield make
    for receiver in started:
        receiver.stop()


FAST_RETRIES = {"HYPERPLAN_WEBHOOK_RETRY_BASE": "0.2", "HYPERPLAN_WEBHOOK_RETRY_MAX": "1"}
"""Retries after 0.2 s, 0.4 s, ... at most 1 s (real time)."""


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    # A request may take a minute: a receiver the test holds is not given up on and sent it again.
    env = {**FAST_RETRIES, "HYPERPLAN_WEBHOOK_TIMEOUT": "60"}
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET, env=env).start()


@pytest.fixture
def real_small(server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    for name, value in FAST_RETRIES.items():
        monkeypatch.setenv(name, value)
    return server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


# -- helpers ----------------------------------------------------------------------------------------


def _buy(server: Server, credentials: Credentials, name: str, **search: Any) -> dict[str, Any]:
    client = server.sagemaker(credentials)
    request = {"InstanceType": P5, "TargetResources": ["training-job"], **search}
    offering = client.search_training_plan_offerings(**request)["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return offering


def _register(server: Server, account: str, receiver: Receiver) -> dict[str, Any]:
    hook = server.native().post("/api/v1/webhooks", {"Account": account, "Url": receiver.url})
    assert hook["Secret"] and hook["Url"] == receiver.url
    return dict(hook)


def _history(server: Server, account: str, plan: str) -> list[dict[str, Any]]:
    return list(server.native().get(f"/api/v1/plans/{plan}/events", account=account)["Events"])


def _wait_for(receiver: Receiver, count: int, timeout: float) -> list[Received]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        accepted = receiver.accepted()
        if len(accepted) >= count:
            return accepted
        time.sleep(0.05)
    raise AssertionError(f"{len(receiver.accepted())} of {count} deliveries after {timeout}s")


def _all_delivered(server: Server, hook: dict[str, Any], count: int) -> list[dict[str, Any]]:
    """Wait until the server counts `count` deliveries of `hook`, all Delivered: from then on it sends
    that webhook nothing more, and every request it sent has reached the receiver."""
    path = f"/api/v1/webhooks/{hook['WebhookId']}/deliveries"

    def delivered() -> list[dict[str, Any]]:
        deliveries = list(server.native().get(path)["Deliveries"])
        done = len(deliveries) == count and all(d["Status"] == "Delivered" for d in deliveries)
        return deliveries if done else []

    deliveries = wait_until(delivered, timeout=30)
    assert deliveries, server.native().get(path)["Deliveries"]
    return deliveries


def _assert_signed_and_in_order(
    received: list[Received], secret: str, history: list[dict[str, Any]], plan: str
) -> None:
    """Every accepted request is signed, names its delivery and event, and they are the plan's history."""
    bodies = [r.json for r in received]
    for request, body in zip(received, bodies, strict=True):
        assert verify(secret, request.body, request.headers["X-Hyperplan-Signature"])
        assert not verify(secret, request.body + b" ", request.headers["X-Hyperplan-Signature"])
        assert request.headers["X-Hyperplan-Event"] == body["Kind"]
        assert request.headers["X-Hyperplan-Delivery"] == str(body["DeliveryId"])
        assert request.headers["Content-Type"] == "application/json"
        assert body["TrainingPlanName"] == plan
        assert body["TrainingPlanArn"].endswith(f":{body['AccountId']}:training-plan/{plan}")
    ids = [b["EventId"] for b in bodies]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [(b["Kind"], b["Status"], b["Message"], b["At"]) for b in bodies] == [
        (e["Kind"], e["Status"], e["Message"], e["At"]) for e in history
    ]


# -- the cases --------------------------------------------------------------------------------------


def test_a_receiver_gets_a_plans_whole_life_in_order_and_signed(
    small: Server, receivers: Callable[..., Receiver]
) -> None:
    """A two-segment plan paid on approval, walked through both segments to Expired."""
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    blocker = small.new_account("blocker")
    owner = small.new_account("owner", PaymentMode="approval")
    receiver = receivers()
    created = json.loads(small.cli("webhooks", "add", "owner", receiver.url, "--json").stdout)
    secret = created["Secret"]
    other = _register(small, "blocker", receivers())  # another account's webhook sees none of owner's
    _buy(
        small,
        blocker,
        "block",
        InstanceCount=8,
        DurationHours=48,
        StartTimeAfter=start + timedelta(days=1),
        EndTimeBefore=start + timedelta(days=3),
    )
    _buy(
        small,
        owner,
        "walk",
        InstanceCount=8,
        DurationHours=48,
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=4),
    )
    invoice = small.native().get("/api/v1/invoices", account="owner", status="Pending")["Invoices"][0]
    small.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    for moment in (
        start,
        start + timedelta(days=1),
        start + timedelta(days=3, hours=1),
        start + timedelta(days=5),
    ):
        small.set_clock(moment)
    history = _history(small, "owner", "walk")
    assert history[-1]["Status"] == "Expired"
    kinds = [e["Kind"] for e in history]
    assert kinds.count("segment-started") == 2 and kinds.count("segment-ended") == 2

    received = _wait_for(receiver, len(history), timeout=30)
    _all_delivered(small, created, len(history))  # nothing more will come
    assert len(receiver.requests) == len(history)  # and nothing came twice
    _assert_signed_and_in_order(received, secret, history, "walk")
    assert all(r.json["Attempt"] == 1 for r in received)
    assert all(r.json["AccountId"] == created["AccountId"] for r in received)

    listed = json.loads(small.cli("webhooks", "list", "--account", "owner", "--json").stdout)
    assert [(h["WebhookId"], h["PendingDeliveries"]) for h in listed] == [(created["WebhookId"], 0)]
    assert {h["WebhookId"] for h in small.native().get("/api/v1/webhooks")["Webhooks"]} == {
        created["WebhookId"],
        other["WebhookId"],
    }
    shown = json.loads(small.cli("webhooks", "deliveries", str(created["WebhookId"]), "--json").stdout)
    assert [d["Status"] for d in shown["Deliveries"]] == ["Delivered"] * len(history)
    assert [d["Kind"] for d in reversed(shown["Deliveries"])] == kinds


def test_a_receiver_that_fails_at_first_gets_every_event_later_in_order(
    small: Server, receivers: Callable[..., Receiver]
) -> None:
    receiver = receivers(fail_first=3)
    team = small.new_account("flaky-team")
    hook = _register(small, "flaky-team", receiver)
    offering = _buy(small, team, "flaky", InstanceCount=2, DurationHours=24)
    small.set_clock(offering["ReservedCapacityOfferings"][0]["EndTime"])
    history = _history(small, "flaky-team", "flaky")
    assert history[-1]["Status"] == "Expired"

    received = _wait_for(receiver, len(history), timeout=30)
    _assert_signed_and_in_order(received, hook["Secret"], history, "flaky")
    # The first event was tried until it got through, and nothing overtook it meanwhile.
    first = [r.json for r in receiver.requests[:4]]
    assert [b["EventId"] for b in first] == [first[0]["EventId"]] * 4
    assert [b["Attempt"] for b in first] == [1, 2, 3, 4]
    assert [r.answered for r in receiver.requests[:4]] == [500, 500, 500, 204]
    # The receiver has answered the last event, but the server records that answer a moment later.
    deliveries = _all_delivered(small, hook, len(history))
    oldest = deliveries[-1]
    assert (oldest["Status"], oldest["Attempts"]) == ("Delivered", 4)
    assert "500" in oldest["LastError"]
    assert all(d["Attempts"] == 1 for d in deliveries[:-1])


def test_a_slow_receiver_delays_no_transition(small: Server, receivers: Callable[..., Receiver]) -> None:
    """The slow receiver holds its first request until the test lets it go: the plan's transitions
    happen on time regardless, a fast webhook of the same account is served meanwhile, and the slow one
    gets everything in the end."""
    held = threading.Event()
    slow, fast = receivers(gate=held), receivers()
    team = small.new_account("patient-team")
    slow_hook, fast_hook = _register(small, "patient-team", slow), _register(small, "patient-team", fast)
    client = small.sagemaker(team)

    offering = _buy(small, team, "slowpoke", InstanceCount=2, DurationHours=24)
    assert wait_until(lambda: slow.arrived >= 1, timeout=30), "the slow receiver was sent nothing"
    segment = offering["ReservedCapacityOfferings"][0]
    for moment, status in (
        (segment["StartTime"], "Active"),
        (segment["StartTime"] + timedelta(hours=12), "Active"),
        (segment["EndTime"], "Expired"),
    ):
        moved = time.monotonic()
        small.native().post("/api/v1/clock/set", {"Time": moment.isoformat()})
        # A move that waited on the held receiver would wait until the test lets it go.
        assert time.monotonic() - moved < 5, "a clock move waited on a webhook receiver"
        assert client.describe_training_plan(TrainingPlanName="slowpoke")["Status"] == status
    history = _history(small, "patient-team", "slowpoke")
    assert slow.accepted() == [], "the plan's life waited for the slow receiver"

    _assert_signed_and_in_order(
        _wait_for(fast, len(history), timeout=5), fast_hook["Secret"], history, "slowpoke"
    )
    assert slow.accepted() == [], "the fast webhook waited for the slow one"
    held.set()
    received = _wait_for(slow, len(history), timeout=30)
    _assert_signed_and_in_order(received, slow_hook["Secret"], history, "slowpoke")


def test_pending_deliveries_survive_a_crash_and_are_sent_after_restart(
    real_small: Server, receivers: Callable[..., Receiver]
) -> None:
    small = real_small
    receiver = receivers()
    receiver.stop()  # keep its port, answer nothing: every attempt is refused
    team = small.new_account("restart-team")
    hook = _register(small, "restart-team", receiver)
    offering = _buy(small, team, "durable", InstanceCount=2, DurationHours=24)
    small.set_clock(offering["ReservedCapacityOfferings"][0]["StartTime"])
    history = _history(small, "restart-team", "durable")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the first delivery has been tried and refused at least once
        deliveries = small.native().get(f"/api/v1/webhooks/{hook['WebhookId']}/deliveries")["Deliveries"]
        if deliveries[-1]["Attempts"] >= 1:
            break
        time.sleep(0.1)
    assert len(deliveries) == len(history)
    assert all(d["Status"] in ("Pending", "Retrying") for d in deliveries)
    assert deliveries[-1]["LastError"] and deliveries[-1]["Status"] == "Retrying"

    small.kill()
    receiver.start()  # on the same port
    small.restart()
    received = _wait_for(receiver, len(history), timeout=30)
    _assert_signed_and_in_order(received, hook["Secret"], history, "durable")
    assert received[0].json["Attempt"] >= 2


def test_webhook_administration(small: Server, receivers: Callable[..., Receiver]) -> None:
    receiver, witness = receivers(), receivers()
    team = small.new_account("admin-team")
    for url in ("ftp://example.com/hook", "example.com/hook", "http://", "http://exa mple.com/"):
        with pytest.raises(ApiError) as refused:
            small.native().post("/api/v1/webhooks", {"Account": "admin-team", "Url": url})
        assert refused.value.code == "ValidationException" and "Url" in refused.value.message
    with pytest.raises(ApiError) as missing:
        small.native().post("/api/v1/webhooks", {"Account": "nobody", "Url": receiver.url})
    assert missing.value.code == "ResourceNotFound"
    with pytest.raises(ApiError) as denied:
        small.native(team).post("/api/v1/webhooks", {"Account": "admin-team", "Url": receiver.url})
    assert denied.value.code == "AccessDeniedException"

    hook = _register(small, "admin-team", receiver)
    assert "Secret" not in small.native().get("/api/v1/webhooks", account="admin-team")["Webhooks"][0]
    removed = small.cli("webhooks", "remove", str(hook["WebhookId"]))
    assert "deleted" in removed.stdout
    assert small.native().get("/api/v1/webhooks", account="admin-team")["Webhooks"] == []
    witnessing = _register(small, "admin-team", witness)
    _buy(small, team, "unheard", InstanceCount=1, DurationHours=24)
    # Once the account's remaining webhook has had every event, the deleted one had its chance.
    _all_delivered(small, witnessing, len(_history(small, "admin-team", "unheard")))
    assert receiver.requests == []  # a deleted webhook is sent nothing
    again = small.cli("webhooks", "remove", str(hook["WebhookId"]), check=False)
    assert again.returncode == 1 and "ResourceNotFound" in again.stderr


def test_a_graceful_stop_finishes_the_request_in_flight_and_sends_the_rest_after(
    real_small: Server, receivers: Callable[..., Receiver]
) -> None:
    small = real_small
    receiver = receivers(delay=2.0)
    team = small.new_account("stopping-team")
    hook = _register(small, "stopping-team", receiver)
    _buy(small, team, "interrupted", InstanceCount=1, DurationHours=24)
    history = _history(small, "stopping-team", "interrupted")
    assert wait_until(lambda: receiver.arrived >= 1, timeout=30)  # in flight, its receiver sleeping

    stopping = time.monotonic()
    assert small.stop() == 0
    assert time.monotonic() - stopping < 10, "a stop waited on more than the request in flight"
    assert len(receiver.accepted()) == 1  # answered during the stop, and recorded: not sent again
    receiver.delay = 0.0
    small.restart()
    received = _wait_for(receiver, len(history), timeout=30)
    _all_delivered(small, hook, len(history))  # nothing more will come
    assert len(receiver.requests) == len(history)  # and nothing came twice
    _assert_signed_and_in_order(received, hook["Secret"], history, "interrupted")
