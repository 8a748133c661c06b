"""The lifecycle loop: persisted, timed events run once each, in (due time, id) order.

Every timed transition of the service is a row in `scheduled_events`, written in the same transaction
as the change that makes it due. The loop is stateless: after a restart, even after a crash, it finds
the rows not yet done and runs them in order before the server answers requests, so the state equals
that of a run that never stopped. An event and the record that it ran commit together.

Several servers on one store: only the elected leader runs this loop (services/runtime/leadership.py), and
each event is claimed in the transaction that runs it (its row FOR UPDATE SKIP LOCKED, then checked not done),
so even a second runner could never run one twice.

Under the wall and accelerated clocks, and in the catch-up at startup (`run_due`), due events run in
batches: up to BATCH_EVENTS of them, for up to BATCH_SECONDS, in one transaction, in (due time, id)
order, each handler seeing what the ones before it wrote; one read finds a batch, one statement claims
it, one commit ends it. So a minute with 10,000 events due pays for a few hundred commits (SQLite's is
an fsync), not 10,000. Each event's `done` still commits with its effect, in that one transaction. A
batch ends early where an event's order could otherwise change: before an event another runner holds,
and after a handler that scheduled an event due no later than the next in the batch (that one runs
first, in the next batch). A handler that raises rolls the batch back, and the batch runs again one
event per transaction, so that the events before it commit as they would alone and the error is the
same. `ran_at` is stamped once per batch, just before its commit: the time its effects became real.

Under the manual clock nothing runs by itself: `advance_to` steps the clock to each due event in turn
(so the handler sees the service time it was due at, and `ran_at` is that time) and returns when all
events due by the target have run. It runs them in batches too, the clock stepped inside the batch's
transaction and set back if the batch rolls back. Under the wall and accelerated clocks a background
thread does the same continuously; an accelerated clock may also be moved ahead by `advance_to`, which
re-anchors it the same way.

A catch-up can be long (a year of a demo fleet's events takes minutes), so every runner looks for a stop
request between two events: `request_stop` (the server calls it from its SIGTERM handler) makes the
catch-up at startup, the background loop and a clock move in progress end after the event they are
running, committed (with the events of its batch that ran before it). What did not run is still pending
and runs at the next start, or the next move.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import event as orm_event
from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan import metrics
from hyperplan.clock import AcceleratedClock, Anchor, Clock, ManualClock
from hyperplan.errors import ServiceUnavailable
from hyperplan.store import settings
from hyperplan.store.db import Database
from hyperplan.store.schema import ScheduledEvent
from hyperplan.worker import Wake, Worker

log = logging.getLogger(__name__)

# A batch's bounds. Its transaction holds the writers' turn (SQLite's write lock; PostgreSQL's writers'
# lock), so other writers wait at most about BATCH_SECONDS for it, plus the commit.
BATCH_EVENTS = 100
BATCH_SECONDS = 0.1


@dataclass(frozen=True)
class DueEvent:
    id: int
    kind: str
    subject: str
    due_at: datetime
    payload: Mapping[str, Any]


EventHandler = Callable[[Session, DueEvent], None]


class BatchReader(Protocol):
    """A handler that reads what a whole batch of its events needs at once (one statement, not one per
    event), in the batch's transaction before any of them runs: `prepare` is called once per batch with
    those of its events the batch claimed."""

    def __call__(self, session: Session, event: DueEvent) -> None: ...

    def prepare(self, session: Session, events: Sequence[DueEvent]) -> None: ...


def schedule(session: Session, kind: str, due_at: datetime, subject: str = "", **payload: Any) -> None:
    """Add a timed event in the caller's transaction."""
    session.add(ScheduledEvent(kind=kind, due_at=due_at, subject=subject, payload=json.dumps(payload)))


class TimedEventLoop:
    def __init__(
        self, db: Database, clock: Clock, handlers: Mapping[str, EventHandler], wake: Wake | None = None
    ) -> None:
        self.db = db
        self.clock = clock
        self.handlers = dict(handlers)
        self._lock = threading.RLock()  # one runner at a time: events run strictly in order
        self._stop_requested = False  # request_stop's flag; a plain attribute, see there
        # Woken by any commit that inserts a timed event (the composition root wires Database.on_insert
        # to `wake`); the step sleeps until the next due event. The 1 s poll bounds how long a
        # request_stop from a signal handler goes unseen.
        self.worker = Worker("lifecycle", self._step, poll=1.0, wake=wake)

    # -- running events -------------------------------------------------------------------------

    def run_due(self, until: datetime) -> int:
        """Run every pending event due at or before `until`, in order and in batches (the module's
        docstring), until a stop is requested. Returns how many ran."""
        ran = 0
        with self._lock:
            while not self.stopping and (batch := self._due_batch(until)):
                ran += self._run_batch(batch)
        return ran

    def advance_to(self, target: datetime) -> int:
        """Move a manual clock to `target`, running each due event at its own due time. A stop request
        ends the move between two events: the clock stays at the last event that ran, and the caller
        gets a ServiceUnavailable that says so."""
        clock = self.clock
        if isinstance(clock, AcceleratedClock):
            return self._jump_to(clock, target)
        if not isinstance(clock, ManualClock):
            raise TypeError("only the manual and accelerated clocks are moved by hand")
        with self._lock:
            self._refuse_when_stopping(0)
            if target < clock.now():
                clock.move_to(target)  # refuses, naming both times
            ran = self._step_through(target, _ManualSteps(clock))
            clock.move_to(target)
            self._save_clock()
        return ran

    def _jump_to(self, clock: AcceleratedClock, target: datetime) -> int:
        """An accelerated clock moved ahead: as the manual clock's move, each event due on the way runs
        at its own due time (the clock set there), then the clock runs on from `target`. Its new anchor
        is stored, so that every process on the store reads the moved clock
        (services/runtime/shared_state.py)."""
        steps = _AcceleratedSteps(clock)
        with self._lock:
            try:
                self._refuse_when_stopping(0)
                if target < clock.now():
                    clock.jump(target)  # refuses, naming both times
                ran = self._step_through(target, steps)
                clock.jump(max(target, clock.now()))
                steps.moved = True
            finally:
                if steps.moved:
                    with self.db.write() as session:
                        settings.put_record(session, settings.CLOCK_ANCHOR, clock.anchor.record())
                        settings.put_time(session, settings.CLOCK_NOW, clock.now())
        return ran

    def _step_through(self, target: datetime, steps: ClockSteps) -> int:
        """Run every event due by `target` in order, each with the clock set to its due time, in batches
        as `run_due` does (a clock move over days of a busy fleet is thousands of events: one commit
        each would make it slow). A stop request ends it after the event running, with a
        ServiceUnavailable that says how many ran."""
        ran = 0
        while batch := self._due_batch(target):
            self._refuse_when_stopping(ran)
            ran += self._run_batch(batch, steps)
        return ran

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    def request_stop(self) -> None:
        """Ask every runner to end after the event it is running. Safe in a signal handler, which may
        interrupt the thread that holds any lock: it sets attributes and takes none. (The background
        loop polls at least once a second, so it needs no wake-up.)"""
        self._stop_requested = True
        self.worker.request_stop()

    def _refuse_when_stopping(self, ran: int) -> None:
        if self.stopping:
            raise ServiceUnavailable(
                f"The server is stopping: the clock stopped at {self.clock.now().isoformat()} after "
                f"{ran} lifecycle events, each committed; move it again once the server is back."
            )

    def _next_due(self, until: datetime) -> DueEvent | None:
        batch = self._due_batch(until, limit=1)
        return batch[0] if batch else None

    def _due_batch(self, until: datetime, limit: int = BATCH_EVENTS) -> list[DueEvent]:
        """The first `limit` pending events due at or before `until`, in order; one read."""
        with self.db.read() as session:
            rows = session.scalars(
                select(ScheduledEvent)
                .where(ScheduledEvent.done.is_(False), ScheduledEvent.due_at <= until)
                .order_by(ScheduledEvent.due_at, ScheduledEvent.id)
                .limit(limit)
            )
            return [
                DueEvent(row.id, row.kind, row.subject, row.due_at, json.loads(row.payload)) for row in rows
            ]

    def _run_batch(self, batch: list[DueEvent], steps: ClockSteps | None = None) -> int:
        """The batch in one transaction; if a handler raises, again one event per transaction, so that
        those before it commit and its error is raised as it would be alone. With `steps` (a clock
        moved by hand), the clock is set to each event's due time before it runs, and set back to where
        it was if the batch rolls back. Returns how many ran."""
        if len(batch) > 1:
            mark = steps.mark() if steps is not None else None
            try:
                return self._run_together(batch, steps)
            except Exception:
                log.warning(
                    "a batch of %d timed events failed; running them one by one", len(batch), exc_info=True
                )
                if steps is not None:
                    steps.back_to(mark)
        ran = 0
        for event in batch:
            if self.stopping:
                break
            if steps is not None:
                steps.step(event.due_at)
            ran += self._run_one(event)
        return ran

    def _run_together(self, batch: list[DueEvent], steps: ClockSteps | None) -> int:
        """Claim the batch (rows another runner holds are skipped, and the batch ends before the first
        of them: what comes after it may depend on it), then run its events in order, each only if no
        runner, nor a handler before it in this batch, marked it done. Ends early on a stop request,
        past BATCH_SECONDS, or after a handler that scheduled an event due no later than the next."""
        began = time.monotonic()
        ran: list[ScheduledEvent] = []
        with self.db.write() as session:
            claimed = {
                row.id: row
                for row in session.scalars(
                    select(ScheduledEvent)
                    .where(ScheduledEvent.id.in_([event.id for event in batch]))
                    .with_for_update(skip_locked=True)
                )
            }
            self._prepare(session, [event for event in batch if event.id in claimed])
            with _new_events_watched(session) as scheduled:
                for position, event in enumerate(batch):
                    row = claimed.get(event.id)
                    if row is None:
                        break  # another runner has it: it, and what follows it, wait for the next batch
                    if row.done:
                        continue  # ran already, or a handler before it in this batch cancelled it
                    if steps is not None:
                        steps.step(event.due_at)
                        row.ran_at = self.clock.now()  # a moved clock: each event at its own time
                    self._handle(session, event)
                    row.done = True
                    ran.append(row)
                    following = batch[position + 1] if position + 1 < len(batch) else None
                    if (
                        following is None
                        or self.stopping
                        or time.monotonic() - began >= BATCH_SECONDS
                        or (scheduled and min(scheduled) <= following.due_at)
                    ):
                        break
            self._finish(session, ran)
        return len(ran)

    def _prepare(self, session: Session, events: list[DueEvent]) -> None:
        """Each BatchReader handler's reads for its events of the batch, once."""
        by_handler: dict[int, tuple[Any, list[DueEvent]]] = {}
        for event in events:
            handler = self.handlers.get(event.kind)
            if handler is not None and hasattr(handler, "prepare"):
                by_handler.setdefault(id(handler), (handler, []))[1].append(event)
        for handler, mine in by_handler.values():
            handler.prepare(session, mine)

    def _handle(self, session: Session, event: DueEvent) -> None:
        """One event's handler, in the claiming transaction."""
        metrics.LIFECYCLE_LAG.observe(max((self.clock.now() - event.due_at).total_seconds(), 0.0))
        handler = self.handlers.get(event.kind)
        if handler is None:
            log.error("no handler for event kind %r (event %d); marking it done", event.kind, event.id)
        else:
            handler(session, event)

    def _finish(self, session: Session, ran: list[ScheduledEvent]) -> None:
        """Stamp the events that ran with the time just before their commit, and save the clock."""
        if not ran:
            return
        now = self.clock.now()
        for row in ran:
            if row.ran_at is None:
                row.ran_at = now
        if self.clock.kind != "wall":
            # Saved with the events, so that a restarted clock never reads earlier than what has run.
            settings.put_time(session, settings.CLOCK_NOW, now)

    def _run_one(self, event: DueEvent) -> int:
        """One event in a transaction of its own (the manual clock's moves, a batch's retry); 1 if it
        ran, 0 if another runner has it or ran it first."""
        with self.db.write() as session:
            # The claim: the row locked until this transaction ends (skipped if another runner holds it;
            # SQLite's write lock is already exclusive), and run only if nobody marked it done before.
            row = session.scalars(
                select(ScheduledEvent).where(ScheduledEvent.id == event.id).with_for_update(skip_locked=True)
            ).first()
            if row is None or row.done:
                return 0  # another runner has it, or ran it first
            self._handle(session, event)
            row.done = True
            self._finish(session, [row])
        return 1

    def next_due_time(self) -> datetime | None:
        with self.db.read() as session:
            return session.scalars(
                select(ScheduledEvent.due_at)
                .where(ScheduledEvent.done.is_(False))
                .order_by(ScheduledEvent.due_at, ScheduledEvent.id)
                .limit(1)
            ).first()

    # -- the clock's persistence ------------------------------------------------------------------

    def _save_clock(self) -> None:
        with self.db.write() as session:
            saved = settings.get_time(session, settings.CLOCK_NOW)
            # Never backwards: a process that does not lead may hold an older time than the leader saved.
            if saved is None or self.clock.now() > saved:
                settings.put_time(session, settings.CLOCK_NOW, self.clock.now())

    # -- the background loop (wall and accelerated clocks) ----------------------------------------

    def wake(self) -> None:
        self.worker.wake()

    def start(self) -> None:
        if not self.clock.moves_by_itself or self.stopping:
            return
        self.worker.start()

    def stop(self) -> None:
        self.request_stop()
        self.worker.stop()
        self._save_clock()

    def _step(self) -> float:
        self.run_due(self.clock.now())
        if self.clock.kind == "accelerated":
            self._save_clock()  # so that a restart resumes from here, not from where it began
        return self._sleep_seconds()

    def _sleep_seconds(self) -> float:
        due = self.next_due_time()
        if due is None:
            return 1.0
        seconds = (due - self.clock.now()).total_seconds() / getattr(self.clock, "scale", 1.0)
        return max(0.0, min(1.0, seconds))


class ClockSteps(Protocol):
    """A clock moved by hand through the events due on the way: set to each one's due time before it
    runs (never backwards), and set back to a mark when the batch that moved it rolls back."""

    def mark(self) -> object: ...

    def step(self, due_at: datetime) -> None: ...

    def back_to(self, mark: object) -> None: ...


class _ManualSteps:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock

    def mark(self) -> object:
        return self.clock.now()

    def step(self, due_at: datetime) -> None:
        if due_at > self.clock.now():
            self.clock.move_to(due_at)

    def back_to(self, mark: object) -> None:
        assert isinstance(mark, datetime)
        self.clock.rewind_to(mark)


class _AcceleratedSteps:
    def __init__(self, clock: AcceleratedClock) -> None:
        self.clock = clock
        self.moved = False  # whether the anchor changed, so that the new one is stored

    def mark(self) -> object:
        return self.clock.anchor

    def step(self, due_at: datetime) -> None:
        if due_at > self.clock.now():
            self.clock.jump(due_at)
            self.moved = True

    def back_to(self, mark: object) -> None:
        assert isinstance(mark, Anchor)
        self.clock.anchor = mark


@contextmanager
def _new_events_watched(session: Session) -> Iterator[list[datetime]]:
    """The due times of the timed events added to `session` while the block runs (a handler's follow-up
    events), so that a batch can end before an event one of them should precede."""
    due_times: list[datetime] = []

    def added(_session: Session, instance: object) -> None:
        if isinstance(instance, ScheduledEvent) and instance.due_at is not None:
            due_times.append(instance.due_at)

    orm_event.listen(session, "transient_to_pending", added)
    try:
        yield due_times
    finally:
        orm_event.remove(session, "transient_to_pending", added)
