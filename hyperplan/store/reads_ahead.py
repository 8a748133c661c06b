"""PostgreSQL's change counters read on the event loop, for a request answered there (store/counter_watch.py).

The read is libpq's connection itself in non-blocking mode, driven by the loop's callbacks: the query is
sent, the loop calls back when the socket has the answer, and the answer resolves the futures of the
requests waiting for it. No task, no coroutine of the driver's, no cursor: psycopg's asynchronous
connection (its cursor, generators and lock), and a task and a shielded future per read, cost as much
CPU as the hop to the thread pool that the read saves a search.

Every read begins after each of the requests it answers arrived: one that arrives while a read is under
way waits for the next, which is sent as soon as that one ends and answers every request that came in
between. A request gives up on its own future only (cancelled), never on the others'.

The connection is opened in a thread (several round trips), the first time a request asks: that request
and those that come before it is open get None, as do the requests of a read that failed (the
connection is then closed, and opened anew at the next ask). None sends the request to the thread pool,
whose read is the synchronous one, which reopens its own connection and empties the pool when the
server was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

_PREPARED = b"hyperplan_counters"
Values = dict[str, int] | None  # None: no read (the caller reads the synchronous way)


class ReadsAhead:
    """The reads of one database's counters on one event loop, in one process."""

    def __init__(self, url: str, sql: str) -> None:
        self._url = url  # libpq's: postgresql://...
        self._sql = sql
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._connection: Any = None  # psycopg.pq.PGconn, once open
        self._socket = -1  # its descriptor
        self._opening = False
        self._waiting: list[asyncio.Future[Values]] = []  # for the read under way
        self._next: list[asyncio.Future[Values]] = []  # for the read after it
        self._reading = False
        self._values: Values = None  # what the read under way got so far

    async def read(self) -> Values:
        """The counters as committed when the call was made, or later; None when none could be read."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._pid != os.getpid():
            self.close()  # another loop's (a test's earlier server) or a parent process's: never ours
            self._loop, self._pid = loop, os.getpid()
            self._waiting, self._next, self._reading, self._opening = [], [], False, False
        if self._connection is None:
            self._open_in_a_thread(loop)
            return None
        future: asyncio.Future[Values] = loop.create_future()
        self._next.append(future)
        if not self._reading:
            self._send()
        return await future

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and self._pid == os.getpid():
            if self._loop is not None and not self._loop.is_closed():
                # By the descriptor it had when it opened: a lost connection no longer says it (libpq
                # closed it), and a descriptor left watched in the loop's selector refuses the next
                # connection given the same number (its reader never added: every read waits for ever).
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._socket)
                    self._loop.remove_writer(self._socket)
            with contextlib.suppress(Exception):
                connection.finish()

    # -- opening ------------------------------------------------------------------------------------

    def _open_in_a_thread(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._opening:
            return
        self._opening = True
        opened = loop.run_in_executor(None, self._open)
        opened.add_done_callback(self._opened)

    def _open(self) -> Any:
        from psycopg import OperationalError, pq  # PostgreSQL's driver: only a PostgreSQL store needs it

        connection = pq.PGconn.connect(self._url.encode())
        try:
            if connection.status != pq.ConnStatus.OK:
                raise OperationalError(connection.get_error_message())
            prepared = connection.prepare(_PREPARED, self._sql.encode())
            if prepared.status != pq.ExecStatus.COMMAND_OK:
                raise OperationalError(prepared.get_error_message())
            connection.nonblocking = 1
        except BaseException:
            connection.finish()
            raise
        return connection

    def _opened(self, opened: asyncio.Future[Any]) -> None:
        self._opening = False
        if opened.cancelled() or opened.exception() is not None:
            return  # the next ask tries again
        if opened.get_loop() is not self._loop or self._pid != os.getpid():
            opened.result().finish()  # opened for a loop since replaced (a test's earlier server)
            return
        self._connection = opened.result()
        self._socket = self._connection.socket
        assert self._loop is not None
        # Watched for as long as it is open (two system calls a read fewer than adding and removing it
        # each time): an answer, or the server closing the connection between reads.
        self._loop.add_reader(self._socket, self._on_readable)

    # -- one read, from the loop's callbacks ---------------------------------------------------------

    def _send(self) -> None:
        assert self._loop is not None
        self._waiting, self._next = self._next, []
        self._reading, self._values = True, None
        connection = self._connection
        try:
            connection.send_query_prepared(_PREPARED, None)
            if connection.flush():  # 1: some of it still to send, when the socket can take it
                self._loop.add_writer(self._socket, self._on_writable)
        except Exception:
            self._end(None, lost=True)

    def _on_writable(self) -> None:
        assert self._loop is not None
        connection = self._connection
        try:
            if not connection.flush():
                self._loop.remove_writer(self._socket)
        except Exception:
            self._end(None, lost=True)

    def _on_readable(self) -> None:
        from psycopg import OperationalError, pq

        connection = self._connection
        try:
            connection.consume_input()  # raises when the connection was lost
            if not self._reading:
                return  # nothing asked: a notice, say
            while not connection.is_busy():  # busy: the rest of the answer is still to come
                result = connection.get_result()
                if result is None:  # the answer is complete
                    if self._values is None:
                        raise OperationalError("the change counters' read returned nothing")
                    self._end(self._values)
                    return
                if result.status != pq.ExecStatus.TUPLES_OK:
                    raise OperationalError(result.get_error_message())
                self._values = {
                    bytes(result.get_value(row, 0) or b"").decode(): int(result.get_value(row, 1) or 0)
                    for row in range(result.ntuples)
                }
        except Exception:
            self._end(None, lost=True)

    def _end(self, values: Values, *, lost: bool = False) -> None:
        if lost:
            self.close()
        self._reading = False
        for future in self._waiting:
            if not future.done():  # a request cancelled meanwhile (the server stopping)
                future.set_result(values)
        self._waiting = []
        if self._next and self._connection is not None:
            self._send()  # for the requests that came while this read was under way
        elif self._next:
            for future in self._next:
                if not future.done():
                    future.set_result(None)
            self._next = []
