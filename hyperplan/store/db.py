"""The database: one engine, short transactions, the schema brought up to date by Alembic at open.

Alembic is imported only when a store needs a migration: a new store is made at the head and stamped
here, and a store already at the head is left as it is, so most starts never load it (about 0.15 s of
CPU each)."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager, nullcontext
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    create_engine,
    event,
    inspect,
    select,
    text,
)
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from hyperplan.errors import ServiceUnavailable, StartRefused, ValidationError
from hyperplan.store import prepared, session_marks
from hyperplan.store.counter_watch import READ_COUNTERS_SQL, CounterWatch
from hyperplan.store.group_commit import GroupCommit
from hyperplan.store.prepared import Prepared
from hyperplan.store.turn_file import TurnFile
from hyperplan.waits import (
    WouldWait,
    done_on_the_loop,
    may_wait,
    note_done_on_the_loop,
    waits_forbidden,
)

MIGRATIONS = Path(__file__).with_name("migrations")
HEAD_REVISION = "0022"
"""The newest migration's revision: a store stamped with it is at the head (tests/store/test_schema.py
checks that it is Alembic's head, so a new migration cannot be forgotten here)."""

VERSION_TABLE = Table(
    "alembic_version",
    MetaData(),
    Column("version_num", String(32), nullable=False),
    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"),
)
"""Alembic's own version table, as Alembic makes it (test_schema.py compares the two roads' tables)."""


# PostgreSQL advisory locks (class, object): held by a transaction until it ends. store/locks.py has the
# finer ones (pools); the classes differ, so no pool's lock is ever one of these.
WRITERS_LOCK = {"c": 72_080, "o": 0}
MIGRATION_LOCK = {"c": 72_080, "o": 1}

T = TypeVar("T")

_TURN_WAIT = 30.0  # seconds a SQLite writer waits in each queue: this process's, then the lock file's

_AFTER_COMMIT = session_marks.AFTER_COMMIT
_NOTIFIED = session_marks.NOTIFIED
_BUMPED = "change_counters_bumped"
_WANTED = session_marks.WANTED
_RELAXED = "synchronous_normal"  # a SQLite connection's info: a write(durable=False) lowered its sync


def committed_change(session: Session, counter: str) -> int | None:
    """The value this session's transaction gave `counter` (see Database.count_changes), or None if it
    did not change it; read it in an after_commit callback."""
    return session.info.get(_BUMPED, {}).get(counter)


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` after the session's transaction commits (see Database.write)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'hyperplan.db'}"


def check_url(url: str) -> str:
    """A store's URL as SQLAlchemy takes it: sqlite:///PATH, or postgresql+psycopg://USER@HOST:PORT/DB
    (postgresql:// and postgres:// mean the same: psycopg 3 is the one driver). ValidationError names
    what is wrong, without the URL's password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValidationError(
            f"database URL {redact(url)!r} has no scheme: give sqlite:///PATH or postgresql://..."
        )
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ValidationError(
                "a PostgreSQL store needs psycopg 3: pip install 'hyperplan[postgres]'"
            ) from None
        if not rest.partition("?")[0].rpartition("/")[2]:
            raise ValidationError(f"database URL {redact(url)!r} names no database (…/DBNAME)")
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite":
        return url
    raise ValidationError(
        f"database URL {redact(url)!r}: {scheme!r} is not a store hyperplan knows; give sqlite:///PATH or "
        "postgresql://USER@HOST:PORT/DBNAME"
    )


def redact(url: str) -> str:
    """The URL with any password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def _create_at_head(connection: Connection) -> None:
    """A new, empty store: the schema as schema.py declares it, in one step, then stamped with the head
    revision (Alembic's recipe for new databases, without loading Alembic). Replaying every migration on
    an empty store gives the same tables (tests/store/test_schema.py compares the two) at several times
    the cost, paid by every server's first start."""
    from hyperplan.store import changes
    from hyperplan.store.schema import Base  # the tables, only where they are made

    Base.metadata.create_all(connection)
    # The rows migrations seed, as they seed them: one change counter each, at zero (migration 0017).
    connection.execute(
        text("INSERT INTO change_counters (name, value) VALUES (:name, 0)"),
        [{"name": name} for name in changes.ALL],
    )
    VERSION_TABLE.create(connection)
    connection.execute(VERSION_TABLE.insert().values(version_num=HEAD_REVISION))


def _at_head(connection: Connection, tables: list[str]) -> bool:
    """The store is stamped with the head revision, and with nothing else."""
    if VERSION_TABLE.name not in tables:
        return False
    return list(connection.scalars(select(VERSION_TABLE.c.version_num))) == [HEAD_REVISION]


def _upgrade(connection: Connection, revision: str) -> None:
    """Alembic's upgrade to `revision`, on this connection (migrations/env.py takes it from here)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


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
        self.engine = _make_engine(url)
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
        own_file = self.is_postgres or (self.is_sqlite and _writers_lock_path(url) is not None)
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
            rows = _bump_many(len(names)).rows(
                session.connection(),
                {f"n{i}": name for i, name in enumerate(names)},
                then_commit=self.is_postgres,
            )
            session.info.setdefault(_BUMPED, {}).update({name: value for name, value in rows})

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
        """Bring the schema to `revision` (tests build a store as an earlier version left it)."""
        self._check_reachable()
        with self.engine.begin() as connection:
            if self.is_sqlite:
                connection.exec_driver_sql("BEGIN IMMEDIATE")  # DDL and data move together or not at all
            elif self.is_postgres:
                # PostgreSQL's DDL is transactional too; servers starting at once migrate one after another.
                connection.execute(text("SELECT pg_advisory_xact_lock(:c, :o)"), MIGRATION_LOCK)
            if revision != "head":
                _upgrade(connection, revision)
                return
            tables = inspect(connection).get_table_names()
            if not tables:
                _create_at_head(connection)
            elif not _at_head(connection, tables):  # at the head already: nothing for Alembic to do
                _upgrade(connection, revision)

    def _check_reachable(self) -> None:
        try:
            with self.engine.connect():
                pass
        except OperationalError as exc:
            said = str(exc.orig or exc).strip().splitlines()[0]
            raise StartRefused(f"cannot open the store at {redact(self.url)}: {said}") from None

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

    def refuse_early(self, refusals: Callable[[Connection], object]) -> None:
        """`refusals(connection)` (what a write_grouped `check` refuses, read without its locks) on a
        snapshot, before the write: what it raises is raised here, without the write; a write_grouped
        that follows checks again, under its locks, against the rows as they are then. Nothing within a
        write of this thread (a snapshot would not see what that write has done so far).

        It reads in a read transaction, on a pooled connection past the session (a session's setup and
        teardown cost about what the reads do): on SQLite WAL's snapshot, which readers take side by
        side, beside the writer and one another; on PostgreSQL outside any transaction, where each
        statement is a snapshot of its own, so that `refusals` must read what it weighs together in one
        statement (`_refuse_early_postgres`).

        Most purchases under contention are refused (capacity taken since the search: 82% of the
        bench's buy-only answers). On SQLite each refusal in the writers' turn was a wait for every
        writer of every process behind it; on PostgreSQL each held its account's and pools' locks for
        its reads, which every buyer of those pools waited for, and cost a write transaction. A refusal
        read on a snapshot is the answer the write would have given at that snapshot, which is taken
        after the request arrived and before it is answered: a valid place for it among the other
        writes (linearizable). It only reads: nothing is written either way.

        On SQLite it may run on the event loop (server/sagemaker.py tries a purchase there): the snapshot
        read waits for no lock (a busy store is a WouldWait at once, not SQLite's busy timeout) and is
        two indexed reads of a file the page cache holds; its connection must be open and idle in the
        pool (a pool thread may take it first: then one is opened, the one wait left, and a rare one). Most
        refusals are then answered with no hop to the thread pool, which under load cost a request more
        CPU than these reads. A purchase that passes them is answered in the pool, which skips them
        (hyperplan/waits.py `done_on_the_loop`)."""
        writing: int = getattr(self._in_write, "depth", 0)
        if writing:
            return
        if self.is_postgres:
            self._refuse_early_postgres(refusals)
            return
        if not self.is_sqlite:
            return
        if done_on_the_loop(_SNAPSHOT_REFUSALS):
            return  # this request's try on the event loop read them, on a snapshot taken after it arrived
        on_the_loop = waits_forbidden()
        if on_the_loop and not self._idle_connection():
            may_wait("a pooled connection")
        with self.engine.connect() as connection:
            driver = connection.connection.dbapi_connection
            assert driver is not None
            with _no_busy_wait(driver, on_the_loop):
                driver.execute("BEGIN")  # deferred: the snapshot is taken at the first read
                try:
                    refusals(connection)
                finally:
                    driver.execute("ROLLBACK")
        note_done_on_the_loop(_SNAPSHOT_REFUSALS)

    def _idle_connection(self) -> bool:
        """Whether a connection waits idle in the pool, opened already: a checkout on the event loop must
        neither wait for one nor open one (whose setup waits for a lock the busy timeout long)."""
        pool = self.engine.pool
        return isinstance(pool, QueuePool) and pool.checkedin() > 0

    def _refuse_early_postgres(self, refusals: Callable[[Connection], object]) -> None:
        """refuse_early on PostgreSQL: outside any transaction (autocommit), so that a read is one round
        trip, with no BEGIN before it nor ROLLBACK after; each statement is then its own snapshot, and
        `refusals` reads what it weighs together in one statement (plan_purchase.Purchase). It only
        reads: it takes no lock, and has nothing to roll back. A connection found lost answers nothing
        here: the write that follows opens a new one (_first_statement)."""
        may_wait("a read of the store")
        try:
            with self.engine.connect() as connection:
                # Only the driver's flag (psycopg's autocommit): no statement; the pool puts it back.
                connection.execution_options(isolation_level="AUTOCOMMIT")
                refusals(connection)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise

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
            for callback in session.info.pop(_AFTER_COMMIT, []):
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
            if not durable:  # the pool puts FULL back as the connection returns (_make_engine)
                connection.info[_RELAXED] = True
                connection.exec_driver_sql("PRAGMA synchronous=NORMAL")
            _begin_immediate(connection)
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
            path = _writers_lock_path(self.url)
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


def _writers_lock(concurrent: bool, durable: bool) -> Prepared:
    take = "pg_advisory_xact_lock_shared" if concurrent else "pg_advisory_xact_lock"
    relax = "" if durable else ", set_config('synchronous_commit', 'off', true)"
    return Prepared(text(f"SELECT {take}(:c, :o){relax}"))


# A PostgreSQL writer's first statement, by (concurrent, durable).
_TAKE_WRITERS_LOCK = {(c, d): _writers_lock(c, d) for c in (True, False) for d in (True, False)}

WRITERS_LOCK_SUFFIX = ".writers-lock"


def _first_statement(session: Session, run: Callable[[], object]) -> None:
    """A transaction's first statements (`run`, which only reads and locks), on PostgreSQL, where the
    pool does not ping a connection before handing it out (_make_engine): its connection found lost (the
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


def _begin_immediate(connection: Connection) -> None:
    """SQLite's write lock, within its busy timeout; past it a retryable ServiceUnavailable, not a 500."""
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except OperationalError as exc:
        if "locked" not in str(exc.orig):
            raise
        raise ServiceUnavailable(
            "The store is busy: another process has held its write lock for longer than the store "
            "waits; try again."
        ) from None


def _writers_lock_path(url: str) -> str | None:
    """The writers' lock file of a SQLite database on disk: its path with WRITERS_LOCK_SUFFIX."""
    path = url.removeprefix("sqlite:///").partition("?")[0]
    if not path or path == ":memory:" or path.startswith("file:") or url == path:
        return None
    return path + WRITERS_LOCK_SUFFIX


def _changed_beyond(instance: Any, ignoring: frozenset[str]) -> bool:
    state = inspect(instance)
    return any(attr.key not in ignoring and attr.history.has_changes() for attr in state.attrs)


def _make_engine(url: str) -> Engine:
    if url.startswith("postgresql"):
        # READ COMMITTED, not stricter: a writer's statements after its locks must see what the
        # transactions it waited for committed. Readers ask for REPEATABLE READ per transaction.
        # No ping at checkout (a round trip, two with the BEGIN it starts, before every transaction):
        # each request's first statement is the change counters' read on a connection of their own,
        # which finds a restarted server first and has the pool drop every older connection
        # (store/counter_watch.py); a writer's first statement runs again once on a new connection
        # (_first_statement); anything else lost mid-way is a ServiceUnavailable. Connections are
        # replaced after pool_recycle seconds, so none outlives what a proxy or firewall keeps open.
        engine = create_engine(
            url, pool_recycle=600, isolation_level="READ COMMITTED", pool_size=8, max_overflow=24
        )
        engine.dialect.do_rollback = _rollback_keeping_prepared  # type: ignore[method-assign]
        _deferred_statements_sent_in_time(engine)
        return engine
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000}, pool_size=16
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would defer BEGIN; we issue BEGIN ourselves (see write()).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        # What a row no longer holds is overwritten, not left in a free page: a secret re-sealed under
        # a new key leaves no old token in the file.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()

    _savepoints_as_plain_sql(engine.dialect)

    @event.listens_for(engine, "checkin")
    def _durable_again(dbapi_connection: Any, record: Any) -> None:
        # After a write(durable=False), before any other writer can have the connection.
        if record.info.pop(_RELAXED, False) and dbapi_connection is not None:
            dbapi_connection.execute("PRAGMA synchronous=FULL")

    return engine


def _deferred_statements_sent_in_time(engine: Engine) -> None:
    """A transaction's deferred statements (store/prepared.py: its locks) go to the server before any
    statement SQLAlchemy runs and before the commit; a rollback, or the connection's return to the
    pool, forgets them."""

    @event.listens_for(engine, "before_cursor_execute")
    def _before(connection: Connection, *_args: Any) -> None:
        if prepared.DEFERRED in connection.info:
            prepared.run_deferred(connection)

    @event.listens_for(engine, "commit")
    def _before_commit(connection: Connection) -> None:
        prepared.run_deferred(connection)

    @event.listens_for(engine, "rollback")
    def _rolled_back(connection: Connection) -> None:
        if not connection.invalidated:  # an invalidated one's info goes with its driver connection
            prepared.drop_deferred(connection.info)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_connection: Any, record: Any) -> None:
        prepared.drop_deferred(record.info)


BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite statement waits for another connection's lock before it fails (on the event loop:
not at all, `_no_busy_wait`)."""
_SNAPSHOT_REFUSALS = "a purchase's refusals read on a snapshot"
_SQLITE_BUSY_CODES = frozenset({5, 6})  # SQLITE_BUSY, SQLITE_LOCKED


@contextmanager
def _no_busy_wait(driver: Any, on_the_loop: bool) -> Iterator[None]:
    """On the event loop, a SQLite connection that fails at once where it would wait for a lock: the
    failure is a WouldWait (the request is answered in the pool); elsewhere, nothing changes."""
    if not on_the_loop:
        yield
        return
    driver.execute("PRAGMA busy_timeout=0")
    try:
        yield
    except (sqlite3.OperationalError, OperationalError) as exc:
        cause = exc.orig if isinstance(exc, OperationalError) else exc
        if getattr(cause, "sqlite_errorcode", None) in _SQLITE_BUSY_CODES:
            raise WouldWait("a lock on the store") from None
        raise
    finally:
        driver.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def _rollback_keeping_prepared(dbapi_connection: Any) -> None:
    """PostgreSQL: ROLLBACK, leaving the statements psycopg prepared on the server prepared.

    psycopg prepares a statement on the server once a connection has run it a few times
    (prepare_threshold), so that PostgreSQL parses and plans it once. But its own rollback() forgets
    every prepared statement, and sends DEALLOCATE ALL before the connection's next statement: it guards
    against DDL rolled back under a prepared statement. Here every read ends in a rollback (Database.read),
    and so does each refused purchase: nothing stayed prepared, and each statement was parsed and
    planned afresh, a purchase's capacity read ~1 ms of the database's CPU each time (issue 20). Our DDL
    runs only in migrations, at a server's start, and a DROP or ALTER still clears psycopg's cache as it
    runs. The ROLLBACK goes straight to libpq (which waits without holding the GIL); if it does not
    answer as a rollback does, the driver's own rollback runs, and raises as it would have."""
    from psycopg import pq

    pgconn = dbapi_connection.pgconn
    if pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        result = pgconn.exec_(b"ROLLBACK")
    except Exception:  # no result at all: the driver's rollback says what is wrong
        result = None
    if result is None or result.status != pq.ExecStatus.COMMAND_OK:
        dbapi_connection.rollback()


def _savepoints_as_plain_sql(dialect: Any) -> None:
    """SQLAlchemy runs each SAVEPOINT, RELEASE and ROLLBACK TO as a statement it compiles afresh, never
    from its cache (~0.2 ms of CPU each); a batch of purchases (store/group_commit.py) runs two per
    purchase. The same SQL, as text: the name is SQLAlchemy's own (sa_savepoint_N), quoted if needed."""
    quote = dialect.identifier_preparer.quote

    def run(verb: str) -> Callable[[Connection, str], None]:
        def statement(connection: Connection, name: str) -> None:
            connection.exec_driver_sql(f"{verb} {quote(name)}")

        return statement

    dialect.do_savepoint = run("SAVEPOINT")
    dialect.do_release_savepoint = run("RELEASE SAVEPOINT")
    dialect.do_rollback_to_savepoint = run("ROLLBACK TO SAVEPOINT")
