"""Small fleets and times for the core tests, built directly (the TOML reader has its own tests)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from hyperplan.core.fleet import AvailabilityZone, BookingPolicy, Fleet, Pool

ZONES = tuple(
    AvailabilityZone(f"us-west-2{letter}", f"usw2-az{i + 1}", (f"subnet-0a1b2c3d4e5f6000{i + 1}",))
    for i, letter in enumerate("abc")
)


def pool(zone: str = "a", reservable: int = 8, price: str = "10.00", kind: str = "ml.p5.48xlarge") -> Pool:
    return Pool(kind, f"us-west-2{zone}", reservable, reservable, Decimal(price), "USD")


def fleet(*pools: Pool, policy: BookingPolicy | None = None) -> Fleet:
    return Fleet("us-west-2", ZONES, tuple(pools) or (pool(),), policy or BookingPolicy())


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
