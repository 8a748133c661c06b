"""The request rate limiter: one token bucket per (account, class of request), shared by every process.

The rules are in core/rate_limits.py; this keeps the buckets and the time. An account's limits are the
fleet file's ``[rate_limits]`` with the overrides an administrator set on the account, which travel with
the caller (read with its access key, so they cost no extra query). Administrators are never limited:
they are trusted, and their scripts are what un-sticks a server in trouble.

Shared buckets. Each (account, class) has one bucket in the store (table rate_buckets, `SharedBuckets`),
counted in real time (seconds since the epoch: servers agree on it, as the leader's lease needs). A
process does not visit it per request: it leases a small batch of tokens at once (`batch_size`: what the
rate gives in LEASE_SPAN, half a second, at most a quarter of the burst, at least one) and admits from
the batch in memory; the request that finds the batch empty leases the next one (one short write). A
refused lease says when a token will be there, and the process refuses from memory until then, so a
flood costs no store access either. Leased tokens are good for LEASE_LIFE; what is left then goes back
to the bucket with the process's next lease of it (in the same write), so a slow client wastes none. A
process that dies holding a batch loses it: the fleet admits less, never more.

A lease's commit does not wait for the disk (`Database.write(durable=False)`): a lease is a write a
second per busy (account, class) and process, and its fsync was most of what the limiter cost. What a
crash can lose is only the newest leases: a crash of the machine takes the processes holding those
tokens with it; a crash of the PostgreSQL server alone (the servers live on) lets the buckets forget
at most the leases of its last moments, so once, each process may spend one batch more than the bound.

The bound. The store's bucket grants no more than one bucket would (burst, then rate); the only excess
is tokens leased before a window and spent in it: over any window the whole fleet admits at most
burst + rate x window + N x (batch - 1) of an account's requests of one class, N the processes serving
(docs/DEPLOY.md). A client that reaches one process only gets the account's whole rate.

Without a store (`RateLimiter()`, a context built without one) the buckets live in this process alone.
Memory is bounded: four entries per account at most.

A request admitted on the event loop that then finds it must wait (hyperplan/waits.py) is finished in
the thread pool without being admitted again (server/loop_or_pool.py). A lease is a wait: on the loop,
a request whose batch is spent goes to the pool before it takes anything.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from hyperplan.core.rate_limits import Bucket, RateLimit, RateLimits, RequestClass, lease, take
from hyperplan.errors import Throttling
from hyperplan.services.accounts.accounts import Caller
from hyperplan.store.db import Database
from hyperplan.store.schema import RateBucket
from hyperplan.waits import may_wait

LEASE_SPAN = 0.5  # seconds of an account's rate one lease takes
LEASE_LIFE = 1.0  # seconds a process may spend leased tokens; what is left then is dropped
_LEASE_NOW = -1.0  # what memory says when only a lease can answer


def batch_size(limit: RateLimit) -> int:
    """Tokens one lease asks for: few enough that N processes holding a batch each stay near the limit,
    many enough that an account at its rate costs a lease every LEASE_SPAN at most (a write per request
    only for a rate of 2 a second or less: 2 writes a second)."""
    return max(1, min(math.ceil(limit.rate * LEASE_SPAN), limit.burst // 4))


class SharedBuckets:
    """The buckets in the store: a lease is one short transaction on the bucket's row."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self._clock = clock  # real time since the epoch: every server counts the same instants

    def lease(
        self, account_id: str, request_class: RequestClass, limit: RateLimit, want: int, returned: int = 0
    ) -> tuple[int, float]:
        """Up to `want` tokens, once `returned` unspent ones are back: how many were granted, and (none
        granted) the seconds until one is there."""
        try:
            return self._lease(account_id, request_class, limit, want, returned)
        except IntegrityError:  # PostgreSQL: another server made the bucket's row first; it is there now
            return self._lease(account_id, request_class, limit, want, returned)

    def _lease(
        self, account_id: str, request_class: RequestClass, limit: RateLimit, want: int, returned: int
    ) -> tuple[int, float]:
        # Concurrent: the row's lock (SQLite: the write lock) is all a lease needs. Not durable: a lease
        # lost in a crash of the machine or the database only forgets tokens taken (see the module).
        # Core statements on the session's connection: the ORM's unit of work cost more than the rest.
        key = {"account": account_id, "class": request_class.value}
        with self.db.write(concurrent=True, durable=False) as session:
            connection = session.connection()
            row = connection.execute(_READ_BUCKET, key).first()
            before = None if row is None else Bucket(row.tokens, row.counted_at)
            after, granted, wait = lease(limit, before, self._clock(), want, returned)
            if not granted and (row is None or not returned):
                return 0, wait or 0.0  # nothing taken or given back: the row stays as it was
            if row is None:
                connection.execute(
                    insert(RateBucket).values(
                        account_id=account_id,
                        request_class=request_class.value,
                        tokens=after.tokens,
                        counted_at=after.at,
                    )
                )
            else:
                connection.execute(_SET_BUCKET, {**key, "tokens": after.tokens, "at": after.at})
            return granted, wait or 0.0


_KEY = (RateBucket.account_id == bindparam("account")) & (RateBucket.request_class == bindparam("class"))
_READ_BUCKET = select(RateBucket.tokens, RateBucket.counted_at).where(_KEY).with_for_update()
_SET_BUCKET = update(RateBucket).where(_KEY).values(tokens=bindparam("tokens"), counted_at=bindparam("at"))


@dataclass(frozen=True)
class Admission:
    """The token `admit` took: from the bucket `key` of this process (`batch` None) or from a batch
    leased from the store."""

    key: tuple[str, RequestClass]
    limit: RateLimit
    batch: _Held | None


@dataclass(eq=False)  # a batch is known by identity
class _Held:
    """What this process holds of a shared bucket: leased tokens until `expires`, or a refusal until
    `refused_until` (monotonic seconds), under the limit they were leased for."""

    limit: RateLimit
    tokens: int = 0
    expires: float = 0.0
    refused_until: float = 0.0


class RateLimiter:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, store: SharedBuckets | None = None
    ) -> None:
        # Real time, never the service clock: a manual clock standing still must not freeze the buckets.
        self._clock = clock
        self._store = store
        self._buckets: dict[tuple[str, RequestClass], Bucket] = {}  # without a store
        self._held: dict[tuple[str, RequestClass], _Held] = {}  # with one
        self._leasing: dict[tuple[str, RequestClass], threading.Lock] = {}
        self._lock = threading.Lock()

    def admit(self, caller: Caller, request_class: RequestClass, defaults: RateLimits) -> Admission | None:
        """Take a token for this request, or raise Throttling naming the class, limit and wait. Returns
        the token taken (None: none is needed, for an administrator or a class without a limit)."""
        if caller.is_admin:
            return None
        limit = caller.rate_limits.get(request_class) or defaults.get(request_class)
        if limit is None:
            return None
        key = (caller.account_id, request_class)
        if self._store is None:
            with self._lock:
                bucket, wait = take(limit, self._buckets.get(key), self._clock())
                self._buckets[key] = bucket
            if wait is None:
                return Admission(key, limit, None)
        else:
            taken = self._from_held(key, limit)
            if taken == _LEASE_NOW:
                taken = self._lease(key, limit)
            if isinstance(taken, _Held):
                return Admission(key, limit, taken)
            wait = taken
        raise Throttling(
            f"Rate exceeded: account {caller.account_name!r} made more {request_class.value} requests "
            f"than its limit ({limit}); try again in {max(wait, 0.001):.3f} s."
        )

    def _from_held(self, key: tuple[str, RequestClass], limit: RateLimit) -> _Held | float:
        """From memory: the batch a token was taken from (admitted), the wait of a refusal still
        running, or _LEASE_NOW."""
        now = self._clock()
        with self._lock:
            held = self._held.get(key)
            if held is None or held.limit != limit:  # new, or an administrator changed the limit
                return _LEASE_NOW
            if held.tokens > 0 and now < held.expires:
                held.tokens -= 1
                return held
            if now < held.refused_until:
                return held.refused_until - now
            return _LEASE_NOW

    def _lease(self, key: tuple[str, RequestClass], limit: RateLimit) -> _Held | float:
        """A batch from the shared bucket (one lease at a time per bucket in this process: the threads
        that wait for it take from what it brought): the batch the token was taken from, or the wait."""
        assert self._store is not None
        may_wait("a lease of rate tokens")  # before waiting for the bucket's `leasing` lock
        with self._lock:
            leasing = self._leasing.setdefault(key, threading.Lock())
        with leasing:
            wait = self._from_held(key, limit)
            if wait != _LEASE_NOW:
                return wait
            with self._lock:
                held = self._held.get(key)
                # An expired batch's unspent tokens (leased under this limit) go back with this lease.
                returned = held.tokens if held is not None and held.limit == limit else 0
            granted, wait = self._store.lease(key[0], key[1], limit, batch_size(limit), returned)
            now = self._clock()
            with self._lock:
                if granted:
                    batch = self._held[key] = _Held(limit, granted - 1, now + LEASE_LIFE)
                    return batch
                self._held[key] = _Held(limit, refused_until=now + wait)
                return wait
