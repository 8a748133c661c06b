"""The planner bench's grid (bench/planner_grid.py, issue 54): the points it covers, the fleet it builds
for a spec's zones, and what a point's measure holds. Figures are never judged here; the smoke run of the
section (tests/test_bench_smoke.py) prints them."""

from __future__ import annotations

from dataclasses import replace

from bench.planner_grid import ISSUE_POINT, Point, grid, grid_fleet, measure
from bench.scale import Scale
from bench.server import BENCH_START
from hyperplan.core.fleet import RANKINGS
from hyperplan.core.replay import hour_zero, replay_on_calendar
from hyperplan.core.workloads import PRESETS, generate


def test_the_full_grid_crosses_leads_slacks_and_loads_with_issue_54s_workload_among_them() -> None:
    points, seeds, base = grid(Scale.FULL)
    assert seeds >= 5
    assert len({p.lead for p in points}) >= 3 and len({p.slack for p in points}) >= 3
    assert len({p.load for p in points}) >= 2
    assert len(points) == len({p.lead for p in points}) * len({p.slack for p in points}) * len(
        {p.load for p in points}
    )
    issue = Point(*ISSUE_POINT)
    assert issue in points and issue.spec(base) == PRESETS["issue54"]
    smoke, smoke_seeds, _ = grid(Scale.SMOKE)
    assert smoke == [issue] and smoke_seeds == 1


def test_a_spec_with_two_zones_gets_a_pool_in_each_and_bookings_use_both() -> None:
    spec = replace(PRESETS["issue54"], zones=2, pool_size=8, span_days=14, arrival_days=7, max_days=7)
    fleet = grid_fleet(spec)
    assert [(p.instance_type, p.reservable) for p in fleet.pools] == [(spec.instance_type, 8)] * 2
    assert len({p.availability_zone for p in fleet.pools}) == 2 == len(fleet.zones)
    booked, _ = replay_on_calendar(fleet, generate(spec, 0), hour_zero(BENCH_START, fleet))
    used = {s.pool_key for b in booked if b.offering is not None for s in b.offering.segments}
    assert used == {p.key for p in fleet.pools}


def test_a_point_measured_gives_every_ranking_a_share_of_the_bound_per_seed() -> None:
    base = replace(PRESETS["issue54"], span_days=14, arrival_days=7, max_days=7)
    measured = measure(Point(*ISSUE_POINT), base, 2)
    assert len(measured.requests) == 2 and all(n > 0 for n in measured.requests)
    assert set(measured.shares) == set(RANKINGS)
    for shares in measured.shares.values():
        assert len(shares) == 2 and all(0 < s <= 100 + 1e-9 for s in shares)  # the bound bounds them
    assert 0 <= measured.below("packing", "earliest") <= 2
