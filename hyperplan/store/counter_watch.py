"""The change counters read at every request (store/changes.py), at the least cost that still sees every
commit made before the read began, by any process.

SQLite: one long-lived connection of this process's own, kept out of the pool, asks `PRAGMA
data_version` first. Its value differs from the one it last gave if any other connection (of this
process or another) committed in between; it reads the shared-memory index of the write-ahead log,
no table, in microseconds. Only then does the connection read the counters again. The pragma opens a
read transaction of its own, so what it answers is the state at the time of asking, not a cached one.

PostgreSQL: the same connection idea, in autocommit, so the read is one round trip (a pooled
connection cost a ping at checkout and a rollback at checkin besides). A connection lost (the server
restarted) is opened again once, in the same call, and the pool, whose connections were surely lost
too and are not pinged at checkout (store/db.py, _make_engine), is emptied first: the request's own
transactions, which come after this read, get new ones.

One lock serialises the callers of one watch; each call still reads after it was made. On PostgreSQL,
where a read is a round trip, callers arriving while one is under way share the next one: it begins
after each of them called, so it answers each of them, and N requests arriving together cost two
reads, not N one after another.

A search answered on the event loop (hyperplan/waits.py) cannot make that round trip there: it would
stall every connection of the process. So the server reads ahead (`reading_ahead`) before the
synchronous answer begins: a read on the loop, on a third connection of this process's own
(store/reads_ahead.py), which the request's synchronous reads then take as theirs. It too begins after
the request arrived, so the request sees every commit acknowledged before it began, on any server. When
there is none (the connection still opening, or lost), the request's synchronous read, which may not
wait on the loop, sends it to the thread pool, whose read reopens.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import AsyncIterator
from contextvars import ContextVar
from typing import Any

from sqlalchemy import Engine

from hyperplan.store.reads_ahead import ReadsAhead
from hyperplan.waits import holding, may_wait

READ_COUNTERS_SQL = "SELECT name, value FROM change_counters"

# The counters a request read ahead, asynchronously (`CounterWatch.reading_ahead`), and the watch that
# read them: a context variable, so only that request's own synchronous reads take them.
_READ_AHEAD: ContextVar[tuple[CounterWatch, dict[str, int]] | None] = ContextVar(
    "hyperplan_counters_read_ahead", default=None
)


class CounterWatch:
    def __init__(self, engine: Engine, *, sqlite: bool) -> None:
        self._engine = engine
        self._sqlite = sqlite
        self._lock = threading.Lock()
        self._connection: Any = None  # the driver's connection, detached from the pool
        self._pid = 0  # the process that opened it: a child never uses its parent's
        self._version: int | None = None  # SQLite's data_version when `_values` was read
        self._values: dict[str, int] = {}
        self._share_anew()
        self._reads_ahead = (
            None
            if sqlite
            else ReadsAhead(
                engine.url.set(drivername="postgresql").render_as_string(False), READ_COUNTERS_SQL
            )
        )

    def _share_anew(self) -> None:
        """PostgreSQL's shared reads: how many began, the newest finished one's number and values (in
        this process: a child starts afresh)."""
        self._turns = threading.Condition(threading.Lock())
        self._turns_pid = os.getpid()
        self._began = 0
        self._finished = 0
        self._reading = False
        self._latest: dict[str, int] = {}

    def read(self) -> dict[str, int]:
        """Every counter's value as committed when the call began (a new dict each time).

        On the event loop (hyperplan/waits.py): SQLite's read is a look at shared memory (and, after a
        commit, a read that WAL never makes wait for a writer), fine there, but never a wait for the
        lock; PostgreSQL's is a round trip, a wait, unless the request read ahead (`reading_ahead`)."""
        ahead = _READ_AHEAD.get()
        if ahead is not None and ahead[0] is self:
            return dict(ahead[1])
        if not self._sqlite:
            may_wait("the change counters' round trip")
            return self._read_shared()
        with holding(self._lock, "the change counters' connection"):
            return dict(self._read())

    def _read_shared(self) -> dict[str, int]:
        """A read that began after this call did: one under way already began too early, so wait for
        it to end, then take the next one, the caller's own or one begun by a caller that came while
        the same one was under way."""
        if self._turns_pid != os.getpid():
            self._share_anew()
        with self._turns:
            wanted = self._began + 1
            while self._finished < wanted:
                if not self._reading:
                    self._reading, self._began = True, self._began + 1
                    number = self._began
                    break
                self._turns.wait()
            else:
                return dict(self._latest)
        try:
            with self._lock:
                values = self._read_or_reopen()
            with self._turns:
                self._latest, self._finished = values, number
        finally:
            with self._turns:
                self._reading = False
                self._turns.notify_all()
        return dict(values)

    def _read_or_reopen(self) -> dict[str, int]:
        try:
            return self._read()
        except Exception:
            # The connection was lost (the server restarted, say). So were the pool's, which are not
            # pinged at checkout: the pool starts afresh before this request's transactions check one
            # out. Then one more try, on a new connection.
            self._drop()
            self._engine.dispose()
            return self._read()

    def close(self) -> None:
        with self._lock:
            self._drop()
        if self._reads_ahead is not None:
            self._reads_ahead.close()

    # -- reading ahead, on the event loop (PostgreSQL) -------------------------------------------------

    @contextlib.asynccontextmanager
    async def reading_ahead(self) -> AsyncIterator[None]:
        """Within the block, this context's `read()` answers what an asynchronous read made on entry
        found (on PostgreSQL; SQLite's read never waits, and is left as it is). A read that failed
        leaves `read()` as it is."""
        values = None if self._reads_ahead is None else await self._reads_ahead.read()
        if values is None:
            yield
            return
        token = _READ_AHEAD.set((self, values))
        try:
            yield
        finally:
            _READ_AHEAD.reset(token)

    def _read(self) -> dict[str, int]:
        connection = self._open()
        cursor = connection.cursor()
        try:
            if self._sqlite:
                cursor.execute("PRAGMA data_version")
                version = cursor.fetchone()[0]
                if version == self._version:
                    return self._values
                # Read after the pragma: a commit in between moves the version again, and the next
                # call reads once more; never the other way round (values older than the version).
                cursor.execute(READ_COUNTERS_SQL)
                self._values, self._version = dict(cursor.fetchall()), version
                return self._values
            cursor.execute(READ_COUNTERS_SQL)
            return dict(cursor.fetchall())
        finally:
            cursor.close()

    def _open(self) -> Any:
        if self._connection is None or self._pid != os.getpid():
            may_wait("opening the change counters' connection")
            pooled = self._engine.raw_connection()  # configured as every connection (pragmas, isolation)
            connection: Any = pooled.driver_connection
            pooled.detach()  # ours for good: the pool makes another when it needs one
            if not self._sqlite:
                connection.rollback()  # whatever the checkout began, then one statement per transaction
                connection.autocommit = True
            self._connection, self._pid, self._version = connection, os.getpid(), None
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None and self._pid == os.getpid():
            with contextlib.suppress(Exception):  # already broken: nothing more to give back
                self._connection.close()
        self._connection, self._version = None, None
