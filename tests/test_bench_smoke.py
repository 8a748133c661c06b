"""`python -m bench --quick` runs end to end and prints every figure. Timings are never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABELS = (
    "in-process search p99",
    "HTTP search p99 (1 client)",
    "HTTP searches/s (8 clients)",
    "HTTP purchases/s (search+buy pairs, 8 clients)",
    "HTTP purchases/s (buy only, 8 clients)",
    "HTTP purchases/s (buy only, 1 client)",
    "server RSS, empty store",
    "server RSS, plans booked",
    "lifecycle lag, spread over time",
    "lifecycle lag, burst at one instant",
    "restart catch-up of missed events",
)


@pytest.mark.timeout(480)
def test_quick_bench_prints_every_figure() -> None:
    process = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=450,  # about 130 s on an idle 2-core machine; room for a busy one
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    summary = process.stdout.partition("== Summary")[2]
    for label in LABELS:
        assert label in summary, f"{label!r} missing from the summary:\n{summary}"
    assert "failed unexpectedly" not in process.stdout, process.stdout
