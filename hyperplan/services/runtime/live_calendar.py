"""The live capacity calendar: the pure calendar, loaded from the store and kept in step with bookings.

Searches read it; purchases re-check capacity against the store's rows inside their transaction (the
authority) and then book it here after the commit. The lock makes each read or change whole.

Several processes may share the store (serve --workers, several servers): each transaction that changes
what is held adds one to the `calendar` change counter (store/changes.py), and `version` is the value this
calendar reflects. A process's own commit moves it on by one when nothing else came between; any other
value seen (`sync`) reloads the whole calendar from the store, in one snapshot with the counter.

Committed changes are applied in the counter's order. This process's writers commit one after another
(the counter's row is locked to each commit) but reach `book` and `release` in any order after it, so a
change that comes before the one just below it waits for it; a change a reload already read is not
counted twice. The store's counter moved past the calendar (`sync`) means another process changed it,
or a writer of this one has committed and not yet applied: each version this process commits is
announced as the counter moves (`committing`, then `expect`: Database.on_bump), and a read behind only
by such versions waits for them (at most CATCH_UP) instead of reloading. Any other gap (a commit of
another process, or one of this process that told the calendar nothing: the demo load written in bulk),
or a change that cannot be applied to this copy (a release of what it does not hold:
another server's plan), is read again from the store: one reload at a time, which the readers that came
meanwhile share. Applying a committed change never raises: the store has decided, this is only its copy.

On the event loop (a search answered there, hyperplan/waits.py) a read never waits: a reload reads the
store, so it sends the search to the thread pool (Database.read refuses on the loop), and so does the
lock when a pool thread holds it (`holding`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Mapper, Session

from hyperplan.core.calendar import CapacityCalendar, peak_booked_slots
from hyperplan.core.fleet import Fleet, Pool, PoolKey
from hyperplan.core.offerings import Offering
from hyperplan.core.search import plan_offerings, read_days
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.store import changes
from hyperplan.store.db import Database
from hyperplan.store.purchase_reads import ends_after
from hyperplan.store.schema import ChangeCounter, PlanExtension, ReservedCapacity, ReturnedWindow
from hyperplan.waits import holding, may_wait

Booking = tuple[tuple[str, str], datetime, datetime, int]


# How far behind the service clock a load reaches: what ended earlier is never read again (searches look
# ahead of now, the console's capacity page from the current booking day, at most a day back; a service
# clock never goes back). The store's rows of a year of plans stay out of memory and out of the start-up.
LOOK_BACK = timedelta(days=2)
# How long a read waits for this process's own commits to be applied before it reloads instead: they are
# applied just after their commit, by the thread that made it; only a writer that died in between, or a
# commit that failed after its counter moved (SQLite), leaves the wait to run out.
CATCH_UP = 1.0
# How many versions applied by a change (not read by a reload) are remembered: a transaction's second
# change (a booking, then its failed payment's release) comes right after its first. Also how many
# changes wait for a version below them before the calendar is marked stale instead.
RECENT_CHANGES = 1_000

Change = Callable[[CapacityCalendar], None]


class LiveCalendar:
    def __init__(
        self, fleet: Fleet, now: Callable[[], datetime] | None = None, *, catch_up: float = CATCH_UP
    ) -> None:
        self.fleet = fleet
        self._catch_up = catch_up  # seconds a read waits for this process's own commits (CATCH_UP)
        self._now = now  # the service clock; None: load everything (a store without a clock)
        self._calendar = CapacityCalendar(fleet.pools)
        self._lock = threading.Lock()
        self._applied = threading.Condition(self._lock)  # notified when the version moves on
        self._reloading = threading.Lock()  # one reload at a time
        self._reservable: dict[PoolKey, int] = {}  # set_reservable's counts, kept across reloads
        self.version: int | None = None  # the calendar change counter this reflects; None: not loaded
        self._by_change: dict[int, None] = {}  # versions committed changes (not a reload) applied, in order
        self._waiting: dict[int, list[Change]] = {}  # committed changes above the next version
        self._expected: set[int] = set()  # versions this process committed, not applied yet
        self._committing = 0  # transactions of this process moving the counter, their version not known
        self.reloads = 0
        self._db: Database | None = None
        self._seen: int | None = None  # the store's counter as last read (sync)
        self._stale = False  # a committed change could not be applied: reload at the next read

    def load(self, db: Database) -> int:
        """Book everything the store says is held (replacing what was here); returns how many bookings."""
        with db.read() as session:
            version = session.scalar(
                select(ChangeCounter.value).where(ChangeCounter.name == changes.CALENDAR)
            )
            since = None if self._now is None else self._now() - LOOK_BACK
            bookings = held(session, ending_after=since)
            returned = returned_windows(session, ending_after=since)
        calendar = CapacityCalendar(self.fleet.pools)
        for key, start, end, count in bookings:
            # restore, not book: a pool made smaller in the fleet file must not stop the server from
            # starting with the plans it already sold.
            calendar.restore(key, start, end, count)
        for key, start, end, count in returned:
            calendar.mark_returned(key, start, end, count)
        with self._lock:
            self._db = db
            self.reloads += 1
            if self._past(version):
                return len(bookings)  # changes applied meanwhile brought this copy past the snapshot
            for pool_key, reservable in self._reservable.items():
                calendar.set_reservable(pool_key, reservable)
            self._calendar = calendar
            self.version = version
            self._by_change.clear()
            self._stale = False
            if version is not None:
                self._expected = {v for v in self._expected if v > version}
                self._waiting = {v: changes for v, changes in self._waiting.items() if v > version}
                self._apply_waiting()
            self._applied.notify_all()
        return len(bookings)

    def _past(self, version: int | None) -> bool:
        """Under the lock: this copy, not stale, already reflects calendar `version` or a later one."""
        if self._stale or self.version is None or version is None:
            return False
        return self.version >= version

    def sync(self, db: Database, version: int | None) -> None:
        """The store's calendar counter, just read: the next read of the bookings reloads them if it is
        not what this reflects (a purchase, which books from the store's rows, reloads nothing)."""
        if version is not None:
            self._db, self._seen = db, version

    # -- this process's own commits, as the store tells them (Database.on_bump, store/db.BumpListener)

    def committing(self) -> None:
        """A transaction of this process is about to move the counter (to a version not known yet)."""
        with self._lock:
            self._committing += 1

    def expect(self, version: int | None) -> None:
        """The counter moved to `version` in a transaction of this process (None: it did not move): its
        change is on its way."""
        with self._lock:
            self._committing -= 1
            if version is not None and self.version is not None and version > self.version:
                self._expected.add(version)
            self._applied.notify_all()

    def committed(self, version: int) -> None:
        """The transaction that moved the counter to `version` committed, its own changes to this
        calendar (early after-commit callbacks, store/session_marks.Early) made before this: it is no
        longer on its way. One that told the calendar nothing (the demo fleet's load written in bulk, or
        capacity written past it) leaves the version missing here, and the next read reloads from the
        store, since only the store knows whether it changed what is held."""
        with self._lock:
            self._expected.discard(version)
            delivered = self.version is None or version <= self.version or version in self._waiting
            if not delivered:
                self._stale = True  # the next read reloads, whether or not it read the counter
            self._applied.notify_all()  # a read waiting for it reloads now

    def _behind(self) -> bool:
        seen, version = self._seen, self.version
        return self._stale or (seen is not None and version is not None and seen > version)

    def _behind_by_own_commits_only(self) -> bool:
        """Under the lock: behind the counter as last read, by versions this process committed only (or
        may have: a version not named yet is one of a transaction still `committing`)."""
        seen, version = self._seen, self.version
        if self._stale or seen is None or version is None or seen <= version:
            return False
        unnamed = sum(
            1 for v in range(version + 1, seen + 1) if v not in self._expected and v not in self._waiting
        )
        return unnamed <= self._committing

    def _fresh(self) -> None:
        db = self._db
        if db is None or self.version is None or not self._behind():
            return
        may_wait("the live calendar catching up with the store")
        if self._own_commits_applied():
            return
        with self._reloading:  # the readers that came meanwhile read what the one reload loaded
            if self._behind():
                self.load(db)

    def _own_commits_applied(self) -> bool:
        """Waits (at most the catch-up time) while the calendar is behind by this process's own commits only;
        whether it is then up to date."""
        deadline = time.monotonic() + self._catch_up
        with self._applied:
            while self._behind_by_own_commits_only():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._applied.wait(left)
        return not self._behind()

    def search(self, request: SearchRequest, now: datetime) -> list[Offering]:
        self._fresh()
        # Only the read under the lock: the planning works on values, and searches run side by side.
        with holding(self._lock, "the live calendar's lock"):
            read = read_days(self.fleet, self._calendar, request, now)
        return plan_offerings(self.fleet, read)

    def forget_derived(self) -> None:
        """Searches read the calendar afresh from now on (what they keep is dropped at each change)."""
        with self._lock:
            self._calendar.forget_derived()

    def set_reservable(self, pool_key: PoolKey, count: int) -> None:
        """A pool's bookable count from now on: its fleet file's reservable count, less its nodes a
        Slurm back end reports unhealthy (services/slurm/pool_health.py)."""
        with self._lock:
            self._calendar.set_reservable(pool_key, count)
            self._reservable[pool_key] = count

    def bookable(self, pool: Pool) -> Pool:
        """The pool as bookings see it now: its reservable count may be lower than the fleet file's."""
        with self._lock:
            reservable = self._calendar.reservable(pool.key)
        return pool if reservable == pool.reservable else replace(pool, reservable=reservable)

    def can_book(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> bool:
        self._fresh()
        with self._lock:
            return self._calendar.can_book(pool_key, start, end, count)

    def book(self, bookings: Iterable[Booking], version: int | None = None) -> None:
        """Book what a transaction committed as calendar `version` (None: not counted)."""
        booked = list(bookings)

        def change(calendar: CapacityCalendar) -> None:
            for pool_key, start, end, count in booked:
                # restore, not book: the store's check decided; a copy that disagrees is reloaded
                calendar.restore(pool_key, start, end, count)

        self._commit(version, change)

    def release(
        self, bookings: Iterable[Booking], version: int | None = None, returned: bool = False
    ) -> None:
        """Free what a transaction committed as calendar `version`; `returned`: a plan gave it back
        (services/plans/returns.py), which a search may price at a resale discount."""
        freed = list(bookings)

        def change(calendar: CapacityCalendar) -> None:
            for pool_key, start, end, count in freed:
                try:
                    calendar.release(pool_key, start, end, count)
                except ValueError:  # not held in this copy: it is behind the store
                    self._stale = True
                if returned:
                    calendar.mark_returned(pool_key, start, end, count)

        self._commit(version, change)

    def _commit(self, version: int | None, change: Change) -> None:
        """Apply `change`, committed as calendar `version` (None: not counted), in the counter's order."""
        with self._lock:
            if version is None or self.version is None or version in self._by_change:
                change(self._calendar)  # uncounted, or a transaction's second change
                return
            if version <= self.version:
                return  # a reload already read it
            self._waiting.setdefault(version, []).append(change)
            self._apply_waiting()
            if len(self._waiting) > RECENT_CHANGES:  # a gap nothing here fills: read it all again
                self._waiting.clear()
                self._stale = True

    def _apply_waiting(self) -> None:
        """Under the lock: the waiting changes that follow on from the version, in order."""
        assert self.version is not None
        moved = False
        while self.version + 1 in self._waiting:
            self.version += 1
            for change in self._waiting.pop(self.version):
                change(self._calendar)
            self._expected.discard(self.version)
            self._by_change[self.version] = None
            if len(self._by_change) > RECENT_CHANGES:
                del self._by_change[next(iter(self._by_change))]
            moved = True
        if moved:
            self._applied.notify_all()

    def profile(
        self, pool_key: tuple[str, str], start: datetime, end: datetime
    ) -> list[tuple[datetime, int]]:
        self._fresh()
        with self._lock:
            return self._calendar.booked_profile(pool_key, start, end)


# -- what the store says is held: the authority ---------------------------------------------------------


def returned_windows(session: Session, ending_after: datetime | None = None) -> list[Booking]:
    """The windows of capacity plans returned (services/plans/returns.py), those ending after
    `ending_after` (None: all): what a search may offer at a resale discount."""
    query = select(
        ReturnedWindow.instance_type,
        ReturnedWindow.availability_zone,
        ReturnedWindow.start,
        ReturnedWindow.end,
        ReturnedWindow.count,
    )
    if ending_after is not None:
        query = query.where(ReturnedWindow.end > ending_after)
    rows = session.execute(query).all()
    return [((t, z), start, end, count) for t, z, start, end, count in rows]


HELD_COLUMNS = frozenset(
    {"instance_type", "availability_zone", "start", "end", "count", "holds_capacity", "released_at"}
)
"""What `held` and the purchase's holdings read of a segment (ReservedCapacity) or an unpaid extension
(PlanExtension): a change to any other column (a status) changes no capacity, and does not move the
calendar's change counter (app.count_changes)."""


def columns_not_held(model: type) -> tuple[str, ...]:
    """The attributes of `model` (ReservedCapacity, PlanExtension) outside HELD_COLUMNS."""
    mapper: Mapper[Any] = inspect(model)
    return tuple(attribute.key for attribute in mapper.attrs if attribute.key not in HELD_COLUMNS)


def held(
    session: Session,
    pool: PoolKey | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    ending_after: datetime | None = None,
) -> list[Booking]:
    """Every interval of capacity held by plans' segments and by unpaid extensions, optionally only those
    of one pool that overlap [start, end), or (`ending_after`) only those held after that instant (a
    calendar that answers for times from then on needs no earlier row). A segment cancelled while open
    is held until `released_at`.

    Each bound is also stated on the row's `end` (a segment is held no later than its end: released_at
    comes before it), as a range (purchase_reads.ends_after), so that the indexes by end
    (store/schema.py, 0031) read what is held after the bound, never the store's past."""
    rc_end = func.coalesce(ReservedCapacity.released_at, ReservedCapacity.end)
    segments = select(
        ReservedCapacity.instance_type,
        ReservedCapacity.availability_zone,
        ReservedCapacity.start,
        rc_end,
        ReservedCapacity.count,
    ).where(ReservedCapacity.holds_capacity.is_(True))
    extensions = select(
        PlanExtension.instance_type,
        PlanExtension.availability_zone,
        PlanExtension.start,
        PlanExtension.end,
        PlanExtension.count,
    ).where(PlanExtension.holds_capacity.is_(True))
    if pool is not None:
        segments = segments.where(
            ReservedCapacity.instance_type == pool[0], ReservedCapacity.availability_zone == pool[1]
        )
        extensions = extensions.where(
            PlanExtension.instance_type == pool[0], PlanExtension.availability_zone == pool[1]
        )
    if start is not None and end is not None:
        segments = segments.where(ends_after(ReservedCapacity.end, start), ReservedCapacity.start < end)
        segments = segments.where(rc_end > start)
        extensions = extensions.where(PlanExtension.start < end, ends_after(PlanExtension.end, start))
    if ending_after is not None:
        segments = segments.where(ends_after(ReservedCapacity.end, ending_after), rc_end > ending_after)
        extensions = extensions.where(ends_after(PlanExtension.end, ending_after))
    rows = [*session.execute(segments).all(), *session.execute(extensions).all()]
    return [((t, az), s, e, n) for t, az, s, e, n in rows if e > s]


def require_room(session: Session, pool: Pool, start: datetime, end: datetime, count: int) -> None:
    """Refuse, with ResourceLimitExceeded, `count` more instances of `pool` over [start, end).

    Read inside the buyer's write transaction, so two buyers never both see the same free instances.
    """
    intervals = [(s, e, n) for _, s, e, n in held(session, pool.key, start, end)]
    check_room(pool, intervals, start, end, count)


def check_room(
    pool: Pool,
    intervals: Iterable[tuple[datetime, datetime, int]],
    start: datetime,
    end: datetime,
    count: int,
) -> None:
    """Refuse `count` more instances of `pool` over [start, end) when the pool already holds
    `intervals` (its held capacity that overlaps the window, as `held` reads it)."""
    refuse_if_full(pool, peak_booked_slots(intervals, start, end), start, end, count)


def refuse_if_full(pool: Pool, booked: int, start: datetime, end: datetime, count: int) -> None:
    """Refuse `count` more instances of `pool` over [start, end) when `booked` of them are held at the
    window's busiest slot (peak_booked_slots of what the pool holds)."""
    if booked + count > pool.reservable:
        raise ResourceLimitExceeded(
            f"The capacity of this offering was taken since the search: {pool.instance_type} in "
            f"{pool.availability_zone} has {max(pool.reservable - booked, 0)} of {pool.reservable} instances "
            f"free between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC, and this offering needs "
            f"{count}. Search again for current offerings."
        )
