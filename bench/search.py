"""In-process search latency: ``hyperplan.core.search.search`` on a calendar about 80% booked."""

from __future__ import annotations

import contextlib
import cProfile
import random
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from bench import mix, profiling
from bench.fill import WINDOW_DAYS, FillSpec, booked_fraction, fill, reservable_pools, window_start
from bench.report import Report, at_most, heading, latency_summary, line, percentile
from bench.scale import Scale
from bench.server import BENCH_START, FLEET
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import HyperplanError

TARGET_P99_MS = 5.0


@dataclass(frozen=True)
class Timed:
    request: SearchRequest
    seconds: float
    outcome: str  # "none", "1 segment", "2 segments" (of the best offering), or an error code


def run(report: Report, *, scale: Scale, profile: bool) -> None:
    heading("Search latency, in-process (hyperplan.core.search.search)")
    fleet = parse_fleet(FLEET.read_text())
    now = BENCH_START  # a fixed instant: the same calendar and offerings at any hour
    calendar = CapacityCalendar(fleet.pools)
    bookings = fill(fleet, calendar, now, FillSpec(max_plans=scale.pick(None, None, 200)))
    fraction = booked_fraction(fleet, calendar, window_start(fleet, now))
    line(
        f"calendar: {len(reservable_pools(fleet))} reservable pools, 30-minute slots, "
        f"{WINDOW_DAYS}-day window, {fraction:.1%} booked by {len(bookings):,} random whole-day segments"
    )
    rng = random.Random(11)
    context = mix.MixContext.of(fleet, now)
    requests = [mix.search_request(rng, context) for _ in range(scale.pick(3000, 300, 60))]
    for request in requests[:50]:  # warm-up, untimed
        _timed(fleet, calendar, request, now)
    results = [_timed(fleet, calendar, request, now) for request in requests]
    _print_results(results)
    report.add(
        at_most(
            percentile([r.seconds for r in results], 99) * 1000, TARGET_P99_MS, "ms", "in-process search p99"
        )
    )
    if profile:
        _profile(fleet, calendar, requests, now)


def _timed(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> Timed:
    began = time.perf_counter()
    try:
        offerings = search(fleet, calendar, request, now)
    except HyperplanError as exc:
        return Timed(request, time.perf_counter() - began, exc.code)
    seconds = time.perf_counter() - began
    if not offerings:
        return Timed(request, seconds, "no offering")
    segments = len(offerings[0].segments)
    return Timed(request, seconds, f"best has {segments} segment{'s' * (segments > 1)}")


def _print_results(results: list[Timed]) -> None:
    line(
        "mix: every reservable type, counts 1-32, 1-30 days, both targets; half with a window "
        "(StartTimeAfter, or both bounds)"
    )
    outcomes = Counter(r.outcome for r in results)
    line("outcomes: " + ", ".join(f"{name} {n:,}" for name, n in sorted(outcomes.items())))
    line(f"latency: {latency_summary([r.seconds for r in results])}")
    groups: dict[str, list[float]] = {}
    for r in results:
        windowed = "window" if r.request.start_after else "no window"
        groups.setdefault(f"{r.request.target}, {windowed}", []).append(r.seconds)
    for name, seconds in sorted(groups.items()):
        line(f"  {name:<32} {latency_summary(seconds)}")
    slowest = max(results, key=lambda r: r.seconds)
    line(f"slowest: {slowest.seconds * 1000:.2f} ms for {_describe(slowest.request)} ({slowest.outcome})")


def _describe(request: SearchRequest) -> str:
    window = ""
    if request.start_after:
        window = f", from {request.start_after:%m-%d %H:%M}"
    if request.end_before:
        window += f" to {request.end_before:%m-%d %H:%M}"
    return (
        f"{request.instance_count} x {request.instance_type}, {request.duration_hours} h, "
        f"{request.target}{window}"
    )


def _profile(fleet: Fleet, calendar: CapacityCalendar, requests: list[SearchRequest], now: datetime) -> None:
    line("cProfile of the same searches:")
    profiler = cProfile.Profile()
    profiler.enable()
    for request in requests:
        with contextlib.suppress(HyperplanError):
            search(fleet, calendar, request, now)
    profiler.disable()
    profiling.print_summary(profiler)
