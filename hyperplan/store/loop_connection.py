"""One PostgreSQL connection driven by the event loop's callbacks, for reads a request makes there.

libpq's connection itself, in non-blocking mode: a query is sent, the loop calls back when the socket
has the answer. No task, no coroutine of the driver's, no cursor: psycopg's asynchronous connection cost
~230 us of CPU a read here (its cursor, generators and lock), as much as the hop to the thread pool
the read saves a request. Two kinds of read use it: the change counters read ahead for every request
tried on the loop (store/reads_ahead.py), and the statements a request's try on the loop asks for
(store/loop_reads.py).

The connection is opened in a thread (several round trips), the first time a read is asked for: that
read, and those asked before it is open, get None (the request goes to the thread pool, whose reads are
the synchronous ones). A connection found lost is closed, and opened anew at the next ask. It belongs to
one event loop in one process: a test's earlier server's loop, or a parent process's, never uses it.

Every session on it is read only (`default_transaction_read_only`): what is sent here reads, and
nothing written by mistake could get through.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from sqlalchemy import Engine


def libpq_url(engine: Engine) -> str:
    """The engine's database as libpq names it (postgresql://...), password included."""
    return engine.url.set(drivername="postgresql").render_as_string(hide_password=False)


class LoopConnection:
    """The connection (see the module); a subclass sends on it and reads what comes back
    (`_on_readable`), and drops its reads under way when the connection is lost or replaced
    (`_forget`)."""

    def __init__(self, url: str, prepare: dict[bytes, str] | None = None) -> None:
        self._url = url  # libpq's: postgresql://...
        self._prepare = prepare or {}  # statements prepared as it opens, by name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self._connection: Any = None  # psycopg.pq.PGconn, once open
        self._socket = -1  # its descriptor
        self._opening = False

    def _connected(self) -> Any:
        """The open connection of the running loop, or None: then it is opened in a thread, for a later
        ask (call on the loop)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop or self._pid != os.getpid():
            self.close()  # another loop's (a test's earlier server) or a parent process's: never ours
            self._loop, self._pid, self._opening = loop, os.getpid(), False
            self._forget(answer=False)  # asked on that loop: none of them is waited for here
        if self._connection is None:
            self._open_in_a_thread(loop)
        return self._connection

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None and self._pid == os.getpid():
            if self._loop is not None and not self._loop.is_closed():
                # By the descriptor it had when it opened: a lost connection no longer says it, and a
                # descriptor left watched would refuse the next connection given the same number.
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._socket)
                    self._loop.remove_writer(self._socket)
            with contextlib.suppress(Exception):
                connection.finish()

    def _lost(self) -> None:
        """The connection failed: closed, and every read under way or asked for gets None."""
        self.close()
        self._forget(answer=True)

    # -- for the subclass ------------------------------------------------------------------------------

    def _forget(self, *, answer: bool) -> None:
        """Drop every read under way or asked for; `answer`: each ends with None first (none can be
        answered on this connection)."""

    def _on_readable(self) -> None:
        """Input came: an answer, or the server closing the connection."""

    def _flush(self) -> None:
        """Send what was queued on the connection; what the socket cannot take yet goes when it can."""
        assert self._loop is not None
        connection = self._connection
        if connection.flush():  # 1: some of it still to send
            self._loop.add_writer(self._socket, self._on_writable)

    # -- opening ---------------------------------------------------------------------------------------

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
            steps = [connection.exec_(b"SET default_transaction_read_only = on")]
            steps += [connection.prepare(name, sql.encode()) for name, sql in self._prepare.items()]
            for step in steps:
                if step.status != pq.ExecStatus.COMMAND_OK:
                    raise OperationalError(step.get_error_message())
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

    def _on_writable(self) -> None:
        assert self._loop is not None
        connection = self._connection
        try:
            if not connection.flush():
                self._loop.remove_writer(self._socket)
        except Exception:
            self._lost()
