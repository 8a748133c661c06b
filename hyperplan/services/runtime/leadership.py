"""One leader among the processes sharing a store: it alone runs the work that needs one owner.

The leader holds the lease row `leader` (table leases) until `expires_at`, real time, `lease` seconds
after its last renewal; it renews every third of that. Another candidate takes the row once it has
expired (or, at a process's start, at once when the holder is a process of this machine that no longer
exists: a restart after a crash does not wait out its own lease). Taking or renewing is one short write;
on PostgreSQL the row is read FOR UPDATE, on SQLite the write lock is held from the start, so two
candidates never both win.

The leader runs the timed-event loop, the webhook dispatcher, the node watcher, the job runner and the
Slurm reconciler (the composition root's `take_over`, which first adopts every node and job task and runs
the events missed). It also watches the change counters (store/changes.py) so that work written by any
process wakes its loop here, and carries out the manual clock moves other processes ask for (table
clock_moves): the process that was asked waits for the row to be done.

A leader that cannot renew in time (its store unreachable) gives the work up itself: it stops its loops
before its lease can have expired for the others, and stays a candidate. Each timed event runs in a
transaction that claims it, checks it and marks it done, so even two runners could not run one twice.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.errors import HyperplanError, ServiceUnavailable, ValidationError
from hyperplan.store import changes
from hyperplan.store.db import Database
from hyperplan.store.schema import ClockMove, Lease
from hyperplan.worker import Wake, Worker

log = logging.getLogger(__name__)

LEADER = "leader"
PRESENCE = "process:"  # + holder: a live process's presence row
DEFAULT_LEASE = 10.0  # seconds
LEASE_ENV = "HYPERPLAN_LEADER_LEASE"
COUNTER_POLL = 0.1  # seconds between two reads of the change counters by the leader
CLOCK_MOVE_WAIT = 600.0  # seconds a process waits for the leader to carry out a clock move


def lease_from_env() -> float:
    text = os.environ.get(LEASE_ENV)
    if not text:
        return DEFAULT_LEASE
    try:
        value = float(text)
    except ValueError:
        raise ValidationError(f"{LEASE_ENV}={text!r} is not a number of seconds") from None
    if not 0.2 <= value <= 3600:
        raise ValidationError(f"{LEASE_ENV}={text!r}: the leader's lease is 0.2 to 3600 seconds")
    return value


def process_id() -> str:
    """This process as a lease holder: host, pid and a token (a pid is reused, the token is not)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _gone_here(holder: str) -> bool:
    """The holder was a process of this machine that no longer exists."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def others_alive(session: Session) -> bool:
    """Whether a process other than this one holds a live presence row (a process that starts)."""
    now = utcnow()
    for row in session.scalars(select(Lease).where(Lease.name.like(PRESENCE + "%"))).all():
        if row.expires_at >= now and not _gone_here(row.holder):
            return True
    return False


class Leadership:
    """This process's candidacy (or not: an API-only process of `serve --workers` never leads)."""

    def __init__(
        self,
        db: Database,
        *,
        lease: float = DEFAULT_LEASE,
        candidate: bool = True,
        holder: str | None = None,
    ) -> None:
        self.db = db
        self.lease = lease
        self.candidate = candidate
        self.holder = holder or process_id()
        self.is_leader = False
        self._held_until = 0.0  # monotonic: when this process's lease ends, as far as it knows
        self._take_over: Callable[[], None] = lambda: None
        self._give_up: Callable[[], None] = lambda: None
        self._move_clock: Callable[[datetime], int] | None = None
        self._wakes: dict[str, Wake] = {}
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self.elections = Worker("leadership", self._elect, poll=max(lease / 3, 0.05))
        self.watcher = Worker("change-watcher", self._watch, poll=COUNTER_POLL)

    def wire(
        self,
        take_over: Callable[[], None],
        give_up: Callable[[], None],
        move_clock: Callable[[datetime], int] | None,
        wakes: dict[str, Wake],
    ) -> None:
        """What the leader does: `take_over` when elected, `give_up` when deposed, `move_clock` for a
        clock move asked by another process; `wakes` by change counter name."""
        self._take_over, self._give_up, self._move_clock, self._wakes = take_over, give_up, move_clock, wakes

    # -- the lease --------------------------------------------------------------------------------

    def start(self) -> None:
        """Try once now (a lone server leads before it serves), then keep trying or renewing; every
        process, candidate or not, keeps its presence row alive."""
        self._be_present()
        if self.candidate and self._try(startup=True):
            self._become_leader()
        self.elections.start()

    def stop(self) -> None:
        self.elections.stop()
        self.watcher.stop()
        self.is_leader = False
        self._release()

    def request_stop(self) -> None:
        self.elections.request_stop()
        self.watcher.request_stop()

    def _elect(self) -> float:
        self._be_present()
        if not self.candidate:
            return self.lease / 3
        try:
            held = self._try(startup=False)
        except Exception:
            if self.is_leader and time.monotonic() >= self._held_until:
                self._lose("its lease could not be renewed")
            raise
        if held and not self.is_leader:
            self._become_leader()
        elif not held and self.is_leader:
            self._lose("another process holds the lease")
        return self.lease / 3

    def _try(self, *, startup: bool) -> bool:
        asked = time.monotonic()
        now = utcnow()
        expires = now + timedelta(seconds=self.lease)
        try:
            with self.db.write(concurrent=True) as session:
                row = session.scalars(select(Lease).where(Lease.name == LEADER).with_for_update()).first()
                if row is None:
                    session.add(Lease(name=LEADER, holder=self.holder, expires_at=expires))
                elif (
                    row.holder == self.holder or row.expires_at < now or (startup and _gone_here(row.holder))
                ):
                    if row.holder != self.holder:
                        log.info("taking the leader's lease from %s", row.holder)
                    row.holder = self.holder
                    row.expires_at = expires
                else:
                    return False
        except IntegrityError:
            return False  # another candidate inserted the row first
        # Counted from before the write: the others count from its commit, later.
        self._held_until = asked + self.lease * 0.9
        return True

    def _be_present(self) -> None:
        """Renew this process's presence row and drop expired ones."""
        now = utcnow()
        with self.db.write(concurrent=True) as session:
            name = PRESENCE + self.holder
            row = session.get(Lease, name)
            expires = now + timedelta(seconds=self.lease)
            if row is None:
                session.add(Lease(name=name, holder=self.holder, expires_at=expires))
            else:
                row.expires_at = expires
            session.flush()
            for other in session.scalars(select(Lease).where(Lease.name.like(PRESENCE + "%"))).all():
                if other.holder != self.holder and (other.expires_at < now or _gone_here(other.holder)):
                    session.delete(other)  # expired, or a process of this machine that is gone

    def _release(self) -> None:
        """A leader stopping hands the lease back at once, so that another need not wait it out."""
        try:
            with self.db.write(concurrent=True) as session:
                row = session.scalars(select(Lease).where(Lease.name == LEADER).with_for_update()).first()
                if row is not None and row.holder == self.holder:
                    row.expires_at = utcnow() - timedelta(seconds=1)
                session.execute(delete(Lease).where(Lease.name == PRESENCE + self.holder))
        except Exception:  # the store is gone: the lease expires by itself
            log.warning("could not hand the leader's lease back; it expires by itself")

    def _become_leader(self) -> None:
        log.info("this process (%s) is the leader", self.holder)
        self._seen = self.db.counters()
        self.is_leader = True
        try:
            self._take_over()
        except BaseException:
            self.is_leader = False
            self._release()
            raise
        self.watcher.start()
        self._carry_out_clock_moves()

    def _lose(self, why: str) -> None:
        log.error("no longer the leader: %s; stopping the background work", why)
        self.is_leader = False
        self.watcher.stop()
        self._give_up()

    # -- the leader's watch over the change counters ----------------------------------------------

    def _watch(self) -> float:
        if not self.is_leader:
            return COUNTER_POLL
        values = self.db.counters()
        for name, value in values.items():
            if self._seen.get(name) != value:
                wake = self._wakes.get(name)
                if wake is not None:
                    wake.notify()
        moves = values.get(changes.CLOCK_MOVES) != self._seen.get(changes.CLOCK_MOVES)
        self._seen = values
        if moves:
            self._carry_out_clock_moves()
        return COUNTER_POLL

    def _carry_out_clock_moves(self) -> None:
        if self._move_clock is None:
            return
        with self._lock:
            with self.db.read() as session:
                pending = session.scalars(
                    select(ClockMove).where(ClockMove.done.is_(False)).order_by(ClockMove.id)
                ).all()
            for move in pending:
                ran, error = 0, None
                try:
                    ran = self._move_clock(move.target)
                except HyperplanError as exc:
                    error = f"{exc.code}\n{exc.message}"
                with self.db.write(concurrent=True) as session:
                    row = session.get(ClockMove, move.id)
                    if row is not None:
                        row.done, row.events_run, row.error = True, ran, error

    # -- a clock move asked of the leader -----------------------------------------------------------

    def move_clock(self, target: datetime, local: Callable[[datetime], int]) -> int:
        """Move the manual clock to `target`: here if this process leads, else by the leader, waiting
        until it has run every event due on the way. Returns how many ran."""
        if self.is_leader:
            with self._lock:
                return local(target)
        with self.db.write(concurrent=True) as session:
            move = ClockMove(target=target)
            session.add(move)
            session.flush()
            move_id = move.id
        deadline = time.monotonic() + CLOCK_MOVE_WAIT
        while time.monotonic() < deadline:
            with self.db.read() as session:
                row = session.get(ClockMove, move_id)
                if row is not None and row.done:
                    if row.error:
                        code, _, message = row.error.partition("\n")
                        if code == ValidationError.code:
                            raise ValidationError(message)
                        raise ServiceUnavailable(message)
                    return row.events_run or 0
            time.sleep(0.02)
        raise ServiceUnavailable(
            f"No leader carried out the clock move to {target.isoformat()} within {CLOCK_MOVE_WAIT:.0f} s; "
            "is any server that may lead running?"
        )


class SharedWake:
    """A loop's wake that also reaches the leader when this process does not lead: the notification is
    carried by a change counter (bumped by a forwarding thread, never inside the caller's transaction)
    that the leader watches."""

    def __init__(self, local: Wake, counter: str, forwarder: WakeForwarder) -> None:
        self.local = local
        self.counter = counter
        self.forwarder = forwarder

    def notify(self) -> None:
        self.local.notify()
        self.forwarder.forward(self.counter)

    def wait(self, timeout: float) -> None:
        self.local.wait(timeout)


class WakeForwarder:
    def __init__(self, db: Database, leadership: Leadership) -> None:
        self.db = db
        self.leadership = leadership
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self.worker = Worker("wake-forwarder", self._step, poll=1.0)

    def forward(self, counter: str) -> None:
        if self.leadership.is_leader:
            return
        with self._lock:
            self._pending.add(counter)
        self.worker.start()
        self.worker.wake()

    def _step(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
        for counter in sorted(pending):
            self.db.bump(counter)
        return None
