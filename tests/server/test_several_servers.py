"""Several `hyperplan serve` processes on one PostgreSQL database (services/runtime/leadership.py): any of
them answers any request, nothing is ever booked above a pool's capacity, and the leader's death hands its
work to another with nothing lost or run twice. Real servers, real client processes; the manual clock."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text

from hyperplan.services.accounts import work_root
from hyperplan.store import settings
from hyperplan.store.schema import ScheduledEvent
from tests.harness import ADMIN, Server, service_now
from tests.postgres import PostgresServer
from tests.server.test_rate_limits import SHARED_BURST, limited_account, searches
from tests.server.test_webhooks import Receiver, _assert_signed_and_in_order, _buy, _history, _register

pytestmark = pytest.mark.postgres

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
RESERVABLE = {("ml.p5.48xlarge", "us-west-2a"): 8, ("ml.p5.48xlarge", "us-west-2b"): 4}
ROOT = Path(__file__).parents[2]
CLIENTS = 16


def _servers(server_factory: type[Server], data_dir: Path, url: str, count: int, *extra: str) -> list[Server]:
    """`count` servers on one database and one data directory (the local back end's work lives there);
    the first alone first, so that it makes the key file and the administrator."""
    first = server_factory(data_dir=data_dir, fleet=SMALL_FLEET, database_url=url, extra_args=extra).start()
    others = [
        server_factory(data_dir=data_dir, fleet=SMALL_FLEET, database_url=url, extra_args=extra)
        for _ in range(count - 1)
    ]
    for server in others:
        server.start()
    return [first, *others]


def _peaks(url: str) -> dict[tuple[str, str], int]:
    """An independent sweep of what the store holds: at every boundary, each pool's held instances."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    'SELECT instance_type, availability_zone, start, COALESCE(released_at, "end"), count '
                    "FROM reserved_capacities WHERE holds_capacity "
                    'UNION ALL SELECT instance_type, availability_zone, start, "end", count '
                    "FROM plan_extensions WHERE holds_capacity"
                )
            ).all()
    finally:
        engine.dispose()
    peaks: dict[tuple[str, str], int] = defaultdict(int)
    for moment in sorted({row[2] for row in rows}):
        held: dict[tuple[str, str], int] = defaultdict(int)
        for kind, zone, start, end, count in rows:
            if start <= moment < end:
                held[(kind, zone)] += count
        for pool, count in held.items():
            peaks[pool] = max(peaks[pool], count)
    return peaks


def test_sixteen_clients_over_three_servers_never_overbook(
    server_factory: type[Server], tmp_path: Path, postgres_server: PostgresServer
) -> None:
    url = postgres_server.new_database()
    servers = _servers(server_factory, tmp_path / "data", url, 3)
    accounts = [(f"racer-{n}", servers[0].new_account(f"racer-{n}")) for n in range(CLIENTS)]
    clients = []
    for number, (name, credentials) in enumerate(accounts):
        task = {
            "number": number,
            "url": servers[number % 3].url,
            "key": credentials.access_key,
            "secret": credentials.secret_key,
            "admin": [ADMIN.access_key, ADMIN.secret_key],
            "account": name,
        }
        clients.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.server.race_client", json.dumps(task)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    sweeps: list[dict[tuple[str, str], int]] = []
    while any(client.poll() is None for client in clients):  # sweeps while the race runs
        sweeps.append(_peaks(url))
        time.sleep(0.2)
    results = []
    for client in clients:
        out, err = client.communicate(timeout=300)
        assert client.returncode == 0, err
        results.append(json.loads(out))
    sweeps.append(_peaks(url))
    for peaks in sweeps:
        for pool, peak in peaks.items():
            assert peak <= RESERVABLE[pool], (pool, peak)
    bought = [(accounts[n][1], arn) for n, result in enumerate(results) for arn in result["bought"]]
    refused = [code for result in results for code in result["refused"]]
    assert bought and refused, (bought, refused)  # the race collided, and some won
    assert "InternalFailure" not in refused
    assert any(result["extended"] for result in results)
    assert any(result["cancelled"] for result in results)
    for server in servers:  # every acknowledged plan, on every server
        for credentials, arn in bought:
            plan = server.sagemaker(credentials).describe_training_plan(TrainingPlanName=arn)
            assert plan["TrainingPlanArn"] == arn


def test_an_account_s_rate_limit_holds_across_servers(
    server_factory: type[Server], tmp_path: Path, postgres_server: PostgresServer
) -> None:
    """One bucket per (account, class) in the database (services/runtime/rate_limiter.py), leased by each
    server."""
    servers = _servers(server_factory, tmp_path / "data", postgres_server.new_database(), 2)
    # All of an account's requests to one server: the account's whole burst there, not half.
    steady = servers[0].sagemaker(limited_account(servers[0], "steady"))
    assert searches(steady, SHARED_BURST + 2) == ["ok"] * SHARED_BURST + ["ThrottlingException"] * 2
    # Taking turns over both servers: the same burst between them, no more.
    spread = limited_account(servers[1], "spread")
    clients = [server.sagemaker(spread) for server in servers]
    outcomes = [searches(clients[n % 2], 1)[0] for n in range(3 * SHARED_BURST)]
    assert outcomes.count("ok") == SHARED_BURST, outcomes
    assert set(outcomes[SHARED_BURST:]) == {"ThrottlingException"}  # the other server's empty bucket too


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver().start()
    yield started
    started.stop()


def test_the_leaders_death_hands_its_work_over_with_nothing_lost_or_doubled(
    server_factory: type[Server],
    tmp_path: Path,
    postgres_server: PostgresServer,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYPERPLAN_WEBHOOK_RETRY_BASE", "0.2")
    url = postgres_server.new_database()
    leader, follower = _servers(server_factory, tmp_path / "data", url, 2, "--leader-lease", "2")
    team = follower.new_account("team")
    hook = _register(follower, "team", receiver)
    start = service_now(follower)
    for name, count in (("one", 2), ("two", 4)):
        _buy(follower, team, name, InstanceCount=count, DurationHours=24)
    leader.kill()  # SIGKILL while its lease runs; the events of both plans are due at the move below
    moved: dict[str, Any] = {}

    def move() -> None:
        target = start + timedelta(days=5)
        moved.update(follower.native().post("/api/v1/clock/set", {"Time": target.isoformat()}))

    mover = threading.Thread(target=move)
    mover.start()
    mover.join(timeout=300)  # asked of the leader: carried out once the follower took the lease over
    assert moved["EventsRun"] > 0
    assert datetime.fromisoformat(moved["Now"]) == start + timedelta(days=5)
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            due = start + timedelta(days=5)
            pending = connection.execute(
                select(func.count())
                .select_from(ScheduledEvent)
                .where(ScheduledEvent.done.is_(False), ScheduledEvent.due_at <= due)
            ).scalar_one()
            holder = connection.execute(text("SELECT holder FROM leases WHERE name = 'leader'")).scalar_one()
            store_id = connection.execute(
                text("SELECT value FROM settings WHERE key = :key"), {"key": settings.STORE_ID}
            ).scalar_one()
    finally:
        engine.dispose()
    # One store, one work root: both servers started on it, and its marker names their store.
    assert leader.work_dir == follower.work_dir and work_root.owner_of(follower.work_dir) == store_id
    assert pending == 0  # every due event ran
    assert holder.split(":")[1] == str(follower.process.pid if follower.process else "")
    for name in ("one", "two"):
        history = _history(follower, "team", name)
        transitions = [(event["Kind"], event["At"], event["Message"]) for event in history]
        assert len(transitions) == len(set(transitions)), transitions  # no transition twice
        assert history[-1]["Status"] == "Expired"
    deliveries_path = f"/api/v1/webhooks/{hook['WebhookId']}/deliveries"

    def all_delivered() -> bool:
        found = follower.native().get(deliveries_path)["Deliveries"]
        return bool(found) and all(d["Status"] == "Delivered" for d in found)

    deadline = time.monotonic() + 60
    while not all_delivered() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all_delivered()
    for name in ("one", "two"):
        # At least once (docs/WEBHOOKS.md): a delivery the leader sent but had not recorded when it was
        # killed is sent again by the next; the receiver keeps the first of each DeliveryId.
        received, seen = [], set()
        for request in receiver.accepted():
            body = request.json
            if body["TrainingPlanName"] == name and body["DeliveryId"] not in seen:
                seen.add(body["DeliveryId"])
                received.append(request)
        _assert_signed_and_in_order(received, hook["Secret"], _history(follower, "team", name), name)
