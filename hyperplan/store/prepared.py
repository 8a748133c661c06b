"""Statements a hot path runs many times a second, handed straight to the driver's cursor.

SQLAlchemy's Core spends 60-80 µs of CPU on each statement it executes (an execution context, the
compiled form looked up by a cache key built per call, each value and each row through its type), about
seven times what the driver itself costs; a purchase's dozen statements spent most of its CPU there
(issue 20). A `Prepared` statement is still declared with Core, over the schema's tables, and compiled
by SQLAlchemy, once per dialect; running it binds each value with its column type's own processor (the
integer microseconds of UTCDateTime, the text of DecimalString) and executes on the DBAPI cursor of the
caller's connection, inside the caller's transaction. Rows come back as the driver gives them: the
caller converts what it reads (`from_micros`, `Decimal`).

What may be prepared: statements whose every parameter is an ordinary bind (no expanding IN list, no
literal_execute), so that one SQL string serves every call; `Prepared` refuses any other at compile.
They are announced to the engine's before_cursor_execute listeners as SQLAlchemy's own are (with no
execution context), so that a test counting a path's statements still sees them; SQLAlchemy's echo
logging does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ClauseElement

_REQUIRED: Any = object()  # a bind with no value of its own: the caller must give one


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

    def rows(self, connection: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """Execute once; the rows it returns (none for a statement without RETURNING or a result)."""
        form = self._form(connection.dialect)
        cursor = connection.connection.cursor()
        try:
            bound = form.bind(params)
            _announce(connection, cursor, form.sql, bound, many=False)
            with _as_sqlalchemy_errors(connection, cursor, form.sql, bound):
                cursor.execute(form.sql, bound)
                return [tuple(row) for row in cursor.fetchall()] if cursor.description else []
        finally:
            cursor.close()

    def run_many(self, connection: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per row (the driver's executemany); nothing is returned."""
        if not rows:
            return
        form = self._form(connection.dialect)
        cursor = connection.connection.cursor()
        try:
            bound: Any = [form.bind(row) for row in rows]
            _announce(connection, cursor, form.sql, bound, many=True)
            with _as_sqlalchemy_errors(connection, cursor, form.sql, bound):
                cursor.executemany(form.sql, bound)
        finally:
            cursor.close()

    def _form(self, dialect: Dialect) -> _Form:
        form = self._forms.get(dialect.name)
        if form is None:
            form = self._forms[dialect.name] = _compile(self.statement, dialect)
        return form


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
    compiled: Any = statement.compile(dialect=dialect)
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
