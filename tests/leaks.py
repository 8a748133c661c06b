"""A pytest plugin: nothing a test starts may outlive the test run.

Every process the tests start carries a mark in its environment, `HYPERPLAN_RUN_MARK`
(hyperplan.backends.layout.MARK_VARIABLE): an opaque id of this run and of the test that was running,
never a path. Subprocesses inherit it from the test process; `hyperplan serve` passes it on to every
node agent, node task and job instance it starts. At the end of the session any live process whose
mark belongs to this run is a leak: the run fails, naming each process and the test it was started in,
and the leftovers are killed so that they cannot disturb what runs next.

A nested run (a test that runs pytest) makes its marks below the outer run's, so the outer run still
finds whatever the inner one leaves behind. Under pytest-xdist each worker is such a nested run of the
controller: the workers mark their tests, tell the controller which mark is which test (in the reports'
user properties), and the controller alone checks, once every worker is done.
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from hyperplan.backends import procfs
from hyperplan.backends.layout import MARK_VARIABLE
from tests.processes import MarkedProcess, kill, marked, owns

SETTLE_VARIABLE = "HYPERPLAN_LEAK_SETTLE_SECONDS"
SETTLE_SECONDS = 10.0  # processes told to stop a moment ago may still be on their way out

MARK_PROPERTY = "hyperplan-run-mark"  # the user property that carries a test's mark in its reports

_run_mark = ""
_started_in: dict[str, str] = {}  # test mark -> the test's node id
_tests_marked = 0


def describe(process: MarkedProcess) -> str:
    test = next((nodeid for mark, nodeid in _started_in.items() if owns(mark, process.mark)), None)
    where = f"started during {test}" if test else "started outside any test (a session fixture?)"
    return f"pid {process.pid}: {process.command[:160]} ({where}; mark {process.mark})"


def pytest_configure(config: pytest.Config) -> None:
    global _run_mark
    outer = os.environ.get(MARK_VARIABLE)
    _run_mark = f"{outer}.{uuid.uuid4().hex[:8]}" if outer else f"hptest-{uuid.uuid4().hex[:12]}"
    os.environ[MARK_VARIABLE] = _run_mark


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    # What a test (or a fixture set up for it) starts carries the test's own mark.
    global _tests_marked
    _tests_marked += 1
    mark = f"{_run_mark}.t{_tests_marked}"
    _started_in[mark] = item.nodeid
    item.user_properties.append((MARK_PROPERTY, mark))
    os.environ[MARK_VARIABLE] = mark


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # In an xdist controller, the workers' reports are how it learns which mark is which test.
    for name, value in report.user_properties:
        if name == MARK_PROPERTY:
            _started_in[str(value)] = report.nodeid


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if is_xdist_worker(session.config):
        return  # the controller checks for the whole run, once every worker has finished
    os.environ[MARK_VARIABLE] = _run_mark
    settle = float(os.environ.get(SETTLE_VARIABLE, SETTLE_SECONDS))
    leftovers = find_leftovers(_run_mark, settle=settle, spare=xdist_workers(session.config))
    if not leftovers:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(leftovers)} process(es) started by the tests outlived them:"]
    lines += [f"  {describe(leftover)}" for leftover in leftovers]
    if reporter is not None:
        reporter.write_sep("=", "processes left running", red=True)
        for line in lines:
            reporter.write_line(line)
    kill(leftovers)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def xdist_workers(config: pytest.Config) -> frozenset[int]:
    """The pids of an xdist controller's workers: its own children, which carry the run's mark and end
    after this check. Empty when this run has no workers."""
    if not config.pluginmanager.has_plugin("dsession"):
        return frozenset()
    return frozenset(pid for pid, stat in procfs.snapshot().items() if stat.ppid == os.getpid())


def find_leftovers(
    prefix: str, settle: float = 0.0, spare: frozenset[int] = frozenset()
) -> list[MarkedProcess]:
    """Live processes whose mark is `prefix` or below it (`spare` aside), waiting up to `settle` seconds
    for them to go."""
    deadline = time.monotonic() + settle
    while True:
        found = marked(prefix, spare)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)
