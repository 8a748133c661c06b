"""The `hyperplan` command's start-up, next to the time it takes Python to import Typer and Rich alone.

Two measures, each against the same measure of `python -c "import typer, rich"`:

- wall time: each command is run as a user runs it (the console script, a fresh process), in rounds
  that also time the baseline, and the median ratio is kept. Client commands talk to a real, idle
  server on loopback (a fresh data directory, the manual clock), so what is timed is the command's
  start, its signed requests and its output, with next to no server work (the lists are empty).
- the server's start: CPU time of `hyperplan serve` on the demo fleet until /healthz answers, for a
  first start and a restart (a figure without a target).
- imports, by `python -X importtime` (the sum of the top-level modules' cumulative times): what a
  command loads before it starts to run (`hyperplan.cli.main`, the same for every command), and, as a
  figure without a target, everything it loads from start to exit: its view, http.client, the INI
  reader.

The target: `--help` and client commands within 3 times the baseline, in wall time and in imports at
start.
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
from bench.server import cpu_seconds, running_server

TARGET_RATIO = 3.0
BIN = Path(sys.executable).parent


def run(report: Report, *, scale: Scale) -> None:
    heading("CLI start-up: `hyperplan` commands against Python importing Typer and Rich")
    runs = scale.pick(9, 5, 2)
    baseline_argv = [sys.executable, "-c", "import typer, rich"]
    with (
        tempfile.TemporaryDirectory(prefix="hyperplan-bench-cli-") as scratch,
        # The data directory inside the scratch one: its work directory, made beside it, goes with it.
        running_server(Path(scratch) / "data") as server,
    ):
        env = _client_env(server.port, server.data_dir / "credentials")
        baselines: list[float] = []
        for label, args in COMMANDS.items():
            # The baseline is timed in the same rounds as the command: the machine's speed drifts
            # (other work, frequency), and a ratio of runs minutes apart would measure the drift.
            pairs = _paired(runs, baseline_argv, [str(BIN / "hyperplan"), *args], env)
            baselines += [base for base, _ in pairs]
            seconds = statistics.median(command for _, command in pairs)
            ratio = statistics.median(command / base for base, command in pairs)
            line(f"{label}: {seconds * 1000:.0f} ms, {ratio:.1f}x the baseline (median of {runs} pairs)")
            note = f"{seconds * 1000:.0f} ms"
            report.add(at_most(ratio, TARGET_RATIO, "x", f"CLI start, {label}", note=note))
        baseline = statistics.median(baselines)
        line(f"python -c 'import typer, rich': {baseline * 1000:.0f} ms (median of {len(baselines)})")
        report.add(Figure("CLI baseline: import typer, rich", f"{baseline * 1000:.0f} ms"))
        _imports(report, runs, env)
    _server_start(report, scale.pick(5, 3, 1))


def _imports(report: Report, runs: int, env: dict[str, str]) -> None:
    base = statistics.median(_import_seconds(["import typer, rich"], env) for _ in range(runs))
    line(f"imports of python -c 'import typer, rich' (-X importtime): {base * 1000:.0f} ms")
    report.add(Figure("CLI baseline imports: typer, rich", f"{base * 1000:.0f} ms"))
    start = statistics.median(_import_seconds(["import hyperplan.cli.main"], env) for _ in range(runs))
    line(f"imports at start (hyperplan.cli.main): {start * 1000:.0f} ms, {start / base:.1f}x the baseline's")
    note = f"{start * 1000:.0f} ms"
    report.add(at_most(start / base, TARGET_RATIO, "x", "CLI imports at start", note=note))
    for label, args in COMMANDS.items():
        script = f"import sys; sys.argv = {['hyperplan', *args]!r}; from hyperplan.cli.main import app; app()"
        seconds = statistics.median(_import_seconds([script], env) for _ in range(runs))
        ratio = seconds / base
        line(f"{label}: imports from start to exit {seconds * 1000:.0f} ms, {ratio:.1f}x the baseline's")
        report.add(Figure(f"CLI imports to exit, {label}", f"{ratio:.2f} x ({seconds * 1000:.0f} ms)"))


def _server_start(report: Report, runs: int) -> None:
    """CPU time of `hyperplan serve` until /healthz answers, as `make run` starts it (the demo fleet):
    a first start, which makes the store and stores the demo's background load, and a restart of the
    same data directory. CPU, not wall time: it is what a start costs, whatever else the machine runs
    (the test suite starts hundreds of servers)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled bytecode, as an installed package has
    first: list[float] = []
    again: list[float] = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="hyperplan-bench-start-") as scratch:
            for seconds in (first, again):
                with running_server(Path(scratch) / "data", fleet=None, env=env) as server:
                    seconds.append(cpu_seconds(server.pid))
    for label, seconds in (("first start", first), ("restart", again)):
        median = statistics.median(seconds)
        line(f"hyperplan serve, {label}: {median:.2f} s of CPU until /healthz answers (median of {runs})")
        report.add(Figure(f"server start CPU, {label} (demo fleet)", f"{median:.2f} s"))


def _import_seconds(code: list[str], env: dict[str, str]) -> float:
    """What the top-level imports of `python -c CODE` took, by -X importtime (its lines on stderr)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", *code], env=env, capture_output=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"{code} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    total = 0
    for row in done.stderr.decode(errors="replace").splitlines():
        if not row.startswith("import time:") or "|" not in row:
            continue
        _, cumulative, name = row.split("|")
        if cumulative.strip().isdigit() and not name.startswith("  "):  # a top-level import
            total += int(cumulative)
    return total / 1e6


COMMANDS = {
    "hyperplan --help": ["--help"],
    "hyperplan plans list --help": ["plans", "list", "--help"],
    "hyperplan clock show (native API)": ["clock", "show"],
    "hyperplan plans list (SageMaker API)": ["plans", "list"],
    "hyperplan jobs list (SageMaker API)": ["jobs", "list"],
}


def _paired(
    runs: int, baseline: list[str], argv: list[str], env: dict[str, str]
) -> list[tuple[float, float]]:
    """(baseline, command) wall times, one pair per round, after one untimed run of each."""
    _timed(baseline, env)
    _timed(argv, env)  # warm: bytecode written, files in the page cache
    return [(_timed(baseline, env), _timed(argv, env)) for _ in range(runs)]


def _timed(argv: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:  # a figure of a command that failed would time the wrong thing
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return elapsed


def _client_env(port: int, credentials: Path) -> dict[str, str]:
    """The server's first credentials file as the shared credentials file; nothing of the machine's AWS
    settings. Bytecode is written and reused, as for an installed package (pip compiles it at install):
    with PYTHONDONTWRITEBYTECODE set, every run would compile hyperplan's modules while Typer and Rich,
    in site-packages, load theirs compiled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HYPERPLAN_"))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(credentials),
        AWS_PROFILE="hyperplan",
        AWS_CONFIG_FILE=os.devnull,
        HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{port}",
    )
    return env
