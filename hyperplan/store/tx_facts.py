"""Facts a transaction reads once and reuses until it writes to a table they were read from.

A lifecycle batch (events/loop.py) runs up to a hundred timed events in one transaction, and every
plan event asks each service that follows plans (clusters, training jobs, spot runs) whether anything
of its own uses the plan: a query a service an event, which nearly always finds nothing (on the bench's
PostgreSQL store these reads were about a third of the loop's time). A fact read here, such as "the plans
any in-service cluster group uses", answers them all:

- before each use the session is flushed, as any query's autoflush would, so that the transaction's
  own pending changes have been seen;
- a flush that writes a row of one of the fact's tables, or an ORM statement (insert, update, delete,
  or text) that may write one, forgets the fact, and the next use reads it again;
- so does the end of any transaction or savepoint of the session: a rolled-back write may have been
  read into a fact.

A fact is only ever a shortcut in front of the exact query, used to skip it: "no cluster group uses
this plan" skips the reconcile; a plan the fact names still gets the full read. Writes that bypass the
session (`session.connection().execute`) are not seen, so no fact may be read from a table written
that way inside a transaction that uses it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.orm import (
    ORMExecuteState,
    Session,
    SessionTransaction,
    SessionTransactionOrigin,
    UOWTransaction,
)

T = TypeVar("T")

_FACTS = "hyperplan.tx_facts"  # session.info: {name: (its tables, its value)}


def fact(session: Session, name: str, tables: frozenset[str], read: Callable[[Session], T]) -> T:
    """The fact `name`, read by `read` at its first use in this transaction, or since the transaction
    last wrote one of `tables` (their names)."""
    session.flush()  # what this transaction has pending could change it: seen first, as a query would
    facts: dict[str, tuple[frozenset[str], Any]] = session.info.setdefault(_FACTS, {})
    known = facts.get(name)
    if known is not None:
        return known[1]
    value = read(session)
    facts[name] = (tables, value)
    return value


def _forget(session: Session, written: Iterable[str] | None) -> None:
    """Forget the facts read from any of the tables `written` (None: from any table)."""
    facts = session.info.get(_FACTS)
    if not facts:
        return
    if written is None:
        facts.clear()
        return
    names = set(written)
    for key in [key for key, (tables, _value) in facts.items() if tables & names]:
        del facts[key]


@event.listens_for(Session, "after_flush")
def _after_flush(session: Session, _flush: UOWTransaction) -> None:
    if not session.info.get(_FACTS):
        return
    # After a flush, new, dirty and deleted still hold what it wrote.
    written = chain(session.new, session.dirty, session.deleted)
    _forget(session, {table.name for obj in written for table in _tables_of(obj)})


def _tables_of(obj: object) -> Iterable[Any]:
    mapper = getattr(type(obj), "__mapper__", None)
    return mapper.tables if mapper is not None else ()


@event.listens_for(Session, "do_orm_execute")
def _on_execute(state: ORMExecuteState) -> None:
    if state.is_select or not state.session.info.get(_FACTS):
        return
    table = getattr(state.statement, "table", None)  # insert, update and delete name theirs
    name = getattr(table, "name", None)
    _forget(state.session, [name] if isinstance(name, str) else None)


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    if transaction.origin is SessionTransactionOrigin.SUBTRANSACTION:
        return  # a flush's own: what it wrote was seen by _after_flush, and a failed one ends the rest
    _forget(session, None)
