"""What `hyperplan fleet show` reports: each pool, and how booked it is over time."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

from hyperplan.core.fleet import Pool
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.slurm_state import UnhealthyNode


@dataclass(frozen=True)
class PoolReport:
    pool: Pool
    booked_profile: list[tuple[datetime, int]]  # runs: from each time on, this many booked
    window_start: datetime
    window_end: datetime
    bookable: int = 0  # reservable now: less the nodes a Slurm back end reports unhealthy
    unhealthy: tuple[UnhealthyNode, ...] = ()  # a Slurm pool's nodes Slurm would not run work on

    def booked_at(self, when: datetime) -> int:
        booked = 0
        for start, count in self.booked_profile:
            if start > when:
                break
            booked = count
        return booked

    @property
    def peak(self) -> int:
        return max((count for _, count in self.booked_profile), default=0)

    def utilisation(self) -> float:
        """The booked share of the reservable instance-hours in the window."""
        if self.pool.reservable == 0:
            return 0.0
        total = 0.0
        runs = [*self.booked_profile, (self.window_end, 0)]
        for (start, count), (next_start, _) in itertools.pairwise(runs):
            total += (
                count * (min(next_start, self.window_end) - max(start, self.window_start)).total_seconds()
            )
        span = (self.window_end - self.window_start).total_seconds()
        return total / (span * self.pool.reservable)


def report(runtime: ServiceContext, days: int | None = None) -> list[PoolReport]:
    now = runtime.clock.now()
    end = now + (timedelta(days=days) if days else runtime.fleet.policy.horizon)
    unhealthy = runtime.slurm.unhealthy if runtime.slurm is not None else {}
    return [
        PoolReport(
            pool,
            runtime.calendar.profile(pool.key, now, end),
            now,
            end,
            runtime.calendar.bookable(pool).reservable,
            unhealthy.get(pool.key, ()),
        )
        for pool in runtime.fleet.pools
    ]
