"""PostgreSQL as the store: the dev server script, serve's --database-url, and the store's types and
locks on both databases."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, select

from hyperplan.store.db import Database
from hyperplan.store.postgres_dev import bin_dir
from hyperplan.store.schema import Setting
from hyperplan.store.types import DecimalString, UTCDateTime
from tests.harness import BIN, Server, healthy
from tests.postgres import SCRIPT, PostgresServer, Stores


def postgres_dev(command: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), command, str(directory)], capture_output=True, text=True, timeout=900
    )


def _postmaster_pid(directory: Path) -> int:
    return int((directory / "data" / "postmaster.pid").read_text().splitlines()[0])


@pytest.mark.postgres
@pytest.mark.skipif(
    os.geteuid() != 0 and bin_dir() is None,
    reason="needs PostgreSQL installed, or root to install it (scripts/postgres-dev up)",
)
def test_postgres_dev_up_is_idempotent_down_is_quiet_and_an_unreachable_dir_is_refused() -> None:
    root = Path(tempfile.mkdtemp(prefix="hp-pgdev-", dir="/tmp"))
    root.chmod(0o711)
    directory = root / "pg"
    try:
        assert postgres_dev("status", directory).returncode == 3
        first = postgres_dev("up", directory)
        assert first.returncode == 0, first.stderr
        url = first.stdout.strip()
        assert first.stdout == url + "\n" and url.startswith("postgresql+psycopg://")
        assert "@127.0.0.1:" in url and url.endswith("/hyperplan")
        assert (directory / "url").read_text() == url + "\n"
        assert postgres_dev("status", directory).returncode == 0
        pid = _postmaster_pid(directory)
        again = postgres_dev("up", directory)
        assert (again.returncode, again.stdout) == (0, first.stdout)
        assert _postmaster_pid(directory) == pid  # the same server, untouched
        database = Database(url)
        with database.read() as session:
            assert session.execute(select(1)).scalar() == 1
        database.close()
        assert postgres_dev("down", directory).returncode == 0
        assert postgres_dev("status", directory).returncode == 3
        assert postgres_dev("down", directory).returncode == 0  # nothing runs: still exit 0
    finally:
        postgres_dev("down", directory)
        shutil.rmtree(root, ignore_errors=True)
    if os.geteuid() == 0:
        private = Path(tempfile.mkdtemp(prefix="hp-pgdev-"))  # 0700, as pytest's own directories
        try:
            refused = postgres_dev("up", private / "pg")
            assert refused.returncode == 1
            assert "not reachable by the 'postgres' user" in refused.stderr and str(private) in refused.stderr
            assert not (private / "pg").exists()
        finally:
            shutil.rmtree(private, ignore_errors=True)


def test_exact_values_round_trip_on_both_stores(stores: Stores, tmp_path: Path) -> None:
    """Money as exact decimal text and instants as UTC microseconds, unchanged by either database."""
    database = Database(stores.empty_url(tmp_path))
    database.migrate()
    table = Table(
        "round_trip",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("amount", DecimalString()),
        Column("at", UTCDateTime()),
    )
    amounts = [Decimal("0.1"), Decimal("12345678901234567890.123456789"), Decimal("-0.005")]
    instants = [datetime(1970, 1, 1, tzinfo=UTC), datetime(2038, 1, 19, 3, 14, 8, 1, tzinfo=UTC)]
    try:
        table.create(database.engine)
        with database.engine.begin() as connection:
            for n, (amount, at) in enumerate(zip(amounts, instants * 2, strict=False)):
                connection.execute(table.insert().values(id=n, amount=amount, at=at))
        with database.engine.connect() as connection:
            rows = connection.execute(select(table.c.amount, table.c.at).order_by(table.c.id)).all()
        assert [r.amount for r in rows] == amounts
        assert [r.at for r in rows] == (instants * 2)[: len(amounts)]
        with database.write() as session:
            session.add(Setting(key="k", value="v"))
        with database.read() as session:
            assert session.get(Setting, "k") is not None
        database.migrate()  # at the head already: nothing to do, nothing broken
    finally:
        database.close()


@pytest.mark.postgres
def test_serve_takes_its_store_from_the_flag_over_the_environment(
    server_factory: type[Server], tmp_path: Path, postgres_server: PostgresServer
) -> None:
    """--database-url wins over HYPERPLAN_DATABASE_URL (each is `serve`'s, as typer reads it); DATA_DIR
    keeps the key file and the credentials, and no database file."""
    data_dir = tmp_path / "data"
    url = postgres_server.new_database()
    os.environ["HYPERPLAN_DATABASE_URL"] = "mysql://nobody@127.0.0.1/none"  # the flag must win
    try:
        server = server_factory(data_dir=data_dir, database_url=url).start()
    finally:
        del os.environ["HYPERPLAN_DATABASE_URL"]
    assert healthy(server.port)
    assert server.native().get("/api/v1/whoami")["AccountName"]
    assert (data_dir / "master.key").is_file() and (data_dir / "credentials").is_file()
    assert not (data_dir / "hyperplan.db").exists()
    server.stop()


def test_serve_refuses_a_store_it_cannot_use_naming_it_without_its_password(tmp_path: Path) -> None:
    refused = subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--data-dir", str(tmp_path / "other"), "--isolation", "none",
         "--work-dir", str(tmp_path / "other-work")],
        env={**os.environ, "HYPERPLAN_DATABASE_URL": "mysql://nobody@127.0.0.1/none"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "'mysql' is not a store hyperplan knows" in " ".join(refused.stderr.split())
    unreachable = subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--data-dir", str(tmp_path / "other"), "--isolation", "none",
         "--work-dir", str(tmp_path / "other-work"), "--database-url",
         "postgresql://hp:secret@127.0.0.1:1/none"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert unreachable.returncode == 2
    said = " ".join(unreachable.stderr.split())
    assert "StartRefused" in said and "hp:***@127.0.0.1:1/none" in said
    assert "secret" not in unreachable.stdout + unreachable.stderr
