"""Group commit (store/group_commit.py): writers of one process arriving together share one transaction
and one durable commit on SQLite, each in a savepoint of its own. Real SQLite, real threads: the test
holds the writers' turn while the writers queue, so that they are sure to form one batch."""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from hyperplan.errors import ServiceUnavailable, ValidationError
from hyperplan.store import changes
from hyperplan.store.checked_write import refuse_on_snapshot
from hyperplan.store.db import Database, after_commit, committed_change
from hyperplan.store.engine import no_busy_wait
from hyperplan.store.schema import ChangeCounter, Setting
from hyperplan.store.urls import sqlite_url
from hyperplan.waits import WouldWait, answering, forbid_waits
from tests.batches import fails_at_commit, together
from tests.beside import answered_beside


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    database.count_changes(Setting, changes.SETTINGS)
    try:
        yield database
    finally:
        database.close()


def queued_together(db: Database, works: list[Callable[[Session], Any]]) -> list[Any]:
    return together(db, [partial(db.write_grouped, work) for work in works])


def setting_writer(
    key: str, ran: list[tuple[str, int | None]], *, refuse: bool = False
) -> Callable[[Session], str]:
    def work(session: Session) -> str:
        session.add(Setting(key=key, value="written"))
        session.flush()
        after_commit(session, lambda: ran.append((key, committed_change(session, changes.SETTINGS))))
        if refuse:
            raise ValidationError(f"{key} is refused")
        return key

    return work


def stored_keys(db: Database) -> set[str]:
    with db.read() as session:
        return set(session.scalars(select(Setting.key)))


def counter(db: Database) -> int:
    with db.read() as session:
        value = session.scalar(select(ChangeCounter.value).where(ChangeCounter.name == changes.SETTINGS))
    assert value is not None
    return value


def test_writers_arriving_together_commit_together_and_a_refused_one_alone(db: Database) -> None:
    before = counter(db)
    ran: list[tuple[str, int | None]] = []
    works = [setting_writer(f"k{i}", ran, refuse=i == 2) for i in range(5)]
    outcomes = queued_together(db, works)
    assert outcomes[:2] == ["k0", "k1"] and outcomes[3:] == ["k3", "k4"]
    assert isinstance(outcomes[2], ValidationError) and outcomes[2].message == "k2 is refused"
    # One transaction: one batch, one move of the counter, which every callback of it reads.
    assert (db.group.batches, db.group.largest) == (1, 5)
    assert counter(db) == before + 1
    assert ran == [(key, before + 1) for key in ("k0", "k1", "k3", "k4")]  # the refused one's never ran
    assert stored_keys(db) >= {"k0", "k1", "k3", "k4"} and "k2" not in stored_keys(db)


def test_a_work_sees_what_the_works_before_it_in_its_batch_wrote(db: Database) -> None:
    def first(session: Session) -> None:
        session.add(Setting(key="shared", value="first"))

    def second(session: Session) -> str | None:
        return session.scalar(select(Setting.value).where(Setting.key == "shared"))

    assert queued_together(db, [first, second]) == [None, "first"]
    assert db.group.largest == 2


def test_a_failed_commit_fails_every_writer_of_the_batch_and_writes_nothing(db: Database) -> None:
    before = counter(db)
    ran: list[tuple[str, int | None]] = []

    works = [
        setting_writer("a", ran),
        fails_at_commit,
        setting_writer("b", ran),
        setting_writer("c", ran, refuse=True),
    ]
    outcomes = queued_together(db, works)
    for outcome in outcomes[:3]:
        assert isinstance(outcome, ServiceUnavailable), outcome
        assert "nothing of it was written" in outcome.message
    assert isinstance(outcomes[3], ValidationError)  # refused on its own: its own answer
    assert ran == [] and stored_keys(db).isdisjoint({"a", "b", "c"})
    assert counter(db) == before and db.group.batches == 0
    # The store goes on: the next writer commits alone.
    assert db.write_grouped(setting_writer("d", ran)) == "d"
    assert "d" in stored_keys(db) and counter(db) == before + 1


def reads(key: str, *, refuse: bool = False) -> Callable[[Session], None]:
    """A check that reads what the works before it in the batch wrote, and refuses if told to."""

    def check(session: Session) -> None:
        session.scalar(select(Setting.value).where(Setting.key == key))
        if refuse:
            raise ValidationError(f"{key} is refused by its check")

    return check


def test_a_check_refuses_alone_before_any_savepoint_and_a_check_that_writes_fails_its_batch(
    db: Database,
) -> None:
    ran: list[tuple[str, int | None]] = []
    made: list[str] = []
    event.listen(db.engine, "before_cursor_execute", lambda *args: made.append(args[2]))
    outcomes = together(
        db,
        [
            partial(db.write_grouped, setting_writer("c0", ran), reads("c0")),
            partial(db.write_grouped, setting_writer("c1", ran), reads("c0", refuse=True)),
            partial(db.write_grouped, setting_writer("c2", ran), reads("c1")),
        ],
    )
    assert outcomes[0] == "c0" and outcomes[2] == "c2"
    assert isinstance(outcomes[1], ValidationError) and "by its check" in outcomes[1].message
    assert stored_keys(db) >= {"c0", "c2"} and "c1" not in stored_keys(db)
    assert [key for key, _ in ran] == ["c0", "c2"]
    # The refused check wrote nothing, so nothing was rolled back: a savepoint for each work written.
    assert sum(sql.startswith("SAVEPOINT") for sql in made) == 2
    assert not any(sql.startswith("ROLLBACK TO") for sql in made)

    def writes(session: Session) -> None:
        session.add(Setting(key="by-a-check", value="x"))
        session.flush()
        raise ValidationError("refused after it wrote")

    outcomes = together(
        db,
        [
            partial(db.write_grouped, setting_writer("d0", ran)),
            partial(db.write_grouped, setting_writer("d1", ran), writes),
        ],
    )
    for outcome in outcomes:  # its rows could not be undone alone: the whole batch is refused
        assert isinstance(outcome, ServiceUnavailable), outcome
    assert stored_keys(db).isdisjoint({"d0", "d1", "by-a-check"})


def test_a_batch_holds_at_most_its_bound_and_the_rest_commit_next(db: Database) -> None:
    db.group.max_batch = 2
    ran: list[tuple[str, int | None]] = []
    before = counter(db)
    outcomes = queued_together(db, [setting_writer(f"m{i}", ran) for i in range(5)])
    assert outcomes == [f"m{i}" for i in range(5)]
    assert db.group.largest == 2 and db.group.batches == 3
    assert [key for key, _ in ran] == [f"m{i}" for i in range(5)]  # committed in the order they queued
    assert counter(db) == before + 3


def test_writers_refused_the_turn_are_told_so_and_nothing_is_written(db: Database, tmp_path: Path) -> None:
    """Another process holds the writers' lock file past the wait (stopped, stuck): every writer of the
    batch is refused with a retryable ServiceUnavailable; once it lets go, writers commit again."""
    ran: list[tuple[str, int | None]] = []
    db.turn_wait = 0.2
    other = os.open(tmp_path / "hyperplan.db.writers-lock", os.O_RDWR | os.O_CREAT)  # a file of its own
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with pytest.raises(ServiceUnavailable, match="writers' lock"):
            db.write_grouped(setting_writer("refused", ran))
    finally:
        fcntl.flock(other, fcntl.LOCK_UN)
        os.close(other)
    assert ran == [] and "refused" not in stored_keys(db)
    assert db.write_grouped(setting_writer("later", ran)) == "later"


def test_on_the_event_loop_a_purchase_snapshot_read_waits_for_no_connection_and_no_lock(
    tmp_path: Path,
) -> None:
    """A purchase's refusals read on the event loop (checked_write.refuse_on_snapshot) never wait: with no
    pooled connection open and idle (opening one waits for a lock SQLite's busy timeout long, 30 s here),
    it is a WouldWait at once, which sends the request to the pool; off the loop the same read is made."""
    database = Database(sqlite_url(tmp_path))
    try:
        database.migrate()
        read: list[object] = []

        def refusals(connection: Any) -> None:
            read.append(connection.exec_driver_sql("SELECT count(*) FROM settings").scalar())

        database.engine.dispose()  # no connection open: the lock below can be taken
        locker = sqlite3.connect(tmp_path / "hyperplan.db", isolation_level=None)
        try:
            locker.execute("PRAGMA locking_mode=EXCLUSIVE")  # in WAL mode: new readers are locked out too
            locker.execute("BEGIN EXCLUSIVE")
            locker.execute("DELETE FROM settings")

            def on_the_loop() -> WouldWait | None:
                with answering(), forbid_waits():
                    try:
                        refuse_on_snapshot(database.engine, refusals)
                    except WouldWait as exc:  # a BaseException: answered_beside takes Exceptions only
                        return exc
                return None

            refused = answered_beside(on_the_loop, "a lock on the store")
            assert isinstance(refused, WouldWait) and refused.what == "a pooled connection", refused
            assert read == []
        finally:
            locker.close()
        refuse_on_snapshot(database.engine, refusals)
        assert read == [0]  # the settings the locker deleted, then rolled back by closing
    finally:
        database.close()


def test_a_sqlite_connection_made_not_to_wait_is_a_would_wait_on_a_lock_and_waits_again_after(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.db"
    owner = sqlite3.connect(path, isolation_level=None)
    owner.execute("PRAGMA journal_mode=WAL")
    owner.execute("CREATE TABLE t (x)")
    reader = sqlite3.connect(path, isolation_level=None, timeout=30)  # not read through yet
    try:
        owner.execute("PRAGMA locking_mode=EXCLUSIVE")
        owner.execute("BEGIN EXCLUSIVE")
        owner.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(WouldWait, match="a lock on the store"), no_busy_wait(reader, True):
            reader.execute("SELECT count(*) FROM t")  # at once: after the busy timeout, another error
        assert reader.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
        with no_busy_wait(reader, False):  # off the loop: nothing changes
            assert reader.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
    finally:
        owner.close()
        reader.close()


def test_the_calendars_callbacks_run_before_any_other_of_the_batch_and_a_write_alone(db: Database) -> None:
    """Early callbacks (the live calendar's changes) run first, every work's before any other callback
    of the batch: no other callback reads the calendar, or keeps a reader waiting, before it follows
    the commit."""
    ran: list[str] = []

    def work(key: str) -> Callable[[Session], str]:
        def write(session: Session) -> str:
            session.add(Setting(key=key, value="written"))
            after_commit(session, lambda: ran.append(f"{key} other"))
            after_commit(session, lambda: ran.append(f"{key} calendar"), early=True)
            return key

        return write

    assert queued_together(db, [work("a"), work("b")]) == ["a", "b"]
    assert (db.group.batches, db.group.largest) == (1, 2)
    assert ran == ["a calendar", "b calendar", "a other", "b other"]

    ran.clear()
    with db.write() as session:
        work("c")(session)
        after_commit(session, lambda: ran.append("c second calendar"), early=True)
    assert ran == ["c calendar", "c second calendar", "c other"]
