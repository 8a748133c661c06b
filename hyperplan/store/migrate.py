"""The schema brought up to date at open: a new store made at the head in one step, an older one
upgraded by Alembic.

Alembic is imported only when a store needs a migration: a store already at the head is left as it is,
so most starts never load it."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import OperationalError

from hyperplan.errors import StartRefused
from hyperplan.store.urls import redact

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD_REVISION = "0033"
"""The newest migration's revision: a store stamped with it is at the head (tests/store/test_schema.py
checks that it is Alembic's head, so a new migration cannot be forgotten here)."""

VERSION_TABLE = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)
"""Alembic's own version table, as Alembic makes it (test_schema.py compares the two roads' tables)."""

MIGRATION_LOCK = {"c": 72_080, "o": 1}
"""PostgreSQL's advisory lock (class, object) servers starting at once take to migrate one after another
(the class is the writers' lock's, store/db.py; the object differs)."""


def migrate(engine: Engine, url: str, revision: str = "head") -> None:
    """Bring the schema to `revision` (tests build a store as an earlier version left it)."""
    _check_reachable(engine, url)
    with engine.begin() as connection:
        if url.startswith("sqlite"):
            connection.exec_driver_sql("BEGIN IMMEDIATE")  # DDL and data move together or not at all
        elif url.startswith("postgresql"):
            # PostgreSQL's DDL is transactional too; servers starting at once migrate one after another.
            connection.execute(text("SELECT pg_advisory_xact_lock(:c, :o)"), MIGRATION_LOCK)
        if revision != "head":
            _upgrade(connection, revision)
            return
        tables = inspect(connection).get_table_names()
        if not tables:
            _create_at_head(connection)
        elif not _at_head(connection, tables):  # at the head already: nothing for Alembic to do
            _upgrade(connection, revision)


def _check_reachable(engine: Engine, url: str) -> None:
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        said = str(exc.orig or exc).strip().splitlines()[0]
        raise StartRefused(f"cannot open the store at {redact(url)}: {said}") from None


def _create_at_head(connection: Connection) -> None:
    """A new, empty store: the schema as schema.py declares it, in one step, then stamped with the head
    revision (Alembic's recipe for new databases, without loading Alembic). Replaying every migration on
    an empty store gives the same tables (tests/store/test_schema.py compares the two) at several times
    the cost, paid by every server's first start."""
    from hyperplan.store import changes
    from hyperplan.store.schema import Base  # the tables, only where they are made

    Base.metadata.create_all(connection)
    # The rows migrations seed, as they seed them: one change counter each, at zero (migration 0017).
    connection.execute(
        text("INSERT INTO change_counters (name, value) VALUES (:name, 0)"),
        [{"name": name} for name in changes.ALL],
    )
    VERSION_TABLE.create(connection)
    connection.execute(VERSION_TABLE.insert().values(version_num=HEAD_REVISION))


def _at_head(connection: Connection, tables: list[str]) -> bool:
    """The store is stamped with the head revision, and with nothing else."""
    if VERSION_TABLE.name not in tables:
        return False
    return list(connection.scalars(select(VERSION_TABLE.c.version_num))) == [HEAD_REVISION]


def _upgrade(connection: Connection, revision: str) -> None:
    """Alembic's upgrade to `revision`, on this connection (migrations/env.py takes it from here)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, revision)
