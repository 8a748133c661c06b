"""What this process keeps of the store's state, brought up to date before a request relies on it.

One statement reads every change counter (store/changes.py); then the access-key cache drops entries
older than the last change to keys, accounts or users, the live calendar reloads when another process
changed what is held, a manual clock takes the time the leader moved it to, an accelerated one the
anchor stored in the settings, and a Slurm back end's calendar the pools' bookable counts the leader
published. On one server alone the
counters move only with its own commits, which keep the memory current as they commit: a request costs
the one read.
"""

from __future__ import annotations

import threading

from hyperplan.clock import AcceleratedClock, Anchor, Clock, ManualClock
from hyperplan.services.accounts.key_cache import KeyCache
from hyperplan.services.runtime.live_calendar import LiveCalendar
from hyperplan.services.runtime.slurm_state import SlurmState, read_health
from hyperplan.store import changes, settings
from hyperplan.store.db import Database
from hyperplan.waits import may_wait


class SharedState:
    def __init__(
        self,
        db: Database,
        calendar: LiveCalendar,
        keys: KeyCache,
        clock: Clock,
        slurm: SlurmState | None = None,
    ) -> None:
        self.db = db
        self.calendar = calendar
        self.keys = keys
        self.clock = clock
        self.slurm = slurm  # a Slurm back end's state: the pools' health the leader publishes
        self._settings_seen: int | None = None
        self._lock = threading.Lock()
        self._last: dict[str, int] = {}  # the counters as last read
        # check -> (the counters it was made under, what it found): see recalled()
        self._checks: dict[tuple[object, ...], tuple[tuple[int, ...], object]] = {}

    def sync(self) -> dict[str, int]:
        """Read the counters and bring the memory up to date; returns what was read."""
        values = self.db.counters()
        self._last = values
        self.keys.sync(values.get(changes.KEYS))
        self.calendar.sync(self.db, values.get(changes.CALENDAR))
        moved = values.get(changes.SETTINGS)
        if (
            moved is not None
            and moved != self._settings_seen
            and (self.clock.kind != "wall" or self.slurm is not None)
        ):
            # Before it is marked seen: on the event loop the follow-ups' reads send the request to the
            # thread pool (hyperplan/waits.py), whose new try must still see the counter move.
            may_wait("following the clock and pools another process moved")
            with self._lock:
                self._settings_seen = moved
            self.follow_clock()
            self.follow_pool_health()
        return values

    def versions(self, *counters: str) -> tuple[int, ...] | None:
        """The counters as last read (None before the first read): take them before reading what a
        check depends on, and remember the check under them (`remember`)."""
        last = self._last
        if not last:
            return None
        return tuple(last.get(name, -1) for name in counters)

    def recalled(self, check: tuple[object, ...], versions: tuple[int, ...] | None) -> object | None:
        """What `check` found when the counters read `versions` (None if it was not made under them), so
        that it still holds."""
        if versions is None:
            return None
        found = self._checks.get(check)
        return found[1] if found is not None and found[0] == versions else None

    def remember(self, check: tuple[object, ...], versions: tuple[int, ...] | None, found: object) -> None:
        """Keep what `check` found (never None) under the counters read before it was made."""
        if versions is None:
            return
        with self._lock:
            if len(self._checks) > 10_000:
                self._checks.clear()
            self._checks[check] = (versions, found)

    def follow_clock(self) -> None:
        """A manual clock takes the service time stored by whoever moved it last (the leader); an
        accelerated one, the anchor stored by the first process to start (should it ever change)."""
        if isinstance(self.clock, ManualClock):
            with self.db.read() as session:
                saved = settings.get_time(session, settings.CLOCK_NOW)
            if saved is not None:
                self.clock.follow(saved)
        elif isinstance(self.clock, AcceleratedClock):
            with self.db.read() as session:
                record = settings.get_record(session, settings.CLOCK_ANCHOR)
            anchor = None if record is None else Anchor.from_record(record)
            if anchor is not None and anchor != self.clock.anchor:
                self.clock.follow(anchor)

    def follow_pool_health(self) -> None:
        """A Slurm back end's pools as the leader last read them: bookable counts into the calendar,
        unhealthy nodes into the fleet's report (services/runtime/slurm_state.py)."""
        if self.slurm is None:
            return
        with self.db.read() as session:
            text = settings.get(session, settings.POOL_HEALTH)
        if text is None or text == self.slurm.published:
            return
        known = {pool.key for pool in self.calendar.fleet.pools}
        for key, (bookable, unhealthy) in read_health(text).items():
            if key in known:  # a pool the fleet file no longer has is nobody's to book
                self.calendar.set_reservable(key, bookable)
                self.slurm.unhealthy[key] = unhealthy
        self.slurm.published = text
