"""Access keys in memory for a few seconds, so that a request does not read the store to learn its signer.

A revocation through this process takes effect at once (`forget`); one made by another process or server
sharing the store too: each request first reads the store's `keys` change counter (store/changes.py) and
`sync` drops every entry loaded before the counter moved. `ttl` bounds an entry's life besides. Unknown
keys are not cached, so a key created elsewhere works at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from hyperplan.services.accounts.accounts import Caller

Entry = tuple[str, Caller]


class KeyCache:
    def __init__(self, ttl: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self._clock = clock
        # key -> (expiry, generation it was loaded under, entry)
        self._entries: dict[str, tuple[float, int, Entry]] = {}
        self._lock = threading.Lock()
        self._generation = 0  # moves on with each forget() and each change of the store's counter
        self._counter: int | None = None  # the store's keys counter last seen

    def sync(self, counter: int | None) -> None:
        """The store's keys change counter, just read: every entry loaded before it moved is dropped."""
        if counter is None:
            return
        with self._lock:
            if counter != self._counter:
                self._counter = counter
                self._generation += 1
                self._entries.clear()

    def get(self, access_key_id: str, load: Callable[[str], Entry | None]) -> Entry | None:
        now = self._clock()
        with self._lock:
            cached = self._entries.get(access_key_id)
            generation = self._generation
        if cached is not None and cached[0] > now and cached[1] == generation:
            return cached[2]
        entry = load(access_key_id)
        with self._lock:
            if entry is None:
                self._entries.pop(access_key_id, None)
            elif generation == self._generation:  # nothing was revoked while it loaded
                self._entries[access_key_id] = (now + self.ttl, generation, entry)
        return entry

    def forget(self, access_key_id: str | None = None) -> None:
        """Drop one key (or all): the next request reads the store again."""
        with self._lock:
            self._generation += 1
            if access_key_id is None:
                self._entries.clear()
            else:
                self._entries.pop(access_key_id, None)
