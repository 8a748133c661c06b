"""The live capacity calendar: the pure calendar, loaded from the store and kept in step with bookings.

Searches read it; purchases re-check capacity against the store's rows inside their transaction (the
authority) and then book it here after the commit. The lock makes each read or change whole.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet
from hyperplan.core.search import Offering, SearchRequest, search
from hyperplan.store.db import Database
from hyperplan.store.schema import ReservedCapacity

Booking = tuple[tuple[str, str], datetime, datetime, int]


class LiveCalendar:
    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._calendar = CapacityCalendar(fleet.pools)
        self._lock = threading.Lock()

    def load(self, db: Database) -> int:
        """Book every segment that still holds capacity; returns how many."""
        with db.read() as session:
            rows = session.execute(
                select(
                    ReservedCapacity.instance_type,
                    ReservedCapacity.availability_zone,
                    ReservedCapacity.start,
                    ReservedCapacity.end,
                    ReservedCapacity.count,
                ).where(ReservedCapacity.holds_capacity.is_(True))
            ).all()
        with self._lock:
            for t, az, start, end, count in rows:
                # restore, not book: a pool made smaller in the fleet file must not stop the server from
                # starting with the plans it already sold.
                self._calendar.restore((t, az), start, end, count)
        return len(rows)

    def search(self, request: SearchRequest, now: datetime) -> list[Offering]:
        with self._lock:
            return search(self.fleet, self._calendar, request, now)

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
