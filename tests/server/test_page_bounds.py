"""A plan's events and the audit trail come a page of at most 1 MiB at a time (issue 42;
core/page_bytes.py), every item once across the pages.

Both can pass the bound: a plan's history only grows, and a message or an audit record's detail may
carry a person's text (a cancellation's reason, up to 1,024 characters). So the test writes many such
items with the services' own recorders (a thousand cancellations would take a thousand plans) and reads
them through the native API, the CLI and the console's page, on an in-process server.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from hyperplan.core.page_bytes import MAX_PAGE_BYTES
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views, audit_views
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import TrainingPlan
from tests.harness import ADMIN
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
REASON = "é" * 1024  # the longest reason a cancellation takes, of a two-byte character: 2 KiB


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


def _context(server: InProcessServer) -> ServiceContext:
    assert server.runtime is not None
    return server.runtime.context


def _buy(server: InProcessServer, who: Any, name: str) -> None:
    client = server.sagemaker(who)
    offering = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )


def _event_weight(event: dict[str, Any]) -> int:
    """What an event weighs on a page (services/orchestration/account_views.py): its message's bytes and
    256."""
    return len(event["Message"].encode()) + account_views.PLAN_EVENT_OVERHEAD


def test_a_plans_events_come_a_page_of_at_most_1_mib_and_the_cli_reads_them_all(
    small: InProcessServer,
) -> None:
    team = small.new_account("team")
    _buy(small, team, "noisy")
    runtime = _context(small)
    with runtime.db.write() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "noisy")).one()
        for n in range(1500):
            lifecycle.record(session, plan, "note", f"{n:05d} {REASON}", runtime.clock.now())
    client = small.native(team)
    events: list[dict[str, Any]] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = client.get("/api/v1/plans/noisy/events", cursor=cursor)
        assert sum(_event_weight(event) for event in page["Events"]) <= MAX_PAGE_BYTES
        assert len(page["Events"]) <= account_views.PLAN_EVENTS_PAGE
        events += page["Events"]
        pages += 1
        if "NextCursor" not in page:
            break
        cursor = page["NextCursor"]
    notes = [event["Message"] for event in events if event["Kind"] == "note"]
    assert notes == [f"{n:05d} {REASON}" for n in range(1500)] and pages == 4
    assert events[0]["Kind"] != "note"  # the purchase's events come first, as they were written
    # The CLI follows the pages: the whole history, oldest first.
    listed = json.loads(small.cli("plans", "events", "noisy", "--json", credentials=team).stdout)
    assert [event["Message"] for event in listed["Events"]] == [event["Message"] for event in events]
    # The console's plan page shows the newest page, and says how many came before it.
    caller = Caller(client.get("/api/v1/whoami")["AccountId"], "team", False, team.access_key)
    newest = account_views.plan_events(runtime, caller, None, "noisy", start=None)
    weights = [len(e.message.encode()) + account_views.PLAN_EVENT_OVERHEAD for e in newest.events]
    assert sum(weights) <= MAX_PAGE_BYTES < sum(weights) + weights[0]  # one more would not fit
    assert newest.events[-1].message == notes[-1] and newest.before + len(newest.events) == len(events)
    assert newest.next_cursor is None


def test_the_audit_trail_comes_a_page_of_at_most_1_mib_and_goes_on_before_its_first_record(
    small: InProcessServer,
) -> None:
    runtime = _context(small)
    with runtime.db.write() as session:
        start = runtime.clock.now()
        for n in range(1200):
            at = start + timedelta(seconds=n // 2)  # pairs written at the same instant: ties by id
            audit.record(session, at, None, "plan.cancel", target=f"plan {n}", detail={"Reason": REASON})
    admin = small.native(ADMIN)
    targets: list[str] = []
    asked: dict[str, Any] = {"since": start.isoformat()}
    pages = 0
    while True:
        page = admin.get("/api/v1/audit", **asked)
        weight = sum(_record_weight(record) for record in page["Events"])
        assert weight <= MAX_PAGE_BYTES and len(page["Events"]) <= 1000
        targets[:0] = [record["Target"] for record in page["Events"]]  # each page before the last read
        pages += 1
        if not page["Truncated"]:
            break
        asked["before"] = page["Events"][0]["Id"]
    assert targets == [f"plan {n}" for n in range(1200)] and pages == 3
    # The CLI shows a page too, and says how to ask for the one before it.
    newest = small.cli("audit", "list", "--since", start.isoformat())
    first = admin.get("/api/v1/audit", since=start.isoformat())["Events"][0]
    assert f"Older records: --before {first['Id']}" in newest.stderr
    older = json.loads(small.cli("audit", "list", "--before", str(first["Id"]), "--json").stdout)
    before_first = targets[targets.index(first["Target"]) - 1]
    assert older[-1]["Target"] == before_first  # the page before ends right before it


def _record_weight(record: dict[str, Any]) -> int:
    """What a record weighs on a page (services/orchestration/audit_views.py), from the answer's fields."""
    actor = record["Actor"] or {}
    texts = [
        record["Action"],
        actor.get("AccountName", ""),
        actor.get("UserName", ""),
        actor.get("AccessKeyId", ""),
        record["RemoteAddress"],
        record["AccountId"] or "",
        record["AccountName"],
        record["Target"],
        json.dumps(record["Detail"], ensure_ascii=False),
    ]
    return sum(len(text.encode()) for text in texts) + audit_views.AUDIT_OVERHEAD
