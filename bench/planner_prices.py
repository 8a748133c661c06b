"""Prices that steer demand (issue 54, point 3; docs/PLANNING.md): the same workloads replayed with buyers
who take the cheapest of the offerings a search returns (``max_offerings`` of them), under list prices
and under load-based prices (``[pricing] load_based``: from ``low`` x the list price on idle days to
``high`` x on full ones, core/pricing.py). Printed per load: instance-days booked, their share of the LP
bound, revenue, and revenue per instance-day, each a mean over the seeds; then the first-offering buyers
of issue 54's workload under both, for comparison (they do not look at prices, so only revenue moves).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from decimal import Decimal

from bench.planner_grid import grid_fleet
from bench.report import Figure, Report, line
from bench.scale import Scale
from bench.server import BENCH_START
from hyperplan.core.bound import lp_bound
from hyperplan.core.fleet import Fleet, LoadPricing
from hyperplan.core.replay import hour_zero, jobs_of, replay_on_calendar
from hyperplan.core.workloads import PRESETS, WorkloadSpec, generate

LOAD_PRICES = LoadPricing(load_based=True, low=Decimal("0.8"), high=Decimal("1.5"))
LOADS = (0.8, 1.3, 2.0)


@dataclass(frozen=True)
class Outcome:
    instance_days: float
    share: float  # % of the LP bound
    revenue: Decimal

    @property
    def per_day(self) -> Decimal:
        return self.revenue / Decimal(self.instance_days) if self.instance_days else Decimal(0)


def replayed(fleet: Fleet, spec: WorkloadSpec, seed: int, choice: str) -> Outcome:
    workload = [replace(request, choice=choice) for request in generate(spec, seed)]
    bound = lp_bound(*jobs_of(fleet, workload))
    booked, _ = replay_on_calendar(fleet, workload, hour_zero(BENCH_START, fleet))
    taken = [b for b in booked if b.offering is not None]
    days = sum(b.request.instance_days for b in taken)
    revenue = sum((b.offering.upfront_fee for b in taken if b.offering), Decimal("0.00"))
    return Outcome(days, 100 * days / bound if bound else 100.0, revenue)


def mean(outcomes: list[Outcome]) -> Outcome:
    return Outcome(
        statistics.mean(o.instance_days for o in outcomes),
        statistics.mean(o.share for o in outcomes),
        sum((o.revenue for o in outcomes), Decimal(0)) / len(outcomes),
    )


def run(report: Report, *, scale: Scale) -> None:
    base = PRESETS["issue54"]
    if scale is Scale.SMOKE:
        base = replace(base, span_days=14, arrival_days=7, max_days=7)
    seeds, loads = scale.pick(10, 3, 1), scale.pick(LOADS, LOADS, (1.3,))
    line("")
    line(
        f"load-based prices (issue 54): issue 54's workload at each offered load, {seeds} seeds; buyers take "
        f"the cheapest of the offerings a search returns; list prices against load-based ones "
        f"({LOAD_PRICES.low} x the list price on idle days to {LOAD_PRICES.high} x on full ones)"
    )
    line(
        f"  {'load':>4} {'buyers':8} {'prices':6} {'instance-days':>13} {'of bound':>9} {'revenue':>14}"
        f" {'per inst.-day':>13}"
    )
    for load in loads:
        spec = replace(base, load=load)
        for choice in ("cheapest", "first") if load == 1.3 else ("cheapest",):
            rows = {}
            for name, pricing in (("list", LoadPricing()), ("load", LOAD_PRICES)):
                fleet = replace(grid_fleet(spec), pricing=pricing)
                rows[name] = mean([replayed(fleet, spec, seed, choice) for seed in range(seeds)])
                o = rows[name]
                line(
                    f"  {load:4.1f} {choice:8} {name:6} {o.instance_days:13.1f} {o.share:8.1f}% "
                    f"{o.revenue:14,.2f} {o.per_day:13,.2f}"
                )
            if choice == "cheapest" and load == 1.3:
                gained = rows["load"].instance_days - rows["list"].instance_days
                points = rows["load"].share - rows["list"].share
                report.add(
                    Figure(
                        "load-based prices: cheapest buyers' instance-days, issue 54's workload",
                        f"{gained:+.1f} instance-days ({points:+.1f} points)",
                    )
                )
