"""The shared rate buckets (services/runtime/rate_limiter.py) with several limiters on one real SQLite store,
as several processes would hold them, and the time passed in: one process alone gets the account's whole
limit, and processes taking turns get no more than the documented bound between them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.core.rate_limits import RateLimit, RequestClass
from hyperplan.errors import Throttling
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.rate_limiter import LEASE_LIFE, RateLimiter, SharedBuckets, batch_size
from hyperplan.store.db import Database
from hyperplan.store.urls import sqlite_url

SEARCH = RequestClass.SEARCH


class Time:
    """Real time as the limiters read it: monotonic for what a process holds, the epoch for the store."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def epoch(self) -> float:
        return 1_800_000_000.0 + self.now


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = Database(sqlite_url(tmp_path))
    database.migrate()
    yield database
    database.close()


def _processes(db: Database, time: Time, count: int) -> list[RateLimiter]:
    return [RateLimiter(time.monotonic, SharedBuckets(db, time.epoch)) for _ in range(count)]


def _caller(limit: RateLimit) -> Caller:
    return Caller("123456789012", "team", False, "AKHPKEY", rate_limits={SEARCH: limit})


def _admitted(limiter: RateLimiter, caller: Caller) -> bool:
    try:
        limiter.admit(caller, SEARCH, {})
    except Throttling:
        return False
    return True


def test_one_process_gets_the_whole_limit_and_the_next_shares_the_same_bucket(db: Database) -> None:
    time = Time()
    one, other = _processes(db, time, 2)
    caller = _caller(RateLimit(0.01, 6))
    assert [_admitted(one, caller) for _ in range(8)] == [True] * 6 + [False] * 2  # not 6 / 2
    assert not _admitted(other, caller)  # the same bucket, empty
    time.now += 100  # one token's refill, for whichever process comes first
    assert _admitted(other, caller)
    assert not _admitted(one, caller)


def test_processes_taking_turns_admit_no_more_than_the_bound(db: Database) -> None:
    time = Time()
    limit = RateLimit(40, 40)
    batch = batch_size(limit)
    assert batch == 10  # a quarter of the burst (less than half a second of the rate)
    processes = _processes(db, time, 3)
    caller = _caller(limit)
    admitted = 0
    for step in range(400):  # 2 seconds in 5 ms steps, a request to each process in turn
        time.now += 0.005
        admitted += _admitted(processes[step % 3], caller)
    bound = limit.burst + limit.rate * 2.0 + len(processes) * (batch - 1)
    assert limit.burst + limit.rate * 2.0 - len(processes) * batch <= admitted <= bound


def test_a_process_that_holds_a_batch_and_goes_away_loses_at_most_the_batch(db: Database) -> None:
    time = Time()
    dead, alive = _processes(db, time, 2)
    limit = RateLimit(8, 8)
    caller = _caller(limit)
    assert _admitted(dead, caller)  # it leased a batch of 2 and spent 1
    assert sum(_admitted(alive, caller) for _ in range(10)) == limit.burst - batch_size(limit)
    time.now += LEASE_LIFE + 1  # a batch is not kept longer than its life: it cannot be saved up
    assert sum(_admitted(alive, caller) for _ in range(20)) == limit.burst


def test_a_limit_changed_by_an_administrator_is_not_held_to_the_old_refusal(db: Database) -> None:
    time = Time()
    (limiter,) = _processes(db, time, 1)
    assert _admitted(limiter, _caller(RateLimit(0.01, 1)))
    assert not _admitted(limiter, _caller(RateLimit(0.01, 1)))  # refused from memory for 100 s
    time.now += 1
    assert _admitted(limiter, _caller(RateLimit(1000, 1000)))


def test_an_expired_batch_s_unspent_tokens_go_back_with_the_next_lease(db: Database) -> None:
    time = Time()
    slow, busy = _processes(db, time, 2)
    limit = RateLimit(8, 100)
    batch = batch_size(limit)
    assert batch == 4  # half a second of the rate
    caller = _caller(limit)
    assert _admitted(slow, caller)  # leased a batch, spent 1: 3 held
    assert sum(_admitted(busy, caller) for _ in range(120)) == 100 - batch  # the bucket, emptied
    time.now += LEASE_LIFE + 0.01  # the held tokens' batch expired; 8.08 tokens came back by the rate
    assert _admitted(slow, caller)  # its next lease gave the 3 unspent back (11.08), took a batch
    assert sum(_admitted(busy, caller) for _ in range(20)) == 7  # 11.08 - 4: the returned ones among them


def test_administrators_and_unlimited_classes_take_no_token(db: Database) -> None:
    (limiter,) = _processes(db, Time(), 1)
    admin = Caller("123456789012", "root", True, "AKHPADMIN")
    assert limiter.admit(admin, SEARCH, {}) is None
    assert limiter.admit(_caller(RateLimit(1, 1)), RequestClass.READ, {}) is None
