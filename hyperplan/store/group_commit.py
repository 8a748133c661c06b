"""Group commit: writers of one process that arrive together share one transaction and one durable commit.

On SQLite every writer runs alone and each commit waits for the disk (synchronous=FULL: an fsync of the
log, a few milliseconds). Purchases paid one commit each were capped near 1 / (fsync + work) per second
whatever the CPU (issue 20). Here a writer hands its work to the process's queue; the first writer
finding no batch under way leads one: it takes the writers' turn once (Database.write), then runs each
work queued by then (those that arrived while the turn was awaited join) in a SAVEPOINT of its own,
commits them all in one transaction, then runs each work's after-commit callbacks and hands every
writer its own outcome. Writers queued while a batch commits form the next one.

What each writer is promised is unchanged:
- A work that raises (a refusal: capacity, a quota, a taken name) rolls back to its savepoint alone:
  nothing of it is written, none of its after-commit callbacks runs, the writer gets its own error; the
  batch goes on. The works after it see the store as if it had never run.
- A work may come with a `check` that only reads (a purchase's checks: most refusals under contention
  are its capacity, taken since the search). It runs first, outside any savepoint: a refusal there has
  written nothing, so it costs no SAVEPOINT and no ROLLBACK TO, two statements fewer in the writers'
  turn that every writer waits for. A check found to have written fails the batch (nothing committed).
- A work sees everything the works before it in the batch wrote (one transaction): a pool's capacity,
  an account's quotas and names are checked against them as against committed rows.
- Nothing is acknowledged before the one commit is durable. If the commit fails (or the savepoint of a
  failed work cannot be rolled back, or the connection is lost), nothing of the batch is written and
  every writer of it that had not failed on its own gets ServiceUnavailable (clients retry).
- The change counters move once for the batch's transaction (Database._bump_counted): each work's
  after-commit callbacks read the same committed value, as the works of one transaction do
  (services/runtime/live_calendar.py applies a transaction's several changes at one version).

Bounds: a batch holds at most `max_batch` works; a writer waits at most `wait` seconds for a batch to
take its work (then ServiceUnavailable, nothing done); once taken, it waits for the batch's outcome,
which the writers' turn and the store's own timeouts bound.

Only SQLite batches (Database.write_grouped): on PostgreSQL concurrent writers already commit side by
side, and one transaction holding several accounts' and pools' locks could deadlock with another.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from hyperplan.errors import ServiceUnavailable
from hyperplan.store import session_marks as marks

T = TypeVar("T")

MAX_BATCH = 32


@dataclass(eq=False)
class _Work(Generic[T]):
    """One writer's work and, once its batch is done, its outcome."""

    run: Callable[[Session], T]
    check: Callable[[Session], object] | None = None  # reads only (see the module)
    result: T | None = None
    error: BaseException | None = None
    callbacks: list[Callable[[], None]] = field(default_factory=list)
    taken: bool = False  # a batch holds it: the writer waits for the outcome, however long
    done: bool = False


class Writer(Protocol):
    """What a batch needs of the store (store/db.py's Database): a write transaction, in the writers' turn."""

    def write(self) -> AbstractContextManager[Session]: ...


class BatchFailed(Exception):
    """The batch's transaction cannot go on (a savepoint that does not roll back, a lost connection)."""


class GroupCommit:
    """The batches of one Database (see the module)."""

    def __init__(self, db: Writer, *, max_batch: int = MAX_BATCH) -> None:
        self.db = db
        self.max_batch = max_batch
        self._state = threading.Condition()
        self._queue: deque[_Work[Any]] = deque()
        self._leading = False
        self.batches = 0  # committed batches (for tests and benchmarks)
        self.largest = 0  # the most works one committed batch held

    @property
    def waiting(self) -> int:
        """Works queued and not yet taken by a batch."""
        with self._state:
            return len(self._queue)

    def run(
        self, work: Callable[[Session], T], wait: float, check: Callable[[Session], object] | None = None
    ) -> T:
        """Run `check(session)` (if any: it only reads), then `work(session)`, in a batch's transaction;
        the work's result once durably committed, or the error of either."""
        mine: _Work[T] = _Work(work, check)
        deadline = time.monotonic() + wait
        with self._state:
            self._queue.append(mine)
            while not mine.done and (self._leading or mine.taken):
                left = deadline - time.monotonic()
                if mine.taken:
                    self._state.wait()
                elif left <= 0 or not self._state.wait(left):
                    if mine.taken or mine.done:
                        continue
                    self._queue.remove(mine)
                    raise ServiceUnavailable(
                        f"The store is busy: this request waited more than {wait:g} s for its turn to "
                        "write; nothing was done; try again."
                    )
            lead = not mine.done
            if lead:
                self._leading = True
        if lead:
            try:
                while not mine.done:  # a batch full before reaching this work: another one
                    self._commit_batch()
            finally:
                with self._state:
                    self._leading = False
                    self._state.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.result  # type: ignore[return-value]  # None only for a work returning None

    def _take(self) -> list[_Work[Any]]:
        with self._state:
            batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            for work in batch:
                work.taken = True
            return batch

    def _commit_batch(self) -> None:
        """One batch: the works queued once the writers' turn is ours (those that arrived while it was
        awaited join), committed together."""
        batch: list[_Work[Any]] = []
        alone = False  # a batch of one runs without a savepoint: its error is the transaction's
        try:
            with self.db.write() as session:
                batch = self._take()
                if len(batch) == 1:
                    alone = True
                    _run(session, batch[0])
                    alone = False
                else:
                    for work in batch:
                        _run_in_savepoint(session, work)
                _calendar_changes_first(session, batch)
        except BaseException as exc:  # nothing of the batch was written
            batch = batch or self._take()  # the turn was refused: to every writer waiting for it
            for work in batch:
                if work.error is None:  # each its own: every writer raises it in its own thread
                    work.error = exc if alone else _batch_failure(exc)
                work.callbacks = []
        else:
            self.batches += 1
            self.largest = max(self.largest, len(batch))
            for work in batch:
                _after_commit(work)
        finally:
            with self._state:
                for work in batch:
                    work.done = True
                self._state.notify_all()


def _run(session: Session, work: _Work[Any]) -> None:
    """The work alone in the transaction: what it raises rolls the transaction back (Database.write)."""
    before = len(session.info.get(marks.AFTER_COMMIT, []))
    if work.check is not None:
        work.check(session)
    work.result = work.run(session)
    _set_callbacks_aside(session, work, before)


def _set_callbacks_aside(session: Session, work: _Work[Any], before: int) -> None:
    """The after-commit callbacks the work registered, kept for it (run once the batch committed)."""
    registered: list[Callable[[], None]] = session.info.get(marks.AFTER_COMMIT, [])
    work.callbacks = registered[before:]
    del registered[before:]


def _run_in_savepoint(session: Session, work: _Work[Any]) -> None:
    """The work in a savepoint; its after-commit callbacks set aside for it (Database.write runs only
    those registered outside the works: the wakes of what was inserted)."""

    before = _snapshot(session)
    if work.check is not None and not _checked(session, work, before):
        return
    savepoint = session.begin_nested()
    try:
        work.result = work.run(session)
        savepoint.commit()
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise
        try:
            if savepoint.is_active:
                savepoint.rollback()
        except Exception as rollback_failed:
            raise BatchFailed("a savepoint could not be rolled back") from rollback_failed
        _restore(session, before)
        work.error = exc
        return
    _set_callbacks_aside(session, work, before.callbacks)


def _checked(session: Session, work: _Work[Any], before: _Snapshot) -> bool:
    """The work's check, outside any savepoint: False, with the work's error set, if it refused. A
    check that wrote (SQLite counts every row a connection changes) fails the batch: its rows could not
    be undone alone."""
    dbapi = session.connection().connection.dbapi_connection
    changes = getattr(dbapi, "total_changes", None)
    try:
        assert work.check is not None
        work.check(session)
    except Exception as exc:
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            raise
        _unchanged(dbapi, changes)
        _restore(session, before)
        work.error = exc
        return False
    _unchanged(dbapi, changes)
    return True


def _unchanged(dbapi: Any, changes: int | None) -> None:
    if changes is not None and dbapi.total_changes != changes:
        raise BatchFailed("a purchase's check wrote to the store")


@dataclass(frozen=True)
class _Snapshot:
    """What a work leaves in the session's info, as it was before the work."""

    callbacks: int
    wanted: frozenset[str]
    notified: frozenset[int]
    info: dict[str, Any]


def _snapshot(session: Session) -> _Snapshot:
    return _Snapshot(
        callbacks=len(session.info.get(marks.AFTER_COMMIT, [])),
        wanted=frozenset(session.info.get(marks.WANTED, ())),
        notified=frozenset(session.info.get(marks.NOTIFIED, ())),
        info=dict(session.info),
    )


def _restore(session: Session, before: _Snapshot) -> None:
    """A rolled-back work's marks undone: its callbacks, the counters and wakes it asked for."""
    registered = session.info.get(marks.AFTER_COMMIT)
    if registered is not None:
        del registered[before.callbacks :]
    session.info[marks.WANTED] = set(before.wanted)
    session.info[marks.NOTIFIED] = set(before.notified)
    kept = (marks.AFTER_COMMIT, marks.WANTED, marks.NOTIFIED)
    for key in [key for key in session.info if key not in before.info]:
        del session.info[key]
    session.info.update({key: value for key, value in before.info.items() if key not in kept})


def _calendar_changes_first(session: Session, batch: list[_Work[Any]]) -> None:
    """Every work's early after-commit callbacks (session_marks.Early: its changes to the live calendar)
    handed to the transaction, which runs them after its commit before any other, and before what the
    commit itself tells the calendar (Database.on_bump: registered as it commits, after these)."""
    registered = session.info.setdefault(marks.AFTER_COMMIT, [])
    for work in batch:
        registered += [callback for callback in work.callbacks if isinstance(callback, marks.Early)]
        work.callbacks = [callback for callback in work.callbacks if not isinstance(callback, marks.Early)]


def _after_commit(work: _Work[Any]) -> None:
    """The work's after-commit callbacks, in order; one that raises is its writer's error (the write
    itself is committed, as with Database.write)."""
    try:
        for callback in work.callbacks:
            callback()
    except Exception as exc:
        work.error = exc
    work.callbacks = []


def _batch_failure(exc: BaseException) -> BaseException:
    """What each writer of a batch that failed as a whole is told (a retryable 503)."""
    if isinstance(exc, ServiceUnavailable):  # the writers' turn refused, a lost connection: already clear
        failure = ServiceUnavailable(exc.message)
    else:
        failure = ServiceUnavailable(
            "The store could not commit this request (nothing of it was written); try again."
        )
    failure.__cause__ = exc
    return failure
