"""What a search returns: an :class:`Offering` of one or more :class:`Segment` (``count`` instances of
one pool over a time), with its upfront fee, the sum of its segments' prices (core/pricing.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from hyperplan.core.fleet import PoolKey


def _hours_minutes(length: timedelta) -> tuple[int, int]:
    hours, minutes = divmod(length // timedelta(minutes=1), 60)
    return int(hours), int(minutes)


@dataclass(frozen=True)
class Segment:
    """``count`` instances of one pool over ``[start, end)``."""

    pool_key: PoolKey
    start: datetime
    end: datetime
    count: int
    # Its price is count x hours x the pool's price x this (core/pricing.py): 1 but where the fleet
    # prices by load or discounts returned capacity.
    multiplier: Decimal = Decimal(1)

    @property
    def duration_hours_minutes(self) -> tuple[int, int]:
        return _hours_minutes(self.end - self.start)


@dataclass(frozen=True)
class Offering:
    target: str
    segments: tuple[Segment, ...]
    upfront_fee: Decimal
    currency: str

    @property
    def start(self) -> datetime:
        return self.segments[0].start

    @property
    def end(self) -> datetime:
        return self.segments[-1].end

    @property
    def duration_hours_minutes(self) -> tuple[int, int]:
        """The segments' real lengths added up (gaps between segments are not counted)."""
        return _hours_minutes(sum((s.end - s.start for s in self.segments), timedelta()))

    @property
    def instance_type(self) -> str:
        return self.segments[0].pool_key[0]

    @property
    def instance_count(self) -> int:
        return self.segments[0].count
