"""A write checked twice: first on a snapshot, without a lock, then under its locks in the write itself.

Most purchases under contention are refused (the capacity was taken since the search). Refused in the
write, each one waited for the writers' turn (SQLite) or held its account's and pools' locks while it
read (PostgreSQL), and every buyer of those pools waited behind it. A refusal read on a snapshot taken
after the request arrived and before it is answered is the answer the write would have given at that
instant: a valid place for it among the other writes (linearizable), and it writes nothing either way.
A write that passes the snapshot's check checks again under its locks, against the rows as they are
then (`CheckedWrite.check`); only that check decides.

`Database.write_checked` (store/db.py) runs the phases in order; this module holds the value that
names them and the snapshot's read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from hyperplan.store.engine import no_busy_wait
from hyperplan.waits import done_on_the_loop, may_wait, note_done_on_the_loop, waits_forbidden

T = TypeVar("T")

SNAPSHOT_STEP = "a write's refusals read on a snapshot"
"""The step a try on the event loop notes done (hyperplan/waits.py), so that the pool's try skips it."""


@dataclass(frozen=True)
class CheckedWrite(Generic[T]):
    """The phases of a checked write, in the order they run."""

    on_snapshot: Callable[[Connection], object]
    """The refusals `check` would give, read on a connection that takes no lock; raises to refuse. On
    PostgreSQL each statement is its own snapshot, so what it weighs together it reads in one statement."""
    prepare: Callable[[], object]
    """What the write needs that no row of the store decides, worked out once the snapshot did not
    refuse, before the writers' turn (a refused write needs none of it)."""
    check: Callable[[Session], object]
    """The refusals again, in the write: it locks what it reads (store/locks.py) and only reads."""
    work: Callable[[Session], T]
    """The rows, in the same transaction as `check`; its result is the write's."""
    likely_passes: Callable[[], bool] = lambda: False
    """Whether what this process holds in memory says the snapshot would not refuse (a purchase: the live
    calendar, as of the request's sync, has room for it). On PostgreSQL the snapshot's read is a round
    trip and a statement of its own, and a write predicted to pass skips it: `check` decides under the
    locks either way, so a wrong guess costs a refusal made there, under the locks, instead. On SQLite
    the read is in-process (and may answer on the event loop) and runs regardless."""


def refuse_on_snapshot(engine: Engine, reads: Callable[[Connection], object]) -> None:
    """`reads(connection)` on a snapshot, before the write; what it raises is raised here. On SQLite a
    read transaction on a pooled connection past the session (WAL's snapshot: readers go side by side,
    beside the writer); on PostgreSQL outside any transaction (autocommit: one round trip a read).

    On SQLite it may run on the event loop (server/loop_or_pool.py): the read waits for no lock (a busy
    store is a WouldWait at once, not SQLite's busy timeout), and its connection must be open and idle
    in the pool. A try on the loop notes the step done; the pool's try of the same request skips it."""
    dialect = engine.dialect.name
    if dialect == "postgresql":
        _refuse_on_postgres(engine, reads)
    elif dialect == "sqlite" and not done_on_the_loop(SNAPSHOT_STEP):
        _refuse_on_sqlite(engine, reads)
        note_done_on_the_loop(SNAPSHOT_STEP)


def _refuse_on_sqlite(engine: Engine, reads: Callable[[Connection], object]) -> None:
    on_the_loop = waits_forbidden()
    if on_the_loop and not _idle_connection(engine):
        may_wait("a pooled connection")
    with engine.connect() as connection:
        driver = connection.connection.dbapi_connection
        assert driver is not None
        with no_busy_wait(driver, on_the_loop):
            driver.execute("BEGIN")  # deferred: the snapshot is taken at the first read
            try:
                reads(connection)
            finally:
                driver.execute("ROLLBACK")


def _idle_connection(engine: Engine) -> bool:
    """Whether a connection waits idle in the pool, opened already: a checkout on the event loop must
    neither wait for one nor open one (whose setup waits for a lock the busy timeout long)."""
    pool = engine.pool
    return isinstance(pool, QueuePool) and pool.checkedin() > 0


def _refuse_on_postgres(engine: Engine, reads: Callable[[Connection], object]) -> None:
    """Autocommit: a read is one round trip, with no BEGIN before it nor ROLLBACK after, takes no lock
    and leaves nothing to roll back. A connection found lost answers nothing here: the write that
    follows opens a new one (store/db.py _first_statement)."""
    may_wait("a read of the store")
    try:
        with engine.connect() as connection:
            # Only the driver's flag (psycopg's autocommit): no statement; the pool puts it back.
            connection.execution_options(isolation_level="AUTOCOMMIT")
            reads(connection)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
