"""`hyperplan simulate` on the shipped example (examples/planning): the table of both rankings side by
side with the plot of utilisation over time, and one ranking's row as JSON; with the owners' busy hours
and spot jobs, what the plans lent and what was taken back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hyperplan.core.workloads import read_csv
from tests.cli.support import BIN, client_env

EXAMPLES = Path(__file__).parents[2] / "examples" / "planning"
START = ("--start", "2026-03-02T09:00:00Z")
SPOT = ("--spot", str(EXAMPLES / "spot.csv"))


def simulate(tmp_path: Path, *args: str, workload: str = "tiny.csv") -> subprocess.CompletedProcess[str]:
    env = client_env(TMPDIR=str(tmp_path), COLUMNS="120")  # the replays' stores go to the test's directory
    files = ("--fleet", str(EXAMPLES / "fleet.toml"), "--workload", str(EXAMPLES / workload))
    command = [str(BIN / "hyperplan"), "simulate", *files, *START, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    return done


def test_simulate_prints_both_rankings_side_by_side_and_draws_utilisation(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the plot extra)")
    plot = tmp_path / "utilisation.png"
    lines = simulate(tmp_path, "--plot", str(plot)).stdout.splitlines()
    header = next(line for line in lines if "packing" in line)
    assert header.index("packing") < header.index("earliest")
    for row in (
        "requests accepted",
        "instance-days booked",
        "utilisation ml.p5.48xlarge/us-west-2a",
        "revenue",
    ):
        assert any(row in line for line in lines), row
    ratio = next(line for line in lines if "ratio to the bound" in line)
    assert ratio.count("%") == 2
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert list(tmp_path.iterdir()) == [plot]  # the replays' stores are gone


def test_simulate_prints_one_ranking_as_json(tmp_path: Path) -> None:
    (row,) = json.loads(simulate(tmp_path, "--ranking", "earliest", "--json").stdout)["Rankings"]
    assert (row["Ranking"], row["Requests"], row["LpBound"]) == ("earliest", 6, 412.0)
    assert 0 < row["InstanceDays"] <= row["LpBound"]
    assert row["RatioToBound"] == round(row["InstanceDays"] / row["LpBound"], 4)
    assert set(row["Utilisation"]) == {"ml.p5.48xlarge/us-west-2a"}
    assert "Borrowing" not in row  # no busy hours, no spot jobs: every plan is its owner's all along


def cells(lines: list[str], name: str) -> list[str]:
    """The table row named ``name``: its cells, one per ranking."""
    for line in lines:
        first, *rest = (cell.strip() for cell in line.strip("│ ").split("│"))
        if first == name:
            return rest
    raise AssertionError(f"no row {name!r} in:\n" + "\n".join(lines))


def hours(lines: list[str], name: str) -> list[float]:
    return [float(cell.replace(",", "")) for cell in cells(lines, name)]


def test_simulate_with_spot_jobs_prints_idle_lent_and_reclaimed_hours_that_add_up(tmp_path: Path) -> None:
    lines = simulate(tmp_path, *SPOT, workload="tiny-busy.csv").stdout.splitlines()
    reserved, busy, idle, lent = (
        hours(lines, name)
        for name in ("reserved instance-hours", "owners' busy", "idle", "lent to spot jobs")
    )
    lost = hours(lines, "of it, work lost at reclaims")
    for ranking in range(2):  # packing, earliest
        assert busy[ranking] + idle[ranking] + lent[ranking] == pytest.approx(reserved[ranking], abs=0.15)
        assert min(busy[ranking], idle[ranking], lent[ranking]) > 0
        assert 0 < lost[ranking] < lent[ranking]
    for reclaims in cells(lines, "reclaims (promises kept)"):
        taken, kept = reclaims.removesuffix(" kept)").split(" (")
        assert int(taken) == int(kept) > 0  # each borrower exits on SIGTERM, within its notice
    completed, dropped = cells(lines, "spot jobs completed"), cells(lines, "spot jobs dropped")
    for done, gone in zip(completed, dropped, strict=True):
        assert done.endswith(" / 10") and int(done.split(" / ")[0]) + int(gone) == 10
    revenue, credits = (hours(lines, name) for name in ("spot revenue", "owners' credits"))
    assert all(0 < credit < paid for credit, paid in zip(credits, revenue, strict=True))


def test_simulate_as_json_counts_each_plan_busy_as_its_workload_line_says(tmp_path: Path) -> None:
    done = simulate(tmp_path, *SPOT, "--ranking", "packing", "--json", workload="tiny-busy.csv")
    (row,) = json.loads(done.stdout)["Rankings"]
    requests = read_csv((EXAMPLES / "tiny-busy.csv").read_text())
    assert row["Accepted"] == row["Requests"] == len(requests)  # so every line's plan was booked
    lent = row["Borrowing"]
    assert lent["ReservedInstanceHours"] == 24 * row["InstanceDays"]
    # Busy hours cut to each plan's days; a line without them is busy the whole plan.
    assert lent["BusyInstanceHours"] == sum(
        r.count * (sum(min(end, 24 * r.days) - start for start, end in r.busy_h) if r.busy_h else 24 * r.days)
        for r in requests
    )
    assert lent["IdleInstanceHours"] == pytest.approx(
        lent["ReservedInstanceHours"] - lent["BusyInstanceHours"] - lent["LentInstanceHours"], abs=0.01
    )
    assert lent["SpotJobs"] == lent["SpotJobsCompleted"] + lent["SpotJobsDropped"] == 10
    assert lent["Reclaims"] == lent["PromisesKept"] > 0


def test_simulate_with_busy_hours_and_no_spot_jobs_reports_the_idle_hours(tmp_path: Path) -> None:
    lines = simulate(tmp_path, "--ranking", "earliest", workload="tiny-busy.csv").stdout.splitlines()
    (reserved,), (busy,), (idle,) = (
        hours(lines, name) for name in ("reserved instance-hours", "owners' busy", "idle")
    )
    assert busy + idle == pytest.approx(reserved, abs=0.1) and idle > 0
    assert not any("lent to spot jobs" in line or "reclaims" in line for line in lines)


def test_simulate_compares_list_and_load_based_prices_for_cheapest_buyers(tmp_path: Path) -> None:
    cheapest = tmp_path / "cheapest.csv"
    cheapest.write_text((EXAMPLES / "tiny.csv").read_text().replace(",first", ",cheapest"))
    assert "cheapest" in cheapest.read_text()
    answer = simulate(tmp_path, "--ranking", "packing", "--compare-prices", "--json", workload=str(cheapest))
    listed, loaded = json.loads(answer.stdout)["Rankings"]
    assert (listed["Ranking"], loaded["Ranking"]) == ("packing", "packing, load prices")
    assert listed["LpBound"] == loaded["LpBound"]
    assert 0 < loaded["InstanceDays"] <= loaded["LpBound"]
    # The example fleet has no [pricing]: list prices are its own, load-based ones the defaults (0.8-1.5 x).
    per_day = [float(row["Revenue"]) / row["InstanceDays"] for row in (listed, loaded)]
    assert per_day[0] != per_day[1]
    assert 0.8 * per_day[0] <= per_day[1] <= 1.5 * per_day[0]
