"""A store with a year of history, written in bulk: accounts, plans, their segments, status events, timed
events, invoices, ledger lines, plan histories and audit rows, as the service shapes them
(core/status_rows.py, store/purchase_rows.py), inserted table by table with SQLAlchemy Core's
executemany rather than bought one by one (50,000 purchases would take an hour; 100x builds in minutes).

Segments are placed on a :class:`CapacityCalendar` as bench/fill.py places them, on the day grid, so
that no pool is booked above its reservable count: most of them in the 12 months before the service
time (expired: every status move and timed event they made, done), the rest in the 120-day window
after it (scheduled: their timed events pending). Each plan holds 1 to 7 consecutive segments of one
type (4 on average, as the issue's 500 plans / 2,000 segments), each 1 or 2 days of 1 or 2 instances,
in any pool of the type. Plans go to accounts by a Zipf law (account i gets a share 1/(i+1)): the first
accounts, the load clients', are the heaviest, as in a real organisation. A separate account, the
lister, holds ``lister_plans`` expired one-day plans at every size: the lists are read for it.

Ids are given here (from the table's largest + 1) so that rows can name each other; on PostgreSQL the
sequences are moved past them afterwards, and the tables vacuumed and analysed (as autovacuum would have).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

from sqlalchemy import Connection, Table, func, insert, select, text

from bench.fill import DAY, WINDOW_DAYS, window_start
from bench.server import open_application
from hyperplan.app import Application
from hyperplan.clock import utcnow
from hyperplan.core import status_rows
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet, Pool
from hyperplan.core.lifecycle import RESERVED_CAPACITY_LIFECYCLE, PlanStatus, Window, status_message
from hyperplan.core.pricing import segment_price
from hyperplan.core.status import INVOICE_LIFECYCLE, InvoiceStatus
from hyperplan.core.status_rows import Entry, Row
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import NewKey
from hyperplan.services.plans import lifecycle, payments
from hyperplan.services.runtime.context import Policies, ServiceContext
from hyperplan.store.schema import (
    AuditEvent,
    Invoice,
    LedgerEntry,
    PlanEvent,
    ReservedCapacity,
    ScheduledEvent,
    StatusEvent,
    TrainingPlan,
)

TARGET = "training-job"
CHUNK = 5_000  # rows per executemany
TABLES = {
    model.__tablename__: cast(Table, model.__table__)
    for model in (
        TrainingPlan,
        ReservedCapacity,
        Invoice,
        LedgerEntry,
        PlanEvent,
        StatusEvent,
        ScheduledEvent,
        AuditEvent,
    )
}


@dataclass(frozen=True)
class HistorySpec:
    plans: int
    accounts: int
    lister_plans: int  # the lister's expired plans, read by ListTrainingPlans and the console
    past_days: int = 365
    live_share: float = 0.15  # of the plans, in the 120-day window ahead
    max_segments: int = 7  # 1..7 per plan: 4 on average
    seed: int = 55


@dataclass(frozen=True)
class Segment:
    pool_index: int
    start: datetime
    end: datetime
    count: int


@dataclass(frozen=True)
class PlacedPlan:
    """A plan to write: whose (an index into the accounts; -1: the lister), its segments, and the timed
    events it gets (None: those the service would make, from the fleet's policy)."""

    account: int
    segments: tuple[Segment, ...]
    bought_at: datetime
    timed: tuple[tuple[str, datetime, str], ...] | None = None


@dataclass
class History:
    """A built store: its application (stopped by ``close``), keys and what it holds."""

    data_dir: Path
    application: Application
    keys: list[NewKey]  # the accounts, heaviest first
    lister: NewKey
    plans: int
    segments: int
    rows: dict[str, int]
    missed: int  # plans that found no room in the calendar
    booked: float  # fraction of the 120-day window ahead
    build_seconds: float
    plans_of: list[int] = field(default_factory=list)  # plans per account, in the order of keys

    @property
    def runtime(self) -> ServiceContext:
        return self.application.context

    @property
    def fleet(self) -> Fleet:
        return self.runtime.fleet

    def close(self) -> None:
        self.application.stop()


def build(data_dir: Path, fleet_path: Path, spec: HistorySpec, database_url: str | None = None) -> History:
    began = time.perf_counter()
    application = open_application(data_dir, fleet_path, database_url)
    runtime = application.context
    now = runtime.clock.now()
    keys, lister = _accounts(runtime, spec.accounts, now)
    calendar = CapacityCalendar(runtime.fleet.pools)
    rng = random.Random(spec.seed)
    placed, missed = place(runtime.fleet, calendar, now, spec, rng)
    callers = [*keys, lister]
    rows = write_plans(runtime, placed, callers, now)
    rows["audit_events"] = _audit(runtime, placed, callers, now)
    finish_bulk(runtime)
    runtime.calendar.load(runtime.db)
    start = window_start(runtime.fleet, now)
    reservable = sum(pool.reservable for pool in runtime.fleet.pools) * WINDOW_DAYS * 48
    booked = sum(
        int(calendar.booked(p.key, start, start + WINDOW_DAYS * DAY).sum()) for p in runtime.fleet.pools
    )
    counts = [0] * len(keys)
    for plan in placed:
        if plan.account >= 0:
            counts[plan.account] += 1
    return History(
        data_dir,
        application,
        keys,
        lister,
        plans=len(placed),
        segments=sum(len(plan.segments) for plan in placed),
        rows=rows,
        missed=missed,
        booked=booked / max(reservable, 1),
        build_seconds=time.perf_counter() - began,
        plans_of=counts,
    )


def _accounts(runtime: ServiceContext, count: int, now: datetime) -> tuple[list[NewKey], NewKey]:
    """``count`` accounts (isolation mode none: no OS users) and the lister."""
    box = runtime.secret_box
    with runtime.db.write() as session:
        keys = [accounts.create_account(session, f"history-{i}", box=box, now=now) for i in range(count)]
        lister = accounts.create_account(session, "history-lister", box=box, now=now)
    return keys, lister


# -- placing the segments -------------------------------------------------------------------------------


def place(
    fleet: Fleet, calendar: CapacityCalendar, now: datetime, spec: HistorySpec, rng: random.Random
) -> tuple[list[PlacedPlan], int]:
    """Every plan's segments booked into ``calendar``; returns the plans and how many found no room."""
    ahead = window_start(fleet, now)
    by_type: dict[str, list[int]] = {}
    for index, pool in enumerate(fleet.pools):
        if pool.reservable > 0:
            by_type.setdefault(pool.instance_type, []).append(index)
    types = sorted(by_type)
    weights = [sum(fleet.pools[i].reservable for i in by_type[t]) for t in types]
    shares = [1 / (i + 1) for i in range(spec.accounts)]
    placed: list[PlacedPlan] = []
    missed = 0
    for number in range(spec.plans + spec.lister_plans):
        lister = number >= spec.plans
        account = -1 if lister else rng.choices(range(spec.accounts), shares)[0]
        live = not lister and rng.random() < spec.live_share
        segments = 1 if lister else rng.randint(1, spec.max_segments)
        pools = by_type[rng.choices(types, weights)[0]]
        plan = _place_one(fleet, calendar, rng, pools, segments, ahead, live, spec.past_days, lister)
        if plan is None:
            missed += 1
            continue
        bought = min(plan[0].start, now) - timedelta(days=rng.randint(1, 20), minutes=rng.randrange(1440))
        placed.append(PlacedPlan(account, plan, bought))
    return placed, missed


def _place_one(
    fleet: Fleet,
    calendar: CapacityCalendar,
    rng: random.Random,
    pools: list[int],
    segments: int,
    ahead: datetime,
    live: bool,
    past_days: int,
    lister: bool,
) -> tuple[Segment, ...] | None:
    """Consecutive segments of 1-2 days, each in a pool of the type with room; None after 30 tries."""
    for _ in range(30):
        days = [1 if lister else rng.randint(1, 2) for _ in range(segments)]
        total = sum(days)
        if live:
            first = ahead + rng.randrange(max(WINDOW_DAYS - total, 1)) * DAY
        else:
            first = ahead - rng.randint(total + 1, past_days) * DAY
        count = 1 if lister else rng.choice((1, 1, 2))
        chosen: list[Segment] = []
        start = first
        for length in days:
            end = start + length * DAY
            room = [
                i
                for i in rng.sample(pools, len(pools))
                if calendar.can_book(fleet.pools[i].key, start, end, count)
            ]
            if not room:
                break
            chosen.append(Segment(room[0], start, end, count))
            start = end
        if len(chosen) == segments:
            for s in chosen:
                calendar.book(fleet.pools[s.pool_index].key, s.start, s.end, s.count)
            return tuple(chosen)
    return None


# -- the rows ---------------------------------------------------------------------------------------------


class _Ids:
    """The next id of each table: one more than its largest."""

    def __init__(self, connection: Connection) -> None:
        self.next = {
            name: int(connection.execute(select(func.coalesce(func.max(table.c.id), 0))).scalar_one()) + 1
            for name, table in TABLES.items()
        }

    def take(self, table: str) -> int:
        value = self.next[table]
        self.next[table] = value + 1
        return value


class _Batch:
    """The rows of many plans, per table, each with its id."""

    def __init__(self, runtime: ServiceContext, ids: _Ids, now: datetime) -> None:
        self.runtime, self.ids, self.now = runtime, ids, now
        self.policy: Policies = runtime.lifecycle.policies(TARGET)
        self.rows: dict[str, list[Row]] = {name: [] for name in TABLES}

    def add(self, table: str, row: Row) -> int:
        new_id = self.ids.take(table)
        self.rows[table].append({"id": new_id, **row})
        return new_id

    def plan(self, plan: PlacedPlan, caller: NewKey) -> None:
        fleet, now, bought = self.runtime.fleet, self.now, plan.bought_at
        pools = [fleet.pools[s.pool_index] for s in plan.segments]
        windows = [Window(s.start, s.end) for s in plan.segments]
        expired = windows[-1].end <= now
        status = PlanStatus.EXPIRED if expired else PlanStatus.SCHEDULED
        fee = sum(
            (segment_price(p, s.start, s.end, s.count) for p, s in zip(pools, plan.segments, strict=True)),
            Decimal(0),
        )
        currency = pools[0].currency
        plan_id = self.ids.next["training_plans"]
        message = status_message(windows, status, now)
        self.add(
            "training_plans",
            {
                "account_id": caller.account_id,
                "name": f"h-{plan_id}",
                "offering_id": f"history-{plan_id}",
                "target": TARGET,
                "instance_type": pools[0].instance_type,
                "status": status,
                "status_message": message,
                "upfront_fee": fee,
                "currency": currency,
                "created_at": bought,
                "updated_at": windows[-1].end if expired else bought,
            },
        )
        segment_ids = [
            self._segment(plan_id, ordinal, pool, s, expired)
            for ordinal, (pool, s) in enumerate(zip(pools, plan.segments, strict=True), start=1)
        ]
        invoice_id = self._paid_invoice(plan_id, caller, fee, currency, bought, plan)
        history = [
            (bought, status_rows.bought(f"history-{plan_id}", fee, currency), PlanStatus.PENDING),
            (
                bought,
                status_rows.invoiced(invoice_id, fee, currency, status_rows.paid_for(None)),
                PlanStatus.PENDING,
            ),
            (
                bought,
                status_rows.paid(status_rows.invoice_paid(invoice_id, status_rows.PAID_AUTOMATICALLY)),
                PlanStatus.PENDING,
            ),
            (bought, Entry(status_rows.SCHEDULED, message), PlanStatus.SCHEDULED),
        ]
        for ordinal, (segment_id, s) in enumerate(zip(segment_ids, plan.segments, strict=True), start=1):
            self._moved(segment_id, PlanStatus.PENDING, PlanStatus.SCHEDULED, bought, message)
            if expired:
                history += self._lived(plan_id, ordinal, segment_id, s, ordinal == len(segment_ids))
        for at, entry, state in history:
            self.add("plan_events", status_rows.plan_event(plan_id, at, entry, state, None))
        self._timed(plan_id, plan, bought)

    def _segment(self, plan_id: int, ordinal: int, pool: Pool, s: Segment, expired: bool) -> int:
        return self.add(
            "reserved_capacities",
            {
                "plan_id": plan_id,
                "ordinal": ordinal,
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "count": s.count,
                "start": s.start,
                "end": s.end,
                "status": PlanStatus.EXPIRED if expired else PlanStatus.SCHEDULED,
                "holds_capacity": True,
                "released_at": None,
            },
        )

    def _paid_invoice(
        self, plan_id: int, caller: NewKey, fee: Decimal, currency: str, bought: datetime, plan: PlacedPlan
    ) -> int:
        due = payments.payment_deadline(plan.segments[0].start, bought)
        row = status_rows.invoice(caller.account_id, plan_id, None, fee, currency, bought, due)
        row.update(status=InvoiceStatus.PAID, settled_at=bought, note=status_rows.PAID_AUTOMATICALLY)
        invoice_id = self.add("invoices", row)
        paid = status_rows.status_event(
            INVOICE_LIFECYCLE,
            invoice_id,
            InvoiceStatus.PENDING,
            InvoiceStatus.PAID,
            bought,
            status_rows.PAID_AUTOMATICALLY,
        )
        self.add("status_events", paid)
        line = status_rows.payment_line(
            invoice_id, f"h-{plan_id}", status_rows.paid_for(None), status_rows.PAID_AUTOMATICALLY
        )
        self.add(
            "ledger_entries",
            status_rows.ledger_entry(caller.account_id, invoice_id, bought, -fee, Decimal(0), line),
        )
        return invoice_id

    def _moved(self, segment_id: int, old: PlanStatus, new: PlanStatus, at: datetime, message: str) -> None:
        self.add(
            "status_events",
            status_rows.status_event(RESERVED_CAPACITY_LIFECYCLE, segment_id, old, new, at, message),
        )

    def _lived(
        self, plan_id: int, ordinal: int, segment_id: int, s: Segment, last: bool
    ) -> list[tuple[datetime, Entry, PlanStatus]]:
        """What an expired segment went through: reminders, its start, its reclaim, its end."""
        name = f"h-{plan_id}"
        reclaim = max(s.start, s.end - self.policy.reclaim_lead)
        self._moved(segment_id, PlanStatus.SCHEDULED, PlanStatus.ACTIVE, s.start, "started")
        self._moved(segment_id, PlanStatus.ACTIVE, PlanStatus.EXPIRED, s.end, "ended")
        after = PlanStatus.EXPIRED if last else PlanStatus.ACTIVE
        return [
            (
                s.start - self.policy.start_reminder,
                status_rows.start_reminder(name, ordinal, s.start),
                PlanStatus.SCHEDULED,
            ),
            (
                s.start,
                Entry("segment-started", f"Reserved capacity {name}-rc{ordinal} started."),
                PlanStatus.ACTIVE,
            ),
            (reclaim, status_rows.reclaim_begins(name, ordinal), PlanStatus.ACTIVE),
            (s.end, Entry("segment-ended", f"Reserved capacity {name}-rc{ordinal} ended."), after),
        ]

    def _timed(self, plan_id: int, plan: PlacedPlan, bought: datetime) -> None:
        timed = plan.timed
        if timed is None:
            timed = tuple(
                (kind, due, json.dumps(payload))
                for ordinal, s in enumerate(plan.segments, start=1)
                for kind, due, payload in lifecycle.segment_events(
                    s.start, s.end, ordinal, self.policy, bought
                )
            )
        for kind, due, payload in timed:
            row = status_rows.timed_event(kind, due, str(plan_id), payload)
            if due <= self.now:  # run when it fell due
                row.update(done=True, ran_at=due)
            self.add("scheduled_events", row)


def write_plans(
    runtime: ServiceContext, placed: Sequence[PlacedPlan], callers: Sequence[NewKey], now: datetime
) -> dict[str, int]:
    """Every placed plan's rows (account -1: the last caller), in bulk; rows written per table."""
    written = dict.fromkeys(TABLES, 0)
    with _bulk(runtime) as connection:
        ids = _Ids(connection)
        for chunk in _chunks(placed, 2_000):
            batch = _Batch(runtime, ids, now)
            for plan in chunk:
                batch.plan(plan, callers[plan.account])
            for name, rows in batch.rows.items():
                insert_rows(connection, name, rows)
                written[name] += len(rows)
    return written


@contextmanager
def _bulk(runtime: ServiceContext) -> Iterator[Connection]:
    """One transaction for a bulk insert. SQLite: without a sync per WAL checkpoint and with a large page
    cache while it runs (a bench's build, not a durable write: 140,000 rows took 25 s with the store's
    synchronous=FULL), the store's settings back afterwards."""
    with runtime.db.engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            connection.exec_driver_sql("PRAGMA synchronous=OFF")
            connection.exec_driver_sql("PRAGMA cache_size=-262144")
            connection.commit()
        try:
            with connection.begin():
                yield connection
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA synchronous=FULL")
                connection.exec_driver_sql("PRAGMA cache_size=-2000")
                connection.commit()


def insert_rows(connection: Connection, table: str, rows: Sequence[Row]) -> None:
    for chunk in _chunks(rows, CHUNK):
        connection.execute(insert(TABLES[table]), list(chunk))


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for at in range(0, len(items), size):
        yield items[at : at + size]


def _audit(
    runtime: ServiceContext, placed: Sequence[PlacedPlan], callers: Sequence[NewKey], now: datetime
) -> int:
    """An administrator's record of each account made, and a lending policy set on one plan in ten."""
    wall = utcnow()
    rows: list[Row] = []
    for caller in callers:
        rows.append(
            _audit_row(now - 400 * DAY, wall, "account.create", None, caller.account_id, caller.account_name)
        )
    for number, plan in enumerate(placed):
        if number % 10 == 0:
            caller = callers[plan.account]
            rows.append(
                _audit_row(plan.bought_at, wall, "plan.lending-set", caller, caller.account_id, f"h-{number}")
            )
    with _bulk(runtime) as connection:
        insert_rows(connection, "audit_events", rows)
    return len(rows)


def _audit_row(
    at: datetime, wall: datetime, action: str, actor: NewKey | None, account_id: str, target: str
) -> Row:
    return {
        "at": at,
        "wall_at": wall,
        "action": action,
        "actor_account_id": actor.account_id if actor else None,
        "actor_account_name": actor.account_name if actor else "",
        "actor_user_name": actor.user_name if actor else "",
        "access_key_id": actor.access_key_id if actor else "",
        "remote_address": "192.0.2.1" if actor else "",
        "account_id": account_id,
        "target": target,
        "detail": json.dumps({"min_notice_seconds": 600}) if actor else "{}",
    }


def finish_bulk(runtime: ServiceContext) -> None:
    """PostgreSQL: each table's sequence past the ids given here, then the tables vacuumed and analysed,
    as autovacuum would have left a store that grew over a year. Analysed alone, the bulk's pages were
    not yet marked all-visible, so an index-only scan still read the table's rows; and autovacuum's
    own first pass came during the measurements (within 150 s of a 10x build it had vacuumed each of
    the seven tables the bulk fills). Then a checkpoint."""
    engine = runtime.db.engine
    if engine.dialect.name != "postgresql":
        return
    with engine.begin() as connection:
        for name in TABLES:
            connection.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), "
                    f"(SELECT coalesce(max(id), 0) + 1 FROM {name}), false)"
                )
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(text("VACUUM (ANALYZE)"))
        # The bulk and the vacuum leave gigabytes written but not yet on disk (at 100x); a checkpoint
        # now writes them before the measurements, not while they run, as a store that grew over a year
        # has nothing of the kind pending.
        connection.execute(text("CHECKPOINT"))
