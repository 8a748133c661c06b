"""The `hyperplan` command's start-up, next to the time it takes Python to import Typer and Rich alone.

Each command is run as a user runs it (the console script, a fresh process) several times, and the
median wall time is kept. Client commands talk to a real, idle server on loopback (a fresh data
directory, the manual clock), so what is timed is the command's start, its signed requests and its
output, with next to no server work (the lists are empty). The target: `--help` and client commands
within 3 times the bare import of Typer and Rich.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import Figure, Report, at_most, heading, line
from bench.scale import Scale
from bench.server import running_server

TARGET_RATIO = 3.0
BIN = Path(sys.executable).parent


def run(report: Report, *, scale: Scale) -> None:
    heading("CLI start-up: `hyperplan` commands against Python importing Typer and Rich")
    runs = scale.pick(9, 5, 2)
    with (
        tempfile.TemporaryDirectory(prefix="hyperplan-bench-cli-") as scratch,
        running_server(Path(scratch)) as server,
    ):
        env = _client_env(server.port, server.data_dir / "credentials")
        baseline = _median(runs, [sys.executable, "-c", "import typer, rich"], env)
        line(f"python -c 'import typer, rich': {baseline * 1000:.0f} ms (median of {runs})")
        report.add(Figure("CLI baseline: import typer, rich", f"{baseline * 1000:.0f} ms"))
        for label, args in COMMANDS.items():
            seconds = _median(runs, [str(BIN / "hyperplan"), *args], env)
            ratio = seconds / baseline
            line(f"{label}: {seconds * 1000:.0f} ms, {ratio:.1f}x the baseline")
            note = f"{seconds * 1000:.0f} ms"
            report.add(at_most(ratio, TARGET_RATIO, "x", f"CLI start, {label}", note=note))


COMMANDS = {
    "hyperplan --help": ["--help"],
    "hyperplan plans list --help": ["plans", "list", "--help"],
    "hyperplan clock show (native API)": ["clock", "show"],
    "hyperplan plans list (SageMaker API)": ["plans", "list"],
    "hyperplan jobs list (SageMaker API)": ["jobs", "list"],
}


def _median(runs: int, argv: list[str], env: dict[str, str]) -> float:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
        samples.append(time.perf_counter() - began)
        if done.returncode != 0:  # a figure of a command that failed would time the wrong thing
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return statistics.median(samples)


def _client_env(port: int, credentials: Path) -> dict[str, str]:
    """The server's first credentials file as the shared credentials file; nothing of the machine's AWS
    settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_"))}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(credentials),
        AWS_PROFILE="hyperplan",
        AWS_CONFIG_FILE=os.devnull,
        HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    return env
