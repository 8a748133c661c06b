"""`python -m bench --smoke SECTION` runs each section end to end and prints its figures: the bench
keeps working as the code changes. Its figures are never asserted (and at smoke size mean nothing);
each section is a test of its own, so that a parallel run spreads them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.__main__ import SECTIONS
from bench.loadgen import PhaseResult
from bench.phases import describe_phase

pytestmark = pytest.mark.bench  # a part of its own: its sections start servers and floods

ROOT = Path(__file__).resolve().parents[1]
LABELS = {
    "search": ("in-process search p99",),
    "http": (
        "HTTP search p99 (1 client)",
        "HTTP searches/s (2 clients)",  # a smoke run's clients; `make bench` has 8
        "HTTP purchases/s (search+buy pairs, 2 clients)",
        "HTTP purchases/s (buy only, 2 clients)",
        "HTTP purchases/s (buy only, 1 client)",
    ),
    "scale": (
        "HTTP searches/s (workers 2, SQLite)",
        "server CPU per search (workers 2, SQLite)",
        "HTTP purchases/s, buy only (workers 2, SQLite)",
        "server CPU per purchase (workers 2, SQLite)",
        "CreateTrainingPlan p99 (workers 2, SQLite)",
    ),
    "memory": ("server RSS, empty store", "server RSS, plans booked"),
    "lifecycle": (
        "lifecycle lag, spread over time",
        "lifecycle lag, burst at one instant",
        "restart catch-up of missed events",
    ),
    "cli": (
        "CLI baseline: import typer, rich",
        "CLI start, hyperplan --help",
        "CLI start, hyperplan plans list --help",
        "CLI start, hyperplan clock show (native API)",
        "CLI start, hyperplan plans list (SageMaker API)",
        "CLI start, hyperplan jobs list (SageMaker API)",
    ),
    "fairness": tuple(
        label
        for limits in ("no rate limits", "default rate limits")
        for label in (
            f"search latency of A alone, {limits}",
            f"search latency of A beside the flood, {limits}",
            f"B's flood served, {limits}",
        )
    )
    + tuple(
        label
        for quota in ("no on-demand quota", "half of a type each")
        for label in (f"on-demand instances B took, {quota}", f"A's on-demand node after B's flood, {quota}")
    ),
    "planner": (
        "planner: packing ranking / LP bound",
        "planner: packing over earliest",
        "planner: acceptance, 2 segments / 1",
        "planner grid: packing over earliest, mean",  # issue 54's grid, one tiny point at smoke size
        "planner grid: points where packing >= earliest",
    ),
    "containers": tuple(
        f"containers: {what}, {runtime}"
        for what in ("job launch", "node provisioning")
        for runtime in ("process", "podman", "added by podman")
    ),
    # issue 55: a tiny 1x history on SQLite (PostgreSQL is left out of a smoke run), each figure that has
    # a target, and the Slurm reconciler's pass over recorded output
    "history": (
        *(
            f"history SQLite: {name} at 1x"
            for name in (
                "search p99, in-process (ms)",
                "HTTP search p99 (ms)",
                "HTTP purchase p99 (ms)",
                "lifecycle lag p99 (ms)",
                "ListTrainingPlans, first page (ms)",
                "ListTrainingPlans, last page (ms)",
                "console plans list (ms)",
                "start-up to healthy (s)",
                "RSS after the load (MiB)",
            )
        ),
        "Slurm reconciler pass p99 (20 nodes)",
    ),
}


TABLE_COLUMNS = {"http": "1 process, SQLite", "scale": "workers 2, SQLite"}
TABLE_ROWS = (
    "searches/s",
    "server CPU per search",
    "purchases/s (buy only)",
    "server CPU per purchase",
    "CreateTrainingPlan p99",
)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("section", list(LABELS))
def test_each_bench_section_runs_and_prints_its_figures(section: str) -> None:
    if section == "containers" and os.geteuid() != 0:
        pytest.skip("the containers section needs root (user namespaces, Podman's store)")
    process = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", section],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=450,  # the slowest section (http) takes about a minute on a busy 2-core machine
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    summary = process.stdout.partition("== Summary")[2]
    for label in LABELS[section]:
        assert label in summary, f"{label!r} missing from the summary:\n{summary}"
    if section in TABLE_COLUMNS:  # issue 20's table: its rows, and a column for what the section ran
        table = summary.partition("== Scale-out table")[2]
        header = table.splitlines()[1]  # after the rest of the heading's line
        assert TABLE_COLUMNS[section] in header, table
        for row in TABLE_ROWS:
            assert f"\n  {row} " in table, f"{row!r} missing from the table:\n{table}"
    assert "failed unexpectedly" not in process.stdout, process.stdout
    # The host's speed beside the figures, at both ends (bench/report.py speed_check), and before each
    # phase of the scale-out table.
    checks = re.findall(r"speed check (.+?): a fixed Python loop took (\d+) ms of CPU", process.stdout)
    assert len(checks) >= 2 and (checks[0][0], checks[-1][0]) == ("before", "after"), checks
    assert all(int(ms) > 0 for _, ms in checks), checks
    if section == "scale":
        assert "the purchases (workers 2, SQLite)" in [when for when, _ in checks], checks


def test_a_phase_answered_in_two_ways_prints_each_outcomes_latencies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A buy-only phase's purchases take two paths (bought, refused): each one's latencies are printed
    beside those of all of them."""
    bought, refused = ("CreateTrainingPlan", "ok"), ("CreateTrainingPlan", "ResourceLimitExceeded")
    by_outcome = {bought: [0.020, 0.030], refused: [0.002]}
    result = PhaseResult(
        clients=1,
        wall=1.0,
        latencies={"CreateTrainingPlan": [0.020, 0.030, 0.002]},
        outcomes=Counter({key: len(values) for key, values in by_outcome.items()}),
        clients_cpu=0.1,
        by_outcome=by_outcome,
    )
    describe_phase(result, ("CreateTrainingPlan",))
    printed = [text.strip() for text in capsys.readouterr().out.splitlines()]
    assert "ResourceLimitExceeded: latency p50 2.00 / p90 2.00 / p99 2.00 / max 2.00 ms over 1" in printed
    assert "ok: latency p50 20.00 / p90 30.00 / p99 30.00 / max 30.00 ms over 2" in printed


def test_every_section_of_the_bench_is_run_here() -> None:
    assert set(LABELS) == set(SECTIONS)  # a section added to the bench is added here too


@pytest.mark.timeout(300)
def test_two_builds_compared_phase_by_phase_print_each_pair_and_the_medians() -> None:
    """`python -m bench.compare` (bench/compare.py), here a checkout against itself at smoke size: each
    phase's figure, and the medians of both kinds after against before."""
    process = subprocess.run(
        [sys.executable, "-m", "bench.compare", str(ROOT), str(ROOT), "--smoke", "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    rounds = re.findall(r"round 0 (search|buy)\s+(before|after)\s+[\d.]+ ms a request", process.stdout)
    every_phase = [(kind, build) for kind in ("search", "buy") for build in ("before", "after")]
    assert sorted(rounds) == sorted(every_phase), process.stdout
    for kind in ("search", "buy"):
        for unit in ("ms a request", "/s", "ms p99"):
            median = rf"{kind}\s+{re.escape(unit)}\s+before\s+[\d.]+\s+after\s+[\d.]+"
            assert re.search(median, process.stdout), (unit, process.stdout)


@pytest.mark.timeout(300)
def test_two_builds_instructions_run_every_child_and_print_each_kind() -> None:
    """`python -m bench.instructions` (bench/instructions.py), a checkout against itself with --smoke
    (children without valgrind): every child runs its requests, the buying ones buy, and both kinds of
    request are printed after against before."""
    process = subprocess.run(
        [sys.executable, "-m", "bench.instructions", str(ROOT), str(ROOT), "--smoke", "--requests", "3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    children = dict(re.findall(r"^  (\w+ \w+): searched \d+, bought (\d+)$", process.stdout, re.MULTILINE))
    assert set(children) == {
        f"{build} {mode}" for build in ("before", "after") for mode in ("start", "search", "buy")
    }
    assert children["before buy"] == children["after buy"] == "3", process.stdout
    assert children["before search"] == children["after search"] == "0", process.stdout
    for kind in ("search", "purchase"):
        assert re.search(rf"^  {kind}\s+before\s+[\d.]+ M\s+after\s+[\d.]+ M", process.stdout, re.MULTILINE)
