"""What a search reads of the calendar to price its offerings beyond the list price (core/pricing.py):
each pool's reservable count and, where plans returned capacity, the returned instances per day. Read
under the calendar's lock with the days (core/search.py's ``read_days``), only when the fleet prices by
load or discounts returned capacity; the multipliers are then worked out for the chosen offerings alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import numpy.typing as npt

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet, LoadPricing
from hyperplan.core.pricing import ONE, DayLoad, multiplier
from hyperplan.core.search_request import _Query

Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class PriceDays:
    """Per pool of the query: its reservable count, its resale discount, and the most returned
    instances on each whole day of the window (None: none of the pools had any returned).

    Kept by the calendar until it next changes, as the days are (``CapacityCalendar.derived``), and
    compared by identity: the offerings planned from one read are kept under it (core/search.py)."""

    pricing: LoadPricing
    reservable: tuple[int, ...]
    discounts: tuple[Decimal, ...]
    returned: Ints | None  # (P, N)

    @staticmethod
    def read(fleet: Fleet, calendar: CapacityCalendar, query: _Query) -> PriceDays | None:
        """None when every offering of the query costs the list price (neither setting is on)."""
        keys = tuple(pool.key for pool in query.pools)
        discounts = tuple(fleet.cancellation_for(*key).resale_discount for key in keys)
        discounted = any(discounts) and calendar.has_returned(keys)
        if not fleet.pricing.load_based and not discounted:
            return None
        key = ("price days", keys, query.first_boundary, query.n_days, discounts, fleet.pricing)
        return calendar.derived(
            key,
            lambda: PriceDays(
                fleet.pricing,
                tuple(calendar.reservable(k) for k in keys),
                discounts,
                calendar.returned_days_of(keys, query.first_boundary, query.n_days) if discounted else None,
            ),
        )

    def multiplier(self, free_days: Ints, pool: int, start_day: int, stop_day: int, count: int) -> Decimal:
        """The multiplier of ``count`` instances of the query's pool ``pool`` over whole days
        ``[start_day, stop_day)``, from the days' free counts the search read (``free_days``, (P, N))."""
        reservable = self.reservable[pool]
        if reservable <= 0:
            return ONE
        free = free_days[pool, start_day:stop_day]
        returned = (
            self.returned[pool, start_day:stop_day] if self.returned is not None else np.zeros_like(free)
        )
        days = [DayLoad(1 - int(f) / reservable, int(f), int(r)) for f, r in zip(free, returned, strict=True)]
        return multiplier(self.pricing, self.discounts[pool], days, count)
