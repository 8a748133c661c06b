"""PostgreSQL's change counters read on the event loop, for a request answered there (store/counter_watch.py).

The read is sent on the loop's own connection (store/loop_connection.py), and its answer resolves the
futures of the requests waiting for it. A task and a shielded future per read cost ~85 us more of CPU,
as much as the hop to the thread pool the read saves a search: there are none.

Every read begins after each of the requests it answers arrived: one that arrives while a read is under
way waits for the next, which is sent as soon as that one ends and answers every request that came in
between. A request gives up on its own future only (cancelled), never on the others'.

A request that asks before the connection is open, or whose read failed, gets None: it goes to the
thread pool, whose read is the synchronous one, which reopens its own connection and empties the pool
when the server was lost.
"""

from __future__ import annotations

import asyncio

from hyperplan.store.loop_connection import LoopConnection

_PREPARED = b"hyperplan_counters"
Values = dict[str, int] | None  # None: no read (the caller reads the synchronous way)


class ReadsAhead(LoopConnection):
    """The reads of one database's counters on one event loop, in one process."""

    def __init__(self, url: str, sql: str) -> None:
        super().__init__(url, prepare={_PREPARED: sql})
        self._waiting: list[asyncio.Future[Values]] = []  # for the read under way
        self._next: list[asyncio.Future[Values]] = []  # for the read after it
        self._reading = False
        self._values: Values = None  # what the read under way got so far

    async def read(self) -> Values:
        """The counters as committed when the call was made, or later; None when none could be read."""
        if self._connected() is None:
            return None
        assert self._loop is not None
        future: asyncio.Future[Values] = self._loop.create_future()
        self._next.append(future)
        if not self._reading:
            self._send()
        return await future

    def _forget(self, *, answer: bool) -> None:
        waiting, self._waiting, self._next, self._reading = self._waiting + self._next, [], [], False
        for future in waiting if answer else ():
            if not future.done():  # a request cancelled meanwhile (the server stopping)
                future.set_result(None)

    # -- one read, from the loop's callbacks ---------------------------------------------------------

    def _send(self) -> None:
        self._waiting, self._next = self._next, []
        self._reading, self._values = True, None
        try:
            self._connection.send_query_prepared(_PREPARED, None)
            self._flush()
        except Exception:
            self._lost()

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
            self._lost()

    def _end(self, values: Values) -> None:
        self._reading = False
        for future in self._waiting:
            if not future.done():  # a request cancelled meanwhile (the server stopping)
                future.set_result(values)
        self._waiting = []
        if self._next:
            self._send()  # for the requests that came while this read was under way
