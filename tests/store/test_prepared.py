"""A prepared statement (store/prepared.py) writes what SQLAlchemy's own execution would: each value
through its column's type, rows returned, in the caller's transaction, seen by statement listeners; and
it refuses at once what one SQL string cannot serve. A real SQLite file, a table of the schema's types;
and PostgreSQL, where the SQL goes to psycopg's raw cursor with PostgreSQL's own placeholders."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    create_engine,
    event,
    insert,
    literal_column,
    or_,
    select,
)
from sqlalchemy.exc import IntegrityError

from hyperplan.store.engine import make_engine
from hyperplan.store.prepared import Prepared
from hyperplan.store.types import DecimalString, UTCDateTime
from tests.postgres import Stores

METADATA = MetaData()
ROWS = Table(
    "rows",
    METADATA,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", UTCDateTime),
    Column("amount", DecimalString),
    Column("note", String(200)),
)
INSERT = Prepared(
    insert(ROWS).values(at=bindparam("at"), amount=bindparam("amount")).returning(ROWS.c.id, ROWS.c.at)
)
AT = datetime(2027, 1, 2, 11, 30, 0, 250, tzinfo=UTC)


def test_values_go_through_their_column_types_in_the_callers_transaction(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'rows.db'}")
    METADATA.create_all(engine)
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement.split()[0])

    event.listen(engine, "before_cursor_execute", note)
    with engine.connect() as connection:
        with connection.begin():
            [(first, stored_at)] = INSERT.rows(connection, {"at": AT, "amount": Decimal("12.50")})
            assert stored_at == 1798889400000250  # the driver's value: integer microseconds
        with connection.begin():
            INSERT.run_many(connection, [{"at": AT, "amount": Decimal("-1")}, {"at": None, "amount": None}])
            connection.rollback()  # nothing of a rolled-back transaction stays
        rows = connection.execute(select(ROWS.c.id, ROWS.c.at, ROWS.c.amount)).all()
    assert [tuple(row) for row in rows] == [(first, AT, Decimal("12.50"))]
    assert seen[:2] == ["INSERT", "INSERT"]  # listeners counting statements still see them
    # A parameter left out is an error before anything runs, not a NULL written.
    with engine.connect() as connection, pytest.raises(KeyError, match="amount"):
        INSERT.rows(connection, {"at": AT})


def test_an_expanding_list_is_refused_when_first_run(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'rows.db'}")
    METADATA.create_all(engine)
    listed = Prepared(select(ROWS.c.id).where(ROWS.c.id.in_(bindparam("ids", expanding=True))))
    with engine.connect() as connection, pytest.raises(ValueError, match="ids: an expanding"):
        listed.rows(connection, {"ids": [1, 2]})


def test_the_drivers_errors_are_sqlalchemys_so_a_racing_duplicate_is_not_a_500(tmp_path: Path) -> None:
    """plans.create turns sqlalchemy.exc.IntegrityError (a racing buyer took the name) into
    ResourceInUse; the driver's own sqlite3.IntegrityError would have passed it by."""
    engine = create_engine(f"sqlite:///{tmp_path / 'rows.db'}")
    METADATA.create_all(engine)
    insert_with_id = Prepared(insert(ROWS).values(id=bindparam("id"), at=bindparam("at"), amount=None))
    with engine.connect() as connection:
        with connection.begin():
            insert_with_id.rows(connection, {"id": 1, "at": AT})
        with connection.begin(), pytest.raises(IntegrityError) as raised:
            insert_with_id.rows(connection, {"id": 1, "at": AT})
        assert "UNIQUE constraint failed: rows.id" in str(raised.value)
        assert not raised.value.connection_invalidated  # the connection is still good
        assert connection.execute(select(ROWS.c.id)).scalars().all() == [1]


def test_on_both_stores_a_name_bound_in_many_places_and_a_literal_percent_read_right(
    stores: Stores, tmp_path: Path
) -> None:
    """What the purchase's read of its facts and holdings has (one name bound in several places) and what
    a hand-written statement may (a `%` in its text): on PostgreSQL the SQL is compiled with $1, $2, ...
    and sent as it is by psycopg's raw cursor, so no `%` may be doubled nor read as a placeholder."""
    engine = make_engine(stores.url() or f"sqlite:///{tmp_path / 'rows.db'}")
    try:
        METADATA.create_all(engine)
        with engine.begin() as connection:
            for note in ("50% off", "5 off", "full price"):
                INSERT.rows(connection, {"at": AT, "amount": Decimal("1")})
                connection.execute(ROWS.update().where(ROWS.c.note.is_(None)).values(note=note))
        # The note written with a percent in the statement's text, or the one named, in twenty places.
        named = or_(*(ROWS.c.note == bindparam("wanted") for _ in range(20)))
        wanted = Prepared(
            select(ROWS.c.note)
            .where(or_(ROWS.c.note == literal_column("'50% off'"), named))
            .order_by(ROWS.c.note)
        )
        seen: list[str] = []
        event.listen(engine, "before_cursor_execute", lambda _c, _k, sql, *_a: seen.append(sql))
        with engine.connect() as connection:
            assert wanted.rows(connection, {"wanted": "full price"}) == [("50% off",), ("full price",)]
            assert wanted.rows(connection, {"wanted": "5 off"}) == [("5 off",), ("50% off",)]
        if stores.is_postgres:
            assert "$1" in seen[0] and "$2" not in seen[0] and "%(" not in seen[0], seen[0]
    finally:
        METADATA.drop_all(engine)
        engine.dispose()
        stores.drop_all()
