"""A pytest plugin: every test belongs to one part of the suite, and the run ends by saying how long
each part took, so each stays within its budget (README, "Tests").

A test joins a part by its mark (`pytestmark = pytest.mark.sdk` in a module); a test without one is
`core`. `pytest -m sdk` runs one part; `pytest -m core` the core alone.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

PARTS = {
    "core": "the core suite: every test without another part's mark",
    "sdk": "the SageMaker Python SDK and S3-compatible storage (moto's server)",
    "isolation": "tenant isolation: OS users, permissions (needs root)",
    "slurm": "a real Slurm cluster on this host (needs root)",
    "containers": "a dev registry, images built offline and pushed, pulled and run with Podman (needs root)",
    "postgres": "a real PostgreSQL server",
    "browser": "the console in a real headless browser",
    "aws": "the rest of the AWS toolchain on the endpoint: S3, CloudWatch Logs, STS (aws CLI and boto3)",
    "scale": "several processes on one store: serve --workers N on SQLite",
    "bench": "every section of `make bench` at smoke size (figures printed, never asserted)",
}

_seconds: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)
_part_of: dict[str, str] = {}


def pytest_configure(config: pytest.Config) -> None:
    for name, meaning in PARTS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        marked = [name for name in PARTS if name != "core" and item.get_closest_marker(name)]
        if len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid} is in several parts: {', '.join(marked)}")
        part = marked[0] if marked else "core"
        if not marked:
            item.add_marker(pytest.mark.core)
        _part_of[item.nodeid] = part


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # An xdist controller collects nothing: it reads the part from the marks a worker's report carries.
    # (A package named like a part, tests/core, is a keyword too: any other part's mark wins over it.)
    part = _part_of.get(report.nodeid) or next(
        (p for p in PARTS if p != "core" and p in report.keywords), "core"
    )
    _seconds[part] += report.duration  # setup, call and teardown alike
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _counts[part] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    workers = getattr(terminalreporter.config.option, "numprocesses", None)
    summed = f" (test time summed over {workers} workers)" if workers else ""
    terminalreporter.write_sep("=", f"time per part{summed}")
    for part in PARTS:
        if part in _seconds:
            minutes, seconds = divmod(round(_seconds[part]), 60)
            terminalreporter.write_line(f"{part:>10}: {_counts[part]:4d} tests, {minutes}m{seconds:02d}s")
