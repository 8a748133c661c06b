"""The request rate limiter: one token bucket per (account, class of request), in this server's memory.

The rules are in core/rate_limits.py; this keeps the buckets and the time. An account's limits are the
fleet file's ``[rate_limits]`` with the overrides an administrator set on the account, which travel with
the caller (read with its access key, so they cost no extra query). Administrators are never limited:
they are trusted, and their scripts are what un-sticks a server in trouble.

Memory is bounded: four buckets per account at most. Each server keeps its own buckets; behind several
servers an account may reach each one's limit (docs/FLEET.md says so).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hyperplan.core.rate_limits import Bucket, RateLimits, RequestClass, take
from hyperplan.errors import Throttling
from hyperplan.services.accounts import Caller


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        # Real time, never the service clock: a manual clock standing still must not freeze the buckets.
        self._clock = clock
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
        with self._lock:
            bucket, wait = take(limit, self._buckets.get(key), self._clock())
            self._buckets[key] = bucket
        if wait is not None:
            raise Throttling(
                f"Rate exceeded: account {caller.account_name!r} made more {request_class.value} requests "
                f"than its limit ({limit}); try again in {max(wait, 0.001):.3f} s."
            )
