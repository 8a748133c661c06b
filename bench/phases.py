"""Running a load phase against a server and saying what it cost: the phase's sizes, and the CPU the
server and the client processes used (on a 2-core machine they share the cores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench import mix
from bench.loadgen import ClientJob, PhaseResult, run_phase
from bench.report import latency_summary, line
from bench.scale import Scale
from bench.server import ServerProcess, Store, cpu_seconds


@dataclass(frozen=True)
class Sizes:
    clients: int
    seconds: float  # per throughput phase
    single_searches: int  # searches of the one-client latency phase
    offerings: int  # per client, in the buy-only phase
    breakdown_samples: int
    max_plans: int | None = None  # of the filled store (None: filled to its target)

    @staticmethod
    def of(scale: Scale) -> Sizes:
        if scale is Scale.SMOKE:
            return Sizes(
                clients=2, seconds=0.5, single_searches=10, offerings=3, breakdown_samples=5, max_plans=60
            )
        if scale is Scale.QUICK:
            return Sizes(clients=8, seconds=2, single_searches=100, offerings=10, breakdown_samples=30)
        return Sizes(clients=8, seconds=15, single_searches=2000, offerings=250, breakdown_samples=300)

    def context(self, store: Store) -> mix.MixContext:
        return mix.MixContext.of(store.fleet, store.now)


def run_measured(server: ServerProcess, jobs: list[ClientJob]) -> PhaseResult:
    result = run_phase(jobs, server_cpu=lambda: cpu_seconds(server.pid))
    if any(result.failed(operation) for operation, _ in result.outcomes):
        line("!! some calls failed unexpectedly; the end of the server's log:")
        for row in server.log().splitlines()[-25:]:
            line(f"   | {row}")
    return result


def describe_phase(result: PhaseResult, operations: Sequence[str]) -> None:
    requests = sum(result.completed(op) for op in operations)
    for op in operations:
        line(
            f"  {op}: {result.completed(op):,} in {result.wall:.1f} s = {result.rate(op):,.0f}/s; "
            f"latency {latency_summary(result.latencies.get(op, []))}"
        )
        line(f"    outcomes: {result.breakdown(op)}")
        outcomes = sorted(outcome for (each, outcome) in result.by_outcome if each == op)
        if len(outcomes) > 1:  # each outcome's own path: a purchase bought, one refused
            for outcome in outcomes:
                line(f"      {outcome}: latency {latency_summary(result.by_outcome[(op, outcome)])}")
        if result.failed(op):
            line(
                f"    !! {result.failed(op):,} {op} calls failed unexpectedly; they are left out of the rate"
            )
    if requests:
        line(
            f"  CPU: server {result.server_cpu:.1f} s ({result.server_cpu / result.wall:.0%} of one core, "
            f"{result.server_cpu / requests * 1000:.2f} ms per request); clients {result.clients_cpu:.1f} s "
            f"({result.clients_cpu / result.wall:.0%} of one core, "
            f"{result.clients_cpu / requests * 1000:.2f} ms per request)"
        )
