"""The `hyperplan` command's start-up, next to the time it takes Python to import Typer and Rich alone.

Each command is run as a user runs it (the console script, a fresh process) several times, and the
median wall time is kept. Client commands are pointed at a loopback port nobody listens on, so that
what is timed is the start and the refused connection, not a server's work. The target: `--help` and
client commands within 3 times the bare import of Typer and Rich.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.report import Figure, Report, at_most, heading, line
from bench.scale import Scale

TARGET_RATIO = 3.0
BIN = Path(sys.executable).parent


def run(report: Report, *, scale: Scale) -> None:
    heading("CLI start-up: `hyperplan` commands against Python importing Typer and Rich")
    runs = scale.pick(9, 5, 2)
    env = _client_env(_closed_port())
    baseline = _median(runs, [sys.executable, "-c", "import typer, rich"], env)
    line(f"python -c 'import typer, rich': {baseline * 1000:.0f} ms (median of {runs})")
    report.add(Figure("CLI baseline: import typer, rich", f"{baseline * 1000:.0f} ms"))
    commands = {
        "hyperplan --help": ["--help"],
        "hyperplan plans list --help": ["plans", "list", "--help"],
        "hyperplan clock show (native API)": ["clock", "show"],
        "hyperplan plans list (SageMaker API)": ["plans", "list"],
    }
    for label, args in commands.items():
        seconds = _median(runs, [str(BIN / "hyperplan"), *args], env)
        ratio = seconds / baseline
        line(f"{label}: {seconds * 1000:.0f} ms, {ratio:.1f}x the baseline")
        report.add(at_most(ratio, TARGET_RATIO, "x", f"CLI start, {label}", note=f"{seconds * 1000:.0f} ms"))


def _median(runs: int, argv: list[str], env: dict[str, str]) -> float:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _client_env(port: int) -> dict[str, str]:
    """Keys in the environment, nothing of the machine's AWS settings, the endpoint a closed port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_"))}
    env.update(
        AWS_ACCESS_KEY_ID="AKIDBENCHCLI",
        AWS_SECRET_ACCESS_KEY="secret",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_DEFAULT_REGION="us-west-2",
    )
    return env
