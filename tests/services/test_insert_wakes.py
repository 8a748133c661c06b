"""A commit that inserts rows of a watched table notifies its loop once; a rollback or a read does not
(SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperplan.clock import utcnow
from hyperplan.store.db import Database
from hyperplan.store.schema import ScheduledEvent, Setting
from tests.postgres import Stores


@pytest.fixture
def db(tmp_path: Path, stores: Stores) -> Database:
    database = Database(stores.empty_url(tmp_path))
    database.migrate()
    return database


def _event() -> ScheduledEvent:
    return ScheduledEvent(kind="test", due_at=utcnow(), subject="", payload=json.dumps({}))


def test_a_commit_that_inserts_watched_rows_calls_back_once(db: Database) -> None:
    calls: list[str] = []
    db.on_insert(ScheduledEvent, lambda: calls.append("lifecycle"))
    with db.write() as session:
        session.add(_event())
        session.flush()
        session.add(_event())  # two inserts, two flushes: one call
        assert calls == []  # not before the commit
    assert calls == ["lifecycle"]
    db.close()


def test_no_call_after_a_rollback_or_for_other_tables(db: Database) -> None:
    calls: list[str] = []
    db.on_insert(ScheduledEvent, lambda: calls.append("lifecycle"))
    with pytest.raises(RuntimeError), db.write() as session:
        session.add(_event())
        session.flush()
        raise RuntimeError("refused")
    with db.write() as session:
        session.add(Setting(key="k", value="v"))
    assert calls == []
    db.close()
