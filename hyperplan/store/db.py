"""The database: one engine, short transactions, the schema brought up to date by Alembic at open."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).with_name("migrations")


_AFTER_COMMIT = "after_commit"
_NOTIFIED = "notified_on_insert"


def after_commit(session: Session, callback: Callable[[], None]) -> None:
    """Run `callback` after the session's transaction commits (see Database.write)."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


def sqlite_url(data_dir: Path) -> str:
    return f"sqlite:///{data_dir / 'hyperplan.db'}"


class Database:
    """Sessions for readers and writers.

    On SQLite, writers open with BEGIN IMMEDIATE so that a transaction that reads capacity and then
    books it holds the write lock from its first read: two buyers can never both see the same free
    instances. WAL lets readers go on while one writer works; synchronous=FULL makes every
    acknowledged commit survive a crash of the process or of the machine.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self.engine = _make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._on_insert: dict[type, list[Callable[[], None]]] = {}
        event.listen(self._sessions, "after_flush", self._note_inserts)

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
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            if self.is_sqlite:
                connection.exec_driver_sql("BEGIN IMMEDIATE")  # DDL and data move together or not at all
            config.attributes["connection"] = connection
            command.upgrade(config, revision)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            if self.is_sqlite:
                session.connection().exec_driver_sql("BEGIN")
            try:
                yield session
            finally:
                # Detach first, so that rows read here stay readable after the transaction ends.
                session.expunge_all()
                session.rollback()

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits when the block ends and rolls back on any error.

        Callbacks registered with `after_commit` run once the commit succeeded, never after a rollback:
        in-memory state (the live calendar) follows only what is durably stored.
        """
        with self._sessions() as session:
            if self.is_sqlite:
                session.connection().exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
            for callback in session.info.pop(_AFTER_COMMIT, []):
                callback()

    def compact(self) -> None:
        """Rewrite the database file and empty its write-ahead log, so that no free page or old log frame
        keeps content that rows no longer hold (a secret that was stored in plain text, say)."""
        if not self.is_sqlite:
            return
        with self.engine.connect() as connection:
            connection.exec_driver_sql("VACUUM")
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self.engine.dispose()


def _make_engine(url: str) -> Engine:
    if not url.startswith("sqlite"):
        return create_engine(url, pool_pre_ping=True)
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=16)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would defer BEGIN; we issue BEGIN ourselves (see write()).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        # What a row no longer holds is overwritten, not left in a free page: a secret re-sealed under
        # a new key leaves no old token in the file.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.close()

    return engine
