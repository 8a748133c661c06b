"""The SQLite writers' lock file (store/db.py, `_writers_turn`): an exclusive `flock` that every process
writing to one database takes before BEGIN IMMEDIATE, with a bound on the wait.

flock's wait is in the kernel, which wakes the next writer the moment the lock is free (what the queue
is for), but it has no time limit: a process stopped or stuck while it holds the lock would hold every
writer of every other process forever. So a writer that finds the lock taken hands the wait to a
helper thread, which waits in the kernel as before, and waits for the helper only as long as the bound
allows. A helper whose writer gave up and left, and that later gets the lock, hands it to the next
writer of this process if one is waiting for it, else lets it go at once.

Only one thread of a process asks at a time (the head of the process's own queue): a lock taken with
flock belongs to the open file, which a process's threads share.
"""

from __future__ import annotations

import fcntl
import threading
from dataclasses import dataclass, field


@dataclass
class _Wait:
    """One wait in the kernel, by a helper thread: `wanted` while a writer waits for it; `handed` set
    when the helper took the lock for that writer."""

    wanted: bool = True
    handed: threading.Event = field(default_factory=threading.Event)


class TurnFile:
    def __init__(self, descriptor: int) -> None:
        self.descriptor = descriptor
        self._guard = threading.Lock()
        self._waiting: _Wait | None = None  # a helper blocked in flock, if any

    def take(self, timeout: float) -> bool:
        """The lock within `timeout` seconds (True), or False: then it is not held by this call."""
        with self._guard:
            wait = self._waiting
            if wait is None:
                try:
                    fcntl.flock(self.descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
                wait = self._waiting = _Wait()
                threading.Thread(
                    target=self._wait_in_kernel, args=(wait,), name="writers-turn", daemon=True
                ).start()
            wait.wanted = True  # a helper left by a writer that gave up is this writer's now
        if wait.handed.wait(timeout):
            return True
        with self._guard:
            if wait.handed.is_set():  # handed over as the wait ran out
                return True
            wait.wanted = False
            return False

    def release(self) -> None:
        fcntl.flock(self.descriptor, fcntl.LOCK_UN)

    @property
    def in_use(self) -> bool:
        """A helper still waits in the kernel on the descriptor (which must not be closed then)."""
        with self._guard:
            return self._waiting is not None

    def _wait_in_kernel(self, wait: _Wait) -> None:
        fcntl.flock(self.descriptor, fcntl.LOCK_EX)
        with self._guard:  # under the guard: no writer may find the lock free-looking in between
            self._waiting = None
            if wait.wanted:
                wait.handed.set()
            else:
                fcntl.flock(self.descriptor, fcntl.LOCK_UN)
