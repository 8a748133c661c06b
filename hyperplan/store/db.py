"""The database: one engine, short transactions; serial or concurrent writers, batched commits on SQLite,
checked writes (store/checked_write.py). The engine's setup is store/engine.py's, the schema's migration
store/migrate.py's, the URL's rules store/urls.py's."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from functools import cache, partial
from typing import Any, Protocol, TypeVar

from sqlalchemy import event, inspect, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from hyperplan.errors import ServiceUnavailable
from hyperplan.store import migrate, session_marks
from hyperplan.store.checked_write import CheckedWrite, refuse_on_snapshot
from hyperplan.store.counter_watch import READ_COUNTERS_SQL, CounterWatch
from hyperplan.store.engine import RELAXED, begin_immediate, make_engine
from hyperplan.store.group_commit import GroupCommit
from hyperplan.store.prepared import Prepared
from hyperplan.store.turn_file import TurnFile
from hyperplan.store.urls import writers_lock_path
from hyperplan.waits import may_wait

# PostgreSQL's writers' advisory lock (class, object): held by a transaction until it ends. store/locks.py
# has the finer ones (pools); the classes differ, so no pool's lock is ever this one.
WRITERS_LOCK = {"c": 72_080, "o": 0}

T = TypeVar("T")

_TURN_WAIT = 30.0  # seconds a SQLite writer waits in each queue: this process's, then the lock file's

_AFTER_COMMIT = session_marks.AFTER_COMMIT
_NOTIFIED = session_marks.NOTIFIED
_BUMPED = "change_counters_bumped"
_WANTED = session_marks.WANTED


def committed_change(session: Session, counter: str) -> int | None:
    """The value this session's transaction gave `counter` (see Database.count_changes), or None if it
    did not change it; read it in an after_commit callback."""
    return session.info.get(_BUMPED, {}).get(counter)


def after_commit(session: Session, callback: Callable[[], None], *, early: bool = False) -> None:
    """Run `callback` after the session's transaction commits (see Database.write); `early`: before the
    callbacks that are not (session_marks.Early: a change to the live calendar)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(session_marks.Early(callback) if early else callback)


class BumpListener(Protocol):
    """What keeps a counter's state in memory hears of this process's transactions that move it
    (Database.on_bump), in this order, in the writer's thread."""

    def committing(self) -> None:
        """The counter is about to move. On PostgreSQL the commit goes in the same round trip, so
        another thread may read the new value before `expect` names it."""

    def expect(self, version: int | None) -> None:
        """The counter moved to `version`, committed (PostgreSQL) or about to be (SQLite); None: the
        statement failed and nothing moved."""

    def committed(self, version: int) -> None:
        """The transaction that moved it to `version` committed: an early after-commit callback, after
        the early ones its work registered (a batch's works run theirs after it: store/group_commit.py),
        before any other."""


class Database:
    """Sessions for readers and writers, on SQLite or PostgreSQL (docs/POSTGRES.md).

    Each writer relies on one of two guarantees, chosen where it opens its transaction. By default
    (`write()`) a writer runs alone:
    - SQLite: BEGIN IMMEDIATE, so a transaction that reads capacity and then books it holds the write
      lock from its first read; two buyers can never both see the same free instances. WAL lets readers
      go on while one writer works; synchronous=FULL makes every acknowledged commit survive a crash of
      the process or of the machine.
    - PostgreSQL: the transaction first takes the writers' advisory lock exclusively
      (`pg_advisory_xact_lock`, held to commit or rollback) and runs at READ COMMITTED, so each of its
      statements sees everything committed before it started and nobody else writes meanwhile: the same
      serial order as SQLite's, across every server on the database.
    `write(concurrent=True)` (buying a plan, an extension) takes the writers' lock shared instead: such
    writers run beside one another, never beside a serial one, and rely only on what they lock
    themselves (store/locks.py: an account's row, a pool's lock) and on the unique constraints.
    Readers see one snapshot (REPEATABLE READ on PostgreSQL; WAL's snapshot on SQLite).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.is_postgres = url.startswith("postgresql")
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._writer_queue = threading.RLock()  # SQLite: see _writers_turn
        self._turn_depth = 0  # nested write()s of the thread holding _writer_queue
        self._turn_file: tuple[int, TurnFile] | None = None  # (pid, the writers' lock file) SQLite
        self.turn_wait = _TURN_WAIT  # seconds a SQLite writer waits in each queue (see _writers_turn)
        self.group = GroupCommit(self)  # SQLite: see write_grouped
        self._in_write = threading.local()  # `depth`: this thread's open write()s
        self._on_insert: dict[type, list[Callable[[], None]]] = {}
        # model -> (counter, columns whose change alone does not count)
        self._counted: dict[type, list[tuple[str, frozenset[str], bool]]] = {}
        self._bump_listeners: dict[str, list[BumpListener]] = {}  # counter -> on_bump's listeners
        own_file = self.is_postgres or (self.is_sqlite and writers_lock_path(url) is not None)
        self._watch = CounterWatch(self.engine, sqlite=self.is_sqlite) if own_file else None
        event.listen(self._sessions, "after_flush", self._note_inserts)
        event.listen(self._sessions, "after_flush", self._count_changes)
        event.listen(self._sessions, "before_commit", self._bump_counted)

    def count_changes(
        self, model: type, counter: str, *, ignoring: Iterable[str] = (), inserts_only: bool = False
    ) -> None:
        """Add one to the change counter `counter` (table change_counters) in every transaction that
        inserts, changes or deletes rows of `model`, once per transaction, as it commits: every
        process sharing the store sees that the state it keeps of those rows is out of date
        (store/changes.py). A change to the `ignoring` columns only does not count; `inserts_only`: only
        new rows count."""
        self._counted.setdefault(model, []).append((counter, frozenset(ignoring), inserts_only))

    def _count_changes(self, session: Session, _flush_context: Any) -> None:
        """After each flush: note which counters this transaction's changes move (no SQL here)."""
        if not self._counted:
            return
        wanted: set[str] = session.info.setdefault(_WANTED, set())
        for instances, kind in ((session.new, "new"), (session.dirty, "dirty"), (session.deleted, "deleted")):
            for instance in instances:
                for counter, ignoring, inserts_only in self._counted.get(type(instance), ()):
                    if counter in wanted or (inserts_only and kind != "new"):
                        continue
                    if kind == "dirty" and not _changed_beyond(instance, ignoring):
                        continue
                    wanted.add(counter)

    def wrote(
        self, session: Session, model: type, *, inserted: bool = True, columns: Iterable[str] = ()
    ) -> None:
        """A transaction that wrote rows of `model` with Core statements, past the session's unit of work,
        says so here: the change counters (count_changes) and the wakes (on_insert) follow the rules
        a flush of such rows would. `inserted` False: rows were updated, in these `columns`."""
        wanted: set[str] = session.info.setdefault(_WANTED, set())
        changed = frozenset(columns)
        for counter, ignoring, inserts_only in self._counted.get(model, ()):
            if inserted or not (inserts_only or changed <= ignoring):
                wanted.add(counter)
        if inserted:
            notified = session.info.setdefault(_NOTIFIED, set())
            for callback in self._on_insert.get(model, ()):
                if id(callback) not in notified:
                    notified.add(id(callback))
                    after_commit(session, callback)

    def _bump_counted(self, session: Session) -> None:
        """Just before the commit: one statement moves every counter this transaction's changes moved
        (held from here to the commit: briefly, on PostgreSQL, where it is a row lock).

        On PostgreSQL the COMMIT goes in that statement's round trip, with whatever was deferred before
        it (store/prepared.py): the session's commit that follows finds the connection idle and sends
        nothing. A write that holds locks (a purchase's pools) then waits once for the server between
        its last read and its end, not twice. So this must be the session's last before_commit
        listener (it is its only one), and it flushes the session first."""
        if not self._counted or session.in_nested_transaction():
            return  # a savepoint's release (store/group_commit.py): the transaction's commit counts it
        session.flush()  # what is still pending is part of the transaction too
        wanted = session.info.pop(_WANTED, set())
        if wanted:
            names = sorted(wanted)
            listeners = [listener for name in names for listener in self._bump_listeners.get(name, ())]
            for listener in listeners:
                listener.committing()
            try:
                rows = _bump_many(len(names)).rows(
                    session.connection(),
                    {f"n{i}": name for i, name in enumerate(names)},
                    then_commit=self.is_postgres,
                )
            except BaseException:
                for listener in listeners:
                    listener.expect(None)
                raise
            moved = {name: value for name, value in rows}
            session.info.setdefault(_BUMPED, {}).update(moved)
            for name, value in moved.items():
                for listener in self._bump_listeners.get(name, ()):
                    listener.expect(value)
                    after_commit(session, partial(listener.committed, value), early=True)

    def on_bump(self, counter: str, listener: BumpListener) -> None:
        """Tell `listener` as a transaction of this process moves `counter` (see BumpListener): the live
        calendar then knows a version is its own and on its way until it has committed
        (services/runtime/live_calendar.py)."""
        self._bump_listeners.setdefault(counter, []).append(listener)

    def bump(self, counter: str) -> None:
        """Add one to `counter` in a transaction of its own (a wake for a loop in another process)."""
        with self.write(concurrent=True) as session:
            session.connection().execute(BUMP, {"n": counter})

    def counters(self) -> dict[str, int]:
        """Every change counter's value, as committed when the call began (store/changes.py): on this
        process's own connection, which on SQLite reads the table only when something was committed since
        its last look (store/counter_watch.py)."""
        if self._watch is not None:
            return self._watch.read()
        # A database without a file of its own (in memory): a pooled connection, past SQLAlchemy's
        # Connection and its statement cache.
        may_wait("a pooled connection")
        connection = self.engine.raw_connection()
        try:
            cursor = connection.cursor()
            try:
                cursor.execute(READ_COUNTERS_SQL)
                rows = cursor.fetchall()
            finally:
                cursor.close()
        finally:
            connection.close()
        return {name: value for name, value in rows}

    def counters_read_ahead(self) -> AbstractAsyncContextManager[None]:
        """For a request answered on the event loop: within the block, `counters()` answers a read made
        asynchronously on entry, after the request arrived (PostgreSQL: store/counter_watch.py); as it
        is elsewhere."""
        if self._watch is None or self.is_sqlite:
            return nullcontext()
        return self._watch.reading_ahead()

    def on_insert(self, model: type, callback: Callable[[], None]) -> None:
        """Call `callback` once after each commit of a transaction that inserted rows of `model`: how a
        background loop hears of new work (a timed event, a queued delivery), whoever wrote it."""
        self._on_insert.setdefault(model, []).append(callback)

    def _note_inserts(self, session: Session, _flush_context: Any) -> None:
        # After a flush the session still lists what it inserted (SQLAlchemy's after_flush contract).
        notified = session.info.setdefault(_NOTIFIED, set())
        for instance in session.new:
            for callback in self._on_insert.get(type(instance), ()):
                if id(callback) not in notified:
                    notified.add(id(callback))
                    after_commit(session, callback)

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to `revision` (store/migrate.py; tests build a store as an earlier version
        left it)."""
        migrate.migrate(self.engine, self.url, revision)

    @contextmanager
    def read(self) -> Iterator[Session]:
        may_wait("a read of the store")  # a connection, a lock, a round trip: never on the event loop
        with _lost_connection_refused(), self._sessions() as session:
            if self.is_sqlite:
                session.connection().exec_driver_sql("BEGIN")
            elif self.is_postgres:
                # One snapshot for the whole read, as SQLite's WAL gives (read-only: it never conflicts).
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            try:
                yield session
            finally:
                # Detach first, so that rows read here stay readable after the transaction ends.
                session.expunge_all()
                session.rollback()

    @contextmanager
    def write(self, *, concurrent: bool = False, durable: bool = True) -> Iterator[Session]:
        """A transaction that commits when the block ends and rolls back on any error.

        Serial by default: no other writer runs meanwhile (see the class). `concurrent=True`: the block
        takes the locks its invariants need itself, before it reads what it checks (store/locks.py).

        `durable=False`: the commit does not wait for the disk (SQLite: synchronous=NORMAL for this
        transaction, no fsync of the log; PostgreSQL: synchronous_commit off). Only for rows whose loss
        in a crash of the machine or of the database loses nothing anyone was promised (a rate bucket's
        lease). Atomicity and order are unchanged: the next durable commit makes it durable too, and a
        crash may only lose such commits, newest first, never a durable one after them.

        Callbacks registered with `after_commit` run once the commit succeeded, never after a rollback:
        in-memory state (the live calendar) follows only what is durably stored.
        """
        may_wait("a write to the store")  # the writers' turn above all (hyperplan/waits.py)
        with self._counted_write(concurrent=concurrent, durable=durable) as session:
            yield session

    @contextmanager
    def _counted_write(
        self, *, concurrent: bool, durable: bool, first: Callable[[Session], object] | None = None
    ) -> Iterator[Session]:
        """`_write`, counted as this thread's write (write_grouped within it is not batched)."""
        depth: int = getattr(self._in_write, "depth", 0)
        self._in_write.depth = depth + 1
        try:
            with self._write(concurrent=concurrent, durable=durable, first=first) as session:
                yield session
        finally:
            self._in_write.depth = depth

    def write_grouped(
        self, work: Callable[[Session], T], check: Callable[[Session], object] | None = None
    ) -> T:
        """`check(session)` (if given), then `work(session)`, in a write transaction; the work's result
        once that committed; on SQLite in a batch with the writes of other threads arriving at the same
        time, committed together in one durable commit, each in a savepoint of its own
        (store/group_commit.py). Together they must be what a `write(concurrent=True)` block may be:
        they lock what they check (store/locks.py); `check` only reads (its refusal then needs no
        savepoint); an error rolls back only what the work wrote, and is raised here. Not batched on
        PostgreSQL, nor within a write of this thread (whose turn a batch led by another thread would
        wait for)."""
        may_wait("a write to the store")
        writing: int = getattr(self._in_write, "depth", 0)
        if not self.is_sqlite or writing:
            with self._counted_write(concurrent=True, durable=True, first=check) as session:
                result = work(session)
            return result
        return self.group.run(work, self.turn_wait, check)

    def write_checked(self, write: CheckedWrite[T]) -> T:
        """A checked write (store/checked_write.py): its refusals read on a snapshot, without a lock;
        then, not refused, what it needs that no row decides, worked out before the writers' turn; then
        the check again under its locks and the work, as `write_grouped` runs them. Within a write of
        this thread the snapshot is skipped: it would not see what that write has done so far; so is a
        PostgreSQL one when the write is likely to pass it (CheckedWrite.likely_passes)."""
        if not getattr(self._in_write, "depth", 0) and not (self.is_postgres and write.likely_passes()):
            refuse_on_snapshot(self.engine, write.on_snapshot)
        # Tried on the event loop (server/loop_or_pool.py), a write the snapshot did not refuse goes on
        # in the pool, before `prepare`, which the pool would only do again.
        may_wait("the writers' turn")
        write.prepare()
        return self.write_grouped(write.work, write.check)

    @contextmanager
    def _write(
        self, *, concurrent: bool, durable: bool, first: Callable[[Session], object] | None = None
    ) -> Iterator[Session]:
        """A write transaction; `first(session)`, when given, runs in it before the block. It only reads
        (and takes locks): on PostgreSQL the writers' lock then goes with its first statement, in that
        round trip, and it runs again on a new connection if that one is found lost."""
        with _lost_connection_refused(), self._sessions() as session:
            with self._writers_turn():
                try:
                    self._begin_write(session, concurrent, durable, first)
                    yield session
                    session.commit()
                except BaseException:
                    session.rollback()
                    raise
            for callback in session_marks.early_first(session.info.pop(_AFTER_COMMIT, [])):
                callback()

    def _begin_write(
        self, session: Session, concurrent: bool, durable: bool, first: Callable[[Session], object] | None
    ) -> None:
        """The transaction's start (the writers' lock), then `first(session)` if given."""
        if self.is_postgres:
            writers_lock = _TAKE_WRITERS_LOCK[concurrent, durable]
            if first is None:  # with the BEGIN, in one round trip (store/prepared.py)
                _first_statement(session, lambda: writers_lock.rows(session.connection(), WRITERS_LOCK))
            else:  # with the BEGIN and `first`'s own first statement, in one round trip
                _first_statement(session, lambda: _locked_first(session, writers_lock, first))
            return
        if self.is_sqlite:
            connection = session.connection()
            if not durable:  # the pool puts FULL back as the connection returns (store/engine.py)
                connection.info[RELAXED] = True
                connection.exec_driver_sql("PRAGMA synchronous=NORMAL")
            begin_immediate(connection)
        if first is not None:
            first(session)

    @contextmanager
    def _writers_turn(self) -> Iterator[None]:
        """SQLite: writers queue before BEGIN IMMEDIATE, first on a lock of this process, then on a
        lock file next to the database that every process on it takes (`flock`, a wait in the kernel:
        store/turn_file.py). SQLite's own wait for its write lock is a sleep-and-retry whose sleeps grow
        to 100 ms: eight threads buying at once spent most of their time asleep with the lock free
        (purchase p99 of seconds), and so did the processes of `serve --workers 2` beside one another.
        The queue changes nothing of what is guaranteed: BEGIN IMMEDIATE still takes SQLite's lock,
        which a process that does not queue (an older version, the sqlite3 shell) respects too. Past
        `turn_wait` in this process's queue a writer goes on to SQLite's own wait, as before the queue;
        past `turn_wait` at the lock file (another process holds it: stopped, stuck) it is refused with
        ServiceUnavailable, which clients retry. PostgreSQL's writers wait in the server, which wakes
        them."""
        if not self.is_sqlite:
            yield
            return
        queued = self._writer_queue.acquire(timeout=self.turn_wait)
        try:
            # Only the thread at the head of this process's queue touches the file lock: a lock taken
            # with flock belongs to the open file, which this process's threads share.
            locked = self._lock_turn_file() if queued and self._turn_depth == 0 else None
            self._turn_depth += queued
            try:
                yield
            finally:
                self._turn_depth -= queued
                if locked is not None:
                    locked.release()
        finally:
            if queued:
                self._writer_queue.release()

    def _lock_turn_file(self) -> TurnFile | None:
        """Take the writers' lock file (opened once per process); None for a database without a file of
        its own (in memory). ServiceUnavailable past `turn_wait`."""
        if self._turn_file is None or self._turn_file[0] != os.getpid():
            path = writers_lock_path(self.url)
            if path is None:
                return None
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._turn_file = (os.getpid(), TurnFile(descriptor))
        turn = self._turn_file[1]
        if not turn.take(self.turn_wait):
            raise ServiceUnavailable(
                f"The store is busy: another process has held its writers' lock for more than "
                f"{self.turn_wait:g} s; try again."
            )
        return turn

    def compact(self) -> None:
        """Rewrite the database file and empty its write-ahead log, so that no free page or old log frame
        keeps content that rows no longer hold (a secret that was stored in plain text, say)."""
        if not self.is_sqlite:
            return
        with self.engine.connect() as connection:
            connection.exec_driver_sql("VACUUM")
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self.engine.dispose()
        # After the writers in flight (they unlock the file through its descriptor); past the wait, or
        # with a helper still waiting on it for a writer that gave up (store/turn_file.py), the
        # descriptor is left to the process's end rather than closed under a writer or a wait.
        if self._turn_file is not None and self._writer_queue.acquire(timeout=self.turn_wait):
            try:
                if self._turn_file[0] == os.getpid() and not self._turn_file[1].in_use:
                    os.close(self._turn_file[1].descriptor)
                self._turn_file = None
            finally:
                self._writer_queue.release()


BUMP = text("UPDATE change_counters SET value = value + 1 WHERE name = :n RETURNING value")


@cache
def _bump_many(count: int) -> Prepared:
    """`count` counters moved on in one statement (:n0, :n1...), returning (name, value) each: prepared
    once per count (store/prepared.py), as every transaction that changes counted rows runs it."""
    names = ", ".join(f":n{i}" for i in range(count))
    return Prepared(
        text(f"UPDATE change_counters SET value = value + 1 WHERE name IN ({names}) RETURNING name, value")
    )


def counter_shapes_ahead(most: int) -> None:
    """Make the statements that move 1 to `most` counters at once (for prepared.compile_every)."""
    for count in range(1, most + 1):
        _bump_many(count)


def _writers_lock(concurrent: bool, durable: bool) -> Prepared:
    take = "pg_advisory_xact_lock_shared" if concurrent else "pg_advisory_xact_lock"
    relax = "" if durable else ", set_config('synchronous_commit', 'off', true)"
    return Prepared(text(f"SELECT {take}(:c, :o){relax}"))


# A PostgreSQL writer's first statement, by (concurrent, durable).
_TAKE_WRITERS_LOCK = {(c, d): _writers_lock(c, d) for c in (True, False) for d in (True, False)}


def _first_statement(session: Session, run: Callable[[], object]) -> None:
    """A transaction's first statements (`run`, which only reads and locks), on PostgreSQL, where the
    pool does not ping a connection before handing it out (store/engine.py): its connection found lost (the
    server restarted), they run again on a new connection, once; nothing was done on the lost one."""
    try:
        run()
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        session.rollback()  # lets go of the lost connection (and what was deferred on it)
        run()


def _locked_first(session: Session, writers_lock: Prepared, first: Callable[[Session], object]) -> None:
    """The writers' lock deferred (store/prepared.py), then `first`: its first statement takes the lock
    with it, after the BEGIN, before anything it locks or reads. A purchase's write waits for the
    server once less (the lock was a round trip of its own, every buyer's, with the pools' locks still
    to take)."""
    writers_lock.defer(session.connection(), WRITERS_LOCK)
    first(session)


@contextmanager
def _lost_connection_refused() -> Iterator[None]:
    """A connection to PostgreSQL lost in the middle of a transaction: ServiceUnavailable (503, which
    clients retry), not a 500. The pool has dropped every connection older than the loss by then."""
    try:
        yield
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        raise ServiceUnavailable("The connection to the database was lost; try again.") from exc


def _changed_beyond(instance: Any, ignoring: frozenset[str]) -> bool:
    state = inspect(instance)
    return any(attr.key not in ignoring and attr.history.has_changes() for attr in state.attrs)
