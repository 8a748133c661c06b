"""The live capacity calendar: the pure calendar, loaded from the store and kept in step with bookings.

Searches read it; purchases re-check capacity against the store's rows inside their transaction (the
authority) and then book it here after the commit. The lock makes each read or change whole.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.calendar import CapacityCalendar, peak_booked_slots
from hyperplan.core.fleet import Fleet, Pool, PoolKey
from hyperplan.core.search import Offering, SearchRequest, search
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.store.db import Database
from hyperplan.store.schema import PlanExtension, ReservedCapacity

Booking = tuple[tuple[str, str], datetime, datetime, int]


class LiveCalendar:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._calendar = CapacityCalendar(fleet.pools)
        self._lock = threading.Lock()

    def load(self, db: Database) -> int:
        """Book everything the store says is held; returns how many bookings."""
        with db.read() as session:
            bookings = held(session)
        with self._lock:
            for key, start, end, count in bookings:
                # restore, not book: a pool made smaller in the fleet file must not stop the server from
                # starting with the plans it already sold.
                self._calendar.restore(key, start, end, count)
        return len(bookings)

    def search(self, request: SearchRequest, now: datetime) -> list[Offering]:
        with self._lock:
            return search(self.fleet, self._calendar, request, now)

    def set_reservable(self, pool_key: PoolKey, count: int) -> None:
        """A pool's bookable count from now on: its fleet file's reservable count, less its nodes a
        Slurm back end reports unhealthy (services/slurm_reservations.py)."""
        with self._lock:
            self._calendar.set_reservable(pool_key, count)

    def bookable(self, pool: Pool) -> Pool:
        """The pool as bookings see it now: its reservable count may be lower than the fleet file's."""
        with self._lock:
            reservable = self._calendar.reservable(pool.key)
        return pool if reservable == pool.reservable else replace(pool, reservable=reservable)

    def can_book(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> bool:
        with self._lock:
            return self._calendar.can_book(pool_key, start, end, count)

    def book(self, bookings: Iterable[Booking]) -> None:
        with self._lock:
            for pool_key, start, end, count in bookings:
                self._calendar.book(pool_key, start, end, count)

    def release(self, bookings: Iterable[Booking]) -> None:
        with self._lock:
            for pool_key, start, end, count in bookings:
                self._calendar.release(pool_key, start, end, count)

    def profile(
        self, pool_key: tuple[str, str], start: datetime, end: datetime
    ) -> list[tuple[datetime, int]]:
        with self._lock:
            return self._calendar.booked_profile(pool_key, start, end)


# -- what the store says is held: the authority ---------------------------------------------------------


def held(
    session: Session, pool: PoolKey | None = None, start: datetime | None = None, end: datetime | None = None
) -> list[Booking]:
    """Every interval of capacity held by plans' segments and by unpaid extensions, optionally only those
    of one pool that overlap [start, end). A segment cancelled while open is held until `released_at`."""
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
        segments = segments.where(ReservedCapacity.start < end, rc_end > start)
        extensions = extensions.where(PlanExtension.start < end, PlanExtension.end > start)
    rows = [*session.execute(segments).all(), *session.execute(extensions).all()]
    return [((t, az), s, e, n) for t, az, s, e, n in rows if e > s]


def require_room(session: Session, pool: Pool, start: datetime, end: datetime, count: int) -> None:
    """Refuse, with ResourceLimitExceeded, `count` more instances of `pool` over [start, end).

    Read inside the buyer's write transaction, so two buyers never both see the same free instances.
    """
    intervals = [(s, e, n) for _, s, e, n in held(session, pool.key, start, end)]
    booked = peak_booked_slots(intervals, start, end)
    if booked + count > pool.reservable:
        raise ResourceLimitExceeded(
            f"The capacity of this offering was taken since the search: {pool.instance_type} in "
            f"{pool.availability_zone} has {max(pool.reservable - booked, 0)} of {pool.reservable} instances "
            f"free between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC, and this offering needs "
            f"{count}. Search again for current offerings."
        )
