"""A purchase's rows, each table's in one statement (services/plans/plan_purchase.py decides which rows;
core/status_rows.py shapes the history's, the status events', the timed events', the invoice's and the
ledger's).

Every statement is Core, compiled once (store/prepared.py) and run on the driver's cursor. Each insert
binds every column of its table but the id (or the id too, when it was drawn already: NewIds in
store/purchase_reads.py), by column name: a row that leaves a column out fails at once. A row whose
result nobody reads is deferred (store/prepared.py `defer`): it goes with the transaction's next
statement, in its round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Connection,
    Dialect,
    Integer,
    Table,
    Text,
    and_,
    bindparam,
    insert,
    literal,
    null,
    select,
    update,
)

from hyperplan.store.prepared import Prepared
from hyperplan.store.schema import (
    Account,
    Invoice,
    LedgerEntry,
    PlanEvent,
    ReservedCapacity,
    ScheduledEvent,
    StatusEvent,
    TrainingPlan,
    Webhook,
    WebhookDelivery,
)

Row = Mapping[str, Any]

_PLANS = cast(Table, TrainingPlan.__table__)
_SEGMENTS = cast(Table, ReservedCapacity.__table__)
_INVOICES = cast(Table, Invoice.__table__)
_LEDGER = cast(Table, LedgerEntry.__table__)
_HISTORY = cast(Table, PlanEvent.__table__)
_STATUS_EVENTS = cast(Table, StatusEvent.__table__)
_TIMED = cast(Table, ScheduledEvent.__table__)
_DELIVERIES = cast(Table, WebhookDelivery.__table__)
_ACCOUNTS = cast(Table, Account.__table__)
_WEBHOOKS = cast(Table, Webhook.__table__)


def _insert(table: Table, *, returning: Sequence[str] = (), rows: int = 1, with_id: bool = False) -> Prepared:
    """One row (or `rows` rows, in one statement) of every column but the id (`with_id`: the id too),
    bound by column name (`name_0`, `name_1`... for several rows): a caller that leaves a column out
    fails at once."""
    keys = [column.key for column in table.c if with_id or column.key != "id"]
    if rows == 1:
        values: Any = {key: bindparam(key) for key in keys}
    else:
        values = [
            {key: bindparam(f"{key}_{i}", type_=table.c[key].type) for key in keys} for i in range(rows)
        ]
    statement: Any = insert(table).values(values)
    if returning:
        statement = statement.returning(*(table.c[name] for name in returning))
    return Prepared(statement)


# Prepared once (store/prepared.py): each runs on the driver's cursor, past SQLAlchemy's execution.
_INSERT_LEDGER = _insert(_LEDGER)
_SET_BUDGET = Prepared(
    update(_ACCOUNTS).where(_ACCOUNTS.c.id == bindparam("account")).values(budget=bindparam("budget"))
)
_SET_MESSAGE = Prepared(
    update(_PLANS).where(_PLANS.c.id == bindparam("plan")).values(status_message=bindparam("message"))
)


@cache
def _one_row_insert(table: Table, with_id: bool) -> Prepared:
    """One row of `table`: its id given (drawn already, NewIds), or returned by the insert."""
    return _insert(table, with_id=True) if with_id else _insert(table, returning=("id",))


def _insert_one(connection: Connection, table: Table, row: Row, drawn_id: int | None) -> int:
    """Insert `row` into `table`; its id. With `drawn_id` (PostgreSQL) the insert is deferred: it goes
    with the transaction's next statement, and nothing waits for it."""
    if drawn_id is None:
        [(new_id,)] = _one_row_insert(table, False).rows(connection, row)
        return int(new_id)
    _one_row_insert(table, True).defer(connection, {"id": drawn_id, **row})
    return drawn_id


@cache
def _segments_insert(count: int, with_id: bool) -> Prepared:
    """A plan's `count` segments in one statement; without `with_id`, returning each one's (id,
    ordinal)."""
    if with_id:
        return _insert(_SEGMENTS, rows=count, with_id=True)
    return _insert(_SEGMENTS, returning=("id", "ordinal"), rows=count)


@cache
def _rows_insert(table: Table, count: int) -> Prepared:
    return _insert(table, rows=count)


def shapes_ahead(dialect: Dialect, segment_counts: Iterable[int], event_rows: int) -> None:
    """Make the statements a purchase of each of `segment_counts` segments writes (for compile_every),
    its rows of events from 1 to `event_rows` a table: on PostgreSQL each with its id drawn already,
    elsewhere returning it."""
    drawn = dialect.name == "postgresql"
    for table in (_PLANS, _INVOICES):
        _one_row_insert(table, drawn)
    for count in segment_counts:
        _segments_insert(count, drawn)
    for table in (_HISTORY, _STATUS_EVENTS, _TIMED):
        for count in range(1, event_rows + 1):
            _rows_insert(table, count)


def _flat(rows: Sequence[Row]) -> Row:
    """The parameters of a statement of several rows (`_insert(rows=...)`): each column of row i as
    `name_i`; one row's are its own."""
    if len(rows) == 1:
        return rows[0]
    return {f"{key}_{i}": value for i, row in enumerate(rows) for key, value in row.items()}


def _insert_all(connection: Connection, table: Table, rows: Sequence[Row]) -> None:
    """`rows` of `table` in one statement (ids given in their order), not one each as executemany runs
    them: in the writers' turn each statement is a wait for the GIL again (the driver lets it go);
    deferred, sent with the transaction's next statement."""
    _rows_insert(table, len(rows)).defer(connection, _flat(rows))


# -- the rows -------------------------------------------------------------------------------------------


def insert_plan(connection: Connection, row: Row, drawn_id: int | None) -> int:
    """The plan's row; its id (`drawn_id`, PostgreSQL: already drawn, and the insert deferred)."""
    return _insert_one(connection, _PLANS, row, drawn_id)


def insert_segments(
    connection: Connection, rows: Sequence[Row], drawn_ids: Sequence[int] | None
) -> dict[int, int]:
    """The plan's segments in one statement, in ordinal order (each row with its "ordinal"); their ids
    by ordinal. `drawn_ids` (PostgreSQL): their ids already drawn, in the same order; the insert is
    deferred."""
    if drawn_ids is not None:
        params = _flat([{"id": id_, **row} for id_, row in zip(drawn_ids, rows, strict=True)])
        _segments_insert(len(rows), True).defer(connection, params)
        return {row["ordinal"]: id_ for id_, row in zip(drawn_ids, rows, strict=True)}
    written = _segments_insert(len(rows), False).rows(connection, _flat(rows))
    return {ordinal: id_ for id_, ordinal in written}


def insert_invoice(connection: Connection, row: Row, drawn_id: int | None) -> int:
    """The invoice's row; its id (as insert_plan)."""
    return _insert_one(connection, _INVOICES, row, drawn_id)


def insert_ledger_entry(connection: Connection, row: Row) -> None:
    """A ledger line, deferred."""
    _INSERT_LEDGER.defer(connection, row)


def set_budget(connection: Connection, account_id: str, budget: Decimal) -> None:
    """The account's budget after a payment, deferred."""
    _SET_BUDGET.defer(connection, {"account": account_id, "budget": budget})


def set_status_message(connection: Connection, plan_id: int, message: str) -> None:
    """A new status message for the plan just inserted, deferred."""
    _SET_MESSAGE.defer(connection, {"plan": plan_id, "message": message})


def insert_history(connection: Connection, rows: Sequence[Row]) -> None:
    """Entries of a plan's history (plan_events), in order, in one deferred statement."""
    _insert_all(connection, _HISTORY, rows)


def insert_status_events(connection: Connection, rows: Sequence[Row]) -> None:
    """Status events, in order, in one deferred statement."""
    _insert_all(connection, _STATUS_EVENTS, rows)


def insert_timed_events(connection: Connection, rows: Sequence[Row]) -> None:
    """Timed events, in order, in one deferred statement."""
    _insert_all(connection, _TIMED, rows)


def _queue_deliveries_statement() -> Any:
    """A delivery of each of the plan's history entries to each live webhook of its account, in the
    order the step-by-step path queues them (entry, then webhook): one statement, whatever their number."""
    events, hooks = _HISTORY, _WEBHOOKS
    sent_at: BindParameter[datetime] = bindparam("sent_at", type_=_DELIVERIES.c.next_attempt_at.type)
    rows = (
        select(
            hooks.c.id,
            events.c.plan_id,
            events.c.id,
            literal(0, Integer),
            sent_at,
            literal("", Text),
            null(),
        )
        .select_from(
            events.join(hooks, and_(hooks.c.account_id == bindparam("account"), hooks.c.deleted_at.is_(None)))
        )
        .where(events.c.plan_id == bindparam("plan"))
        .order_by(events.c.id, hooks.c.id)
    )
    columns = ["webhook_id", "plan_id", "plan_event_id", "attempts", "next_attempt_at", "last_error"]
    return insert(_DELIVERIES).from_select([*columns, "delivered_at"], rows)


_QUEUE_DELIVERIES = Prepared(_queue_deliveries_statement())


def queue_deliveries(connection: Connection, account_id: str, plan_id: int, sent_at: datetime) -> None:
    """A delivery of each of the plan's history entries (inserted so far) to each live webhook of the
    account, the first attempt due at `sent_at`."""
    _QUEUE_DELIVERIES.rows(connection, {"account": account_id, "plan": plan_id, "sent_at": sent_at})
