"""The planner's grid (issue 54, docs/PLANNING.md): each ranking's share of the LP bound over workloads of
many shapes, not only those the rankings were tuned on.

A point of the grid is a lead-time mix, a slack mix and an offered load (``LEAD_MIXES`` and ``SLACK_MIXES``
of hyperplan/core/workloads.py); the rest is issue 54's workload (``PRESETS["issue54"]``: one pool of 64,
8 weeks, gangs of 1-32, 1-28 days with a median of 3, windows cut at the span, buyers taking the first
offering), which is itself the point (issue54, issue54, 1.3). Each point is replayed over its seeds
straight on a calendar (``replay_on_calendar``, as the planner section does) under every ranking, and
printed as each ranking's mean share of the bound over the seeds; then the means over the grid, and the
default ranking against ``earliest`` (issue 54's targets for a placement that holds up: at least
``earliest`` at every point, at least 5 points more on average).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from decimal import Decimal

from bench.report import Figure, Report, line
from bench.scale import Scale
from bench.server import BENCH_START
from hyperplan.core.bound import lp_bound
from hyperplan.core.fleet import RANKINGS, AvailabilityZone, BookingPolicy, Fleet, Pool
from hyperplan.core.replay import hour_zero, jobs_of, replay_on_calendar
from hyperplan.core.workloads import LEAD_MIXES, PRESETS, SLACK_MIXES, WorkloadSpec, generate

LOADS = (0.8, 1.3, 2.0)
ISSUE_POINT = ("issue54", "issue54", 1.3)
TARGET_OVER_EARLIEST = 5.0  # points, the default ranking over earliest, averaged over the grid


@dataclass(frozen=True)
class Point:
    lead: str  # a key of LEAD_MIXES
    slack: str  # a key of SLACK_MIXES
    load: float

    def spec(self, base: WorkloadSpec) -> WorkloadSpec:
        return replace(base, lead=LEAD_MIXES[self.lead], slack_days=SLACK_MIXES[self.slack], load=self.load)


@dataclass(frozen=True)
class Measured:
    point: Point
    requests: tuple[int, ...]  # per seed
    shares: dict[str, tuple[float, ...]]  # ranking -> % of the LP bound, per seed

    def mean(self, ranking: str) -> float:
        return statistics.mean(self.shares[ranking])

    def below(self, ranking: str, other: str) -> int:
        """The seeds on which ``ranking`` booked less than ``other``."""
        return sum(a < b for a, b in zip(self.shares[ranking], self.shares[other], strict=True))


def grid_fleet(spec: WorkloadSpec) -> Fleet:
    """The spec's pools: one of ``pool_size`` instances of its type in each of ``zones`` zones."""
    zones = tuple(
        AvailabilityZone(f"us-west-2{chr(ord('a') + i)}", f"usw2-az{i + 1}", (f"subnet-{i:017x}",))
        for i in range(spec.zones)
    )
    pools = tuple(
        Pool(spec.instance_type, zone.name, spec.pool_size, spec.pool_size, Decimal("98.32"), "USD")
        for zone in zones
    )
    return Fleet("us-west-2", zones, pools, BookingPolicy())


def grid(scale: Scale) -> tuple[list[Point], int, WorkloadSpec]:
    """The points, the seeds of each, and the base spec: the whole grid, or one tiny point at smoke size."""
    base = PRESETS["issue54"]
    if scale is Scale.SMOKE:
        return [Point(*ISSUE_POINT)], 1, replace(base, span_days=14, arrival_days=7, max_days=7)
    points = [Point(lead, slack, load) for load in LOADS for lead in LEAD_MIXES for slack in SLACK_MIXES]
    return points, scale.pick(20, 5, 1), base


def measure(point: Point, base: WorkloadSpec, seeds: int) -> Measured:
    spec = point.spec(base)
    fleet = grid_fleet(spec)
    hour0 = hour_zero(BENCH_START, fleet)
    requests: list[int] = []
    shares: dict[str, list[float]] = {ranking: [] for ranking in RANKINGS}
    for seed in range(seeds):
        workload = generate(spec, seed)
        requests.append(len(workload))
        bound = lp_bound(*jobs_of(fleet, workload))
        for ranking in RANKINGS:
            booked, _ = replay_on_calendar(fleet, workload, hour0, ranking)
            got = sum(b.request.instance_days for b in booked if b.offering is not None)
            shares[ranking].append(100 * got / bound if bound else 100.0)
    return Measured(point, tuple(requests), {ranking: tuple(values) for ranking, values in shares.items()})


def run(report: Report, *, scale: Scale) -> list[Measured]:
    points, seeds, base = grid(scale)
    default = BookingPolicy().ranking
    line("")
    line(
        f"grid (issue 54): {len(points)} points x {seeds} seeds; each point is issue 54's workload (one pool "
        f"of {base.pool_size}, {base.span_days} days, arrivals over {base.arrival_days}, gangs 1-"
        f"{base.pool_size // 2}, {base.min_days}-{base.max_days} days, windows cut at the span, first "
        "offering) with these lead times, slack and offered load:"
    )
    for name, mix in LEAD_MIXES.items():
        line(f"  lead {name:8} {mix.describe()}")
    for name, mix in SLACK_MIXES.items():
        line(f"  slack {name:7} {mix.describe()}")
    began = time.monotonic()
    others = [r for r in RANKINGS if r != default]
    columns = "".join(f"{r:>10}" for r in (default, *others))
    line(f"  {'lead':8} {'slack':8} {'load':>4} {'requests':>9}{columns}  {default} - earliest  seeds below")
    measured = []
    for point in points:
        m = measure(point, base, seeds)
        measured.append(m)
        shares = "".join(f"{m.mean(r):9.1f}%" for r in (default, *others))
        mark = "   <- issue 54's workload" if (point.lead, point.slack, point.load) == ISSUE_POINT else ""
        line(
            f"  {point.lead:8} {point.slack:8} {point.load:4.1f} {statistics.mean(m.requests):9.0f}{shares}"
            f"  {m.mean(default) - m.mean('earliest'):+17.1f}  {m.below(default, 'earliest'):>5} of {seeds}"
            + mark
        )
    means = {r: statistics.mean(m.mean(r) for m in measured) for r in RANKINGS}
    over = means[default] - means["earliest"]
    behind = sorted((m.mean(default) - m.mean("earliest"), m.point) for m in measured)
    losing = [(gap, p) for gap, p in behind if gap < 0]
    line(
        f"  mean over the {len(points)} points: "
        + ", ".join(f"{r} {means[r]:.1f}%" for r in (default, *others))
        + f"; {default} - earliest {over:+.1f} points"
    )
    line(
        f"  {default} below earliest at {len(losing)} of {len(points)} points"
        + (
            " (" + "; ".join(f"{p.lead}/{p.slack}/{p.load:g} {gap:+.1f}" for gap, p in losing) + ")"
            if losing
            else ""
        )
        + f"; the grid took {time.monotonic() - began:.0f} s"
    )
    report.add(
        Figure(
            f"planner grid: {default} over earliest, mean",
            f"{over:+.1f} points",
            f">= {TARGET_OVER_EARLIEST:g} points",
            over >= TARGET_OVER_EARLIEST,
        )
    )
    at_least_earliest = len(points) - len(losing)
    report.add(
        Figure(
            f"planner grid: points where {default} >= earliest",
            f"{at_least_earliest} of {len(points)}",
            f"all {len(points)}",
            at_least_earliest == len(points),
        )
    )
    return measured
