"""Statements a request's try on the event loop reads there, asynchronously (PostgreSQL).

A purchase tried on the loop (server/sagemaker.py) reads its refusals on a snapshot before it asks for
the writers' turn (store/db.py `refuse_early`). On PostgreSQL that read is a round trip, which the try on
the loop cannot wait for: it asks for it instead (hyperplan/waits.py `ReadFirst`), the server makes the
read here, on the loop's own connection (store/loop_connection.py), and tries the request again, which
then finds the read's rows (`read_ahead`). Most purchases under contention are refused there, with no
hop to the thread pool, which under load cost a request more CPU than all of this.

Each read is one statement, in a transaction of its own (autocommit): one snapshot, taken after the
request arrived, as the synchronous read's REPEATABLE READ one is. The statements are prepared on the
connection the first time each is read (by their text and their parameters' types). Reads asked while
one is under way wait for it, in order; each gets its own rows, or None: not open yet, the connection
lost, the statement failed. None sends the request to the thread pool, which reads the synchronous way
and meets the same error, if any, there.

Values are sent and rows loaded by psycopg's own adapters, as its cursor does for the synchronous read:
a row read here is the row read there.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hyperplan.store.loop_connection import LoopConnection

Rows = list[tuple[Any, ...]]


@dataclass(eq=False)
class _Read:
    sql: str
    params: Sequence[Any]
    future: asyncio.Future[Rows | None]
    transformer: Any = None  # psycopg's Transformer: dumps its values, loads its rows
    preparing: bytes | None = None  # the statement's name, while it is being prepared
    rows: Rows | None = None
    failed: bool = False
    values: Sequence[Any] = field(default_factory=tuple)


class LoopReads(LoopConnection):
    """The reads of one database, on one event loop, in one process (see the module)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._queue: deque[_Read] = deque()
        self._current: _Read | None = None
        self._names: dict[tuple[str, tuple[int, ...]], bytes] = {}  # prepared on the open connection

    async def rows(self, sql: str, params: Sequence[Any]) -> Rows | None:
        """`sql` (with $1... placeholders) read with `params`, in a transaction of its own begun after
        the call; None when it was not read (see the module)."""
        if self._connected() is None:
            return None
        assert self._loop is not None
        read = _Read(sql, params, self._loop.create_future())
        self._queue.append(read)
        if self._current is None:
            self._send_next()
        return await read.future

    def _forget(self, *, answer: bool) -> None:
        reads = [*([self._current] if self._current else []), *self._queue]
        self._current, self._queue, self._names = None, deque(), {}
        for read in reads if answer else ():
            if not read.future.done():  # a request cancelled meanwhile (the server stopping)
                read.future.set_result(None)

    # -- one read at a time, from the loop's callbacks --------------------------------------------------

    def _send_next(self) -> None:
        from psycopg.adapt import PyFormat, Transformer

        while self._queue:
            read = self._queue.popleft()
            if read.future.done():
                continue  # cancelled while it waited: nobody takes its rows
            self._current = read
            try:
                read.transformer = Transformer()
                read.values = read.transformer.dump_sequence(read.params, [PyFormat.TEXT] * len(read.params))
                key = (read.sql, tuple(read.transformer.types))
                name = self._names.get(key)
                if name is None:
                    read.preparing = b"hyperplan_loop_%d" % len(self._names)
                    self._connection.send_prepare(
                        read.preparing, read.sql.encode(), param_types=read.transformer.types
                    )
                else:
                    self._send_query(read, name)
                self._flush()
            except Exception:
                self._lost()
            return

    def _send_query(self, read: _Read, name: bytes) -> None:
        self._connection.send_query_prepared(name, read.values, param_formats=read.transformer.formats)

    def _on_readable(self) -> None:
        from psycopg import pq

        connection = self._connection
        try:
            connection.consume_input()  # raises when the connection was lost
            read = self._current
            if read is None:
                return  # nothing asked: a notice, say
            while not connection.is_busy():  # busy: the rest of the answer is still to come
                result = connection.get_result()
                if result is None:  # this command's answer is complete
                    if connection.status != pq.ConnStatus.OK:
                        raise OSError("the connection was lost")  # its last answer said why
                    self._step_done(read)
                    return
                if result.status == pq.ExecStatus.TUPLES_OK and read.preparing is None:
                    read.transformer.set_pgresult(result)
                    read.rows = read.transformer.load_rows(0, result.ntuples, tuple)
                elif result.status != pq.ExecStatus.COMMAND_OK or read.preparing is None:
                    read.failed = True  # a statement's error: the pool's read meets it and says it
        except Exception:
            self._lost()

    def _step_done(self, read: _Read) -> None:
        if read.preparing is not None and not read.failed:
            name, read.preparing = read.preparing, None
            self._names[(read.sql, tuple(read.transformer.types))] = name
            self._send_query(read, name)
            self._flush()
            return
        self._current = None
        if not read.future.done():
            read.future.set_result(None if read.failed else (read.rows or []))
        self._send_next()
