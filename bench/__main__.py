"""``python -m bench [--quick | --smoke] [--profile] [--keep] [SECTION ...]``.

Sections: search, http, scale, memory, lifecycle, cli, fairness, planner, containers, history (default: all
of them).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import cli, containers, fairness, history, http_bench, lifecycle, memory, planner, scaleout, search
from bench.report import Report, line, load_average, machine_banner, speed_check
from bench.scale import Scale

SECTIONS = (
    "search",
    "http",
    "scale",
    "memory",
    "lifecycle",
    "cli",
    "fairness",
    "planner",
    "containers",
    "history",
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("sections", nargs="*", choices=[*SECTIONS, []], help="default: all of them")
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_const", dest="scale", const=Scale.QUICK, help="small counts, short phases"
    )
    size.add_argument(
        "--smoke",
        action="store_const",
        dest="scale",
        const=Scale.SMOKE,
        help="the least that runs every path (the test suite's check): figures mean nothing",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile the in-process paths of search, purchase and the lifecycle catch-up",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the data directories (their path is printed)"
    )
    parser.set_defaults(scale=Scale.FULL)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    sections = args.sections or list(SECTIONS)
    machine_banner(shlex.join([Path(sys.executable).name, "-m", "bench", *argv]))
    workdir = Path(tempfile.mkdtemp(prefix="hyperplan-bench-"))
    line(f"data directories under {workdir} (same disk as /tmp; the server's SQLite commits with fsync)")
    report = Report()
    began = time.monotonic()
    try:
        if "search" in sections:
            search.run(report, scale=args.scale, profile=args.profile)
        if "http" in sections:
            http_bench.run(report, workdir, scale=args.scale, profile=args.profile)
        if "scale" in sections:
            scaleout.run(report, workdir, scale=args.scale)
        if "memory" in sections:
            memory.run(report, workdir, scale=args.scale)
        if "lifecycle" in sections:
            lifecycle.run(report, workdir, scale=args.scale, profile=args.profile)
        if "cli" in sections:
            cli.run(report, scale=args.scale)
        if "fairness" in sections:
            fairness.run(report, workdir, scale=args.scale)
        if "planner" in sections:
            planner.run(report, scale=args.scale)
        if "containers" in sections:
            containers.run(report, workdir, scale=args.scale)
        if "history" in sections:
            history.run(report, workdir, scale=args.scale)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report.print_summary()
    line(f"took {time.monotonic() - began:.0f} s; load average after: {load_average()}")
    speed_check("after")
    line("figures are printed, never judged: the exit code does not depend on them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
