"""The request rate limiter: one token bucket per (account, class of request), in this server's memory.

The rules are in core/rate_limits.py; this keeps the buckets and the time. An account's limits are the
fleet file's ``[rate_limits]`` with the overrides an administrator set on the account, which travel with
the caller (read with its access key, so they cost no extra query). Administrators are never limited:
they are trusted, and their scripts are what un-sticks a server in trouble.

Memory is bounded: four buckets per account at most. Several processes sharing one store (serve
--workers, several servers) split each limit: each of the N processes alive (their presence rows,
services/leadership.py) keeps a bucket of rate/N and burst/N (at least 1), so that together they admit
no more than the limit however the requests are spread, with no store access per request. An account
whose requests all reach one process meets 1/N of its limit there; a reverse proxy or the kernel spreads
connections evenly enough that this rarely shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hyperplan.core.rate_limits import Bucket, RateLimit, RateLimits, RequestClass, take
from hyperplan.errors import Throttling
from hyperplan.services.accounts import Caller


class RateLimiter:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, processes: Callable[[], int] = lambda: 1
    ) -> None:
        # Real time, never the service clock: a manual clock standing still must not freeze the buckets.
        self._clock = clock
        self._processes = processes  # how many processes share the limits (this one included)
        self._buckets: dict[tuple[str, RequestClass], Bucket] = {}
        self._lock = threading.Lock()

    def admit(self, caller: Caller, request_class: RequestClass, defaults: RateLimits) -> None:
        """Take a token for this request, or raise Throttling naming the class, limit and wait."""
        if caller.is_admin:
            return
        limit = caller.rate_limits.get(request_class) or defaults.get(request_class)
        if limit is None:
            return
        key = (caller.account_id, request_class)
        share = max(1, self._processes())
        mine = limit if share == 1 else RateLimit(limit.rate / share, max(1, limit.burst // share))
        with self._lock:
            bucket, wait = take(mine, self._buckets.get(key), self._clock())
            self._buckets[key] = bucket
        if wait is not None:
            raise Throttling(
                f"Rate exceeded: account {caller.account_name!r} made more {request_class.value} requests "
                f"than its limit ({limit}); try again in {max(wait, 0.001):.3f} s."
            )
