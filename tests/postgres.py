"""Both stores in the suite: a test that takes `stores` runs once on SQLite and once on PostgreSQL.

The PostgreSQL parameter carries the `postgres` mark (the suite's `postgres` part, tests/parts.py). One
real server per test process (each xdist worker has its own), started by `scripts/postgres-dev up` at the
first test that needs it, in a directory the `postgres` OS user can reach, and stopped at the end of the
run, even a failed one. Each store a test asks for is a new database, copied from a template that the
migrations brought to the head once per run (CREATE DATABASE ... TEMPLATE: a few tens of milliseconds).
Where no server can be had (not root and PostgreSQL not installed), the PostgreSQL tests skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from hyperplan.store.db import Database
from hyperplan.store.postgres_dev import bin_dir

SCRIPT = Path(__file__).parents[1] / "scripts" / "postgres-dev"
TEMPLATE = "hp_template"


class PostgresServer:
    """The run's server: fresh databases on demand, each dropped at the end."""

    def __init__(self, url: str) -> None:
        self.url = url  # .../hyperplan
        self._admin: Engine = create_engine(_with_database(url, "postgres"), isolation_level="AUTOCOMMIT")
        self._made: list[str] = []
        self._template_ready = False

    def new_database(self) -> str:
        """A new, empty database already migrated to the head; its URL."""
        if not self._template_ready:
            self._execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
            self._execute(f"CREATE DATABASE {TEMPLATE}")
            template = Database(_with_database(self.url, TEMPLATE))
            try:
                template.migrate()
            finally:
                template.close()
            self._template_ready = True
        name = f"hp_{uuid.uuid4().hex[:12]}"
        self._execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        self._made.append(name)
        return _with_database(self.url, name)

    def new_empty_database(self) -> str:
        """A new database with no table at all (for tests of the migrations themselves)."""
        name = f"hp_{uuid.uuid4().hex[:12]}"
        self._execute(f"CREATE DATABASE {name}")
        self._made.append(name)
        return _with_database(self.url, name)

    def drop(self, url: str) -> None:
        name = url.rpartition("/")[2]
        self._execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if name in self._made:
            self._made.remove(name)

    def _execute(self, statement: str) -> None:
        with self._admin.connect() as connection:
            connection.execute(text(statement))

    def close(self) -> None:
        for name in list(self._made):
            self.drop(name)
        self._admin.dispose()


class Stores:
    """Fresh stores of one kind: `url(data_dir)` is what a server's --database-url gets (None: SQLite
    in the data directory, the default)."""

    def __init__(self, kind: str, server: PostgresServer | None) -> None:
        self.kind = kind
        self._server = server
        self._urls: list[str] = []

    @property
    def is_postgres(self) -> bool:
        return self._server is not None

    def url(self) -> str | None:
        if self._server is None:
            return None
        made = self._server.new_database()
        self._urls.append(made)
        return made

    def empty_url(self, data_dir: Path) -> str:
        """A store with no table yet: a new SQLite file in `data_dir`, or a new PostgreSQL database."""
        if self._server is None:
            data_dir.mkdir(parents=True, exist_ok=True)
            return f"sqlite:///{data_dir / 'hyperplan.db'}"
        made = self._server.new_empty_database()
        self._urls.append(made)
        return made

    def drop_all(self) -> None:
        if self._server is not None:
            for made in self._urls:
                self._server.drop(made)
        self._urls.clear()


def _with_database(url: str, name: str) -> str:
    return f"{url.rpartition('/')[0]}/{name}"


def _why_no_server() -> str | None:
    if os.geteuid() != 0 and bin_dir() is None:
        return "needs PostgreSQL installed, or root to install it (scripts/postgres-dev up)"
    return None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The run's PostgreSQL server (one per test process), stopped at the end of the run."""
    reason = _why_no_server()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="hp-postgres-", dir="/tmp"))
    root.chmod(0o711)  # the postgres user passes through to its directory
    directory = root / "pg"
    server: PostgresServer | None = None
    try:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "up", str(directory)],
            capture_output=True,
            text=True,
            timeout=900,  # a first `up` on a fresh machine installs PostgreSQL
        )
        assert result.returncode == 0, f"postgres-dev up failed:\n{result.stderr}"
        server = PostgresServer(result.stdout.strip())
        yield server
    finally:
        if server is not None:
            server.close()
        subprocess.run(
            [sys.executable, str(SCRIPT), "down", str(directory)], capture_output=True, timeout=120
        )
        shutil.rmtree(root, ignore_errors=True)


EVERYWHERE_VARIABLE = "HYPERPLAN_TEST_STORE"
_everywhere: list[PostgresServer] = []


def default_database_url() -> str | None:
    """With HYPERPLAN_TEST_STORE=postgres, a new database for each server a test starts without naming a
    store (tests/harness.py); otherwise None, SQLite in the data directory. A look for what only the
    PostgreSQL store does: `HYPERPLAN_TEST_STORE=postgres pytest tests/server` (a test that starts a
    second server object on one data directory gets a second store there, and fails for it)."""
    return _everywhere[0].new_database() if _everywhere else None


@pytest.fixture(scope="session", autouse=os.environ.get(EVERYWHERE_VARIABLE) == "postgres")
def _every_server_on_postgres(request: pytest.FixtureRequest) -> Iterator[None]:
    _everywhere.append(request.getfixturevalue("postgres_server"))
    yield
    _everywhere.clear()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    """Run the test on each store: SQLite, then PostgreSQL."""
    server = request.getfixturevalue("postgres_server") if request.param == "postgres" else None
    made = Stores(request.param, server)
    yield made
    made.drop_all()
