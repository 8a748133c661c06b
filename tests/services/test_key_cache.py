from __future__ import annotations

from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.accounts.key_cache import Entry, KeyCache

CALLER = Caller("123456789012", "team", False, "AKHPKEY")


class Store:
    """Counts how often the cache reads the store."""

    def __init__(self) -> None:
        self.keys: dict[str, Entry] = {"AKHPKEY": ("secret", CALLER)}
        self.reads = 0

    def load(self, key: str) -> Entry | None:
        self.reads += 1
        return self.keys.get(key)


def test_a_key_is_read_once_per_ttl_and_forgotten_at_once() -> None:
    now = [0.0]
    cache, store = KeyCache(ttl=5, clock=lambda: now[0]), Store()
    assert cache.get("AKHPKEY", store.load) == ("secret", CALLER)
    assert cache.get("AKHPKEY", store.load) == ("secret", CALLER)
    assert store.reads == 1
    del store.keys["AKHPKEY"]  # revoked by another server: seen once the entry expires
    now[0] = 5.1
    assert cache.get("AKHPKEY", store.load) is None
    store.keys["AKHPKEY"] = ("secret", CALLER)
    assert cache.get("AKHPKEY", store.load) is not None
    cache.forget("AKHPKEY")  # revoked through this server: the next request reads the store
    del store.keys["AKHPKEY"]
    assert cache.get("AKHPKEY", store.load) is None


def test_unknown_keys_are_not_cached() -> None:
    cache, store = KeyCache(), Store()
    assert cache.get("AKHPNEW", store.load) is None
    store.keys["AKHPNEW"] = ("s", CALLER)
    assert cache.get("AKHPNEW", store.load) == ("s", CALLER)


def test_a_change_to_the_stores_keys_counter_drops_every_entry_even_one_loading() -> None:
    cache, store = KeyCache(), Store()
    cache.sync(1)
    assert cache.get("AKHPKEY", store.load) is not None
    cache.sync(1)  # nothing changed: still cached
    assert cache.get("AKHPKEY", store.load) is not None and store.reads == 1
    del store.keys["AKHPKEY"]  # revoked by another process, which moved the counter
    cache.sync(2)
    assert cache.get("AKHPKEY", store.load) is None

    # A load that began before the counter moved is not kept: it may have read the key before it went.
    store.keys["AKHPKEY"] = ("secret", CALLER)

    def load_then_revoked(key: str) -> Entry | None:
        entry = store.load(key)
        cache.sync(3)
        return entry

    assert cache.get("AKHPKEY", load_then_revoked) is not None
    reads = store.reads
    cache.get("AKHPKEY", store.load)
    assert store.reads == reads + 1  # read again, not served from the cache
