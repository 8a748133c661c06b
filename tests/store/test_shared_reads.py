"""What every request pays before its handler, on a real store: the change counters read at once after any
commit by anyone (another connection, another process, through this one), a lease's write that need not
wait for the disk leaving the next writer durable, and a writer behind a process stuck with the writers'
lock refused with a retryable error instead of waiting for ever."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from hyperplan.errors import ServiceUnavailable
from hyperplan.store import changes
from hyperplan.store.db import Database
from hyperplan.store.schema import Setting
from hyperplan.store.urls import WRITERS_LOCK_SUFFIX, sqlite_url
from hyperplan.waits import WouldWait, forbid_waits
from tests.postgres import PostgresServer, Stores


def _two(stores: Stores, tmp_path: Path) -> tuple[Database, Database]:
    url = stores.empty_url(tmp_path)
    first = Database(url)
    first.migrate()
    return first, Database(url)


def test_the_counters_follow_every_commit_at_once(stores: Stores, tmp_path: Path) -> None:
    here, there = _two(stores, tmp_path)  # two processes' worth of connections on one store
    try:
        before = here.counters()
        assert here.counters() == before  # nothing committed: the same values
        there.bump(changes.KEYS)  # a key revoked through another server
        assert here.counters()[changes.KEYS] == before[changes.KEYS] + 1
        here.bump(changes.CALENDAR)  # through this one's own pool
        assert here.counters()[changes.CALENDAR] == before[changes.CALENDAR] + 1
        with there.write() as session:  # a commit that moves no counter moves none
            session.add(Setting(key="unrelated", value="x"))
        seen = here.counters()
        seen[changes.KEYS] = -1  # a copy: what a caller does with it changes nothing kept
        assert here.counters()[changes.KEYS] == before[changes.KEYS] + 1
        if stores.is_postgres:  # the server dropped every connection (a restart): read on a new one
            _drop_every_connection(there)
            there.bump(changes.KEYS)
            assert here.counters()[changes.KEYS] == before[changes.KEYS] + 2
    finally:
        here.close()
        there.close()


def test_readers_arriving_together_each_see_what_was_committed_before_they_asked(
    stores: Stores, tmp_path: Path
) -> None:
    """Threads that each commit, then read the counters at once, all at the same time: on PostgreSQL
    they share reads (store/counter_watch.py), and none may be answered by a read that began before its
    own commit (every writer here moves the same counter: each must see at least its own value)."""
    here, there = _two(stores, tmp_path)
    stale: list[tuple[int, int]] = []
    start = threading.Barrier(8)

    def commit_then_read() -> None:
        start.wait(timeout=60)
        for _ in range(25):
            with there.write(concurrent=True) as session:
                [(mine,)] = session.execute(
                    text("UPDATE change_counters SET value = value + 1 WHERE name = :n RETURNING value"),
                    {"n": changes.KEYS},
                ).all()
            seen = here.counters()[changes.KEYS]
            if seen < mine:
                stale.append((mine, seen))

    try:
        threads = [threading.Thread(target=commit_then_read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert stale == []
        assert here.counters()[changes.KEYS] == 200
    finally:
        here.close()
        there.close()


async def _counters_on_the_loop(database: Database) -> dict[str, int] | None:
    """A request's counters as a search answered on the event loop reads them (server/sagemaker.py):
    read ahead, then taken where no wait is allowed; None when that read would have waited (the request
    would go to the thread pool)."""
    async with database.counters_read_ahead():
        try:
            with forbid_waits():
                return database.counters()
        except WouldWait:
            return None


async def _until_read_ahead(database: Database) -> dict[str, int]:
    """The first requests of a process go to the thread pool while the loop's connection opens."""
    for _ in range(500):
        values = await _counters_on_the_loop(database)
        if values is not None:
            return values
        await asyncio.sleep(0.02)
    raise AssertionError("the counters were never read on the event loop")


def _bump_keys(store: Database) -> int:
    """One commit through `store` (another server) that moves the keys' counter; its new value."""
    with store.write(concurrent=True) as session:
        [(mine,)] = session.execute(
            text("UPDATE change_counters SET value = value + 1 WHERE name = :n RETURNING value"),
            {"n": changes.KEYS},
        ).all()
    return int(mine)


@pytest.mark.postgres
def test_reads_on_the_event_loop_each_see_what_was_committed_before_they_asked(
    postgres_server: PostgresServer,
) -> None:
    """Searches on the event loop read PostgreSQL's counters ahead, without waiting on the loop, and
    requests arriving together share those reads: none may be answered by a read that began before a
    commit acknowledged before it asked, whoever committed (another server here)."""
    here = Database(postgres_server.new_database())
    there = Database(here.url)
    stale: list[tuple[int, int]] = []
    refused: list[int] = []

    async def commit_then_read() -> None:
        for _ in range(20):
            mine = await asyncio.to_thread(_bump_keys, there)
            seen = await _counters_on_the_loop(here)
            if seen is None:
                refused.append(mine)
            elif seen[changes.KEYS] < mine:
                stale.append((mine, seen[changes.KEYS]))

    async def run() -> None:
        before = await _until_read_ahead(here)
        assert before[changes.KEYS] == here.counters()[changes.KEYS]
        await asyncio.gather(*(commit_then_read() for _ in range(8)))
        after = await _counters_on_the_loop(here)
        assert after is not None and after[changes.KEYS] == before[changes.KEYS] + 160

    try:
        asyncio.run(run())
        assert stale == []
        assert refused == []  # once open, the loop's reads never sent a request to the thread pool
    finally:
        here.close()
        there.close()


@pytest.mark.postgres
def test_a_request_arriving_while_a_read_is_under_way_on_the_loop_waits_for_the_next_one(
    postgres_server: PostgresServer,
) -> None:
    """A read sent before a commit was acknowledged may miss it: a request that arrives after that
    acknowledgement, while the read is still under way, must not take its answer."""
    here = Database(postgres_server.new_database())
    there = Database(here.url)

    async def run() -> list[tuple[int, int]]:
        await _until_read_ahead(here)
        stale = []
        for _ in range(20):
            first = asyncio.ensure_future(_counters_on_the_loop(here))
            await asyncio.sleep(0)  # the first request's read is sent, its answer not yet taken
            mine = _bump_keys(there)  # acknowledged while that read is under way (the loop waits meanwhile)
            second = await _counters_on_the_loop(here)
            assert second is not None and (await first) is not None
            if second[changes.KEYS] < mine:
                stale.append((mine, second[changes.KEYS]))
        return stale

    try:
        assert asyncio.run(run()) == []
    finally:
        here.close()
        there.close()


@pytest.mark.postgres
def test_a_read_on_the_event_loop_that_lost_its_connection_sends_the_request_to_the_pool(
    postgres_server: PostgresServer,
) -> None:
    """A PostgreSQL restart: the read ahead fails, the request goes to the thread pool (never answered
    from older values, never an error), whose read reopens; later requests are read on the loop again."""
    database = Database(postgres_server.new_database())
    other = Database(database.url)

    async def run() -> None:
        before = await _until_read_ahead(database)
        _drop_every_connection(other)
        with other.write() as session:
            session.execute(text("UPDATE change_counters SET value = value + 1 WHERE name = 'keys'"))
        assert await _counters_on_the_loop(database) is None
        assert database.counters()[changes.KEYS] == before[changes.KEYS] + 1  # the pool's read
        assert (await _until_read_ahead(database))[changes.KEYS] == before[changes.KEYS] + 1

    try:
        asyncio.run(run())
    finally:
        database.close()
        other.close()


def _drop_every_connection(database: Database) -> None:
    """What a PostgreSQL restart does to every connection to the store but this one."""
    with database.engine.connect() as connection:
        connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    database.engine.dispose()


@pytest.mark.postgres
def test_connections_lost_to_a_postgres_restart_cost_a_request_at_most_a_503(
    postgres_server: PostgresServer,
) -> None:
    """The pool does not ping before each transaction: the request's counters read finds the loss and
    empties the pool, a writer's first statement runs again on a new connection, and a read already
    under way is refused with a retryable ServiceUnavailable, never a 500."""
    database, other = Database(postgres_server.new_database()), None
    try:
        other = Database(database.url)
        with database.write() as session:
            session.add(Setting(key="before", value="x"))
        with database.read() as one, database.read() as two, database.read() as three:
            assert one.get(Setting, "before") and two.get(Setting, "before") and three.get(Setting, "before")
        # the pool holds three connections now, each lost at every drop below

        _drop_every_connection(other)  # a request: the counters first, then its transactions
        database.counters()
        with database.read() as session:
            assert session.get(Setting, "before") is not None

        _drop_every_connection(other)  # a writer with no read before it
        with database.write() as session:
            session.add(Setting(key="after", value="x"))

        _drop_every_connection(other)  # a grouped writer (a purchase): the writers' lock goes with its check
        checks: list[str] = []

        def check(session: Session) -> None:
            checks.append("began")
            assert session.get(Setting, "after") is not None
            checks.append("read")

        database.write_grouped(lambda session: session.add(Setting(key="grouped", value="x")), check=check)
        assert checks == ["began", "began", "read"]  # its connection found lost, it ran again on a new one
        with database.read() as session:
            assert session.get(Setting, "grouped") is not None

        _drop_every_connection(other)  # a read with no request's counters before it
        with pytest.raises(ServiceUnavailable, match="try again"), database.read() as session:
            session.get(Setting, "after")
        with database.read() as session:  # the next one is served
            assert session.get(Setting, "after") is not None
    finally:
        database.close()
        if other is not None:
            other.close()


@pytest.mark.postgres
def test_a_grouped_write_on_postgres_checks_only_once_a_serial_writer_has_committed(
    postgres_server: PostgresServer,
) -> None:
    """A grouped write (a purchase) takes the writers' lock shared with its check's first statement, in
    one round trip: a serial writer holding it exclusively (a change of the fleet's state that every
    purchase must see) makes the check wait, and the check then reads what that writer committed."""
    database = Database(postgres_server.new_database())
    database.migrate()
    serial_holds_the_lock, serial_may_commit = threading.Event(), threading.Event()
    seen: list[str | None] = []

    def serial_writer() -> None:
        with database.write() as session:
            session.add(Setting(key="drain", value="on"))
            session.flush()
            serial_holds_the_lock.set()
            serial_may_commit.wait(timeout=60)

    def check(session: Session) -> None:
        found = session.get(Setting, "drain")
        seen.append(None if found is None else found.value)

    serial = threading.Thread(target=serial_writer)
    grouped = threading.Thread(target=lambda: database.write_grouped(lambda session: None, check=check))
    try:
        serial.start()
        assert serial_holds_the_lock.wait(timeout=60)
        grouped.start()
        _until_waiting_for_a_lock(database, "pg_advisory_xact_lock_shared")
        assert seen == []
        serial_may_commit.set()
        grouped.join(timeout=60)
        assert seen == ["on"]
    finally:
        serial_may_commit.set()
        serial.join(timeout=60)
        grouped.join(timeout=60)
        database.close()


def _until_waiting_for_a_lock(database: Database, statement: str) -> None:
    """Until some connection to the store waits for a lock in a statement containing `statement`."""
    deadline = time.monotonic() + 60
    with database.engine.connect() as connection:
        while time.monotonic() < deadline:
            waiting = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND position(:statement in query) > 0"
                ),
                {"statement": statement},
            ).scalar()
            connection.rollback()
            if waiting:
                return
            time.sleep(0.05)
    raise AssertionError(f"no connection waited for a lock in {statement!r}")


def test_the_counters_follow_a_commit_by_another_process(tmp_path: Path) -> None:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    try:
        before = database.counters()[changes.SETTINGS]
        script = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute(\"UPDATE change_counters SET value = value + 5 WHERE name = 'settings'\"); c.commit()"
        )
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "hyperplan.db")], check=True)
        assert database.counters()[changes.SETTINGS] == before + 5
    finally:
        database.close()


def _synchronous(stores: Stores, database: Database, durable: bool) -> str:
    with database.write(concurrent=True, durable=durable) as session:
        if stores.is_postgres:
            return str(session.execute(text("SHOW synchronous_commit")).scalar())
        return str(session.execute(text("PRAGMA synchronous")).scalar())


def test_a_write_that_need_not_be_durable_leaves_the_next_one_durable(stores: Stores, tmp_path: Path) -> None:
    url = stores.empty_url(tmp_path)
    if stores.is_postgres:  # the tests' server commits without waiting (scripts/postgres-dev); not here
        admin = create_engine(url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            name = connection.execute(text("SELECT current_database()")).scalar()
            connection.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit TO on'))
        admin.dispose()
    database = Database(url)
    database.migrate()
    durable, relaxed = ("on", "off") if stores.is_postgres else ("2", "1")  # SQLite: FULL, NORMAL
    try:
        assert _synchronous(stores, database, durable=True) == durable
        assert _synchronous(stores, database, durable=False) == relaxed
        for _ in range(3):  # one writer at a time: the pool hands back the connection just relaxed
            assert _synchronous(stores, database, durable=True) == durable
        with database.write(durable=False) as session:  # and what it wrote is there
            session.add(Setting(key="lease", value="1"))
        with database.read() as session:
            assert session.get(Setting, "lease") is not None
    finally:
        database.close()


@pytest.fixture
def stuck_holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the SQLite writers' lock file until its stdin closes (stopped, stuck)."""
    path = str(tmp_path / "hyperplan.db") + WRITERS_LOCK_SUFFIX
    script = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        if holder.stdin is not None and not holder.stdin.closed:
            holder.stdin.close()
        holder.wait(timeout=30)


def test_a_writer_behind_a_stuck_process_is_refused_then_served_once_it_lets_go(
    tmp_path: Path, stuck_holder: subprocess.Popen[str]
) -> None:
    database = Database(sqlite_url(tmp_path))
    database.migrate()  # migrations do not queue: they run before any server writes
    database.turn_wait = 0.2
    try:
        with pytest.raises(ServiceUnavailable) as refused, database.write() as session:
            session.add(Setting(key="refused", value="x"))
        assert "writers' lock" in refused.value.message and "try again" in refused.value.message
        # The next writer comes while the process still holds the lock, and gets it when it lets go.
        database.turn_wait = 30.0
        written = threading.Event()

        def write() -> None:
            with database.write() as session:
                session.add(Setting(key="served", value="x"))
            written.set()

        writer = threading.Thread(target=write)
        writer.start()
        assert not written.wait(0.2)  # still behind the holder
        assert stuck_holder.stdin is not None
        stuck_holder.stdin.close()  # it lets go (exits)
        writer.join(timeout=30)
        assert written.is_set()
        with database.write() as session:  # and the lock is free for the next, nothing left holding it
            session.add(Setting(key="after", value="x"))
        with database.read() as session:
            assert session.get(Setting, "refused") is None  # refused: nothing half-written
            assert session.get(Setting, "served") is not None and session.get(Setting, "after") is not None
    finally:
        database.close()


def test_a_writer_behind_sqlite_s_own_lock_held_too_long_is_refused_with_service_unavailable(
    tmp_path: Path,
) -> None:
    """A process that does not queue on the lock file (the sqlite3 shell) holds SQLite's write lock:
    past SQLite's busy wait the writer gets a retryable 503, not a 500."""
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    script = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "c.execute('BEGIN IMMEDIATE'); print('held', flush=True); sys.stdin.read()"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "hyperplan.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # The pool's one connection, the one the next write takes, waits 0.2 s instead of 30.
        with database.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA busy_timeout=200")
        with pytest.raises(ServiceUnavailable, match="try again"), database.write() as session:
            session.add(Setting(key="refused", value="x"))
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
        database.close()
