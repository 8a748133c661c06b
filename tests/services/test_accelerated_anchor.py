"""The accelerated clock's anchor (hyperplan/clock.py, app.py): stored once, taken by every process that
starts while another is alive, and read back by the store's settings as it was written."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.clock import AcceleratedClock, Anchor
from hyperplan.store import settings
from hyperplan.store.db import Database
from hyperplan.store.urls import sqlite_url

START = datetime(2027, 3, 1, tzinfo=UTC)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    yield database
    database.close()


def test_two_clocks_on_one_anchor_read_the_same_time() -> None:
    first = AcceleratedClock(START, 600, real=time.time() - 100_000)  # anchored a day and more ago
    late = AcceleratedClock(START, 50)  # another process's own idea: anchored now, at its own scale
    late.follow(first.anchor)
    assert late.scale == 600
    one, other = first.now(), late.now()
    assert abs((other - one).total_seconds()) < 600  # a real second apart at most
    assert other - START > timedelta(days=365)  # the anchor's time, not where `late` began


def test_a_clock_never_reads_earlier_than_it_did() -> None:
    clock = AcceleratedClock(START, 600)
    before = clock.now()
    clock.follow(Anchor(clock.anchor.real, START - timedelta(days=1), 600))  # an anchor a day behind
    assert clock.now() >= before


def test_the_anchor_is_stored_as_it_was_given(db: Database) -> None:
    anchor = Anchor(1_800_000_000.25, START, 37.5)
    with db.write() as session:
        settings.put_record(session, settings.CLOCK_ANCHOR, anchor.record())
    with db.read() as session:
        record = settings.get_record(session, settings.CLOCK_ANCHOR)
        assert record is not None and Anchor.from_record(record) == anchor
