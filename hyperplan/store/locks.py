"""The locks a concurrent writer (`Database.write(concurrent=True)`) takes before it reads what it checks.

On SQLite every writer runs alone (BEGIN IMMEDIATE), and these take nothing. On PostgreSQL they are what
a concurrent writer's invariant rests on; every writer that could break the invariant takes the same lock:
- `lock_account`: the account's row, FOR UPDATE. Whatever is checked or changed per account (its plans,
  its quotas, its budget and ledger) is read after it; two purchases by one account run one after the
  other.
- `lock_pools`: one advisory lock per pool (instance type and zone), taken in one sorted order. A row lock
  cannot guard rows that do not exist yet (the segments a racing buyer is about to insert), so a pool's
  capacity is guarded by a lock named after the pool: whoever books capacity in a pool holds it from
  before reading the pool's bookings until commit. Giving capacity back needs no lock (it can only make a
  concurrent check more careful than it had to be).
Lock order, to rule out deadlocks: the writers' lock (Database.write), then accounts, then pools.

On PostgreSQL the locks are deferred (store/prepared.py): they go to the server with the transaction's
next statement, in its round trip, and are held before that statement runs, as the server runs them in
order. A purchase's account lock, pools' locks and first read cost one round trip, not three.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import cast

from sqlalchemy import Table, bindparam, select, text
from sqlalchemy.orm import Session

from hyperplan.store.prepared import Prepared
from hyperplan.store.schema import Account

POOLS_LOCK_CLASS = 72_081  # distinct from Database's WRITERS_LOCK class

# Prepared once (store/prepared.py): every purchase on PostgreSQL runs them, past SQLAlchemy's execution.
_ACCOUNTS = cast(Table, Account.__table__)
_LOCK_ACCOUNT = Prepared(
    select(_ACCOUNTS.c.id).where(_ACCOUNTS.c.id == bindparam("account")).with_for_update()
)
_LOCK_POOL = Prepared(text("SELECT pg_advisory_xact_lock(:c, :o)"))


def _postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def lock_account(session: Session, account_id: str) -> None:
    """Hold the account's row until the transaction ends (PostgreSQL); nothing on SQLite."""
    if _postgres(session):
        _LOCK_ACCOUNT.defer(session.connection(), {"account": account_id})


def lock_pools(session: Session, pools: Iterable[tuple[str, str]]) -> None:
    """Hold each pool's lock until the transaction ends (PostgreSQL); nothing on SQLite."""
    if not _postgres(session):
        return
    connection = session.connection()
    for key in sorted(set(pools)):
        _LOCK_POOL.defer(connection, {"c": POOLS_LOCK_CLASS, "o": pool_lock_id(key)})


def pool_lock_id(pool: tuple[str, str]) -> int:
    """A pool's lock as a signed 32-bit number; two pools sharing one only wait for each other."""
    value = zlib.crc32("/".join(pool).encode())
    return value - (1 << 32) if value >= 1 << 31 else value
