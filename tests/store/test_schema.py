"""Two roads to the head meet: a new store gets the schema that schema.py declares in one step, and a
store that grew migration by migration ends with the same tables, columns, indexes and constraints, and
the same rows (those the migrations seed, such as the change counters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, select

from hyperplan.store.db import Database
from hyperplan.store.migrate import HEAD_REVISION, MIGRATIONS, VERSION_TABLE
from hyperplan.store.schema import Base
from tests.postgres import Stores

# SQLite does not enforce a VARCHAR's length, so migration 0007 widens the sealed secrets' columns on the
# other databases only; schema.py declares the wide type everywhere. Nothing else may differ.
SQLITE_ONLY_WIDTHS = {("access_keys", "secret_access_key"), ("webhooks", "secret")}


def _head() -> str:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def test_the_head_revision_the_store_knows_is_alembics() -> None:
    assert _head() == HEAD_REVISION  # a new migration names itself in store/db.py too


def _version_table(database: Database) -> tuple[Any, ...]:
    found = inspect(database.engine)
    columns = [(c["name"], str(c["type"]), c["nullable"]) for c in found.get_columns(VERSION_TABLE.name)]
    return columns, found.get_pk_constraint(VERSION_TABLE.name), found.get_indexes(VERSION_TABLE.name)


def _differences(database: Database) -> list[Any]:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert context.get_current_revision() == _head()
        return compare_metadata(context, Base.metadata)


def _widths_only(differences: list[Any], is_sqlite: bool) -> bool:
    """Every difference is one of SQLite's unenforced VARCHAR widths."""
    for difference in differences:
        changes = difference if isinstance(difference, list) else [difference]
        for change in changes:
            widened = change[0] == "modify_type" and (change[2], change[3]) in SQLITE_ONLY_WIDTHS
            if not (is_sqlite and widened):
                return False
    return True


def _rows(database: Database) -> dict[str, list[tuple[Any, ...]]]:
    tables = MetaData()
    tables.reflect(database.engine)
    with database.engine.connect() as connection:
        return {
            name: sorted(tuple(row) for row in connection.execute(select(table)))
            for name, table in tables.tables.items()
        }


def test_a_new_store_and_a_migrated_one_have_the_same_schema(stores: Stores, tmp_path: Path) -> None:
    created = Database(stores.empty_url(tmp_path / "created"))
    replayed = Database(stores.empty_url(tmp_path / "replayed"))
    try:
        created.migrate()  # empty: made at the head in one step
        replayed.migrate(_head())  # named: every migration in turn
        assert _differences(created) == []
        replayed_differences = _differences(replayed)
        assert _widths_only(replayed_differences, created.is_sqlite), replayed_differences
        tables = set(inspect(created.engine).get_table_names())
        assert tables == set(inspect(replayed.engine).get_table_names())
        assert set(Base.metadata.tables) | {"alembic_version"} == tables
        # A new store is stamped without Alembic: its version table must be the one Alembic makes.
        assert _version_table(created) == _version_table(replayed)
        assert _rows(created) == _rows(replayed)
        assert _rows(created)["change_counters"]  # seeded on both roads, not merely empty on both
        created.migrate()  # at the head already: nothing to do
    finally:
        created.close()
        replayed.close()
