"""The server's resident memory: an empty store, and a store with 10,000 plans booked.

Each server is started on its data directory, answers a few signed searches (so that the botocore
model, the handlers and the thread pool are loaded, as on any server in use), and then VmRSS is read
from /proc for its process: ``python -m hyperplan serve``, started directly, so the pid is the server's.
"""

from __future__ import annotations

import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench import mix
from bench.fill import FillSpec
from bench.loadgen import SEARCH, Client
from bench.report import Figure, Report, heading, line
from bench.scale import Scale
from bench.server import ServerProcess, Store, command_line, memory_kib, prepare_store, running_server

FULL_PLANS = 10_000
QUICK_PLANS = 1_000
SMOKE_PLANS = 50
# Small plans, so that 10,000 of them fit the bench fleet's 120-day window (about 78% booked).
SMALL_PLANS = FillSpec(target=0.95, counts=(1, 2, 4), max_days=5)


def run(report: Report, workdir: Path, *, scale: Scale) -> None:
    heading("Server resident memory")
    line(
        f"for scale: a bare python that imports the server and loads botocore's SageMaker model: "
        f"{_imports_only_mib():.0f} MiB"
    )
    plans = scale.pick(FULL_PLANS, QUICK_PLANS, SMOKE_PLANS)
    empty_mib = _measure(prepare_store(workdir / "memory-empty", FillSpec(max_plans=0), clients=1))
    report.add(Figure("server RSS, empty store", f"{empty_mib:.0f} MiB"))
    full = prepare_store(workdir / "memory-full", replace(SMALL_PLANS, max_plans=plans), clients=1)
    line(
        f"store: {full.plans:,} plans of 1-4 instances for 1-5 days, written in-process in "
        f"{full.fill_seconds:.1f} s; {full.booked:.1%} of the window booked"
    )
    full_mib = _measure(full)
    report.add(
        Figure(
            "server RSS, plans booked",
            f"{full_mib:.0f} MiB",
            note=f"{full.plans:,} plans; {full_mib - empty_mib:+.0f} MiB over the empty store",
        )
    )


def _measure(store: Store) -> float:
    """VmRSS in MiB of a warmed-up server on the store."""
    store.close()
    with running_server(store.data_dir) as server:
        _warm_up(store, server)
        rss = memory_kib(server.pid)
        line(
            f"{store.plans:>6,} plans: VmRSS {rss['VmRSS'] / 1024:.1f} MiB, "
            f"VmHWM {rss['VmHWM'] / 1024:.1f} MiB (pid {server.pid}: {command_line(server.pid)[:60]}...)"
        )
        return rss["VmRSS"] / 1024


_IMPORTS_ONLY = """
import hyperplan.server.app, hyperplan.wire.ops
from hyperplan.wire import model
model.service_model()
print(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])
"""


def _imports_only_mib() -> float:
    output = subprocess.run([sys.executable, "-c", _IMPORTS_ONLY], capture_output=True, text=True, check=True)
    return int(output.stdout.strip()) / 1024


def _warm_up(store: Store, server: ServerProcess) -> None:
    client = Client(server.endpoint(store.keys[0], store.fleet.region))
    rng = random.Random(3)
    context = mix.MixContext.of(store.fleet, store.now)
    for _ in range(20):
        outcome, _ = client.call(SEARCH, mix.wire_search(mix.search_request(rng, context)))
        if outcome != "ok":
            raise RuntimeError(f"warm-up search failed: {outcome}")
    client.close()
