"""Console sessions kept in the store, so that a sign-out ends one on every server and an idle one ends.

The signed cookie (console/session.py) still says who a request comes from; a row of `console_sessions`
says that its session is still open. Signing in writes the row; signing out deletes it, and so does
deactivating the key it was signed in with (services/orchestration/user_views.py); every signed-in console
request checks that the row exists and that the wall clock is before both of its ends: the idle end (the last
request seen plus the idle timeout) and the absolute one (sign-in plus the session's lifetime, which the
cookie carries too).

Cheap per request: a process trusts what it read of a row for CACHE_SECONDS, so another server's
sign-out is refused here within that time (this process's own at once); it forgets all it read when the
store's `keys` change counter moves (a key deactivated anywhere: its sessions' rows went with it), which
each request reads anyway (services/runtime/shared_state.py). It writes a session's last sight at most every
`touch_interval` (a minute, or a tenth of the idle timeout if that is shorter): a session ends between
that interval less than the idle timeout and the idle timeout after its last request. Bounded: each
sign-in deletes every row past either end, and keeps at most MAX_PER_KEY open sessions of its key (the
least recently seen go first); nothing but a live key's sign-in adds a row.

Time is real wall time (`wall`, seconds since the epoch), never the service clock: a manual clock that
stands still must not keep a session alive. The idle timeout is HYPERPLAN_CONSOLE_IDLE_TIMEOUT (seconds)
in the server's environment, an hour by default; give every server sharing a store the same one (each
touch sets a session's idle end with the toucher's timeout).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from sqlalchemy import Delete, Update, delete, or_, select, update
from sqlalchemy.orm import Session

from hyperplan.errors import ValidationError
from hyperplan.store import changes
from hyperplan.store.db import Database
from hyperplan.store.schema import ConsoleSession

if TYPE_CHECKING:
    from hyperplan.services.runtime.shared_state import SharedState

IDLE_TIMEOUT_ENV = "HYPERPLAN_CONSOLE_IDLE_TIMEOUT"
DEFAULT_IDLE_TIMEOUT = 3600.0  # seconds without a request before a session ends
MIN_IDLE_TIMEOUT = 60.0
MAX_IDLE_TIMEOUT = 12 * 3600.0  # a session's whole lifetime (console/session.py): longer never applies
CACHE_SECONDS = 5.0  # how long a process trusts what it read of a session (as the key cache's few seconds)
TOUCH_SECONDS = 60.0  # how often, at most, a session's last sight is written
MAX_PER_KEY = 20  # open sessions of one key; a sign-in past it ends the least recently seen
MAX_CACHED = 10_000  # sessions a process remembers before it forgets those past CACHE_SECONDS

StatementT = TypeVar("StatementT", Delete, Update)


def idle_timeout_from_env(env: Mapping[str, str] | None = None) -> float:
    """HYPERPLAN_CONSOLE_IDLE_TIMEOUT from the server's environment, in seconds; an hour when unset."""
    text = (os.environ if env is None else env).get(IDLE_TIMEOUT_ENV)
    if not text:
        return DEFAULT_IDLE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not MIN_IDLE_TIMEOUT <= value <= MAX_IDLE_TIMEOUT:  # a NaN fails this too
        raise ValidationError(
            f"{IDLE_TIMEOUT_ENV}={text!r}: the console's idle timeout is a number of seconds from "
            f"{MIN_IDLE_TIMEOUT:.0f} to {MAX_IDLE_TIMEOUT:.0f}"
        )
    return value


def session_id(nonce: str) -> str:
    """A session's row id: the SHA-256 of its cookie's nonce, so that the store never holds the nonce
    the forms' CSRF tokens are made from."""
    return hashlib.sha256(nonce.encode()).hexdigest()


@dataclass(frozen=True)
class OpenSession:
    """What a process knows of a session's row; times in wall seconds since the epoch."""

    access_key_id: str
    last_seen: float
    idle_ends: float
    expires: float

    def open_at(self, now: float) -> bool:
        return now < self.idle_ends and now < self.expires

    @classmethod
    def of(cls, row: ConsoleSession) -> OpenSession:
        return cls(
            row.access_key_id,
            row.last_seen_at.timestamp(),
            row.idle_ends_at.timestamp(),
            row.expires_at.timestamp(),
        )


class ConsoleSessions:
    """This process's view of the store's console sessions (one per service context)."""

    def __init__(
        self,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout = idle_timeout
        self.wall = wall  # real time for the sessions' ends; a test drives it
        self._monotonic = monotonic  # the cache's age: immune to the wall clock's steps
        # id -> (when it was read, by `monotonic`; the row as read, None: there is none)
        self._cache: dict[str, tuple[float, OpenSession | None]] = {}
        # Moves on at each end() and each change of keys: a read begun before it is not remembered.
        self._generation = 0
        self._keys_seen: int | None = None  # the store's keys change counter, as last seen
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> ConsoleSessions:
        return cls(idle_timeout_from_env())

    @property
    def touch_interval(self) -> float:
        return min(TOUCH_SECONDS, self.idle_timeout / 10)

    def open(self, db: Database, nonce: str, access_key_id: str, expires_at: float) -> None:
        """Record a session just signed in; rows past their ends, and the key's sessions beyond
        MAX_PER_KEY, go in the same transaction."""
        now = self.wall()
        row = ConsoleSession(
            id=session_id(nonce),
            access_key_id=access_key_id,
            created_at=_instant(now),
            last_seen_at=_instant(now),
            idle_ends_at=_instant(now + self.idle_timeout),
            expires_at=_instant(expires_at),
        )
        found = OpenSession.of(row)
        with self._lock:
            generation = self._generation
        # Serial (a sign-in is a person's, not a flood): its deletions of many rows then never meet
        # another's in the opposite order. The other writes here touch one row by its id, side by side.
        with db.write() as session:
            _remove_ended(session, row.created_at)
            session.add(row)
            session.flush()
            surplus = _keep_most_recent(session, access_key_id)
        self._remember(row.id, found, generation)  # before the surplus's forgetting moves the generation
        self._forget_ended(surplus)

    def is_open(
        self, db: Database, nonce: str, access_key_id: str, shared: SharedState | None = None
    ) -> bool:
        """The session was signed in with this key, is not signed out, and is before both its ends;
        marks it seen (in the store at most every `touch_interval`). `shared`: this process's view of
        the change counters, just read (`runtime.sync()`), so that a key changed anywhere is seen."""
        versions = shared.versions(changes.KEYS) if shared is not None else None
        self._follow_keys(versions[0] if versions else None)
        key = session_id(nonce)
        now = self.wall()
        found = self._lookup(db, key)
        if found is None or found.access_key_id != access_key_id or not found.open_at(now):
            return False
        if now - found.last_seen >= self.touch_interval:
            found = self._touch(db, key, now)
        return found is not None and found.open_at(now)

    def end(self, db: Database, nonce: str) -> None:
        """Sign-out: the session's row goes, and with it the session on every server."""
        key = session_id(nonce)
        with self._lock:
            self._generation += 1
        with db.write(concurrent=True) as session:
            session.execute(_unsynchronised(delete(ConsoleSession).where(ConsoleSession.id == key)))
        self._forget_ended([key])

    def _forget_ended(self, keys: list[str]) -> None:
        """Sessions this process just deleted: refused here at once, not when the cache ages."""
        if not keys:
            return
        with self._lock:  # the generation again: a read begun while the deletion committed saw the row
            self._generation += 1
            for key in keys:
                self._cache[key] = (self._monotonic(), None)

    def _follow_keys(self, keys_version: int | None) -> None:
        with self._lock:
            if keys_version is not None and keys_version != self._keys_seen:
                self._keys_seen = keys_version
                self._generation += 1
                self._cache.clear()

    def _lookup(self, db: Database, key: str) -> OpenSession | None:
        with self._lock:
            cached = self._cache.get(key)
            generation = self._generation
        if cached is not None and self._monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        with db.read() as session:
            row = session.get(ConsoleSession, key)
            found = None if row is None else OpenSession.of(row)
        self._remember(key, found, generation)
        return found

    def _touch(self, db: Database, key: str, now: float) -> OpenSession | None:
        """Write the session's last sight (never backwards: another server may have seen it later);
        the row as it then is, None once it is gone."""
        seen = _instant(now)
        with self._lock:
            generation = self._generation
        # Not durable: a crash may lose a minute of a session's activity, which only ends it sooner.
        with db.write(concurrent=True, durable=False) as session:
            session.execute(
                _unsynchronised(
                    update(ConsoleSession)
                    .where(ConsoleSession.id == key, ConsoleSession.last_seen_at < seen)
                    .values(last_seen_at=seen, idle_ends_at=_instant(now + self.idle_timeout))
                )
            )
            row = session.get(ConsoleSession, key, populate_existing=True)
            found = None if row is None else OpenSession.of(row)
        self._remember(key, found, generation)
        return found

    def _remember(self, key: str, found: OpenSession | None, generation: int) -> None:
        with self._lock:
            if generation != self._generation:  # a sign-out came meanwhile: what was read may be stale
                return
            if len(self._cache) >= MAX_CACHED:
                self._forget_stale()
            self._cache[key] = (self._monotonic(), found)

    def _forget_stale(self) -> None:
        oldest = self._monotonic() - CACHE_SECONDS
        self._cache = {key: value for key, value in self._cache.items() if value[0] >= oldest}
        if len(self._cache) >= MAX_CACHED:
            self._cache.clear()


def end_for_key(session: Session, access_key_id: str) -> None:
    """Every session signed in with the key ends, in the caller's transaction (a key deactivated: its
    sessions do not come back if it is activated again)."""
    session.execute(
        _unsynchronised(delete(ConsoleSession).where(ConsoleSession.access_key_id == access_key_id))
    )


def _remove_ended(session: Session, now: datetime) -> None:
    ended = or_(ConsoleSession.idle_ends_at <= now, ConsoleSession.expires_at <= now)
    session.execute(_unsynchronised(delete(ConsoleSession).where(ended)))


def _keep_most_recent(session: Session, access_key_id: str) -> list[str]:
    """The key's sessions but the MAX_PER_KEY most recently seen, deleted; their ids."""
    surplus = session.scalars(
        select(ConsoleSession.id)
        .where(ConsoleSession.access_key_id == access_key_id)
        .order_by(ConsoleSession.last_seen_at.desc(), ConsoleSession.created_at.desc())
        .offset(MAX_PER_KEY)
    ).all()
    if surplus:
        session.execute(_unsynchronised(delete(ConsoleSession).where(ConsoleSession.id.in_(surplus))))
    return list(surplus)


def _unsynchronised(statement: StatementT) -> StatementT:
    """A bulk statement whose rows the session need not update in memory: none is loaded there."""
    return statement.execution_options(synchronize_session=False)


def _instant(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)
