"""The end-of-run check of tests/leaks.py fails a run that leaves a process behind, and names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hyperplan.backends.layout import MARK_VARIABLE
from tests.leaks import find_leftovers

ROOT = Path(__file__).resolve().parent.parent

LEAKY = """
import subprocess


def test_starts_a_process_and_forgets_it():
    subprocess.Popen(["sleep", "300"])


def test_starts_a_process_and_ends_it():
    process = subprocess.Popen(["sleep", "301"])
    process.kill()
    process.wait()
"""

TIDY = """
import subprocess


def test_starts_a_process_and_ends_it():
    process = subprocess.Popen(["sleep", "302"])
    process.kill()
    process.wait()
"""


def run_inner_pytest(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    """A pytest run of its own, with only the leak check as a plugin, on one test file. The plugins
    installed in the environment (hypothesis, anyio, playwright, timeout...) are not loaded: the run names
    the ones it needs (-p), and loading the rest in each of its processes doubled its CPU."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(source)
    env = {
        **os.environ,
        "HYPERPLAN_LEAK_SETTLE_SECONDS": "1",
        "PYTHONPATH": str(ROOT),
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.leaks", "-c", str(tmp_path / "pytest.ini"),
         "-p", "no:cacheprovider", "-q", *options, str(test_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one process", "xdist"])
def test_a_run_that_leaves_a_process_fails_and_names_it(tmp_path: Path, workers: list[str]) -> None:
    # Under xdist the controller checks, once both workers are done, and still names the test.
    run = run_inner_pytest(tmp_path, LEAKY, *workers)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed" in run.stdout  # every test passed: the leftover alone fails the run
    assert "1 process(es) started by the tests outlived them" in run.stdout
    (line,) = [line for line in run.stdout.splitlines() if "sleep 300" in line]
    assert "started during test_inner.py::test_starts_a_process_and_forgets_it" in line
    assert "sleep 301" not in run.stdout
    # ... and the check ended what it found: nothing of the inner run is left.
    assert find_leftovers(os.environ[MARK_VARIABLE]) == []


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one process", "xdist"])
def test_a_run_that_ends_what_it_started_passes(tmp_path: Path, workers: list[str]) -> None:
    run = run_inner_pytest(tmp_path, TIDY, *workers)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "outlived" not in run.stdout
