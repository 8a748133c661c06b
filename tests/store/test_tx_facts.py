"""A transaction's facts (store/tx_facts.py) are read once and read again after anything that could change
them: the transaction's own write to one of their tables (flushed, pending, or a bulk statement), a
savepoint rolled back, a new transaction. A write to another table keeps them. On a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import delete, select, text, update
from sqlalchemy.orm import Session

from hyperplan.store import tx_facts
from hyperplan.store.db import Database
from hyperplan.store.schema import ScheduledEvent, Setting

SETTINGS = frozenset({"settings"})


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(f"sqlite:///{tmp_path / 'store.db'}")
    database.migrate()
    with database.write() as session:
        session.add(Setting(key="fact-a", value="1"))
    yield database
    database.close()


class Reader:
    """The fact: the settings' keys that start with "fact-"; counts how often it was read."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, session: Session) -> frozenset[str]:
        self.reads += 1
        return frozenset(session.scalars(select(Setting.key).where(Setting.key.like("fact-%"))))

    def fact(self, session: Session) -> frozenset[str]:
        return tx_facts.fact(session, "keys", SETTINGS, self)


def test_a_fact_is_read_once_while_its_table_is_not_written(db: Database) -> None:
    keys = Reader()
    with db.write() as session:
        assert keys.fact(session) == {"fact-a"}
        session.add(
            ScheduledEvent(kind="note", due_at=datetime(2031, 1, 1, tzinfo=UTC), subject="x", payload="{}")
        )
        assert keys.fact(session) == {"fact-a"}
        assert keys.fact(session) == {"fact-a"}  # after another table's row was written
    assert keys.reads == 1


def test_a_pending_write_to_its_table_is_seen(db: Database) -> None:
    keys = Reader()
    with db.write() as session:
        assert keys.fact(session) == {"fact-a"}
        session.add(Setting(key="fact-b", value="2"))  # pending, not flushed
        assert keys.fact(session) == {"fact-a", "fact-b"}
        session.get(Setting, "fact-a").value = "3"  # type: ignore[union-attr]  # a change to a row
        assert keys.fact(session) == {"fact-a", "fact-b"}
        assert keys.reads == 3


@pytest.mark.parametrize(
    ("statement", "after"),
    [
        (update(Setting).where(Setting.key == "fact-a").values(key="fact-c"), {"fact-c"}),
        (delete(Setting).where(Setting.key == "fact-a"), set()),
        (text("DELETE FROM settings WHERE key = 'fact-a'"), set()),
    ],
    ids=["update", "delete", "text"],
)
def test_a_statement_that_may_write_its_table_is_seen(
    db: Database, statement: object, after: set[str]
) -> None:
    keys = Reader()
    with db.write() as session:
        assert keys.fact(session) == {"fact-a"}
        session.execute(statement)  # type: ignore[call-overload]
        assert keys.fact(session) == after
        assert keys.reads == 2


def test_a_savepoint_rolled_back_and_a_new_transaction_read_it_again(db: Database) -> None:
    keys = Reader()
    with db.write() as session:
        with session.begin_nested() as savepoint:
            session.add(Setting(key="fact-b", value="2"))
            assert keys.fact(session) == {"fact-a", "fact-b"}
            savepoint.rollback()
        assert keys.fact(session) == {"fact-a"}
    with db.write() as session:
        assert keys.fact(session) == {"fact-a"}
    assert keys.reads == 3
