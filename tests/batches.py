"""Writers made to arrive together (store/group_commit.py): each call in a thread of its own, started in
order, while the test holds the writers' turn; once every one has queued, the turn is let go and they
commit as one batch (or as many as the batch bound makes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from hyperplan.store.db import Database


def together(db: Database, calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call's result, or the error it raised, in the order given (each call writes once, through
    Database.write_grouped)."""
    outcomes: list[Any] = [None] * len(calls)

    def writer(index: int) -> None:
        try:
            outcomes[index] = calls[index]()
        except Exception as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(calls))]
    queued = db.group.waiting
    with db.write():  # the turn: the first writer waits for it as the batch's leader, the others queue
        for number, thread in enumerate(threads, start=queued + 1):
            thread.start()
            _until(lambda number=number: db.group.waiting == number)  # type: ignore[misc]
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def _until(condition: Callable[[], bool]) -> None:
    """A state the writers' threads reach on their own (no service time passes)."""
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, "the writers never queued"
        time.sleep(0.002)


def fails_at_commit(session: Session) -> None:
    """A write whose own statements succeed and whose COMMIT fails: a SQLite foreign key checked only
    at the commit (deferred), pointing at no plan. Every savepoint of its batch succeeds; the commit not."""
    session.execute(text("PRAGMA defer_foreign_keys = ON"))
    session.execute(
        text("INSERT INTO plan_events (plan_id, at, kind, status, message) VALUES (999999, 0, 'x', 'x', 'x')")
    )
