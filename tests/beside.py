"""Calls that must be answered while the test's own thread holds something a writer would wait for."""

from __future__ import annotations

import threading
from collections.abc import Callable


def answered_beside(call: Callable[[], object], held: str) -> object:
    """What `call` returned or raised, in a thread of its own, which must be answered while this thread
    holds `held` (named in the failure). The join's bound is only there to fail, not a timing."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    assert outcome, f"the call waited for {held}"
    return outcome[0]
