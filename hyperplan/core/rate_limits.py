"""Request rate limits: a token bucket per account and class of request, as values.

Four classes, so that a flood of cheap reads cannot use up an account's purchases and a search storm
(the most expensive request the server answers) is held back on its own:

- ``search``: SearchTrainingPlanOfferings;
- ``purchase``: CreateTrainingPlan and ExtendTrainingPlan;
- ``read``: every Describe, List and Get, and the native API's GETs;
- ``write``: everything else.

A bucket holds at most ``burst`` tokens and gains ``rate`` a second; a request takes one, or is refused
with the time until one is there. The limiter that keeps the buckets (services/runtime/rate_limiter.py) passes
in the time, so everything here is tested without a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from hyperplan.errors import ValidationError


class RequestClass(StrEnum):
    SEARCH = "search"
    PURCHASE = "purchase"
    READ = "read"
    WRITE = "write"


PURCHASES = frozenset({"CreateTrainingPlan", "ExtendTrainingPlan"})
READ_PREFIXES = ("Describe", "List", "Get")


def sagemaker_class(operation: str) -> RequestClass:
    """The class of a SageMaker operation, by its wire name."""
    if operation == "SearchTrainingPlanOfferings":
        return RequestClass.SEARCH
    if operation in PURCHASES:
        return RequestClass.PURCHASE
    if operation.startswith(READ_PREFIXES):
        return RequestClass.READ
    return RequestClass.WRITE


def native_class(method: str) -> RequestClass:
    """The class of a native API request: what only reads is a read, the rest writes."""
    return RequestClass.READ if method.upper() in ("GET", "HEAD") else RequestClass.WRITE


MAX_RATE = 1_000_000.0
MAX_BURST = 1_000_000


@dataclass(frozen=True)
class RateLimit:
    rate: float  # tokens gained per second
    burst: int  # the most a bucket holds: requests that may come at once after a quiet spell

    def __post_init__(self) -> None:
        if not (
            isinstance(self.rate, int | float) and math.isfinite(self.rate) and 0 < self.rate <= MAX_RATE
        ):
            raise ValidationError(f"a rate is requests per second, more than 0 and at most {MAX_RATE:g}")
        if not (isinstance(self.burst, int) and 1 <= self.burst <= MAX_BURST):
            raise ValidationError(f"a burst is a whole number of requests from 1 to {MAX_BURST}")

    def __str__(self) -> str:
        return f"{self.rate:g}/s, burst {self.burst}"


RateLimits = Mapping[RequestClass, RateLimit]
"""A limit per class; a class without one is not limited."""

DEFAULT_RATE_LIMITS: RateLimits = MappingProxyType(
    {
        # Generous: a person at a terminal, a notebook or a CI pipeline never meets them; a script in a
        # tight loop does. A fleet file's [rate_limits] sets its own.
        RequestClass.SEARCH: RateLimit(10, 50),
        RequestClass.PURCHASE: RateLimit(5, 50),
        RequestClass.READ: RateLimit(50, 500),
        RequestClass.WRITE: RateLimit(20, 200),
    }
)


@dataclass(frozen=True)
class Bucket:
    tokens: float
    at: float  # the instant (seconds, any monotonic origin) the tokens were counted


def take(limit: RateLimit, bucket: Bucket | None, now: float) -> tuple[Bucket, float | None]:
    """Take one token: the bucket after, and None, or the bucket unchanged but refilled to ``now`` and
    the seconds until a token is there. A new bucket starts full; time never runs backwards in it."""
    if bucket is None:
        tokens = float(limit.burst)
    else:
        elapsed = max(0.0, now - bucket.at)
        tokens = min(float(limit.burst), bucket.tokens + elapsed * limit.rate)
    now = now if bucket is None else max(now, bucket.at)
    if tokens >= 1.0:
        return Bucket(tokens - 1.0, now), None
    return Bucket(tokens, now), (1.0 - tokens) / limit.rate


def lease(
    limit: RateLimit, bucket: Bucket | None, now: float, want: int, returned: int = 0
) -> tuple[Bucket, int, float | None]:
    """Take up to ``want`` whole tokens at once (a process leasing a batch from a bucket it shares with
    others), after putting back the ``returned`` ones a batch leased earlier left unspent: the bucket
    after, how many were granted, and, when none was, the seconds until one is there. The same bucket as
    ``take``'s: new ones start full, never above the burst, and time never runs backwards in it."""
    if bucket is None:
        tokens = float(limit.burst)
    else:
        refilled = bucket.tokens + max(0.0, now - bucket.at) * limit.rate
        tokens = min(float(limit.burst), refilled + max(0, returned))
    now = now if bucket is None else max(now, bucket.at)
    granted = min(max(1, want), int(tokens))
    if granted >= 1:
        return Bucket(tokens - granted, now), granted, None
    return Bucket(tokens, now), 0, (1.0 - tokens) / limit.rate


def effective(defaults: RateLimits, overrides: Mapping[RequestClass, RateLimit | None]) -> RateLimits:
    """An account's limits: the fleet's, with an administrator's overrides on top (None: the default)."""
    merged = dict(defaults)
    for request_class, limit in overrides.items():
        if limit is not None:
            merged[request_class] = limit
    return MappingProxyType(merged)
