"""The lifecycle loop runs due events in batches (events/loop.py): still each once, in (due time, id)
order, each handler seeing what the ones before it wrote; an event cancelled by one before it in the
same batch does not run; an event a handler schedules before the rest runs before them; a handler that
fails leaves the events before it done and itself and the rest pending; a stop request ends the batch
after the event that is running (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import event as orm_event
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hyperplan.clock import ManualClock
from hyperplan.events.loop import BATCH_EVENTS, DueEvent, EventHandler, TimedEventLoop, schedule
from hyperplan.store.db import Database
from hyperplan.store.schema import ScheduledEvent, Setting
from tests.postgres import Stores

T0 = datetime(2031, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path, stores: Stores) -> Iterator[Database]:
    database = Database(stores.empty_url(tmp_path))
    database.migrate()
    yield database
    database.close()


def _loop(db: Database, handlers: dict[str, EventHandler]) -> TimedEventLoop:
    """A loop on a manual clock standing at T0 + 1 h: every event the tests write is due."""
    return TimedEventLoop(db, ManualClock(T0 + timedelta(hours=1)), handlers)


def _write(db: Database, events: list[tuple[str, datetime, str]]) -> None:
    with db.write() as session:
        for kind, due, subject in events:
            schedule(session, kind, due, subject)


def _ran(db: Database) -> list[str]:
    """What the handlers wrote, in the order they wrote it (one setting row per event run)."""
    with db.read() as session:
        rows = session.scalars(select(Setting).where(Setting.key.like("ran-%")).order_by(Setting.value))
        return [row.key.removeprefix("ran-") for row in rows]


def _pending(db: Database) -> list[str]:
    with db.read() as session:
        query = select(ScheduledEvent.subject).where(ScheduledEvent.done.is_(False))
        return sorted(session.scalars(query.order_by(ScheduledEvent.due_at, ScheduledEvent.id)))


class Recorder:
    """Records each event it runs as a row in the store, in the event's transaction, numbered in the
    order they ran: a row exists only if the event's transaction committed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, session: Session, event: DueEvent) -> None:
        self.count += 1
        session.add(Setting(key=f"ran-{event.subject}", value=f"{self.count:06d}"))


class Breakable:
    """A handler that raises while `broken`, and records its event once mended."""

    def __init__(self, record: Recorder) -> None:
        self.record = record
        self.broken = True

    def __call__(self, session: Session, event: DueEvent) -> None:
        if self.broken:
            raise RuntimeError("the handler is broken")
        self.record(session, event)


def test_more_events_than_a_batch_run_once_each_in_due_order(db: Database) -> None:
    record = Recorder()
    total = BATCH_EVENTS * 2 + 7
    # Written out of order; two at each instant, so that ties go by id.
    events = [("note", T0 + timedelta(seconds=(total - i) // 2), f"e{i:04d}") for i in range(total)]
    _write(db, events)
    loop = _loop(db, {"note": record})
    assert loop.run_due(T0 + timedelta(hours=1)) == total
    expected = [subject for _, _, subject in sorted(events, key=lambda e: (e[1], events.index(e)))]
    assert _ran(db) == expected
    assert _pending(db) == []
    assert loop.run_due(T0 + timedelta(hours=1)) == 0  # nothing runs twice
    with db.read() as session:
        assert None not in session.scalars(select(ScheduledEvent.ran_at)).all()


def test_an_event_cancelled_by_one_before_it_in_the_batch_does_not_run(db: Database) -> None:
    record = Recorder()

    def fail_plan(session: Session, event: DueEvent) -> None:
        record(session, event)
        # As services/plans/lifecycle.py cancels a failed plan's events: one UPDATE of the pending rows.
        session.execute(
            update(ScheduledEvent)
            .where(ScheduledEvent.subject.like("plan-7-%"), ScheduledEvent.done.is_(False))
            .values(done=True)
        )

    _write(
        db,
        [
            ("note", T0, "plan-7-start"),
            ("fail", T0 + timedelta(seconds=1), "fail-7"),
            ("note", T0 + timedelta(seconds=2), "plan-7-end"),
            ("note", T0 + timedelta(seconds=3), "plan-8-end"),
        ],
    )
    loop = _loop(db, {"note": record, "fail": fail_plan})
    loop.run_due(T0 + timedelta(hours=1))
    assert _ran(db) == ["plan-7-start", "fail-7", "plan-8-end"]
    assert _pending(db) == []


def test_an_event_a_handler_schedules_before_the_rest_runs_before_them(db: Database) -> None:
    record = Recorder()

    def follow_up(session: Session, event: DueEvent) -> None:
        record(session, event)
        schedule(session, "note", event.due_at, "follow-up")  # due at once: before "later"

    _write(db, [("first", T0, "first"), ("note", T0 + timedelta(seconds=5), "later")])
    loop = _loop(db, {"note": record, "first": follow_up})
    assert loop.run_due(T0 + timedelta(hours=1)) == 3
    assert _ran(db) == ["first", "follow-up", "later"]


def test_a_failing_handler_leaves_the_events_before_it_done_and_the_rest_pending(db: Database) -> None:
    record = Recorder()
    sometimes = Breakable(record)

    _write(
        db,
        [
            ("note", T0, "a"),
            ("note", T0 + timedelta(seconds=1), "b"),
            ("odd", T0 + timedelta(seconds=2), "c"),
            ("note", T0 + timedelta(seconds=3), "d"),
        ],
    )
    loop = _loop(db, {"note": record, "odd": sometimes})
    with pytest.raises(RuntimeError, match="broken"):
        loop.run_due(T0 + timedelta(hours=1))
    assert _ran(db) == ["a", "b"]
    assert _pending(db) == ["c", "d"]
    sometimes.broken = False
    loop.run_due(T0 + timedelta(hours=1))
    assert _ran(db) == ["a", "b", "c", "d"]


def test_a_stop_request_ends_the_batch_after_the_running_event(db: Database) -> None:
    record = Recorder()
    loop = _loop(db, {})

    def stopping(session: Session, event: DueEvent) -> None:
        record(session, event)
        loop.request_stop()  # as SIGTERM does, while an event runs

    loop.handlers.update({"note": record, "stop": stopping})
    _write(
        db,
        [
            ("note", T0, "a"),
            ("stop", T0 + timedelta(seconds=1), "b"),
            ("note", T0 + timedelta(seconds=2), "c"),
        ],
    )
    assert loop.run_due(T0 + timedelta(hours=1)) == 2
    assert _ran(db) == ["a", "b"]
    assert _pending(db) == ["c"]


def test_payloads_reach_the_handler_as_written(db: Database) -> None:
    seen: list[dict[str, object]] = []

    def keep(session: Session, event: DueEvent) -> None:
        seen.append(dict(event.payload))

    with db.write() as session:
        schedule(session, "note", T0, "x", segment=2, reclaim_at="then")
    _loop(db, {"note": keep}).run_due(T0 + timedelta(hours=1))
    assert seen == [json.loads('{"segment": 2, "reclaim_at": "then"}')]


def _manual_loop(db: Database, handlers: dict[str, EventHandler]) -> tuple[TimedEventLoop, ManualClock]:
    """A loop on a manual clock standing at T0, before every event the tests write."""
    clock = ManualClock(T0)
    return TimedEventLoop(db, clock, handlers), clock


def test_a_clock_move_runs_its_events_in_batches_each_at_its_own_due_time(db: Database) -> None:
    commits: list[int] = []
    seen: list[tuple[str, datetime]] = []
    loop, clock = _manual_loop(db, {})

    def at_its_time(session: Session, event: DueEvent) -> None:
        seen.append((event.subject, clock.now()))
        session.add(Setting(key=f"ran-{event.subject}", value=f"{len(seen):06d}"))

    loop.handlers["note"] = at_its_time
    total = BATCH_EVENTS + 20
    _write(db, [("note", T0 + timedelta(minutes=i + 1), f"e{i:04d}") for i in range(total)])

    def counted(_session: Session) -> None:
        commits.append(1)

    orm_event.listen(Session, "after_commit", counted)
    try:
        assert loop.advance_to(T0 + timedelta(days=1)) == total
    finally:
        orm_event.remove(Session, "after_commit", counted)
    assert seen == [(f"e{i:04d}", T0 + timedelta(minutes=i + 1)) for i in range(total)]
    assert clock.now() == T0 + timedelta(days=1)
    assert len(commits) < total / 10, f"{len(commits)} commits for {total} events"
    with db.read() as session:
        stamped = dict(session.execute(select(ScheduledEvent.subject, ScheduledEvent.ran_at)).tuples().all())
    assert stamped == {f"e{i:04d}": T0 + timedelta(minutes=i + 1) for i in range(total)}


def test_a_handler_failing_in_a_clock_move_stops_the_clock_at_it_with_the_events_before_it_done(
    db: Database,
) -> None:
    record = Recorder()
    sometimes = Breakable(record)

    due = [T0 + timedelta(minutes=m) for m in (1, 2, 3, 4)]
    _write(db, [("note", due[0], "a"), ("note", due[1], "b"), ("odd", due[2], "c"), ("note", due[3], "d")])
    loop, clock = _manual_loop(db, {"note": record, "odd": sometimes})
    with pytest.raises(RuntimeError, match="broken"):
        loop.advance_to(T0 + timedelta(hours=1))
    assert clock.now() == due[2]  # where it stood when "c" failed, as if each event ran alone
    assert _ran(db) == ["a", "b"]
    assert _pending(db) == ["c", "d"]
    with db.read() as session:
        stamped = dict(session.execute(select(ScheduledEvent.subject, ScheduledEvent.ran_at)).tuples().all())
    assert stamped == {"a": due[0], "b": due[1], "c": None, "d": None}
    sometimes.broken = False
    loop.advance_to(T0 + timedelta(hours=1))
    assert _ran(db) == ["a", "b", "c", "d"]
    assert clock.now() == T0 + timedelta(hours=1)
