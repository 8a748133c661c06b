"""Statements a hot path runs many times a second, handed straight to the driver's cursor.

SQLAlchemy's Core spends on each statement it executes several times what the driver itself costs (an
execution context, the compiled form looked up by a cache key built per call, each value and each row
through its type); a purchase's dozen statements spent most of its CPU there (issue 20; `python -m bench
--profile` shows where it goes). A `Prepared` statement is still declared with Core, over the schema's
tables, and compiled by SQLAlchemy, once per dialect; running it binds each value with its column type's
own processor (the integer microseconds of UTCDateTime, the text of DecimalString) and executes on the
DBAPI cursor of the caller's connection, inside the caller's transaction. Rows come back as the driver
gives them: the caller converts what it reads (`from_micros`, `Decimal`).

On PostgreSQL the statement is compiled with PostgreSQL's own placeholders ($1, $2, ...) and run on
psycopg's raw cursor, which sends it as it is. Through the ordinary cursor psycopg turned each `%(name)s`
into `$n` on every execution, by a regular expression over the whole text; its cache of those is only
for statements of at most 4 KiB, and a purchase's read of its facts and holdings is longer (4.6-5.0 KiB):
that scan cost about 8% of the server's CPU under a purchase load.

What may be prepared: statements whose every parameter is an ordinary bind (no expanding IN list, no
literal_execute), so that one SQL string serves every call; `Prepared` refuses any other at compile.
They are announced to the engine's before_cursor_execute listeners as SQLAlchemy's own are (with no
execution context), so that a test counting a path's statements still sees them; SQLAlchemy's echo
logging does not.

Round trips (PostgreSQL). Each statement waits for its answer, and under load each wait costs more
than the statement (a thread switch to the database and back, and the GIL to take again). Two are
spared without changing what runs in which order: a statement whose result nobody reads, only its
effect on what follows and on the commit (a lock; a purchase's history, timed events, ledger entry),
may be `defer`red: it goes to the server just before the connection's next statement, in the same
round trip when that one is a Prepared one (psycopg's pipeline mode: the statements still run one
after another, each with its own snapshot, and the first error stops the rest). And a Prepared
statement that opens its transaction goes with the BEGIN psycopg sends first. Whatever runs the next
statement otherwise (SQLAlchemy, the commit) sends the deferred ones first (`run_deferred`, which
store/db.py calls from the engine's events); a rollback forgets them. The last statement of a
transaction may take the COMMIT with it (`rows(..., then_commit=True)`: store/db.py's change counters),
so that a write's last wait is its commit's.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import CompileError, DBAPIError
from sqlalchemy.sql.elements import ClauseElement

_REQUIRED: Any = object()  # a bind with no value of its own: the caller must give one
DEFERRED = "hyperplan_deferred"  # a connection's info: [(sql, bound)] to send before its next statement
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open, the next statement's BEGIN is still to be sent
_TUPLES_OK = 2  # libpq's PGRES_TUPLES_OK: a result with rows (perhaps none of them)
_NO_RESULT: Any = object()


@dataclass(frozen=True)
class _Form:
    """A statement as one dialect runs it."""

    sql: str
    positional: bool
    names: tuple[str, ...]  # every bind, in the order a positional driver takes them
    # per name in `names`: its type's processor (None: the value as it is), its own value or _REQUIRED
    steps: tuple[tuple[str, Callable[[Any], Any] | None, Any], ...]

    def bind(self, params: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        values = []
        for name, process, default in self.steps:
            value = params[name] if default is _REQUIRED or name in params else default
            values.append(value if process is None or value is None else process(value))
        return tuple(values) if self.positional else dict(zip(self.names, values, strict=True))


class Prepared:
    """A Core statement compiled once per dialect, run on the driver's cursor (see the module)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._forms: dict[str, _Form] = {}
        with _MADE_LOCK:
            _MADE.add(self)

    def rows(
        self, connection: Connection, params: Mapping[str, Any], *, then_commit: bool = False
    ) -> list[tuple[Any, ...]]:
        """Execute once; the rows it returns (none for a statement without RETURNING or a result).
        `then_commit` (PostgreSQL only): the transaction's COMMIT goes in the same round trip, after
        it; the caller's own commit then has nothing left to send (psycopg sends nothing to commit an
        idle connection). If anything before it fails, nothing is committed and the error is raised."""
        form = self._form(connection.dialect)
        bound = form.bind(params)
        deferred = _take_deferred(connection)
        cursor = _cursor(connection)
        try:
            for sql, earlier in deferred:
                _announce(connection, cursor, sql, earlier, many=False)
            _announce(connection, cursor, form.sql, bound, many=False)
            with _as_sqlalchemy_errors(connection, cursor, form.sql, bound):
                if deferred or then_commit or _opens_transaction(connection):
                    with _pipeline(connection, deferred):
                        cursor.execute(form.sql, bound)
                        if then_commit:
                            # As a statement: psycopg's commit() would sync the pipeline, and its end
                            # sync it again, an empty round trip.
                            connection.connection.dbapi_connection.cursor().execute("COMMIT")  # type: ignore[union-attr]
                else:
                    cursor.execute(form.sql, bound)
                return [tuple(row) for row in cursor.fetchall()] if _has_rows(cursor) else []
        finally:
            cursor.close()

    def run_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row (the driver's executemany); nothing is returned."""
        if not rows:
            return
        form = self._form(connection.dialect)
        deferred = _take_deferred(connection)
        cursor = _cursor(connection)
        try:
            bound: Any = [form.bind(row) for row in rows]
            for sql, earlier in deferred:
                _announce(connection, cursor, sql, earlier, many=False)
            _announce(connection, cursor, form.sql, bound, many=True)
            pipelined = _pipeline(connection, deferred) if deferred else nullcontext()
            with _as_sqlalchemy_errors(connection, cursor, form.sql, bound), pipelined:
                cursor.executemany(form.sql, bound)
        finally:
            cursor.close()

    def defer(self, connection: Connection, params: Mapping[str, Any]) -> None:
        """Run just before the connection's next statement, on PostgreSQL in the same round trip when
        that one is a Prepared one (see the module); at once on any other database. For a statement
        whose result nobody reads (a lock): an error it meets is raised by the next statement."""
        if connection.dialect.name != "postgresql":
            self.rows(connection, params)
            return
        form = self._form(connection.dialect)
        connection.info.setdefault(DEFERRED, []).append((form.sql, form.bind(params)))

    def _form(self, dialect: Dialect) -> _Form:
        form = self._forms.get(dialect.name)
        if form is None:
            form = self._forms[dialect.name] = _compile(self.statement, dialect)
        return form


_MADE: weakref.WeakSet[Prepared] = weakref.WeakSet()
"""Every statement prepared in this process and still in use. The service's live as long as it does: they
are made at import, or once per shape by a cached factory (a purchase's reads per number of pools, say);
one a test makes and drops goes."""
_MADE_LOCK = threading.Lock()  # a request may make a new shape while the set is read


def compile_every(dialect: Dialect) -> int:
    """Compile for `dialect` every statement prepared so far (those compiled already cost nothing); how
    many there are. At a server's start (services/plans/plan_purchase.py compile_ahead), so that no
    request compiles one: a purchase compiles its statements in its write, under its pools' locks, and
    the read of its facts and holdings alone took 17 ms to compile."""
    with _MADE_LOCK:
        made = list(_MADE)
    for statement in made:
        # One made for another database (a process that opened both: the tests), or that cannot be
        # prepared, fails when it is first run, as without this.
        with suppress(ValueError, CompileError):
            statement._form(dialect)
    return len(made)


def run_deferred(connection: Connection) -> None:
    """Send the connection's deferred statements now, in one round trip (before a statement that is not
    a Prepared one, or the commit)."""
    deferred = _take_deferred(connection)
    if not deferred:
        return
    sql, bound = deferred[-1]
    cursor = _cursor(connection)
    try:
        with _as_sqlalchemy_errors(connection, cursor, sql, bound), _pipeline(connection, deferred[:-1]):
            cursor.execute(sql, bound)
    finally:
        cursor.close()


def drop_deferred(info: dict[Any, Any]) -> None:
    """Forget a connection's deferred statements (its transaction rolled back; it goes back to the
    pool)."""
    info.pop(DEFERRED, None)


def _take_deferred(connection: Connection) -> list[tuple[str, Any]]:
    if connection.dialect.name != "postgresql":
        return []
    return connection.info.pop(DEFERRED, None) or []


def _has_rows(cursor: Any) -> bool:
    """The statement returned rows (psycopg: read from its result's status, without building the
    cursor's description, a Column object per column and call)."""
    result = getattr(cursor, "pgresult", _NO_RESULT)
    if result is _NO_RESULT:  # another driver
        return cursor.description is not None
    return result is not None and result.status == _TUPLES_OK


def _opens_transaction(connection: Connection) -> bool:
    """PostgreSQL: the statement opens the transaction, so psycopg sends a BEGIN before it."""
    if connection.dialect.name != "postgresql":
        return False
    driver: Any = connection.connection.dbapi_connection
    return bool(driver.pgconn.transaction_status == _IDLE and not driver.autocommit)


@contextmanager
def _pipeline(connection: Connection, deferred: Sequence[tuple[str, Any]]) -> Iterator[None]:
    """psycopg's pipeline: the deferred statements, then what the block executes, sent together; their
    answers (and the first error) once the block ends."""
    driver: Any = connection.connection.dbapi_connection
    with driver.pipeline():
        for sql, bound in deferred:
            _cursor(connection).execute(sql, bound)
        yield


def _cursor(connection: Connection) -> Any:
    """A cursor of the connection's driver for a Prepared statement's SQL: on PostgreSQL psycopg's raw
    cursor (the SQL has PostgreSQL's own placeholders, `_compile`), elsewhere the ordinary one."""
    if connection.dialect.name == "postgresql":
        from psycopg import RawCursor  # only a PostgreSQL store needs its driver

        driver: Any = connection.connection.dbapi_connection
        return RawCursor(driver)
    return connection.connection.cursor()


@contextmanager
def _as_sqlalchemy_errors(connection: Connection, cursor: Any, sql: str, params: Any) -> Iterator[None]:
    """The driver's own errors raised as SQLAlchemy raises them for its statements (a racing duplicate
    is sqlalchemy.exc.IntegrityError, which callers turn into ResourceInUse, not a 500), and a lost
    connection invalidated, so that the pool does not hand it out again (store/db.py retries on it)."""
    dialect = connection.dialect
    try:
        yield
    except dialect.loaded_dbapi.Error as error:
        lost = dialect.is_disconnect(error, connection.connection.dbapi_connection, cursor)
        if lost:
            connection.invalidate(error)
        raise DBAPIError.instance(
            sql, params, error, dialect.loaded_dbapi.Error, connection_invalidated=lost, dialect=dialect
        ) from error


def _announce(connection: Connection, cursor: Any, sql: str, params: Any, *, many: bool) -> None:
    """Tell the engine's before_cursor_execute listeners, if any (a test counting statements), as
    SQLAlchemy would; without a listener this costs one check."""
    listeners = connection.dispatch.before_cursor_execute
    if listeners:
        listeners(connection, cursor, sql, params, None, many)


def _compile(statement: ClauseElement, dialect: Dialect) -> _Form:
    compiled: Any = statement.compile(dialect=_raw_placeholders(dialect))
    # Each parameter by the name the SQL gives it (an anonymous one's, param_1, is made at compile).
    binds = {name: bind for bind, name in compiled.bind_names.items()}
    for name, bind in binds.items():
        if bind.expanding or bind.literal_execute:
            raise ValueError(f"{name}: an expanding or literal-execute parameter cannot be prepared")
    positional = bool(compiled.positional)
    names = tuple(compiled.positiontup) if positional else tuple(binds)
    steps = tuple(
        (
            name,
            binds[name].type.bind_processor(dialect),
            _REQUIRED if binds[name].required else binds[name].effective_value,
        )
        for name in names
    )
    return _Form(compiled.string, positional, names, steps)


def _raw_placeholders(dialect: Dialect) -> Dialect:
    """PostgreSQL: the dialect as it is (its server's version and features, read when it connected), but
    compiling its placeholders as $1, $2, ... (SQLAlchemy's numeric_dollar: a name used twice takes one
    number), for psycopg's raw cursor; with no `%` doubled, since nothing reads the text for them. Any
    other database: the dialect itself."""
    if dialect.name != "postgresql":
        return dialect
    raw: Any = copy.copy(dialect)
    raw.paramstyle, raw.positional = "numeric_dollar", True
    raw.identifier_preparer = raw.preparer(raw)  # it decides, from the paramstyle, whether `%` is doubled
    return raw
