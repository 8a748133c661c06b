"""`serve --workers 2` on SQLite: two API processes on one port and one that owns the background work
(server/processes.py) pass the seed's walkthroughs and the race for capacity; SIGTERM stops them all."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import cast

import pytest

from tests.harness import Server, wait_until
from tests.postgres import Stores
from tests.server import test_concurrency, test_operations, test_plans
from tests.server.test_rate_limits import SHARED_BURST, limited_account, searches

pytestmark = pytest.mark.scale

TWO = ("--workers", "2")
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


def _two_workers(server_factory: type[Server]) -> type[Server]:
    """Servers with `--workers 2`; three processes start on a loaded machine, so they get longer."""

    class TwoWorkers(server_factory):  # type: ignore[valid-type,misc]
        def start(self, timeout: float = 180) -> Server:
            if "--workers" not in self.extra_args:
                self.extra_args = (*self.extra_args, *TWO)
            return super().start(timeout)

    return cast(type[Server], TwoWorkers)


def _children(pid: int) -> set[int]:
    """The API processes the supervisor `pid` started (not the nodes' agents a walkthrough may leave)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                api = b"--role\0api" in Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if int(fields[1]) == pid and api:
                found.add(int(entry))
    return found


def test_the_seed_walkthroughs_on_two_workers(server_factory: type[Server], tmp_path: Path) -> None:
    two = _two_workers(server_factory)
    test_plans.test_seed_walkthrough_with_the_aws_cli(two, tmp_path / "cli", Stores("sqlite", None))
    server = two(data_dir=tmp_path / "boto3").start()
    assert server.process is not None
    children = _children(server.process.pid)
    assert len(children) == 2  # the two API processes
    test_plans.test_seed_walkthrough_with_boto3(server)
    assert server.stop() == 0  # SIGTERM stops every process
    assert not {pid for pid in children if Path(f"/proc/{pid}").exists()}
    # The supervisor killed alone (SIGKILL, not its group): its API processes end with it.
    server.start()
    assert server.process is not None
    children = {pid: _started(pid) for pid in _children(server.process.pid)}
    assert len(children) == 2  # the two API processes, found
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    server.process = None
    assert wait_until(lambda: not any(_alive(pid, at) for pid, at in children.items()), 60)


def _started(pid: int) -> str:
    """When the process started (clock ticks since boot): a pid is reused, this pair is not."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and fields[19] == started


def test_metrics_count_what_every_api_process_answered(server_factory: type[Server], tmp_path: Path) -> None:
    """--metrics-listen with --workers 2: the parent's listener adds up both API processes' counts
    (prometheus_client's multiprocess mode), and its fleet gauges are read once."""
    test_operations.test_metrics_after_the_boto3_walkthrough_say_what_it_did(
        _two_workers(server_factory), tmp_path
    )


def test_racing_buyers_on_two_workers(server_factory: type[Server], tmp_path: Path) -> None:
    test_concurrency.test_racing_buyers_never_overbook_and_every_success_persists(
        _two_workers(server_factory), tmp_path, Stores("sqlite", None)
    )


def test_an_account_s_rate_limit_is_one_bucket_across_the_api_processes(
    server_factory: type[Server], tmp_path: Path
) -> None:
    """services/rate_limiter.py: the bucket is in the store; a process leases tokens from it."""
    server = _two_workers(server_factory)(data_dir=tmp_path / "data", fleet=SMALL_FLEET).start()
    # One client, one kept-alive connection: every request reaches the same API process, which admits
    # the account's whole burst (not half of it).
    steady = server.sagemaker(limited_account(server, "steady"))
    assert searches(steady, SHARED_BURST + 2) == ["ok"] * SHARED_BURST + ["ThrottlingException"] * 2
    # A new connection for each request, spread by the kernel over both processes: no more than the
    # account's burst between them (at one token a lease: the bound adds nothing at this rate).
    spread = limited_account(server, "spread")
    outcomes = [searches(server.sagemaker(spread), 1)[0] for _ in range(3 * SHARED_BURST)]
    assert outcomes.count("ok") == SHARED_BURST, outcomes
    assert set(outcomes) == {"ok", "ThrottlingException"}
