"""The one primitive under every background loop: a named thread that runs a step when woken.

A loop's step does one pass of its work and says when it wants to run again (seconds), or None when
only new work should bring it back. Between steps the worker waits on its `Wake`: whoever makes work
for it (a commit that schedules an event, provisions a node, queues a delivery) notifies the wake,
and the step runs at once. The `poll` bounds every wait, as a safety net for changes nobody announces
(a process that exits by itself) and so that `request_stop`, which only sets a flag, is seen soon.

A step that raises is logged under the worker's name and retried after a back-off that doubles with
each failure in a row (`backoff_base` up to `backoff_max`), so a broken database is not hammered and a
bad moment does not end the loop; a wake does not cut a back-off short.

`Wake` is an interface: this process's `LocalWake` is a `threading.Event`; a later one can carry the
notification between processes (e.g. PostgreSQL LISTEN/NOTIFY), so that a loop with a single owner
runs on one elected server and is woken by the others.

This module imports nothing of hyperplan: every layer may build workers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

Step = Callable[[], float | None]


class Wake(Protocol):
    def notify(self) -> None:
        """There may be work: the next (or current) wait returns at once."""

    def wait(self, timeout: float) -> None:
        """Return when notified or after `timeout` seconds, consuming the notification."""


class LocalWake:
    """A wake within this process."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def notify(self) -> None:
        self._event.set()

    def wait(self, timeout: float) -> None:
        # Cleared after the wait and before the next step runs: a notification that arrives during the
        # step is seen by the wait that follows it, so none is lost.
        self._event.wait(timeout)
        self._event.clear()


def backoff_seconds(failures: int, base: float, cap: float) -> float:
    """The wait after `failures` failed steps in a row: base, 2 base, 4 base, ... at most cap."""
    return min(cap, base * 2 ** min(max(failures - 1, 0), 40))


class Worker:
    def __init__(
        self,
        name: str,
        step: Step,
        *,
        poll: float,
        wake: Wake | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        self.name = name
        self.poll = poll
        self._step = step
        self._wake: Wake = wake or LocalWake()
        self._backoff = (backoff_base, backoff_max)
        self._stop_requested = False  # a plain attribute: request_stop must be safe in a signal handler
        self._thread: threading.Thread | None = None
        self.failures = 0  # failed steps in a row

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop_requested = False
        # A daemon: a step stuck in a call that never returns must not keep the process from exiting.
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.notify()

    def request_stop(self) -> None:
        """End the loop after the step in progress. Sets one attribute and takes no lock, so a signal
        handler may call it; the loop sees it within `poll` seconds."""
        self._stop_requested = True

    def stop(self, timeout: float = 10.0) -> None:
        self.request_stop()
        self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                log.warning("%s: still in a step after %.0f s; left to end on its own", self.name, timeout)
        self._thread = None

    def _loop(self) -> None:
        while not self._stop_requested:
            try:
                delay = self._step()
            except Exception:  # the loop must outlive a bad step; the work stays where it was
                self.failures += 1
                self._back_off()
                continue
            self.failures = 0
            if not self._stop_requested:
                self._wake.wait(self.poll if delay is None else max(0.0, min(delay, self.poll)))

    def _back_off(self) -> None:
        """Wait out the back-off in slices of `poll`, so that a stop request is still seen."""
        wait = backoff_seconds(self.failures, *self._backoff)
        log.exception("%s: step failed (%d in a row); retrying in %.1f s", self.name, self.failures, wait)
        deadline = time.monotonic() + wait
        while not self._stop_requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, self.poll))
