"""``python -m bench.instructions BEFORE AFTER [--requests N] [--smoke]``: what a search and a purchase
cost two builds in instructions executed, counted by valgrind's callgrind, on copies of one filled store.

Time on a virtual machine drifts: the same build's CPU per purchase moves by a fifth from one run to
the next (README, "Benchmarks"), more than most changes to the code do. The number of instructions a
request executes does not drift: it is what the code costs, whatever the host's other tenants do. It
leaves out what the code waits for and what instructions cost on this CPU (cache misses, locks held by
other threads): it says whether a change made the code itself dearer, not how fast a server answers.

The store is filled once, with this checkout's code; each build then runs three children, each on a
fresh copy of it: the start alone, N searches of the purchase mix, and the same N searches each followed
by the purchase of its first offering. The children call the endpoint's stages in-process, as
``bench/breakdown.py`` does (SigV4, admission, validation, handler, serialisation; HTTP left out), with
the same seed and ``PYTHONHASHSEED``, one after another, so the work is the same for both builds. A
search costs (searches - start) / N, a purchase (purchases - searches) / N.

``--smoke`` runs the children without valgrind: the least that runs every path (its counts are 0).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

BUILDS = ("before", "after")
MODES = ("start", "search", "buy")
SEED = 6


def main(argv: list[str]) -> int:
    args = _parse(argv)
    if args.child:
        return _child(args.child, Path(args.data_dir), int(args.requests))
    if not args.smoke and shutil.which("valgrind") is None:
        print("valgrind is not installed: apt-get install valgrind (or run with --smoke)", file=sys.stderr)
        return 1
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    work = Path(tempfile.mkdtemp(prefix="hyperplan-instructions-"))
    try:
        filled = _fill(work, smoke=args.smoke)
        runs = [(build, mode) for build in BUILDS for mode in MODES]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counts = dict(
                zip(
                    runs,
                    pool.map(
                        lambda run: _counted(work, filled, run, trees[run[0]], args.requests, args.smoke),
                        runs,
                    ),
                    strict=True,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _print(counts, args.requests)
    return 0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("before", type=Path, nargs="?", help="a checkout of the build to compare against")
    parser.add_argument("after", type=Path, nargs="?", help="a checkout of the build compared")
    parser.add_argument("--requests", type=int, default=150, help="searches, and purchases, per child")
    parser.add_argument("--smoke", action="store_true", help="children without valgrind: counts are 0")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.child and (args.before is None or args.after is None):
        parser.error("name two checkouts: BEFORE AFTER")
    return args


def _fill(work: Path, *, smoke: bool) -> Path:
    """The filled store's directory, with the one client's key beside its database (keys.json)."""
    from bench.fill import FillSpec
    from bench.server import prepare_store

    store = prepare_store(work / "filled", FillSpec(max_plans=60 if smoke else None), clients=1)
    try:
        (store.data_dir / "keys.json").write_text(json.dumps([asdict(key) for key in store.keys]))
    finally:
        store.close()
    return store.data_dir


def _counted(work: Path, filled: Path, run: tuple[str, str], tree: Path, requests: int, smoke: bool) -> int:
    """Instructions one child executed (0 with --smoke): this file run as a script, so that `bench` and
    `hyperplan` come from the build's checkout (first on PYTHONPATH) while the child's code is this one."""
    build, mode = run
    copy = work / f"{build}-{mode}"
    shutil.copytree(filled, copy)
    out = work / f"{build}-{mode}.callgrind"
    child = [sys.executable, __file__, "--child", mode, "--data-dir", str(copy), "--requests", str(requests)]
    counter = [] if smoke else ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    done = subprocess.run([*counter, *child], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{build} {mode} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    print(f"  {build} {mode}: {done.stdout.strip().splitlines()[-1]}", flush=True)
    if smoke:
        return 0
    totals = re.search(r"^totals:\s+(\d+)", out.read_text(), re.MULTILINE)
    if totals is None:
        raise RuntimeError(f"{out.name}: callgrind wrote no totals")
    return int(totals.group(1))


def _child(mode: str, data_dir: Path, requests: int) -> int:
    """Open the copy as a server would, then run the mode's requests in-process."""
    import random

    from bench import breakdown, mix
    from bench.loadgen import CREATE, SEARCH
    from bench.server import BENCH_START, FLEET, NewKey, Store, unisolated
    from hyperplan.app import AppConfig, Application
    from hyperplan.errors import HyperplanError

    config = AppConfig(
        data_dir=data_dir, fleet_path=FLEET, clock="manual", clock_start=BENCH_START, **unisolated(data_dir)
    )
    application = Application(config)
    application.bootstrap()
    runtime = application.context
    runtime.calendar.load(runtime.db)  # as `serve` does at its start
    keys = [NewKey(**key) for key in json.loads((data_dir / "keys.json").read_text())]
    store = Store(data_dir, application, keys, 0, 0.0, 0.0)
    endpoint, rng = breakdown._endpoint(store), random.Random(SEED)
    context = mix.MixContext.of(store.fleet, store.now)
    bought = 0
    for number in range(requests if mode != "start" else 0):
        search = mix.wire_search(mix.purchase_request(rng, context))
        found = breakdown._call(store, endpoint, SEARCH, search, {})["TrainingPlanOfferings"]
        if mode == "buy" and found:
            offering = {
                "TrainingPlanName": f"counted-{number}",
                "TrainingPlanOfferingId": found[0]["TrainingPlanOfferingId"],
            }
            try:
                breakdown._call(store, endpoint, CREATE, offering, {})
                bought += 1
            except HyperplanError:  # a refusal is a path too, the same in both builds
                pass
    application.stop()
    print(f"searched {requests if mode != 'start' else 0}, bought {bought}")
    return 0


def _print(counts: dict[tuple[str, str], int], requests: int) -> None:
    print(f"instructions per request, {requests} of each kind, in-process (callgrind):")
    per: dict[tuple[str, str], float] = {}
    for build in BUILDS:
        start, searches, bought = (counts[build, mode] for mode in MODES)
        per[build, "search"] = (searches - start) / requests
        per[build, "purchase"] = (bought - searches) / requests
    for kind in ("search", "purchase"):
        before, after = per["before", kind], per["after", kind]
        change = f"{100 * (after - before) / before:+.2f}%" if before else "-"
        print(f"  {kind:8}  before {before / 1e6:8.3f} M  after {after / 1e6:8.3f} M  {change}")
    start_before, start_after = counts["before", "start"], counts["after", "start"]
    print(
        f"  start     before {start_before / 1e6:8.1f} M  after {start_after / 1e6:8.1f} M (not per request)"
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
