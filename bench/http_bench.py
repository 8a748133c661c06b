"""Over HTTP: real servers on a store about 80% booked; search latency with one client, then search and
purchase throughput with eight client processes (see :mod:`bench.loadgen`).

Every phase that buys gets a server of its own on a copy of the same store, as it was filled, so each
one starts from the same ~80%-booked calendar and no phase eats the capacity of the next.
"""

from __future__ import annotations

from pathlib import Path

from bench import breakdown, profiling, purchase, scaleout
from bench.fill import WINDOW_DAYS, FillSpec
from bench.loadgen import SEARCH, ClientJob
from bench.phases import Sizes, describe_phase, run_measured
from bench.report import Report, at_least, at_most, heading, line, percentile
from bench.scale import Scale
from bench.server import (
    ServerProcess,
    Store,
    command_line,
    memory_kib,
    prepare_store,
    running_server,
    snapshot,
)

TARGET_P99_MS = 20.0
TARGET_SEARCHES = 500.0


def run(report: Report, workdir: Path, *, scale: Scale, profile: bool) -> None:
    heading("Over HTTP: SageMaker awsJson1.1 + SigV4, real server process, manual clock")
    sizes = Sizes.of(scale)
    store = _filled_store(workdir / "http", sizes)
    try:
        copies = {name: snapshot(store, name) for name in ("search", *purchase.PHASES)}
        _breakdown(store, sizes, profile=profile)
    finally:
        store.close()
    line("each phase below runs against its own server, on a copy of the store as filled")
    with running_server(copies["search"]) as server:
        line(f"server: pid {server.pid}: {command_line(server.pid)}")
        line(f"server RSS after start: {_rss(server)}")
        _single_client(report, store, server, sizes)
        _search_throughput(report, store, server, sizes)
        line(f"server RSS after the search phases: {_rss(server)}")
    purchase.run(report, store, copies, sizes)


def _rss(server: ServerProcess) -> str:
    rss = memory_kib(server.pid)
    return f"{rss['VmRSS'] / 1024:.0f} MiB (peak {rss['VmHWM'] / 1024:.0f} MiB)"


def _filled_store(data_dir: Path, sizes: Sizes) -> Store:
    store = prepare_store(data_dir, FillSpec(max_plans=sizes.max_plans), clients=sizes.clients)
    line(
        f"store: {store.plans:,} plans written in-process through services.plans.create (durable, "
        f"one transaction each) in {store.fill_seconds:.1f} s; {store.booked:.1%} of the "
        f"{WINDOW_DAYS}-day window booked"
    )
    return store


def _breakdown(store: Store, sizes: Sizes, *, profile: bool) -> None:
    line(
        f"where the time goes: each endpoint stage called in-process, {sizes.breakdown_samples} requests each"
    )
    searches, purchases = breakdown.measure(store, sizes.breakdown_samples)
    breakdown.print_stages("SearchTrainingPlanOfferings (HTTP search mix):", searches)
    breakdown.print_stages("CreateTrainingPlan (purchase mix; durable commit):", purchases)
    if profile:
        searching, buying = breakdown.profile(store, sizes.breakdown_samples)
        line("cProfile (CPU time) of the server-side stages of SearchTrainingPlanOfferings:")
        profiling.print_summary(searching)
        line("cProfile (CPU time) of the server-side stages of CreateTrainingPlan:")
        profiling.print_summary(buying)


def _jobs(store: Store, server: ServerProcess, sizes: Sizes, clients: int) -> list[ClientJob]:
    context = sizes.context(store)
    single = clients == 1
    duration = 300.0 if single else sizes.seconds
    limit = sizes.single_searches if single else None
    return [
        ClientJob("search", i, server.endpoint(store.keys[i], store.fleet.region), context, duration, limit)
        for i in range(clients)
    ]


def _single_client(report: Report, store: Store, server: ServerProcess, sizes: Sizes) -> None:
    line(f"latency: 1 client process, {sizes.single_searches:,} searches one after another (the search mix)")
    result = run_measured(server, _jobs(store, server, sizes, clients=1))
    describe_phase(result, (SEARCH,))
    p99 = percentile(result.latencies[SEARCH], 99) * 1000
    report.add(at_most(p99, TARGET_P99_MS, "ms", "HTTP search p99 (1 client)", note="client-side round trip"))


def _search_throughput(report: Report, store: Store, server: ServerProcess, sizes: Sizes) -> None:
    line(f"search throughput: {sizes.clients} client processes, {sizes.seconds:g} s, the search mix")
    result = run_measured(server, _jobs(store, server, sizes, clients=sizes.clients))
    describe_phase(result, (SEARCH,))
    p99 = percentile(result.latencies[SEARCH], 99) * 1000
    label = f"HTTP searches/s ({sizes.clients} clients)"
    note = f"p99 under this load {p99:.1f} ms"
    report.add(at_least(result.rate(SEARCH), TARGET_SEARCHES, "/s", label, note=note))
    scaleout.search_cells(report, scaleout.ONE_PROCESS, result)
