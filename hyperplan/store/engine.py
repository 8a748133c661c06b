"""The engine a store runs on, as each database needs it: SQLite in WAL with its pragmas and a busy
timeout, PostgreSQL at READ COMMITTED with statements deferred into the next round trip
(store/prepared.py) and rollbacks that keep what psycopg prepared."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import OperationalError

from hyperplan.errors import ServiceUnavailable
from hyperplan.store import prepared
from hyperplan.waits import WouldWait

RELAXED = "synchronous_normal"  # a SQLite connection's info: a write(durable=False) lowered its sync

BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite statement waits for another connection's lock before it fails (on the event loop:
not at all, `no_busy_wait`)."""
_SQLITE_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


def make_engine(url: str) -> Engine:
    if url.startswith("postgresql"):
        # READ COMMITTED, not stricter: a writer's statements after its locks must see what the
        # transactions it waited for committed. Readers ask for REPEATABLE READ per transaction.
        # No ping at checkout (a round trip, two with the BEGIN it starts, before every transaction):
        # each request's first statement is the change counters' read on a connection of their own,
        # which finds a restarted server first and has the pool drop every older connection
        # (store/counter_watch.py); a writer's first statement runs again once on a new connection
        # (store/db.py _first_statement); anything else lost mid-way is a ServiceUnavailable. Connections are
        # replaced after pool_recycle seconds, so none outlives what a proxy or firewall keeps open.
        engine = create_engine(
            url, pool_recycle=600, isolation_level="READ COMMITTED", pool_size=8, max_overflow=24
        )
        engine.dialect.do_rollback = _rollback_keeping_prepared  # type: ignore[method-assign]
        _deferred_statements_sent_in_time(engine)
        return engine
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}, pool_size=16
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would defer BEGIN; we issue BEGIN ourselves (see write()).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # What a row no longer holds is overwritten, not left in a free page: a secret re-sealed under
        # a new key leaves no old token in the file.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()

    _savepoints_as_plain_sql(engine.dialect)

    @event.listens_for(engine, "checkin")
    def _durable_again(dbapi_connection: Any, record: Any) -> None:
        # After a write(durable=False), before any other writer can have the connection.
        if record.info.pop(RELAXED, False) and dbapi_connection is not None:
            dbapi_connection.execute("PRAGMA synchronous=FULL")

    return engine


def _deferred_statements_sent_in_time(engine: Engine) -> None:
    """A transaction's deferred statements (store/prepared.py: its locks) go to the server before any
    statement SQLAlchemy runs and before the commit; a rollback, or the connection's return to the
    pool, forgets them."""

    @event.listens_for(engine, "before_cursor_execute")
    def _before(connection: Connection, *_args: Any) -> None:
        if prepared.DEFERRED in connection.info:
            prepared.run_deferred(connection)

    @event.listens_for(engine, "commit")
    def _before_commit(connection: Connection) -> None:
        prepared.run_deferred(connection)

    @event.listens_for(engine, "rollback")
    def _rolled_back(connection: Connection) -> None:
        if not connection.invalidated:  # an invalidated one's info goes with its driver connection
            prepared.drop_deferred(connection.info)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        prepared.drop_deferred(record.info)


def begin_immediate(connection: Connection) -> None:
    """SQLite's write lock, within its busy timeout; past it a retryable ServiceUnavailable, not a 500."""
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except OperationalError as exc:
        if "locked" not in str(exc.orig):
            raise
        raise ServiceUnavailable(
            "The store is busy: another process has held its write lock for longer than the store "
            "waits; try again."
        ) from None


@contextmanager
def no_busy_wait(driver: Any, on_the_loop: bool) -> Iterator[None]:
    """On the event loop, a SQLite connection that fails at once where it would wait for a lock: the
    failure is a WouldWait (the request is answered in the pool); elsewhere, nothing changes."""
    if not on_the_loop:
        yield
        return
    driver.execute("PRAGMA busy_timeout=0")
    try:
        yield
    except (sqlite3.OperationalError, OperationalError) as exc:
        cause = exc.orig if isinstance(exc, OperationalError) else exc
        if getattr(cause, "sqlite_errorcode", None) in _SQLITE_BUSY_CODES:
            raise WouldWait("a lock on the store") from None
        raise
    finally:
        driver.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def _rollback_keeping_prepared(dbapi_connection: Any) -> None:
    """PostgreSQL: ROLLBACK, leaving the statements psycopg prepared on the server prepared.

    psycopg prepares a statement on the server once a connection has run it a few times
    (prepare_threshold), so that PostgreSQL parses and plans it once. But its own rollback() forgets
    every prepared statement, and sends DEALLOCATE ALL before the connection's next statement: it guards
    against DDL rolled back under a prepared statement. Here every read ends in a rollback (Database.read),
    and so does each refused purchase: nothing stayed prepared, and each statement was parsed and
    planned afresh, the purchase's capacity read the dearest of them (issue 20). Our DDL
    runs only in migrations, at a server's start, and a DROP or ALTER still clears psycopg's cache as it
    runs. The ROLLBACK goes straight to libpq (which waits without holding the GIL); if it does not
    answer as a rollback does, the driver's own rollback runs, and raises as it would have."""
    from psycopg import pq

    pgconn = dbapi_connection.pgconn
    if pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        result = pgconn.exec_(b"ROLLBACK")
    except Exception:  # no result at all: the driver's rollback says what is wrong
        result = None
    if result is None or result.status != pq.ExecStatus.COMMAND_OK:
        dbapi_connection.rollback()


def _savepoints_as_plain_sql(dialect: Any) -> None:
    """SQLAlchemy runs each SAVEPOINT, RELEASE and ROLLBACK TO as a statement it compiles afresh, never
    from its cache; a batch of purchases (store/group_commit.py) runs two per
    purchase. The same SQL, as text: the name is SQLAlchemy's own (sa_savepoint_N), quoted if needed."""
    quote = dialect.identifier_preparer.quote

    def run(verb: str) -> Callable[[Connection, str], None]:
        def statement(connection: Connection, name: str) -> None:
            connection.exec_driver_sql(f"{verb} {quote(name)}")

        return statement

    dialect.do_savepoint = run("SAVEPOINT")
    dialect.do_release_savepoint = run("RELEASE SAVEPOINT")
    dialect.do_rollback_to_savepoint = run("ROLLBACK TO SAVEPOINT")
