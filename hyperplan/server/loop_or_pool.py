"""Where a request is answered: on the event loop when it will not wait, else in the thread pool.

A hop to the thread pool costs a request more CPU than a search with warm caches costs itself (thread
wake-ups, GIL hand-offs); but on the loop any wait (a read of the store, the writers' turn, a lock a
pool thread holds) stalls every connection of the process, and nothing tells beforehand whether a
request will wait. So an operation that usually does not is tried on the loop, where every point that
could wait refuses to (hyperplan/waits.py: `WouldWait`), and finished in the pool when one does.

An answer comes in two steps: `admit` (authenticate, find the operation, take the rate token, parse)
and `respond` (the handler and the serialised result). A step that would wait on the loop is done
again, from its start, in the pool; a first step that finished on the loop is not done again, so a
request is authenticated and admitted once. Every point that may wait says so before any side effect,
so a step done again has nothing to undo: `admit`'s one side effect, the rate token, is its last step,
and taken only once its lease (the wait) is over. Both tries run in one `answering()` block, so that
the pool may skip what the loop's try did and the answer does not depend on (store/checked_write.py:
a write's refusals read on a snapshot). The try on the loop is synchronous: a shutdown never cuts it
off half-way.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from hyperplan.waits import WouldWait, answering, forbid_waits

Admitted = TypeVar("Admitted")
Answer = TypeVar("Answer")


async def answer(
    admit: Callable[[], Admitted],
    respond: Callable[[Admitted], Answer],
    *,
    on_the_loop: bool,
    read_ahead: Callable[[], AbstractAsyncContextManager[None]],
) -> Answer:
    """`respond(admit())`: tried on the event loop first when `on_the_loop`, each step finished in the
    thread pool if it would wait there. `read_ahead()` surrounds the try on the loop (the store's change
    counters read asynchronously on entry, so that the try has nothing to wait for)."""
    with answering():
        if not on_the_loop:
            return await run_in_threadpool(_both, admit, respond)
        async with read_ahead():
            tried = _on_the_loop(admit, respond)
        if isinstance(tried, _Answered):
            return tried.answer
        if isinstance(tried, _Admitted):
            return await run_in_threadpool(respond, tried.admitted)
        return await run_in_threadpool(_both, admit, respond)


@dataclass(frozen=True)
class _Answered(Generic[Answer]):
    answer: Answer


@dataclass(frozen=True)
class _Admitted(Generic[Admitted]):
    admitted: Admitted


def _on_the_loop(
    admit: Callable[[], Admitted], respond: Callable[[Admitted], Answer]
) -> _Answered[Answer] | _Admitted[Admitted] | None:
    """As far as the loop gets: answered, admitted only, or not even admitted (None)."""
    with forbid_waits():
        try:
            admitted = admit()
        except WouldWait:
            return None
        try:
            return _Answered(respond(admitted))
        except WouldWait:
            return _Admitted(admitted)


def _both(admit: Callable[[], Admitted], respond: Callable[[Admitted], Answer]) -> Answer:
    return respond(admit())
