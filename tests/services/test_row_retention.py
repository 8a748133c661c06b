"""The retention of rows (services/orchestration/row_retention.py, metering_compaction.py) on a real
SQLite store under a manual clock: once the fleet's ``[retention]`` periods have passed, an ended plan's
status events and done timed events, old audit rows, untouched rate buckets and done timed events of
other subjects go; a live plan's rows stay, and so does whatever is younger than its period; a holder's
hourly on-demand ledger lines become one line a day with the same total, and the monthly books of every
day say the same as before; a second pass changes nothing. Bad periods are refused naming their key."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.jobs import AttemptState
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.rate_limits import RateLimit, RequestClass
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import metering
from hyperplan.services.orchestration import metering_compaction, row_retention
from hyperplan.services.plans import plans, usage
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.rate_limiter import SharedBuckets
from hyperplan.store.schema import (
    AuditEvent,
    Invoice,
    LedgerEntry,
    RateBucket,
    ReservedCapacity,
    ScheduledEvent,
    StatusEvent,
    TrainingJob,
    TrainingPlan,
)
from tests.services.running import P5, ZONE, application, new_account, one_pool_fleet

FLEET = one_pool_fleet(8, reservable=4, more='on_demand_price_per_instance_hour = "41.37"')
RETENTION = '\n[retention]\nevents = "1d"\naudit = "1d"\nleases = "1h"\nmetering = "1d"\n'
START = datetime(2030, 1, 1, 9, 30, tzinfo=UTC)  # the meter's hours start at half past: days are cut
DAY = timedelta(days=1)
METERED = timedelta(hours=72) - timedelta(minutes=1)  # 15 hours on Jan 1, 24 on Jan 2 and 3, 9 on Jan 4
PASS_AT = START + 6 * DAY  # Jan 7, 09:30: every metered day ended more than a day before
WALL = PASS_AT.timestamp()  # the real time the pass is told, chosen like the service clock


@dataclass(frozen=True)
class Store:
    runtime: ServiceContext  # with the [retention] periods above
    caller: Caller
    ended_plan: int
    live_plan: int


def _buy(runtime: ServiceContext, caller: Caller, name: str, hours: int) -> int:
    offering = plans.search(runtime, caller, SearchRequest(P5, 1, hours, "training-job"))[0]
    plans.create(runtime, caller, name, offering.offering_id)
    with runtime.db.read() as session:
        return session.scalars(select(TrainingPlan.id).where(TrainingPlan.name == name)).one()


def _metered_job(runtime: ServiceContext, caller: Caller) -> str:
    """A training job without a plan holding 2 on-demand instances from START, metered: its holder."""
    pool = runtime.fleet.pools_of_type(P5)[0]
    now = runtime.clock.now()
    with runtime.db.write() as session:
        job = TrainingJob(
            account_id=caller.account_id,
            name="on-demand-job",
            instance_type=P5,
            instance_count=2,
            availability_zone=ZONE,
            status="InProgress",
            secondary_status="Training",
            request=json.dumps({"TrainingJobName": "on-demand-job"}),
            created_at=now,
            updated_at=now,
            attempt=1,
            attempt_state=AttemptState.RUNNING,
        )
        session.add(job)
        session.flush()
        holder = metering.job_holder(job)
        metering.start(session, caller.account_id, holder, job.name, pool, 2, now)
        return holder


def _end_job(runtime: ServiceContext, holder: str) -> None:
    with runtime.db.write() as session:
        job = session.scalars(select(TrainingJob)).one()
        job.attempt_state = AttemptState.ENDED
        metering.stop(session, holder, runtime.clock.now())


def _lease_at(runtime: ServiceContext, account_id: str, request_class: RequestClass, wall: float) -> None:
    SharedBuckets(runtime.db, clock=lambda: wall).lease(account_id, request_class, RateLimit(1.0, 10), 1)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    # Only opened: no worker runs; the test moves the clock and runs the passes itself.
    with application(tmp_path, FLEET, clock_start=START, start=False) as app:
        runtime = app.context
        runtime.calendar.load(runtime.db)
        events = app.workers.events
        caller = new_account(runtime, "vision")
        with runtime.db.write() as session:
            audit.record(session, START, None, "account.note", account_id=caller.account_id, target="old")
        ended_plan = _buy(runtime, caller, "short-plan", 24)
        holder = _metered_job(runtime, caller)
        events.advance_to(START + METERED)
        _end_job(runtime, holder)
        live_plan = _buy(runtime, caller, "long-plan", 24 * 7)
        events.advance_to(PASS_AT)
        with runtime.db.write() as session:
            audit.record(session, PASS_AT, None, "account.note", account_id=caller.account_id, target="new")
        _lease_at(runtime, caller.account_id, RequestClass.READ, WALL - 7200)  # untouched for 2 hours
        _lease_at(runtime, caller.account_id, RequestClass.WRITE, WALL - 60)
        retention = parse_fleet(FLEET + RETENTION).retention
        with_periods = dataclasses.replace(
            runtime, fleet=dataclasses.replace(runtime.fleet, retention=retention)
        )
        yield Store(with_periods, caller, ended_plan, live_plan)


def _pass(store: Store) -> row_retention.RowPass:
    return row_retention.run_once(store.runtime, wall=lambda: WALL)


def _plan_rows(store: Store, plan_id: int) -> tuple[int, int]:
    """The plan's status events (of its segments and invoices) and its done timed events."""
    with store.runtime.db.read() as session:
        segments = select(ReservedCapacity.id).where(ReservedCapacity.plan_id == plan_id)
        invoices = select(Invoice.id).where(Invoice.plan_id == plan_id)
        status_events = session.scalar(
            select(func.count()).where(
                ((StatusEvent.entity_kind == "reserved-capacity") & StatusEvent.entity_id.in_(segments))
                | ((StatusEvent.entity_kind == "invoice") & StatusEvent.entity_id.in_(invoices))
            )
        )
        done = session.scalar(
            select(func.count()).where(ScheduledEvent.subject == str(plan_id), ScheduledEvent.done.is_(True))
        )
        return status_events or 0, done or 0


def _ledger(store: Store) -> list[tuple[datetime, Decimal, str]]:
    with store.runtime.db.read() as session:
        rows = session.execute(
            select(LedgerEntry.at, LedgerEntry.amount, LedgerEntry.description).order_by(LedgerEntry.id)
        )
        return [(row.at, row.amount, row.description) for row in rows]


def _on_demand_paid_per_day(store: Store) -> dict[datetime, Decimal]:
    paid: dict[datetime, Decimal] = {}
    for at, amount, description in _ledger(store):
        if description.startswith("On-demand "):
            day = datetime(at.year, at.month, at.day, tzinfo=UTC)
            paid[day] = paid.get(day, Decimal(0)) + amount
    return paid


def _books_per_day(store: Store) -> list[tuple[str, Decimal, float]]:
    """The monthly books of each day from Jan 1 to Jan 7, one window a day: what was paid, reserved."""
    books = []
    for day in (START.replace(hour=0, minute=0) + n * DAY for n in range(7)):
        rows = usage.monthly_usage(store.runtime, store.caller, account_ref=None, start=day, end=day + DAY)
        books += [(row.month, row.paid, row.reserved_instance_hours) for row in rows]
    return books


def _statuses(store: Store) -> tuple[str, str]:
    with store.runtime.db.read() as session:
        ended = session.get(TrainingPlan, store.ended_plan)
        live = session.get(TrainingPlan, store.live_plan)
        assert ended is not None and live is not None
        return ended.status, live.status


def _count(store: Store, model: type, *where: object) -> int:
    with store.runtime.db.read() as session:
        return session.scalar(select(func.count()).select_from(model).where(*where)) or 0  # type: ignore[arg-type]


def test_old_rows_go_live_and_recent_ones_stay_the_ledger_keeps_its_totals_and_a_second_pass_does_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(row_retention, "BATCH", 5)  # several transactions for each kind
    monkeypatch.setattr(metering_compaction, "BATCH_LINES", 30)
    assert _statuses(store) == (PlanStatus.EXPIRED, PlanStatus.ACTIVE)
    ended_before, live_before = _plan_rows(store, store.ended_plan), _plan_rows(store, store.live_plan)
    assert ended_before[0] > 0 and ended_before[1] > 0 and live_before[0] > 0 and live_before[1] > 0
    pending_before = _count(store, ScheduledEvent, ScheduledEvent.done.is_(False))
    hourly = [line for line in _ledger(store) if ", hour " in line[2]]
    assert len(hourly) == 72
    paid_before, books_before = _on_demand_paid_per_day(store), _books_per_day(store)
    daily_before = usage.usage(store.runtime, store.caller, account_ref=None, start=START - DAY, end=PASS_AT)
    total_before = sum(amount for _, amount, _ in _ledger(store))

    done = _pass(store)

    assert _plan_rows(store, store.ended_plan) == (0, 0)
    assert _plan_rows(store, store.live_plan) == live_before  # a live plan's rows stay, old as they are
    assert _count(store, ScheduledEvent, ScheduledEvent.kind == metering.METER_EVENT) == 0  # all done, old
    assert _count(store, ScheduledEvent, ScheduledEvent.done.is_(False)) == pending_before
    with store.runtime.db.read() as session:
        assert list(session.scalars(select(AuditEvent.target))) == ["new"]
        assert list(session.scalars(select(RateBucket.request_class))) == [RequestClass.WRITE.value]
    compacted = [line for line in _ledger(store) if line[2].startswith("On-demand ")]
    assert [(at, description) for at, _, description in compacted] == [
        (
            START,
            "On-demand on-demand-job: 2 x ml.p5.48xlarge in us-west-2a, 15 hours (1-15) of 2030-01-01, "
            "at 41.37 USD per instance-hour",
        ),
        (
            datetime(2030, 1, 2, 0, 30, tzinfo=UTC),
            "On-demand on-demand-job: 2 x ml.p5.48xlarge in us-west-2a, "
            "24 hours (16-39) of 2030-01-02, at 41.37 USD per instance-hour",
        ),
        (
            datetime(2030, 1, 3, 0, 30, tzinfo=UTC),
            "On-demand on-demand-job: 2 x ml.p5.48xlarge in us-west-2a, "
            "24 hours (40-63) of 2030-01-03, at 41.37 USD per instance-hour",
        ),
        (
            datetime(2030, 1, 4, 0, 30, tzinfo=UTC),
            "On-demand on-demand-job: 2 x ml.p5.48xlarge in us-west-2a, "
            "9 hours (64-72) of 2030-01-04, at 41.37 USD per instance-hour",
        ),
    ]
    assert [amount for _, amount, _ in compacted] == [Decimal("-82.74") * n for n in (15, 24, 24, 9)]
    assert _on_demand_paid_per_day(store) == paid_before
    assert _books_per_day(store) == books_before
    assert (
        usage.usage(store.runtime, store.caller, account_ref=None, start=START - DAY, end=PASS_AT)
        == daily_before
    )
    assert sum(amount for _, amount, _ in _ledger(store)) == total_before
    assert (done.audit_events, done.rate_buckets, done.hourly_lines, done.day_lines) == (1, 1, 72, 4)
    assert done.status_events == ended_before[0]

    # A second pass changes nothing.
    ledger, live, events = _ledger(store), _plan_rows(store, store.live_plan), _count(store, ScheduledEvent)
    assert _pass(store) == row_retention.RowPass()
    assert _ledger(store) == ledger and _plan_rows(store, store.live_plan) == live
    assert _count(store, ScheduledEvent) == events


def test_rows_younger_than_their_periods_stay_and_without_periods_nothing_goes(store: Store) -> None:
    longer = parse_fleet(FLEET + RETENTION.replace('"1d"', '"30d"').replace('"1h"', '"3h"')).retention
    runtime = dataclasses.replace(
        store.runtime, fleet=dataclasses.replace(store.runtime.fleet, retention=longer)
    )
    ledger, ended = _ledger(store), _plan_rows(store, store.ended_plan)

    assert row_retention.run_once(runtime, wall=lambda: WALL) == row_retention.RowPass()
    without = dataclasses.replace(store.runtime, fleet=parse_fleet(FLEET))
    assert row_retention.run_once(without, wall=lambda: WALL) == row_retention.RowPass()

    assert _ledger(store) == ledger and _plan_rows(store, store.ended_plan) == ended
    assert _count(store, AuditEvent) == 2 and _count(store, RateBucket) == 2


def test_a_writer_waiting_during_a_long_pass_gets_its_turn_between_two_deletes(store: Store) -> None:
    """A first pass over a large store deletes for minutes (1.5 million rows at the bench's 100x): its
    deletes are short transactions of at most 250 rows, so that a request's write, on SQLite every one
    of them, waits for one batch and not for the pass. Here 1,001 old audit rows (five deletes); a
    writer asks for its turn once the first delete has begun. What this shows is the batching: the
    writer gets in with the pass's pause after each delete removed as well (Python's lock lets a
    waiting thread in), so the pause is not what this test checks."""
    runtime = store.runtime
    with runtime.db.write() as session:
        for n in range(1_000):
            audit.record(
                session, START, None, "account.note", account_id=store.caller.account_id, target=f"{n}"
            )
    order: list[str] = []
    deleting = threading.Event()

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("DELETE FROM audit_events"):
            order.append("delete")
            deleting.set()

    def writer() -> None:
        deleting.wait(60)
        with runtime.db.write():
            order.append("writer")

    waiting = threading.Thread(target=writer)
    waiting.start()
    event.listen(runtime.db.engine, "before_cursor_execute", note)
    try:
        removed = _pass(store).audit_events
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", note)
        waiting.join(60)
    assert removed == 1_001 and order.count("delete") == 5, order
    assert order[-1] == "delete", order  # the writer got in before the pass's last delete


@pytest.mark.parametrize(
    ("table", "complaint"),
    [
        ('events = "30m"', "retention.events: 30m is shorter than an hour"),
        ('metering = "12h"', "retention.metering: 12h is shorter than a day"),
        ('audit = "soon"', "retention.audit"),
        ("leases = 3600", "retention.leases"),
        ('ledger = "30d"', "retention.ledger: unknown key"),
    ],
)
def test_bad_periods_are_refused_naming_the_key(table: str, complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        parse_fleet(FLEET + f"\n[retention]\n{table}\n")


def test_each_period_is_read_and_period_keeps_its_meaning() -> None:
    retention = parse_fleet(FLEET + '\n[retention]\nperiod = "30d"\nevents = "90d"\n').retention
    assert retention.period == timedelta(days=30) and retention.events == timedelta(days=90)
    assert (retention.audit, retention.leases, retention.metering) == (None, None, None)
    assert parse_fleet(FLEET).retention == type(retention)()
