"""`hyperplan simulate` on the shipped example (examples/planning): the table of both rankings side by
side with the plot of utilisation over time, and one ranking's row as JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.support import BIN, client_env

EXAMPLES = Path(__file__).parents[2] / "examples" / "planning"
ARGS = ("--fleet", str(EXAMPLES / "fleet.toml"), "--workload", str(EXAMPLES / "tiny.csv"))
START = ("--start", "2026-03-02T09:00:00Z")


def simulate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = client_env(TMPDIR=str(tmp_path), COLUMNS="120")  # the replays' stores go to the test's directory
    command = [str(BIN / "hyperplan"), "simulate", *ARGS, *START, *args]
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
