"""The execs a server process runs: counted per account and in all, each on a thread of its own.

An exec waits on a tenant's command for up to its TimeoutSeconds (an hour at most). Waited for on the
request threads every other handler shares (anyio's pool of 40), a few dozen of one account's sleeps
held them all and stalled every account's API. So the waiting happens here instead: `ExecSlots.take`
admits the call or refuses it at once (core/exec_limits.py says when), and `ExecSlot.run` gives the
admitted command a thread of its own, which frees its slot when the command has ended, not when the
request does, so the number of these threads never exceeds the process's total.

One thread per running exec rather than a `ThreadPoolExecutor`: admission already bounds them, so a
pool's queue would never be used, and an executor's threads are joined at interpreter exit: a server
asked to stop would wait for the longest command (up to an hour). These are daemon threads: a stopping
server leaves a running command behind for its next start, which ends every exec task it finds
(`Backend.adopt`), as after a crash.

The counts are this process's alone: with `serve --workers N` (or several servers on one store) an
account may run N times its limit. They are kept in memory, never in the store, since a slot lives
exactly as long as a thread of this process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from hyperplan.core.exec_limits import ExecLimits, ExecRefusal, refusal
from hyperplan.errors import ServiceUnavailable, Throttling
from hyperplan.services.accounts.accounts import Caller

T = TypeVar("T")


class ExecSlots:
    """This process's running execs: how many per account, and in all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._per_account: dict[str, int] = {}  # only accounts with an exec running: bounded memory
        self._total = 0

    def take(self, caller: Caller, limits: ExecLimits) -> ExecSlot:
        """A slot for one exec of `caller`'s, or Throttling (the account runs its limit) or
        ServiceUnavailable (the process runs its total). Never waits: it is called on the event loop."""
        account = caller.account_id
        with self._lock:
            running = self._per_account.get(account, 0)
            refused = refusal(limits, running, self._total, exempt=caller.is_admin)
            if refused is None:
                self._per_account[account] = running + 1
                self._total += 1
                return ExecSlot(self, account)
        if refused is ExecRefusal.ACCOUNT_FULL:
            raise Throttling(
                f"Account {caller.account_name!r} is running {limits.per_account} exec calls, its limit "
                "on this server; try again when one has returned."
            )
        raise ServiceUnavailable(
            f"This server is running {limits.total} exec calls, its most at once; try again shortly."
        )

    def running(self, account_id: str | None = None) -> int:
        """Execs running now: one account's, or (None) every account's."""
        with self._lock:
            return self._total if account_id is None else self._per_account.get(account_id, 0)

    def _give_back(self, account: str) -> None:
        with self._lock:
            left = self._per_account[account] - 1
            if left:
                self._per_account[account] = left
            else:
                del self._per_account[account]
            self._total -= 1


class ExecSlot:
    """One admitted exec's place in the counts, given back once (`release`, or by `run`'s thread)."""

    def __init__(self, slots: ExecSlots, account: str) -> None:
        self._slots = slots
        self._account = account
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._slots._give_back(self._account)

    def run(self, work: Callable[[], T], name: str = "exec") -> Future[T]:
        """`work` on a daemon thread of its own; the slot is released when it ends, however it ends.
        The future holds its result or its exception (`asyncio.wrap_future` awaits it)."""
        future: Future[T] = Future()

        def body() -> None:
            try:
                if future.set_running_or_notify_cancel():  # False: cancelled before it began
                    try:
                        future.set_result(work())
                    except BaseException as failed:  # handed to whoever awaits the future
                        future.set_exception(failed)
            finally:
                self.release()

        try:
            threading.Thread(target=body, name=name, daemon=True).start()
        except BaseException:  # no thread could be made: nothing will release the slot but this
            self.release()
            raise
        return future
