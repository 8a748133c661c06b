"""The requests the benchmarks send: a search mix and a purchase mix, each as a SearchRequest (in-process)
or as an awsJson1.1 body (over HTTP). Plain data, so that client processes can build their own."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hyperplan.core.fleet import SERVED_TARGETS, Fleet
from hyperplan.core.search_request import SearchRequest

DAY = timedelta(days=1)


@dataclass(frozen=True)
class MixContext:
    """What a request mix needs to know about the service: its time and what it sells."""

    now: datetime  # the service's clock
    counts_by_type: tuple[tuple[str, tuple[int, ...]], ...]  # instance type -> counts a plan may hold
    window_days: int = 120

    @staticmethod
    def of(fleet: Fleet, now: datetime, max_count: int = 32) -> MixContext:
        allowed = fleet.policy.allowed_counts or tuple(range(1, max_count + 1))
        types = []
        for instance_type in fleet.reservable_types():
            largest = max(pool.reservable for pool in fleet.pools_of_type(instance_type))
            types.append((instance_type, tuple(c for c in allowed if c <= min(largest, max_count))))
        return MixContext(now, tuple(types))


def search_request(rng: random.Random, ctx: MixContext) -> SearchRequest:
    """Any type, counts 1-32, 1-30 days, either target; half without a window, half with one."""
    instance_type, counts = rng.choice(ctx.counts_by_type)
    days = rng.randint(1, 30)
    start_after, end_before = _window(rng, ctx, days)
    return SearchRequest(
        instance_type=instance_type,
        instance_count=rng.choice(counts),
        duration_hours=days * 24 - rng.randrange(24),
        target=rng.choice(SERVED_TARGETS),
        start_after=start_after,
        end_before=end_before,
    )


def purchase_request(rng: random.Random, ctx: MixContext, spread_share: float = 0.5) -> SearchRequest:
    """What a buyer searches for: 1 or 2 instances for 1 or 2 days; a share ``spread_share`` of them
    from a random day on, so that eight buyers do not all chase the same first free day."""
    instance_type, _ = rng.choice(ctx.counts_by_type)
    spread = rng.random() < spread_share
    return SearchRequest(
        instance_type=instance_type,
        instance_count=rng.choice((1, 2)),
        duration_hours=rng.choice((24, 48)),
        target=rng.choice(SERVED_TARGETS),
        start_after=ctx.now + rng.randint(1, ctx.window_days - 20) * DAY if spread else None,
    )


def _window(rng: random.Random, ctx: MixContext, days: int) -> tuple[datetime | None, datetime | None]:
    roll = rng.random()
    if roll < 0.5:
        return None, None
    start = ctx.now + timedelta(hours=rng.randint(1, (ctx.window_days - days - 5) * 24))
    end = start + (days + rng.randint(1, 20)) * DAY
    if roll < 0.75:
        return start, None
    return start, end


def wire_search(request: SearchRequest) -> dict[str, Any]:
    """The SearchTrainingPlanOfferings body for ``request`` (timestamps as epoch seconds)."""
    body: dict[str, Any] = {
        "InstanceType": request.instance_type,
        "InstanceCount": request.instance_count,
        "DurationHours": request.duration_hours,
        "TargetResources": [request.target],
    }
    if request.start_after is not None:
        body["StartTimeAfter"] = request.start_after.timestamp()
    if request.end_before is not None:
        body["EndTimeBefore"] = request.end_before.timestamp()
    return body
