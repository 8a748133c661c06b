"""Real servers for the benchmarks: a data directory filled in-process before start, then
``python -m hyperplan serve`` as a child process with the manual clock, and what the kernel says about it.

The store is filled through ``hyperplan.services.plans.plans.create`` (one durable transaction per plan, as a
purchase over the wire would commit) with offering ids made for the random bookings of
:mod:`bench.fill`; the server loads its calendar from the store when it starts.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.fill import Booking, FillSpec, booked_fraction, fill, window_start
from bench.loadgen import Endpoint
from bench.report import line
from bench.scale import Scale
from hyperplan.app import AppConfig, Application
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet
from hyperplan.core.offering_ids import OfferingClaim, OfferingSegment, encode
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller, NewKey
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.master_key import KEY_FILE_NAME

FLEET = Path(__file__).with_name("fleet.toml")
HOST = "127.0.0.1"


@dataclass
class Store:
    """A filled data directory, and the runtime that filled it (closed before a server starts)."""

    data_dir: Path
    application: Application
    keys: list[NewKey]  # one account per load-generator client
    plans: int
    booked: float  # fraction of reservable instance-slots over the 120-day window
    fill_seconds: float

    @property
    def runtime(self) -> ServiceContext:
        return self.application.context

    @property
    def fleet(self) -> Fleet:
        return self.runtime.fleet

    @property
    def now(self) -> datetime:
        return self.runtime.clock.now()

    def caller(self, index: int) -> Caller:
        key = self.keys[index]
        return Caller(key.account_id, key.account_name, False, key.access_key_id)

    def close(self) -> None:
        self.application.stop()


# The same service time whenever the bench runs, so that its calendar and its figures can be compared.
BENCH_START = datetime(2026, 12, 31, 23, 50, tzinfo=UTC)


def open_application(data_dir: Path, fleet_path: Path, database_url: str | None) -> Application:
    """The service over `data_dir` (or the database at `database_url`) on `fleet_path`, bootstrapped with
    the manual clock at BENCH_START and no worker running: what the benchmarks fill their stores with."""
    config = AppConfig(
        data_dir=data_dir,
        fleet_path=fleet_path,
        clock="manual",
        clock_start=BENCH_START,
        database_url=database_url,
        **unisolated(data_dir),
    )
    application = Application(config)
    application.bootstrap()
    return application


def prepare_store(data_dir: Path, spec: FillSpec, clients: int, database_url: str | None = None) -> Store:
    """A data directory with the bench fleet, ``clients`` accounts, and plans booked per ``spec`` (in
    the data directory's SQLite, or the database at ``database_url``)."""
    application = open_application(data_dir, FLEET, database_url)
    runtime = application.context
    now = runtime.clock.now()
    with runtime.db.write() as session:
        box = runtime.secret_box
        filler = accounts.create_account(session, "bench-fill", box=box, now=now)
        keys = [
            accounts.create_account(session, f"bench-client-{i}", box=box, now=now) for i in range(clients)
        ]
    calendar = CapacityCalendar(runtime.fleet.pools)
    began = time.perf_counter()
    bookings = fill(runtime.fleet, calendar, now, spec)
    caller = Caller(filler.account_id, filler.account_name, False, filler.access_key_id)
    for number, booking in enumerate(bookings):
        plans.create(runtime, caller, f"fill-{number}", offering_for(runtime, caller, booking, number))
    fraction = booked_fraction(runtime.fleet, calendar, window_start(runtime.fleet, now))
    return Store(data_dir, application, keys, len(bookings), fraction, time.perf_counter() - began)


def offering_for(runtime: ServiceContext, caller: Caller, booking: Booking, number: int) -> str:
    """A signed offering for one booking; the expiry differs per plan so that equal bookings get
    distinct ids (an offering is bought once)."""
    claim = OfferingClaim(
        account_id=caller.account_id,
        expires_at=runtime.clock.now() + timedelta(days=1, seconds=number),
        target="training-job",
        count=booking.count,
        segments=(OfferingSegment(booking.pool_index, booking.start, booking.end),),
    )
    return encode(claim, key=runtime.offering_key, fleet=runtime.fleet)


def snapshot(store: Store, name: str) -> Path:
    """A new data directory holding a copy of the store's database as it is now (SQLite's online
    backup: consistent even while the store's runtime has the database open), and of the master key
    file that opens its secrets."""
    target = store.data_dir.with_name(f"{store.data_dir.name}-{name}")
    target.mkdir()
    source = sqlite3.connect(store.runtime.db.url.removeprefix("sqlite:///"))
    copy = sqlite3.connect(target / "hyperplan.db")
    try:
        source.backup(copy)
    finally:
        copy.close()
        source.close()
    shutil.copy2(store.runtime.secret_box.path, target / KEY_FILE_NAME)
    return target


# -- the server process ------------------------------------------------------------------------------


@dataclass
class ServerProcess:
    data_dir: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def pid(self) -> int:
        return self.process.pid

    def endpoint(self, key: NewKey, region: str) -> Endpoint:
        return Endpoint(HOST, self.port, region, key.access_key_id, key.secret_access_key)

    def log(self) -> str:
        path = self.data_dir / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def unisolated(data_dir: Path) -> dict[str, Any]:
    """A bench's application: mode none, the work directory beside the data directory."""
    return {"isolation": "none", "work_dir": data_dir.with_name(data_dir.name + "-work")}


@contextmanager
def running_server(
    data_dir: Path,
    timeout: float = 120,
    *,
    fleet: Path | None = FLEET,
    clock: str = "manual",
    extra: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """``python -m hyperplan serve`` on the data directory, stopped with SIGTERM when the block ends;
    `fleet` None: the embedded demo fleet; `extra`: more of serve's options (--workers 2,
    --database-url ...); `env`: the server's environment (default: this process's)."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "hyperplan",
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *(["--fleet", str(fleet)] if fleet is not None else []),
        "--clock",
        clock,
        "--log-level",
        "warning",
        # A measurement, not a deployment: no OS users made, the work directory beside the data.
        "--isolation",
        "none",
        "--work-dir",
        str(data_dir.with_name(data_dir.name + "-work")),
        *extra,
    ]
    data_dir.mkdir(parents=True, exist_ok=True)
    with (data_dir / "server.log").open("ab") as log:
        process = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    server = ServerProcess(data_dir, port, process)
    try:
        _wait_ready(server, timeout)
        yield server
    finally:
        _stop(process)


def _wait_ready(server: ServerProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log()}")
        if _healthy(server.port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server not ready after {timeout}s:\n{server.log()}")


def _healthy(port: int) -> bool:
    connection = http.client.HTTPConnection(HOST, port, timeout=2)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


# -- what the kernel says about a process ------------------------------------------------------------


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (resident at its peak) of a process, in KiB."""
    found: dict[str, int] = {}
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = row.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of a process and of its live children (serve --workers: the API processes)."""
    total = cpu_seconds(pid)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def dev_postgres(workdir: Path) -> tuple[str | None, Callable[[], None]]:
    """A development PostgreSQL cluster (scripts/postgres-dev) under a new directory of /tmp: its URL and
    how to stop it; (None, a no-op) when none can be started here (not root and no PostgreSQL), saying
    why if it failed."""
    if os.geteuid() != 0:
        from hyperplan.store.postgres_dev import bin_dir

        if bin_dir() is None:
            return None, lambda: None
    root = Path(tempfile.mkdtemp(prefix="hp-bench-pg-", dir="/tmp"))
    root.chmod(0o711)
    script = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "postgres-dev")]
    made = subprocess.run([*script, "up", str(root / "pg")], capture_output=True, text=True, timeout=900)
    if made.returncode != 0:
        line(f"PostgreSQL: postgres-dev up failed: {made.stderr.strip()[-300:]}")
        return None, lambda: None

    def stop() -> None:
        stopped = subprocess.run([*script, "down", str(root / "pg")], capture_output=True, timeout=120)
        if stopped.returncode == 0:  # the cluster's files: 70 MB left in /tmp otherwise
            shutil.rmtree(root, ignore_errors=True)

    return made.stdout.strip(), stop


def section_postgres(workdir: Path, scale: Scale) -> tuple[str, Callable[[], None]] | None:
    """The PostgreSQL cluster of a section that measures both stores, or None with the line saying why
    there is none: a smoke run leaves it out, and a machine may not be able to start one."""
    if scale is Scale.SMOKE:
        line("PostgreSQL: left out of a smoke run (it starts a PostgreSQL server); `make bench` runs it")
        return None
    url, stop = dev_postgres(workdir)
    if url is None:
        line("PostgreSQL: none could be started here (needs root or PostgreSQL installed); skipped")
        return None
    return url, stop
