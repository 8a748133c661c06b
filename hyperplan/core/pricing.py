"""A segment's price: what a search's offerings cost, and what a purchase or an extension charges.

A segment costs count x real hours x the pool's price x its *multiplier*, to the cent. The multiplier is
1 unless the fleet sets one of two things (docs/DECISIONS.md, "Prices"):

* load-based prices (``[pricing] load_based``): the multiplier runs from ``low`` on days the pool holds
  nothing to ``high`` on days it is full, by how loaded the segment's days are (each whole day's peak
  held share of the pool, averaged), so that a buyer with slack finds the quieter days cheaper;
* a resale discount (``[cancellation] resale_discount``): the share of a segment's instance-days the
  pool could only give from capacity a plan returned is discounted by that fraction, on top of the
  load-based price (the two multiply).

The search works the multiplier out once, from the calendar it read, and signs it into the offering's id
(core/offering_ids.py); a purchase charges what the id says, so an offering costs what the search
showed even if the calendar changed in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache

from hyperplan.core.fleet import LoadPricing, Pool

_CENT = Decimal("0.01")
_MINUTE = timedelta(minutes=1)
ONE = Decimal(1)
# A multiplier is kept to this many places (offering ids carry it as an integer of ten-thousandths).
MULTIPLIER_PLACES = Decimal("0.0001")


def segment_price(
    pool: Pool, start: datetime, end: datetime, count: int, multiplier: Decimal = ONE
) -> Decimal:
    """count x real hours x price x ``multiplier``, to the cent (half up). An offering's fee is the sum of
    its segments' prices, so that invoices itemised per segment add up to the fee."""
    return _price(pool.price_per_instance_hour, (end - start) // _MINUTE, count, multiplier)


@lru_cache(maxsize=4096)
def _price(per_instance_hour: Decimal, minutes: int, count: int, multiplier: Decimal) -> Decimal:
    # Kept: a search prices its offerings' segments, and the same lengths come back all the time.
    exact = count * minutes * per_instance_hour * multiplier / 60
    return exact.quantize(_CENT, rounding=ROUND_HALF_UP)


@dataclass(frozen=True)
class DayLoad:
    """What a segment's price reads of one of its whole days in its pool."""

    held_share: float  # the most of the pool held at any time of the day, as a share of it (0..1)
    free: int  # the fewest instances free at any time of the day
    returned: int  # the most instances returned by plans at any time of the day (resale)


def multiplier(
    pricing: LoadPricing, resale_discount: Decimal, days: Sequence[DayLoad], count: int
) -> Decimal:
    """A segment's price multiplier over its whole ``days``: the load-based part times the resale
    discount's, to four places. 1 when neither is set (or the segment has no whole day to read)."""
    if not days:
        return ONE
    found = ONE
    if pricing.load_based:
        load = Decimal(repr(round(sum(day.held_share for day in days) / len(days), 6)))
        found = pricing.low + (pricing.high - pricing.low) * min(max(load, Decimal(0)), ONE)
    if resale_discount > 0:
        found *= ONE - resale_discount * returned_share(days, count)
    return found.quantize(MULTIPLIER_PLACES, rounding=ROUND_HALF_UP)


def returned_share(days: Sequence[DayLoad], count: int) -> Decimal:
    """The share of a segment's instance-days the pool could give only from returned capacity: each day,
    the count less what the pool had free besides the returned instances, at least 0 and at most
    the returned instances (a day's free count includes them). Returned instances already resold count
    as returned still, so the share errs toward the buyer."""
    if count <= 0 or not days:
        return Decimal(0)
    needed = sum(min(day.returned, count, max(0, count - (day.free - day.returned))) for day in days)
    return Decimal(needed) / (count * len(days))
