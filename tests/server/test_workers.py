"""`serve --workers 2` on SQLite: two API processes on one port and one that owns the background work
(server/processes.py) pass the seed's walkthroughs and the race for capacity; SIGTERM stops them all."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import pytest

from hyperplan.signing import sign_request
from tests.harness import ADMIN, REGION, Server, free_port, wait_until
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
    """services/runtime/rate_limiter.py: the bucket is in the store; a process leases tokens from it."""
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


SCALE = 600  # service seconds per real second


def test_every_api_process_reads_one_accelerated_clock(server_factory: type[Server], tmp_path: Path) -> None:
    """The anchor (a real instant, the service instant it stands for, the scale) is in the store: each
    API process reads the same service time, one started again later too, and a move asked of one is
    read by all (clock.py, app.py, events/loop.py)."""
    server = _two_workers(server_factory)(
        data_dir=tmp_path / "data",
        fleet=SMALL_FLEET,
        clock="accelerated",
        extra_args=("--time-scale", str(SCALE)),
    ).start()
    assert server.process is not None
    supervisor = server.process.pid
    first = _children(supervisor)
    os.kill(min(first), signal.SIGKILL)  # the supervisor starts another a second later, on its own
    assert wait_until(lambda: len(_children(supervisor)) == 2 and _children(supervisor) != first, 60)
    # A connection is served by the one process that accepted it: open a few at once until each API
    # process holds one (an idle connection is closed by the server after seconds: no waiting between).
    try:
        bounds = _over_each_process(server.port, supervisor)
        # Each reading says where the clock's anchor is, within the request's time; one anchor fits all.
        latest_low, earliest_high = max(low for low, _ in bounds), min(high for _, high in bounds)
        assert latest_low <= earliest_high + 1.0, bounds  # a service second for the answer's rounding
        # Thirty days ahead, asked of one API process (the leader carries it out): every process reads it.
        asker = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        moved, sent, answered = _signed(
            asker, server.port, "POST", "/api/v1/clock/advance", {"Duration": "30d"}
        )
        asker.close()
        target = datetime.fromisoformat(moved["Now"])
        assert target.timestamp() >= latest_low + sent * SCALE + 30 * 86400 - 1.0  # thirty days on
        after = _over_each_process(server.port, supervisor)
        # The clock reads the target when the leader moves it there: the real time the move took to get
        # there (at most the request's) is the most the anchor can be short of thirty days.
        carried = (answered - sent) * SCALE
        assert min(high for _, high in after) >= latest_low + 30 * 86400 - carried - 1.0, after
        assert min(high for _, high in after) > earliest_high + 29 * 86400  # and not before the move
        assert max(low for low, _ in after) <= min(high for _, high in after) + 1.0, after  # one anchor
    finally:
        server.stop()


def _over_each_process(port: int, supervisor: int) -> list[tuple[float, float]]:
    """The clock's anchor bounds (`_anchor_bounds`) read over new connections until each API process
    has answered at least once (a connection is served by the one process that accepted it)."""
    deadline = time.monotonic() + 180  # an API process started again serves once it has loaded
    while time.monotonic() < deadline:
        processes = _children(supervisor)
        pinned, bounds = _one_connection_each(port, processes)
        for connection in pinned.values():
            connection.close()
        if set(pinned) == processes:
            return bounds
        time.sleep(0.2)
    raise AssertionError(f"the connections all went to {set(pinned)}, not to each of {processes}")


def _one_connection_each(
    port: int, processes: set[int]
) -> tuple[dict[int, http.client.HTTPConnection], list[tuple[float, float]]]:
    """Six connections, the clock read over each: one connection per process that served one, and
    every reading's bounds (`_anchor_bounds`)."""
    pinned: dict[int, http.client.HTTPConnection] = {}
    bounds = []
    for _ in range(6):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        bounds.append(_anchor_bounds(connection, port))
        owner = _served_by(connection, port, processes)
        if owner in pinned:
            connection.close()
        else:
            pinned[owner] = connection
    return pinned, bounds


def _signed(
    connection: http.client.HTTPConnection, port: int, method: str, path: str, body: Any = None
) -> tuple[dict[str, Any], float, float]:
    """A signed native request over `connection`: the answer, and the real instants it was sent and
    answered at."""
    data = b"" if body is None else json.dumps(body).encode()
    headers = sign_request(
        method,
        f"http://127.0.0.1:{port}{path}",
        headers={"Content-Type": "application/json"} if data else {},
        body=data,
        access_key=ADMIN.access_key,
        secret_key=ADMIN.secret_key,
        region=REGION,
    )
    sent = time.time()
    connection.request(method, path, body=data or None, headers=headers)
    response = connection.getresponse()
    answer = json.loads(response.read())
    answered = time.time()
    assert response.status == 200, answer
    assert answer["Kind"] == "accelerated" and answer["TimeScale"] == SCALE
    return answer, sent, answered


def _anchor_bounds(connection: http.client.HTTPConnection, port: int) -> tuple[float, float]:
    """The service time (seconds since the epoch) the clock read at real time 0, at the scale: a range,
    because the reading was taken at some real instant while the request was in flight."""
    answer, sent, answered = _signed(connection, port, "GET", "/api/v1/clock")
    now = datetime.fromisoformat(answer["Now"]).timestamp()
    return now - answered * SCALE, now - sent * SCALE


def _served_by(connection: http.client.HTTPConnection, port: int, processes: set[int]) -> int:
    """Which of `processes` holds the server's end of `connection` (its socket among the process's
    descriptors: the kernel's tables say which socket it is)."""
    assert connection.sock is not None
    client_port = connection.sock.getsockname()[1]
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local == port and remote == client_port:
                inode = fields[9]
    assert inode is not None
    for pid in processes:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no API process holds the connection from port {client_port}")


def test_shared_metrics_files_of_a_killed_server_are_removed_at_the_next_start(
    server_factory: type[Server], tmp_path: Path
) -> None:
    """The multiprocess metrics directory lives in the data directory (metrics/<pid>): SIGKILL leaves
    it there, not in /tmp, and the next start removes it; SIGTERM removes its own."""
    data_dir = tmp_path / "data"
    metrics = data_dir / "metrics"
    listen = ("--metrics-listen", f"127.0.0.1:{free_port()}")
    server = _two_workers(server_factory)(data_dir=data_dir, fleet=SMALL_FLEET, extra_args=listen).start()
    server.sagemaker().list_training_plans()
    assert server.process is not None
    killed = str(server.process.pid)
    assert [d.name for d in metrics.iterdir()] == [killed]
    server.kill()
    assert (metrics / killed).is_dir()  # a crash cannot tidy up
    server.port = free_port()
    server.extra_args = (*TWO, "--metrics-listen", f"127.0.0.1:{free_port()}")
    server.start()
    assert server.process is not None
    restarted = str(server.process.pid)
    assert [d.name for d in metrics.iterdir()] == [restarted]
    assert server.stop() == 0
    assert list(metrics.iterdir()) == []
