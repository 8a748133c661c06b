"""The guard that lets a request be answered on the event loop only when it will not wait.

The server answers some requests (a search, with warm caches) on the event loop itself rather than in
the thread pool: the hop to a thread costs more CPU than the search. On the loop, any wait (a read of the
store, the writers' turn, a lock a pool thread may hold for long) would stall every connection of the
process. Nothing tells beforehand whether a request will wait, so the code that may wait says so:

- the server runs the attempt under `forbid_waits()` (a context variable, so it marks this thread's
  current context only: a pool thread never sees it);
- every point that may wait calls `may_wait(what)` before any side effect (or takes its lock through
  `holding`, which never blocks there); under `forbid_waits()` that raises `WouldWait`;
- the server then finishes the request in the thread pool, from the start of the step that would have
  waited (server/loop_or_pool.py: a request admitted on the loop is not admitted again).

A request tried on the loop and finished in the pool need not do twice what the try on the loop did
and the answer does not depend on: the server runs both tries of one request in one `answering()`
block; the try on the loop notes a step done (`note_done_on_the_loop`), and the pool's try skips it
(`done_on_the_loop`). A write's refusals read on a snapshot are such a step (store/checked_write.py):
only a shortcut to an answer the writers' turn would give too.

`WouldWait` is a BaseException, like GeneratorExit, and outside the service error tree
(hyperplan/errors.py): no `except Exception` on the way (the one place that turns errors into wire
responses, a retry on a lost connection) can take it for a failure; it always reaches the server.

A leaf module: nothing of hyperplan, checked from any layer (tests/test_layers.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import TracebackType

_FORBIDDEN: ContextVar[bool] = ContextVar("hyperplan_waits_forbidden", default=False)
_DONE_ON_THE_LOOP: ContextVar[set[str] | None] = ContextVar("hyperplan_done_on_the_loop", default=None)


class WouldWait(BaseException):
    """Code under `forbid_waits()` reached a point that may wait; `what` names it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


@contextmanager
def forbid_waits() -> Iterator[None]:
    """Within the block, `may_wait` raises WouldWait (the block runs on the event loop)."""
    token = _FORBIDDEN.set(True)
    try:
        yield
    finally:
        _FORBIDDEN.reset(token)


def waits_forbidden() -> bool:
    return _FORBIDDEN.get()


@contextmanager
def answering() -> Iterator[None]:
    """The span of one request's tries, on the loop and then in the pool (whose thread runs in a copy
    of this context, so it sees the same set of steps done)."""
    token = _DONE_ON_THE_LOOP.set(set())
    try:
        yield
    finally:
        _DONE_ON_THE_LOOP.reset(token)


def note_done_on_the_loop(step: str) -> None:
    """Under `forbid_waits()` within `answering()`: `step` was done, and a try in the pool may skip it."""
    done = _DONE_ON_THE_LOOP.get()
    if done is not None and _FORBIDDEN.get():
        done.add(step)


def done_on_the_loop(step: str) -> bool:
    """Whether this request's try on the loop did `step` (never true on the loop itself)."""
    done = _DONE_ON_THE_LOOP.get()
    return done is not None and step in done and not _FORBIDDEN.get()


def may_wait(what: str) -> None:
    """Call before anything that may wait (and before any side effect of it): raises WouldWait under
    `forbid_waits()`, does nothing elsewhere."""
    if _FORBIDDEN.get():
        raise WouldWait(what)


class holding:  # a lower-case name: used as a lock is, in a with statement
    """`with holding(lock, what):` is `with lock:`, except under `forbid_waits()`, where a lock another
    thread holds raises WouldWait rather than blocking the loop. For locks a pool thread may hold for
    long, or while it is descheduled."""

    __slots__ = ("_lock", "_what")

    def __init__(self, lock: threading.Lock | threading.RLock, what: str) -> None:
        self._lock = lock
        self._what = what

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=not _FORBIDDEN.get()):
            raise WouldWait(self._what)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._lock.release()
