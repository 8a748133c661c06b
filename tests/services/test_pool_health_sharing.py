"""A Slurm back end's pool health, shared through the store (services/runtime/slurm_state.py): the leader's
reconciling pass writes it (`follow_health`, the path every pass takes), and another process's
calendar takes it at its next sync, so a drained node reduces what every process sells. Real SQLite;
the nodes are what `scontrol show node` parses to (Slurm itself is the slurm part's)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hyperplan.app import count_changes
from hyperplan.clock import ManualClock
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.services.accounts.key_cache import KeyCache
from hyperplan.services.runtime.live_calendar import LiveCalendar
from hyperplan.services.runtime.shared_state import SharedState
from hyperplan.services.runtime.slurm_state import SlurmState, UnhealthyNode
from hyperplan.services.slurm.pool_health import follow_health
from hyperplan.slurm.client import SlurmClient
from hyperplan.slurm.parse import Node
from hyperplan.store.db import Database
from hyperplan.store.urls import sqlite_url

FLEET = parse_fleet(
    'region = "us-west-2"\n[backend]\nkind = "slurm"\nslurm_conf = "/etc/slurm/slurm.conf"\n'
    '[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
    '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\nnodes = "gpu[1-4]"\n'
    'price_per_instance_hour = "55.04"\n'
)
POOL = FLEET.pools[0]


class Process:
    """What one server process keeps: its calendar, its Slurm state, its view of the shared store."""

    def __init__(self, db: Database) -> None:
        self.calendar = LiveCalendar(FLEET)
        self.calendar.load(db)
        self.slurm = SlurmState(SlurmClient(FLEET.backend.slurm_conf or "/etc/slurm/slurm.conf"))
        clock = ManualClock(datetime(2027, 1, 1, tzinfo=UTC))
        self.shared = SharedState(db, self.calendar, KeyCache(), clock, self.slurm)

    def bookable(self) -> int:
        return self.calendar.bookable(POOL).reservable


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    count_changes(database)  # as the composition root does: a setting written moves the counter
    yield database
    database.close()


def _nodes(drained: str | None = None) -> dict[str, Node]:
    def node(name: str) -> Node:
        if name == drained:
            return Node(name, "IDLE", frozenset({"DRAIN"}), (), "", ("gpu",), "bad DIMM")
        return Node(name, "IDLE", frozenset(), (), "", ("gpu",), None)

    return {name: node(name) for name in POOL.nodes}


def test_a_node_the_leader_sees_drained_reduces_what_every_process_sells(db: Database) -> None:
    leader, api = Process(db), Process(db)
    follow_health(db, FLEET, leader.calendar, leader.slurm, _nodes())
    api.shared.sync()
    assert api.bookable() == 4
    follow_health(db, FLEET, leader.calendar, leader.slurm, _nodes(drained="gpu3"))
    assert leader.bookable() == 3
    assert api.bookable() == 4  # not until it reads the counters, as before each request
    api.shared.sync()
    assert api.bookable() == 3
    assert api.slurm.unhealthy[POOL.key] == (UnhealthyNode("gpu3", "IDLE+DRAIN", "bad DIMM"),)
    later = Process(db)  # a process started after the drain reads it at its first sync
    later.shared.sync()
    assert later.bookable() == 3
    follow_health(db, FLEET, leader.calendar, leader.slurm, _nodes())  # resumed
    api.shared.sync()
    assert api.bookable() == 4 and api.slurm.unhealthy[POOL.key] == ()


def test_a_pass_that_finds_nothing_changed_writes_nothing(db: Database) -> None:
    leader = Process(db)
    follow_health(db, FLEET, leader.calendar, leader.slurm, _nodes(drained="gpu1"))
    before = db.counters()
    follow_health(db, FLEET, leader.calendar, leader.slurm, _nodes(drained="gpu1"))
    assert db.counters() == before
