"""The planner (docs/PLANNING.md): what each ranking books of the issue's workloads against the LP upper
bound, and what a second segment adds on calendars at least 80% full; then the grid of workload shapes
of issue 54 (bench/planner_grid.py).

The workloads are replayed on a calendar with the real search and the calendar's booking
(``replay_on_calendar``: the same code `hyperplan simulate` runs under the services, minus the store);
one workload is also replayed through the services, to show that both give the same bookings.
"""

from __future__ import annotations

import contextlib
import random
import statistics
from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal

from bench import planner_grid, planner_prices
from bench.report import Report, at_least, heading, line
from bench.scale import Scale
from bench.server import BENCH_START
from hyperplan.core.bound import lp_bound
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import AvailabilityZone, BookingPolicy, Fleet, Pool
from hyperplan.core.replay import hour_zero, jobs_of, replay_on_calendar
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.workloads import SHAPES, WorkloadSpec, generate
from hyperplan.errors import HyperplanError

TARGET_RATIO = 80.0  # % of the LP bound, the default ranking, on average
TARGET_OVER_EARLIEST = 5.0  # points
TARGET_SPLIT_GAIN = 1.9  # acceptance with up to 2 segments / with 1, on calendars >= 80% full
DAY = timedelta(days=1)


def planner_fleet() -> Fleet:
    zone = AvailabilityZone("us-west-2a", "usw2-az1", ("subnet-0a1b2c3d4e5f60718",))
    pool = Pool("ml.p5.48xlarge", "us-west-2a", 64, 64, Decimal("98.32"), "USD")
    return Fleet("us-west-2", (zone,), (pool,), BookingPolicy())


def run(report: Report, *, scale: Scale) -> None:
    from hyperplan.cli.simulate import quiet_highs

    heading("Planner: bookings against the LP upper bound (hyperplan simulate's workloads)")
    quiet_highs()
    fleet = planner_fleet()
    hour0 = hour_zero(BENCH_START, fleet)
    seeds = scale.pick(5, 5, 1)
    shapes = scale.pick(sorted(SHAPES), ["helios"], ["helios"])
    spec = (
        WorkloadSpec() if scale is not Scale.SMOKE else WorkloadSpec(span_days=14, arrival_days=7, max_days=7)
    )
    line(
        f"workload: one pool of {spec.pool_size}, {spec.span_days} days; arrivals over {spec.arrival_days} "
        f"days at {spec.load}x the pool over the span; powers of two up to half the pool; {spec.min_days}-"
        f"{spec.max_days} days, heavy tailed; windows {spec.slack[0]}-{spec.slack[1]}x the plan; buyers take "
        "the first offering"
    )
    ratios: dict[str, list[float]] = {"packing": [], "earliest": []}
    calendars: list[CapacityCalendar] = []
    for shape in shapes:
        for seed in range(seeds):
            requests = generate(replace(spec, shape=shape), seed)
            jobs, capacity = jobs_of(fleet, requests)
            bound = lp_bound(jobs, capacity)
            row = []
            for ranking in ("packing", "earliest"):
                booked, calendar = replay_on_calendar(fleet, requests, hour0, ranking)
                got = sum(b.request.instance_days for b in booked if b.offering is not None)
                accepted = sum(1 for b in booked if b.offering is not None)
                ratios[ranking].append(100 * got / bound)
                row.append(f"{ranking} {accepted}/{len(requests)} {got} ({100 * got / bound:.1f}%)")
                if ranking == "packing":
                    calendars.append(calendar)
            line(f"  {shape:6} seed {seed}: LP bound {bound:.0f} instance-days; " + "; ".join(row))
    packing, earliest = statistics.mean(ratios["packing"]), statistics.mean(ratios["earliest"])
    line(f"  mean over {len(ratios['packing'])} workloads: packing {packing:.1f}%, earliest {earliest:.1f}%")
    report.add(at_least(packing, TARGET_RATIO, "%", "planner: packing ranking / LP bound"))
    report.add(at_least(packing - earliest, TARGET_OVER_EARLIEST, "points", "planner: packing over earliest"))
    _services_agree(fleet, spec, scale)
    _split_gain(report, fleet, calendars, hour0, spec, scale)
    planner_grid.run(report, scale=scale)
    planner_prices.run(report, scale=scale)


def _services_agree(fleet: Fleet, spec: WorkloadSpec, scale: Scale) -> None:
    """One workload through the services (store, manual clock), as `hyperplan simulate` replays it."""
    from hyperplan.cli.simulate import run as simulate

    requests = generate(spec, 0)[: scale.pick(None, 40, 10)]
    outcome = simulate(fleet, requests, BENCH_START, ["packing"])[0]
    booked, _ = replay_on_calendar(fleet, requests, hour_zero(BENCH_START, fleet), "packing")
    on_calendar = sum(b.request.instance_days for b in booked if b.offering is not None)
    same = "the same" if on_calendar == outcome.instance_days else "NOT the same"
    line(
        f"  through the services (hyperplan simulate), {spec.shape} seed 0, {len(requests)} requests: "
        f"{outcome.instance_days} instance-days, {same} as on the calendar ({on_calendar})"
    )


def _split_gain(
    report: Report, fleet: Fleet, calendars: list[CapacityCalendar], hour0: datetime, spec: WorkloadSpec,
    scale: Scale,
) -> None:  # fmt: skip
    """Probes on the packed calendars, over their fullest stretch: accepted with up to 2 segments, and
    with 1."""
    probes = scale.pick(300, 100, 20)
    key = fleet.pools[0].key
    one = replace(fleet, policy=replace(fleet.policy, max_segments=1))
    accepted = {1: 0, 2: 0}
    fullness = []
    rng = random.Random(5)
    weights = SHAPES[spec.shape].count_weights
    for calendar in calendars:
        days = spec.span_days
        daily = calendar.booked(key, hour0, hour0 + days * DAY).reshape(days, 48).max(axis=1) / 64
        # The fullest 3 weeks (or third of the span): where the probes' windows are.
        width = max(days * 3 // 8, 3)
        sums = [daily[d : d + width].mean() for d in range(days - width + 1)]
        first = max(range(len(sums)), key=lambda d: sums[d])
        fullness.append(sums[first])
        if sums[first] < 0.8:
            continue
        start, end = hour0 + first * DAY, hour0 + (first + width) * DAY
        counts = [2**i for i in range(len(weights)) if 2**i <= spec.pool_size // 2]
        for _ in range(probes):
            count = rng.choices(counts, weights[: len(counts)])[0]
            length = rng.randint(1, max(width // 3, 1))
            request = SearchRequest(key[0], count, 24 * length, "training-job", start, end)
            for segments, the_fleet in ((2, fleet), (1, one)):
                with contextlib.suppress(HyperplanError):
                    accepted[segments] += bool(search(the_fleet, calendar, request, hour0))
    full = sum(1 for f in fullness if f >= 0.8)
    line(
        f"  second segments: {probes} probes on each of {full} calendars at least 80% full over their "
        f"fullest {max(spec.span_days * 3 // 8, 3)} days (fullness {min(fullness):.0%}-{max(fullness):.0%}); "
        f"plans of 1 to a third of those days, counts as the workload's: accepted with up to 2 segments "
        f"{accepted[2]}, with 1 {accepted[1]}"
    )
    gain = accepted[2] / accepted[1] if accepted[1] else float(accepted[2] > 0) * 99.0
    report.add(at_least(gain, TARGET_SPLIT_GAIN, "x", "planner: acceptance, 2 segments / 1"))
