"""The guard that lets a request be answered on the event loop only when it will not wait.

The server answers some requests (a search, with warm caches) on the event loop itself rather than in
the thread pool: the hop to a thread costs more CPU than the search. On the loop, any wait (a read of the
store, the writers' turn, a lock a pool thread may hold for long) would stall every connection of the
process. Nothing tells beforehand whether a request will wait, so the code that may wait says so:

- the server runs the attempt under `forbid_waits()` (a context variable, so it marks this thread's
  current context only: a pool thread never sees it);
- every point that may wait calls `may_wait(what)` before any side effect (or takes its lock through
  `holding`, which never blocks there); under `forbid_waits()` that raises `WouldWait`;
- the server then gives back what the attempt took (its rate token) and answers the request again, from
  the start, in the thread pool.

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
