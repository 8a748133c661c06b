"""``python -m bench.compare BEFORE AFTER [--store sqlite|postgres] [--rounds N] [--smoke]``: two builds'
purchases and searches, side by side, on copies of one filled store.

BEFORE and AFTER are checkouts of the project (``git worktree add``). Each phase starts one build's
servers (``serve --workers 2`` on SQLite; two servers on one PostgreSQL) with that checkout first on
PYTHONPATH, on a fresh copy of the same filled store, and runs the scale section's load on it; the builds
alternate phase by phase (before, after; then after, before), so that the machine's speed, which drifts
from one minute to the next on a virtual machine (README, "Benchmarks"), falls on both alike. Whole runs
of ``python -m bench scale`` minutes apart cannot tell a few percent from that drift; pairs of phases
seconds apart can. It prints each pair and the medians of CPU per request, rate and p99, after against
before. Figures are printed, never judged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.fill import FillSpec
from bench.loadgen import CREATE, SEARCH, PhaseResult
from bench.phases import Sizes
from bench.report import line, percentile
from bench.scale import Scale
from bench.scaleout import _phase
from bench.server import ServerProcess, Store, dev_postgres, prepare_store, running_server, snapshot

BUILDS = ("before", "after")
KINDS = {"search": SEARCH, "buy": CREATE}


@dataclass
class Figures:
    """One build's phases of one kind: CPU per request (ms), requests per second, p99 (ms)."""

    cpu: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)

    def add(self, result: PhaseResult, operation: str) -> None:
        done = max(result.completed(operation), 1)
        self.cpu.append(result.server_cpu / done * 1000)
        self.rate.append(result.rate(operation))
        self.p99.append(percentile(result.latencies.get(operation, [0.0]), 99) * 1000)


def main(argv: list[str]) -> int:
    args = _parse(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    scale = Scale.SMOKE if args.smoke else Scale.FULL
    sizes = Sizes.of(scale)
    work = Path(tempfile.mkdtemp(prefix="hyperplan-compare-"))
    url, stop_postgres = (None, lambda: None) if args.store == "sqlite" else dev_postgres(work)
    if args.store == "postgres" and url is None:
        shutil.rmtree(work, ignore_errors=True)
        return 1  # dev_postgres said why
    try:
        store = prepare_store(work / "filled", FillSpec(max_plans=sizes.max_plans), sizes.clients, url)
        copies = _Copies(store, url)
        figures = {(build, kind): Figures() for build in BUILDS for kind in KINDS}
        for number in range(args.rounds):
            order = BUILDS if number % 2 == 0 else BUILDS[::-1]
            for kind, operation in KINDS.items():
                for build in order:
                    with _servers(copies.fresh(), trees[build]) as servers:
                        time.sleep(0.5)  # as the scale section's speed check leaves a server just ready
                        result = _phase(store, servers, sizes, kind, offerings=sizes.offerings)
                    figures[build, kind].add(result, operation)
                    line(f"round {number} {kind:6} {build:6} {figures[build, kind].cpu[-1]:.3f} ms a request")
        _print(figures, args.store)
    finally:
        stop_postgres()
        shutil.rmtree(work, ignore_errors=True)  # the filled store and its copies: nothing is kept
    return 0


class _Copies:
    """Fresh copies of the filled store: SQLite's online backup, or PostgreSQL's CREATE DATABASE ...
    TEMPLATE (the filled database must then have no connection: its store is closed first)."""

    def __init__(self, store: Store, url: str | None) -> None:
        self.store, self.url, self.made = store, url, 0
        if url is not None:
            store.close()

    def fresh(self) -> tuple[Path, str | None]:
        self.made += 1
        name = f"copy{self.made}"
        if self.url is None:
            return snapshot(self.store, name), None
        import psycopg

        base, _, database = self.url.rpartition("/")
        with psycopg.connect(self.url.replace("+psycopg", ""), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}" TEMPLATE "{database}"')
        data_dir = self.store.data_dir.with_name(name)
        shutil.copytree(self.store.data_dir, data_dir)  # with the master key that opens its secrets
        return data_dir, f"{base}/{name}"


@contextlib.contextmanager
def _servers(copy: tuple[Path, str | None], tree: Path) -> Iterator[list[ServerProcess]]:
    data_dir, url = copy
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with contextlib.ExitStack() as stack:
        if url is None:
            yield [stack.enter_context(running_server(data_dir, extra=("--workers", "2"), env=env))]
            return
        shared = ("--database-url", url)
        yield [stack.enter_context(running_server(data_dir, extra=shared, env=env)) for _ in range(2)]


def _print(figures: dict[tuple[str, str], Figures], store: str) -> None:
    line(f"medians, {store}: after against before")
    for kind in KINDS:
        before, after = figures["before", kind], figures["after", kind]
        for what, unit in (("cpu", "ms a request"), ("rate", "/s"), ("p99", "ms p99")):
            b, a = statistics.median(getattr(before, what)), statistics.median(getattr(after, what))
            change = f"{100 * (a - b) / b:+.1f}%" if b else "-"
            line(f"  {kind:6} {unit:13} before {b:9.2f}  after {a:9.2f}  {change}")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a checkout of the build to compare against")
    parser.add_argument("after", type=Path, help="a checkout of the build compared")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--rounds", type=int, default=8, help="pairs of phases of each kind (default 8)")
    parser.add_argument("--smoke", action="store_true", help="smoke sizes: the least that runs every path")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
