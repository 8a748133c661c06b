"""Access keys in memory for a few seconds, so that a request does not read the store to learn its signer.

A revocation through this server takes effect at once (`forget`); one made by another server sharing the
store takes effect within `ttl`. Unknown keys are not cached, so a key created elsewhere works at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hyperplan.services.accounts import Caller

Entry = tuple[str, Caller]


class KeyCache:
    def __init__(self, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        self._entries: dict[str, tuple[float, Entry]] = {}
        self._lock = threading.Lock()

    def get(self, access_key_id: str, load: Callable[[str], Entry | None]) -> Entry | None:
        now = self._clock()
        with self._lock:
            cached = self._entries.get(access_key_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        entry = load(access_key_id)
        with self._lock:
            if entry is None:
                self._entries.pop(access_key_id, None)
            else:
                self._entries[access_key_id] = (now + self.ttl, entry)
        return entry

    def forget(self, access_key_id: str | None = None) -> None:
        """Drop one key (or all): the next request reads the store again."""
        with self._lock:
            if access_key_id is None:
                self._entries.clear()
            else:
                self._entries.pop(access_key_id, None)
