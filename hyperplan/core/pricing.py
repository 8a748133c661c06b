"""A segment's price: what a search's offerings cost, and what a purchase or an extension charges."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import lru_cache

from hyperplan.core.fleet import Pool

_CENT = Decimal("0.01")
_MINUTE = timedelta(minutes=1)


def segment_price(pool: Pool, start: datetime, end: datetime, count: int) -> Decimal:
    """count x real hours x price, to the cent (half up). An offering's fee is the sum of its
    segments' prices, so that invoices itemised per segment add up to the fee."""
    return _price(pool.price_per_instance_hour, (end - start) // _MINUTE, count)


@lru_cache(maxsize=4096)
def _price(per_instance_hour: Decimal, minutes: int, count: int) -> Decimal:
    # Kept: a search prices its offerings' segments, and the same lengths come back all the time.
    return (count * minutes * per_instance_hour / 60).quantize(_CENT, rounding=ROUND_HALF_UP)
