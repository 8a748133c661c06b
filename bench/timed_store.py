"""Stores whose plans fall due within seconds of real time, and what the lifecycle loop recorded of them.

Plans are bought in-process through ``hyperplan.services.plans.plans.create``, as :mod:`bench.server` fills
its stores: one durable transaction per plan, writing the plan, its segment and its timed events, paid
at once (the fleet's accounts pay automatically). The runtime that writes them has a manual clock that
stands at the wall time when the store was opened, so every segment lies in its future and each plan
gets all five of its timed events. The benchmark signs the offerings itself, for segments of seconds on
the lifecycle fleet (``bench/lifecycle_fleet.toml``): a search only offers whole days that end at
11:30 UTC, which no benchmark can wait for, and the loop runs an event the same whatever its time.
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.fill import Booking
from bench.server import offering_for, unisolated
from hyperplan.app import AppConfig, Application
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.master_key import KEY_FILE_NAME

LIFECYCLE_FLEET = Path(__file__).with_name("lifecycle_fleet.toml")
POOLS = 4  # the lifecycle fleet's pools; plans go round them
EVENTS_PER_PLAN = 5  # start reminder, start, reclaim reminder, reclaim, end
REMINDER_LEAD = 2  # seconds: the fleet's start_reminder, the earliest event of a plan before its start


@dataclass(frozen=True)
class Group:
    """``plans`` one-instance plans of ``length`` seconds, whose starts are spread evenly over ``spread``
    seconds (0: all start at the same second) from ``offset`` seconds after the store's base time."""

    name: str
    plans: int
    offset: int
    spread: int
    length: int

    def bookings(self, base: datetime) -> list[Booking]:
        bookings = []
        for i in range(self.plans):
            start = base + timedelta(seconds=self.offset + i * self.spread // max(self.plans, 1))
            bookings.append(Booking(i % POOLS, start, start + timedelta(seconds=self.length), 1))
        return bookings

    @property
    def first_due(self) -> int:
        """Seconds after the base time at which the group's first event falls due."""
        return self.offset - REMINDER_LEAD

    @property
    def last_due(self) -> int:
        return self.offset + self.spread + self.length


@dataclass(frozen=True)
class TimedStore:
    data_dir: Path
    base: datetime  # the whole second after the clock's time when the plans were bought
    groups: tuple[Group, ...]
    group_of: dict[str, str]  # plan id (an event's subject) -> group name
    write_seconds: float

    @property
    def db_path(self) -> Path:
        return self.data_dir / "hyperplan.db"

    @property
    def plans(self) -> int:
        return len(self.group_of)

    def at(self, seconds: int) -> float:
        """The epoch time ``seconds`` after the base time."""
        return self.base.timestamp() + seconds

    @property
    def last_due(self) -> float:
        return self.at(max(group.last_due for group in self.groups))


def write_store(data_dir: Path, groups: tuple[Group, ...], setup_seconds: float = 0.0) -> TimedStore:
    """Buy the groups' plans; their times count from the first whole second ``setup_seconds`` (time to
    write them and start a server) after now."""
    application = Application(
        AppConfig(data_dir=data_dir, fleet_path=LIFECYCLE_FLEET, clock="manual", **unisolated(data_dir))
    )
    try:
        application.bootstrap()
        runtime = application.context
        now = runtime.clock.now()
        base = datetime.fromtimestamp(math.ceil(now.timestamp() + setup_seconds), UTC)
        caller = _account(runtime, now)
        began = time.perf_counter()
        group_of = _buy(runtime, caller, groups, base)
        return TimedStore(data_dir, base, groups, group_of, time.perf_counter() - began)
    finally:
        application.stop()


def _account(runtime: ServiceContext, now: datetime) -> Caller:
    with runtime.db.write() as session:
        key = accounts.create_account(session, "bench-lifecycle", box=runtime.secret_box, now=now)
    return Caller(key.account_id, key.account_name, False, key.access_key_id)


def _buy(
    runtime: ServiceContext, caller: Caller, groups: tuple[Group, ...], base: datetime
) -> dict[str, str]:
    group_of: dict[str, str] = {}
    for group in groups:
        for booking in group.bookings(base):
            number = len(group_of)
            offering = offering_for(runtime, caller, booking, number)
            arn = plans.create(runtime, caller, f"{group.name}-{number}", offering)
            with runtime.db.read() as session:
                group_of[str(plans.get(session, runtime, caller, arn).id)] = group.name
    return group_of


# -- what the loop recorded ------------------------------------------------------------------------


@dataclass(frozen=True)
class RanEvent:
    id: int
    kind: str
    subject: str
    due: float  # epoch seconds
    ran: float  # the clock's time when the loop ran it: under the wall clock, when it took effect


def ran_events(db_path: Path) -> list[RanEvent]:
    """Every event the loop ran (not those it cancelled: those are done with no ``ran_at``)."""
    rows = _query(db_path, "SELECT id, kind, subject, due_at, ran_at FROM scheduled_events WHERE ran_at > 0")
    return [RanEvent(id, kind, subject, due / 1e6, ran / 1e6) for id, kind, subject, due, ran in rows]


def pending_events(db_path: Path) -> int:
    return int(_query(db_path, "SELECT count(*) FROM scheduled_events WHERE NOT done")[0][0])


def due_span(db_path: Path) -> tuple[float, float]:
    """The earliest and the latest due time of the pending events, in epoch seconds."""
    low, high = _query(db_path, "SELECT min(due_at), max(due_at) FROM scheduled_events WHERE NOT done")[0]
    return low / 1e6, high / 1e6


def _query(db_path: Path, sql: str) -> list[tuple[Any, ...]]:
    connection = sqlite3.connect(db_path, timeout=30)
    try:
        return connection.execute(sql).fetchall()
    finally:
        connection.close()


def copy_store(source: Path, target: Path) -> None:
    """A consistent copy of a data directory's database (SQLite's online backup), with the master key
    file that opens its secrets."""
    target.mkdir(parents=True)
    origin, copy = sqlite3.connect(source / "hyperplan.db"), sqlite3.connect(target / "hyperplan.db")
    try:
        origin.backup(copy)
    finally:
        copy.close()
        origin.close()
    shutil.copy2(source / KEY_FILE_NAME, target / KEY_FILE_NAME)
