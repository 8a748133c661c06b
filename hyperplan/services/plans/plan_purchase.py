"""Buying a plan, written as a handful of SQLAlchemy Core statements in the buyer's transaction.

A purchase is the service's busiest write (issue 20). Through the ORM's unit of work it cost ~32
statements and most of its CPU in SQLAlchemy; here, in one transaction (store/db.py's `write`), with
each statement compiled once and run on the driver's cursor (store/prepared.py: SQLAlchemy's own
execution cost several times the driver's):

1. PostgreSQL only: the account's row and the pools' locks (store/locks.py), before any read.
2. One read of the account: its quotas and payment mode, the drain setting, whether the name or the
   offering is taken, the plans it holds and its live webhooks.
3. One read of what is held: the pools' capacity over the segments' windows and the account's own
   holdings the quotas weigh. On PostgreSQL 2 and 3 are one statement (read_facts_and_holdings), sent
   with the locks of 1: one round trip; it also draws the ids the rows of 4 take (NewIds).
4. The rows as they end up, each table in one statement: the plan (already Scheduled when it is paid at
   once), its segments, the invoice (already settled), the ledger line, the plan's history, the status
   events, the timed events and any webhook deliveries (one INSERT ... SELECT: each history entry to
   each live webhook). The change counters move in the one statement the commit makes (Database.wrote).
   On PostgreSQL every row but the deliveries goes with that statement, in its round trip
   (store/prepared.py `defer`): none waits for an answer with the pools' locks held.

What is written is what the step-by-step path wrote (lifecycle.py, payments.py): the same rows, the same
history in the same order, the same messages. A payment that fails at once (a budget short of the fee)
is the one case left to that path: the plan is written as bought, then payments.issue settles and fails it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Connection,
    Integer,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.operators import custom_op

from hyperplan.clock import utcnow
from hyperplan.core.calendar import micros, micros_slot_span, peak_in_slots, slot_span
from hyperplan.core.fleet import Pool
from hyperplan.core.lifecycle import (
    PLAN_LIFECYCLE,
    RESERVED_CAPACITY_LIFECYCLE,
    PlanStatus,
    Window,
    status_at,
    status_message,
)
from hyperplan.core.offering_ids import OfferingClaim, OfferingSegment
from hyperplan.core.quotas import Interval
from hyperplan.core.pricing import segment_price
from hyperplan.core.status import INVOICE_LIFECYCLE, InvoiceStatus
from hyperplan.errors import ResourceInUse, ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import lifecycle, payments, quotas
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import refuse_if_full
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.locks import lock_account, lock_pools
from hyperplan.store.prepared import Prepared
from hyperplan.store.schema import (
    Account,
    Invoice,
    LedgerEntry,
    PlanEvent,
    PlanExtension,
    ReservedCapacity,
    ScheduledEvent,
    Setting,
    StatusEvent,
    TrainingPlan,
    Webhook,
    WebhookDelivery,
)
from hyperplan.store.types import from_micros

Segments = Sequence[tuple[Pool, OfferingSegment]]

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


def _insert_one(connection: Connection, table: Table, row: dict[str, Any], drawn_id: int | None) -> int:
    """Insert `row` into `table`; its id. With `drawn_id` (PostgreSQL) the insert is deferred
    (store/prepared.py `defer`): it goes with the transaction's next statement, and nothing waits for it."""
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


def _insert_all(
    connection: Connection, table: Table, rows: Sequence[dict[str, Any]], *, deferred: bool = False
) -> None:
    """`rows` of `table` in one statement (ids given in their order), not one each as executemany runs
    them: in the writers' turn each statement is a wait for the GIL again (the driver lets it go).
    `deferred`: sent with the transaction's next statement (store/prepared.py `defer`)."""
    if len(rows) == 1:
        statement, params = _rows_insert(table, 1), rows[0]
    else:
        statement = _rows_insert(table, len(rows))
        params = {f"{key}_{i}": value for i, row in enumerate(rows) for key, value in row.items()}
    if deferred:
        statement.defer(connection, params)
    else:
        statement.rows(connection, params)


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


_PAID_HOW = {"auto": "paid automatically", "budget": "paid from the budget"}  # payments._pay's notes


@dataclass(frozen=True)
class AccountFacts:
    """What one query tells a purchase about its account (quotas.QuotaHolder, and more)."""

    id: str
    name: str
    payment_mode: str
    budget: Decimal
    max_active_plans: int | None
    max_reserved_instances_per_type: int | None
    max_reserved_instance_hours_per_30_days: int | None
    max_on_demand_instances_per_type: int | None
    drain: str | None  # the drain setting's stored value
    name_taken: bool
    offering_taken: bool
    active_plans: int
    webhooks: int  # live ones


def _facts_query() -> Select[Any]:
    account: BindParameter[str] = bindparam("account")
    name: BindParameter[str] = bindparam("name")
    offering: BindParameter[str] = bindparam("offering")
    plans = TrainingPlan
    hooks = (
        select(func.count(Webhook.id))
        .where(Webhook.account_id == account, Webhook.deleted_at.is_(None))
        .scalar_subquery()
    )
    return select(
        Account.id,
        Account.name,
        Account.payment_mode,
        Account.budget,
        Account.max_active_plans,
        Account.max_reserved_instances_per_type,
        Account.max_reserved_instance_hours_per_30_days,
        Account.max_on_demand_instances_per_type,
        select(Setting.value).where(Setting.key == drain_state.SETTING).scalar_subquery(),
        exists().where(plans.account_id == account, plans.name == name),
        exists().where(plans.offering_id == offering),
        quotas.active_plans(account).scalar_subquery(),
        hooks,
    ).where(Account.id == account)


_FACTS = Prepared(_facts_query())
_FACTS_COLUMNS = len(_facts_query().selected_columns)


def read_facts(connection: Connection, account_id: str, name: str, offering_id: str) -> AccountFacts:
    found = _FACTS.rows(connection, {"account": account_id, "name": name, "offering": offering_id})
    if not found:
        raise ResourceNotFound(f"No account {account_id!r}.")
    return _facts_of(found[0])


def _facts_of(row: Sequence[Any]) -> AccountFacts:
    return AccountFacts(
        id=row[0],
        name=row[1],
        payment_mode=row[2],
        budget=Decimal(row[3]),
        max_active_plans=row[4],
        max_reserved_instances_per_type=row[5],
        max_reserved_instance_hours_per_30_days=row[6],
        max_on_demand_instances_per_type=row[7],
        drain=row[8],
        name_taken=bool(row[9]),
        offering_taken=bool(row[10]),
        active_plans=row[11] or 0,
        webhooks=row[12] or 0,
    )


# -- what is held ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holdings:
    """Capacity held in the purchase's pools over its windows, and what the account holds that its
    quotas weigh: (instance type, availability zone, start, end, count) each. The pools' times stay in
    the store's microseconds: the capacity check works in slots, and a datetime per row, converted back
    to microseconds there, cost more than the check's sweep."""

    pools: list[tuple[str, str, int, int, int]]
    account: list[tuple[str, str, datetime, datetime, int]]

    def booked_in_pool(self, pool: Pool, start: datetime, end: datetime) -> int:
        """peak_booked_slots of what `pool` holds that overlaps [start, end): the most instances held
        in any of the window's slots."""
        low, high = micros(start), micros(end)
        instance_type, zone = pool.key
        spans = [
            micros_slot_span(s, e, n)
            for t, z, s, e, n in self.pools
            if s < high and e > low and e > s and t == instance_type and z == zone
        ]
        return peak_in_slots(spans, *slot_span(start, end))

    def of_account(self, instance_type: str | None, start: datetime, end: datetime) -> list[Interval]:
        return [
            (s, e, n)
            for t, _, s, e, n in self.account
            if (instance_type is None or t == instance_type) and s < end and e > start
        ]


_UNINDEXED: custom_op[Any] = custom_op("+")  # SQLite's unary +: the value as it is, from no index


@cache
def _holdings_query(pool_count: int, every_type: bool, packed: bool) -> Prepared:
    """Held capacity (segments, then unpaid extensions) in `pool_count` pools between :low and :high,
    then the account's own (of the pools' types, or of every type) between :alow and :ahigh; tagged 0
    and 1. `packed` (SQLite): every row in one, as a JSON array of arrays. The driver lets the GIL go
    for each row it steps to, and takes it back after: in the writers' turn, with the process's other
    threads at work, each take can wait (a busy pool's window holds tens of rows); one row, one wait."""
    rows = _holdings_rows(pool_count, every_type, unindexed_type=packed)
    if not packed:
        return Prepared(rows)
    each = rows.subquery()
    return Prepared(select(func.json_group_array(func.json_array(*each.c))))


@cache
def _facts_and_holdings_query(pool_count: int, every_type: bool, segment_ids: int) -> Prepared:
    """PostgreSQL: the account's facts and what is held, in one statement (one round trip, one
    snapshot), the holdings packed as one JSON array of arrays in the facts' row; then, when
    `segment_ids` > 0, the new plan's id, its invoice's and its `segment_ids` segments' (NewIds)."""
    each = _holdings_rows(pool_count, every_type, unindexed_type=False).subquery()
    packed = select(func.json_agg(func.json_build_array(*each.c))).scalar_subquery()
    query = _facts_query().add_columns(packed)
    if segment_ids:
        query = query.add_columns(
            _next_id(_PLANS), _next_id(_INVOICES), *(_next_id(_SEGMENTS) for _ in range(segment_ids))
        )
    return Prepared(query)


def _next_id(table: Table) -> Any:
    """PostgreSQL: the next value of the sequence that numbers `table`'s rows (its SERIAL id)."""
    sequence = func.pg_get_serial_sequence(table.name, table.c.id.name)
    return func.nextval(sequence.cast(REGCLASS))


@dataclass(frozen=True)
class NewIds:
    """A PostgreSQL purchase's rows' ids, drawn from their sequences in its locked read: its rows then
    need no answer from the server, and go with its commit (store/prepared.py `defer`), not one wait
    each with its pools' locks held. A purchase refused after the read leaves its ids unused (a
    sequence has gaps anyway: a rolled-back insert leaves one too)."""

    plan: int
    invoice: int
    segments: tuple[int, ...]  # by ordinal


def _holdings_rows(pool_count: int, every_type: bool, *, unindexed_type: bool) -> Any:
    """The union _holdings_query reads (see there); `unindexed_type` (SQLite): the account's rows
    compared on their type as `+instance_type` (see of_types)."""
    rc, ext = ReservedCapacity, PlanExtension

    def in_pools(table: Any) -> Any:
        return or_(
            *(
                and_(table.instance_type == bindparam(f"t{i}"), table.availability_zone == bindparam(f"z{i}"))
                for i in range(pool_count)
            )
        )

    def of_types(table: Any) -> Any:
        # The pools' types, one comparison each (a type twice is harmless): no expanding IN list, so
        # that the statement can be prepared. On SQLite the type is compared as `+instance_type`, which
        # no index serves: without statistics its planner otherwise read every segment of the type,
        # any account's (the pools' index leads with the type), to keep the account's few; this way it
        # reads the account's plans, then their segments (a third of the time on the bench's store).
        # PostgreSQL plans from its statistics, and has no unary + on text.
        instance_type = table.instance_type
        if unindexed_type:
            instance_type = UnaryExpression(instance_type, operator=_UNINDEXED)
        return (
            true() if every_type else or_(*(instance_type == bindparam(f"t{i}") for i in range(pool_count)))
        )

    low, high, alow, ahigh = (
        bindparam(n, type_=ReservedCapacity.start.type) for n in ("low", "high", "alow", "ahigh")
    )

    def held(table: Any, end: Any) -> tuple[Select[Any], Select[Any]]:
        """Its rows in the pools, then the account's own (the union's tags 0 and 1)."""
        columns = (table.instance_type, table.availability_zone, table.start, end, table.count)
        in_pool = select(literal(0), *columns).where(
            table.holds_capacity.is_(True), in_pools(table), table.start < high, end > low
        )
        the_accounts = (
            select(literal(1), *columns)
            .join(TrainingPlan, TrainingPlan.id == table.plan_id)
            .where(
                TrainingPlan.account_id == bindparam("account"),
                of_types(table),
                table.holds_capacity.is_(True),
                table.start < ahigh,
                end > alow,
            )
        )
        return in_pool, the_accounts

    segments_in_pool, segments_of_account = held(rc, func.coalesce(rc.released_at, rc.end))
    extensions_in_pool, extensions_of_account = held(ext, ext.end)
    return union_all(segments_in_pool, extensions_in_pool, segments_of_account, extensions_of_account)


def _holdings_params(
    account_id: str, segments: Segments, count: int, every_type: bool
) -> tuple[int, dict[str, Any]]:
    """The holdings query's pool count and parameters."""
    pools = sorted({pool.key for pool, _ in segments})
    low = min(s.start for _, s in segments)
    high = max(s.end for _, s in segments)
    alow, ahigh = (
        quotas.hours_span([(s.start, s.end, count) for _, s in segments]) if every_type else (low, high)
    )
    params: dict[str, Any] = {"low": low, "high": high, "alow": alow, "ahigh": ahigh, "account": account_id}
    for i, (instance_type, zone) in enumerate(pools):
        params[f"t{i}"], params[f"z{i}"] = instance_type, zone
    return len(pools), params


def read_holdings(
    connection: Connection, account_id: str, segments: Segments, count: int, every_type: bool
) -> Holdings:
    pool_count, params = _holdings_params(account_id, segments, count, every_type)
    packed = connection.dialect.name == "sqlite"
    rows: Any = _holdings_query(pool_count, every_type, packed).rows(connection, params)
    return _holdings_of(json.loads(rows[0][0]) if packed else rows)


def read_facts_and_holdings(
    connection: Connection,
    account_id: str,
    name: str,
    offering_id: str,
    segments: Segments,
    count: int,
    every_type: bool,
    *,
    new_ids: bool = False,
) -> tuple[AccountFacts, Holdings, NewIds | None]:
    """PostgreSQL: read_facts and read_holdings in one statement; with `new_ids` (a write transaction:
    a read-only one cannot draw from a sequence), the ids of the purchase's rows too."""
    pool_count, params = _holdings_params(account_id, segments, count, every_type)
    params.update(name=name, offering=offering_id)
    query = _facts_and_holdings_query(pool_count, every_type, len(segments) if new_ids else 0)
    found = query.rows(connection, params)
    if not found:
        raise ResourceNotFound(f"No account {account_id!r}.")
    row = found[0]
    facts, ids = row[:_FACTS_COLUMNS], None
    held = _holdings_of(row[_FACTS_COLUMNS] or [])
    if new_ids:
        plan, invoice, *segment_ids = row[_FACTS_COLUMNS + 1 :]
        ids = NewIds(plan, invoice, tuple(sorted(segment_ids)))
    return _facts_of(facts), held, ids


def _holdings_of(rows: Any) -> Holdings:
    found = Holdings([], [])
    times: dict[int, datetime] = {}  # segments mostly share the day grid's few instants
    for tag, instance_type, zone, start, end, held in rows:
        if not tag:
            found.pools.append((instance_type, zone, start, end, held))
            continue
        if (begins := times.get(start)) is None:
            begins = times[start] = from_micros(start)
        if (ends := times.get(end)) is None:
            ends = times[end] = from_micros(end)
        found.account.append((instance_type, zone, begins, ends, held))
    return found


# -- the purchase ------------------------------------------------------------------------------------


def price_of(segments: Segments, count: int) -> Decimal:
    """The fee follows from the segments and the fleet's prices, exactly as the search priced it."""
    return sum((segment_price(pool, s.start, s.end, count) for pool, s in segments), start=Decimal("0"))


@dataclass(frozen=True)
class Terms:
    """What follows from the request alone: the fee, the statuses and messages of a plan paid at once
    (the account's payment mode and budget decide, in the turn), the segments' timed events (kind, due,
    JSON payload), the payment deadline and the history's first message."""

    fee: Decimal
    currency: str
    paid_status: PlanStatus
    paid_message: str
    paid_segments: list[PlanStatus | None]
    timed: list[tuple[str, datetime, str]]
    due_at: datetime
    bought: str


def _terms(
    runtime: ServiceContext, offering_id: str, claim: OfferingClaim, segments: Segments, now: datetime
) -> Terms:
    fee, currency = price_of(segments, claim.count), segments[0][0].currency
    windows = [Window(s.start, s.end) for _, s in segments]
    paid_status = status_at(windows, now)
    policy = runtime.lifecycle.policies(claim.target)
    return Terms(
        fee=fee,
        currency=currency,
        paid_status=paid_status,
        paid_message=status_message(windows, paid_status, now),
        paid_segments=[
            status_at([window], now) if _segment_moves(window, now) else None for window in windows
        ],
        timed=[
            (kind, when, json.dumps(payload))
            for ordinal, (_, s) in enumerate(segments, start=1)
            for kind, when, payload in lifecycle.segment_events(s.start, s.end, ordinal, policy, now)
        ],
        due_at=payments.payment_deadline(min(s.start for _, s in segments), now),
        bought=f"Bought offering {offering_id} for {fee} {currency}.",
    )


def _segment_moves(window: Window, now: datetime) -> bool:
    return RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus.PENDING, status_at([window], now))


_FACTS_READS = 3  # PostgreSQL: the account's facts and holdings read together at most this often


class Purchase:
    """One purchase (plans.create). Its `refusals` need only the request and the store's rows (on
    SQLite they are read first on a snapshot, Database.refuse_early); what follows from the request
    alone (`Terms`) is worked out once the purchase is not refused there (`work_out`), before it asks for
    the writers' turn; in the turn (Database.write_grouped) `check` reads and refuses, then `write`
    writes: only what needs the store's rows waits there."""

    def __init__(
        self,
        runtime: ServiceContext,
        caller: Caller,
        name: str,
        offering_id: str,
        claim: OfferingClaim,
        segments: Segments,
        now: datetime,
    ) -> None:
        self.runtime, self.caller, self.name, self.offering_id = runtime, caller, name, offering_id
        self.claim, self.segments, self.now = claim, segments, now
        self.booked = [(pool.key, s.start, s.end, claim.count) for pool, s in segments]
        self.facts: AccountFacts | None = None
        self.new_ids: NewIds | None = None  # PostgreSQL: drawn in the check
        self._terms: Terms | None = None

    def work_out(self) -> Terms:
        """The purchase's terms, worked out once (a refused purchase needs none of them)."""
        if self._terms is None:
            self._terms = _terms(self.runtime, self.offering_id, self.claim, self.segments, self.now)
        return self._terms

    def check(self, session: Session) -> None:
        """Every refusal the store can give, in the caller's write transaction (concurrent=True); reads
        only (store/group_commit.py runs it outside the purchase's savepoint), and on PostgreSQL draws
        the ids its rows will take (NewIds)."""
        # Before any read this purchase checks: what it reads can change only once it commits or rolls back.
        lock_account(session, self.caller.account_id)
        lock_pools(session, [pool.key for pool, _ in self.segments])
        self.facts = self._refusals(session.connection(), in_the_write=True)
        assert self.facts is not None, "under the account's lock its quotas do not change between reads"

    def refusals(self, connection: Connection) -> AccountFacts | None:
        """The checks of `check` on `connection` (which takes no lock), run before the write
        (Database.refuse_early: on PostgreSQL outside any transaction, each statement its own snapshot);
        the account's facts read. None: not decided here (PostgreSQL: the account's quotas changed
        between each of its reads; the write decides, under the account's lock)."""
        return self._refusals(connection, in_the_write=False)

    def _refusals(self, connection: Connection, *, in_the_write: bool) -> AccountFacts | None:
        account, held = self.caller.account_id, None
        if connection.dialect.name == "postgresql":
            found = self._facts_and_holdings(connection, new_ids=in_the_write)
            if found is None:
                return None
            facts, held, self.new_ids = found
        else:
            facts = read_facts(connection, account, self.name, self.offering_id)
        _check(self.runtime, connection, facts, self.name, self.offering_id, self.claim, self.segments, held)
        return facts

    def _facts_and_holdings(
        self, connection: Connection, *, new_ids: bool
    ) -> tuple[AccountFacts, tuple[Holdings, bool], NewIds | None] | None:
        """PostgreSQL: the account's facts and what is held, read together in one statement (one round
        trip, one snapshot: the account's limits are never weighed against holdings read at another
        instant), with `new_ids` the ids of its rows too. Whether the quotas weigh the account's
        holdings of every type is known only from its facts: read as the fleet's default says, and read
        again, all together, when the account's own quota says otherwise. None: it said otherwise again
        (its quotas changed between the reads; under the account's lock they cannot)."""
        every_type = self.runtime.fleet.quotas.max_reserved_instance_hours_per_30_days is not None
        for _ in range(_FACTS_READS):
            facts, read, ids = read_facts_and_holdings(
                connection,
                self.caller.account_id,
                self.name,
                self.offering_id,
                self.segments,
                self.claim.count,
                every_type,
                new_ids=new_ids,
            )
            weighed = quotas.limits(self.runtime, facts).max_reserved_instance_hours_per_30_days is not None
            if weighed == every_type:
                return facts, (read, every_type), ids
            every_type = weighed
        return None

    def write(self, session: Session) -> None:
        """The checked purchase's rows, in the same transaction as `check`."""
        assert self.facts is not None, "a purchase is checked before it is written"
        _Rows(self, session, self.facts).write()


def _check(
    runtime: ServiceContext,
    connection: Connection,
    facts: AccountFacts,
    name: str,
    offering_id: str,
    claim: OfferingClaim,
    segments: Segments,
    already: tuple[Holdings, bool] | None = None,
) -> None:
    """Every refusal a purchase can meet in the store, in the order the wire has always given them;
    `already`: what is held, already read (read_facts_and_holdings), and whether of every type."""
    drain_state.refuse_if(drain_state.from_setting(facts.drain), "CreateTrainingPlan")
    if facts.name_taken:
        raise ResourceInUse(f"A training plan named {name!r} already exists in this account.")
    if facts.offering_taken:
        raise ResourceNotFound(f"Training plan offering {offering_id} has already been bought; search again.")
    quotas.check_plans_held(runtime, facts, facts.active_plans)
    every_type = quotas.limits(runtime, facts).max_reserved_instance_hours_per_30_days is not None
    if already is not None and already[1] == every_type:
        held = already[0]
    else:
        held = read_holdings(connection, facts.id, segments, claim.count, every_type)
    for pool, s in segments:
        booked = held.booked_in_pool(pool, s.start, s.end)
        refuse_if_full(runtime.calendar.bookable(pool), booked, s.start, s.end, claim.count)
        mine = held.of_account(pool.instance_type, s.start, s.end)
        quotas.check_instances_held(runtime, facts, pool.instance_type, mine, s.start, s.end, claim.count)
    if every_type:
        adding = [(s.start, s.end, claim.count) for _, s in segments]
        low, high = quotas.hours_span(adding)
        quotas.check_hours_held(runtime, facts, held.of_account(None, low, high), adding)


class _Rows:
    """The rows of one checked purchase, gathered per table and written one statement a table."""

    def __init__(self, purchase: Purchase, session: Session, facts: AccountFacts) -> None:
        self.purchase, self.runtime, self.session = purchase, purchase.runtime, session
        self.connection = session.connection()
        self.caller, self.facts, self.claim, self.now = purchase.caller, facts, purchase.claim, purchase.now
        self.segments = purchase.segments
        self.ids = purchase.new_ids  # PostgreSQL: every row deferred, none waits for its id
        self.plan_id = 0
        self.history: list[dict[str, Any]] = []
        self.status_events: list[dict[str, Any]] = []
        self.timed: list[dict[str, Any]] = []

    def write(self) -> None:
        purchase, runtime, now, facts = self.purchase, self.runtime, self.now, self.facts
        name, offering_id, claim, segments = purchase.name, purchase.offering_id, self.claim, self.segments
        db = runtime.db
        terms = purchase.work_out()
        fee, currency = terms.fee, terms.currency
        # As payments.issue settles: auto pays, a budget pays if it can, any other mode (approval) waits
        # for an administrator.
        fails = facts.payment_mode == "budget" and facts.budget < fee
        how = None if fails else _PAID_HOW.get(facts.payment_mode)
        paid = how is not None
        status, message = PlanStatus.PENDING, "Awaiting payment of the upfront fee."
        if paid:
            status = terms.paid_status
            PLAN_LIFECYCLE.check(PlanStatus.PENDING, status)
            message = terms.paid_message
        plan = {
            "account_id": facts.id,
            "name": name,
            "offering_id": offering_id,
            "target": claim.target,
            "instance_type": segments[0][0].instance_type,
            "status": status,
            "status_message": message,
            "upfront_fee": fee,
            "currency": currency,
            "created_at": now,
            "updated_at": now,
        }
        self.plan_id = _insert_one(self.connection, _PLANS, plan, None if self.ids is None else self.ids.plan)
        statuses = terms.paid_segments if paid else [None] * len(segments)
        segment_ids = self._insert_segments(statuses)
        self._event("created", PlanStatus.PENDING, terms.bought)
        for kind, when, payload in terms.timed:
            self._schedule(kind, when, payload)
        booked = purchase.booked
        # Booked in memory once committed; a payment that fails below releases it again, in that order.
        session = self.session
        after_commit(session, lambda: runtime.calendar.book(booked, committed_change(session, CALENDAR)))
        for model in (TrainingPlan, ReservedCapacity, PlanEvent, ScheduledEvent):
            db.wrote(session, model)
        if fails:
            self._flush_history_and_timed()
            self._settle_by_the_step_by_step_path()
            return
        invoice_id = self._invoice(fee, currency, paid, how or "")
        self._event("invoiced", PlanStatus.PENDING, f"Invoice {invoice_id} for {fee} {currency} (the plan).")
        if paid:
            self._pay(invoice_id, fee, how or "", name, status, message, segment_ids, statuses)
        else:
            self._await_approval(invoice_id, fee, currency)
        self._flush_history_and_timed()
        if self.status_events:
            _insert_all(self.connection, _STATUS_EVENTS, self.status_events, deferred=True)
            db.wrote(session, StatusEvent)

    def _insert_segments(self, statuses: Sequence[str | None]) -> dict[int, int]:
        """The plan's segments, each in the status it ends up in (None: still pending); returns their
        ids by ordinal."""
        params: dict[str, Any] = {}
        ids = self.ids
        for i, ((pool, s), status) in enumerate(zip(self.segments, statuses, strict=True)):
            row: dict[str, Any] = {} if ids is None else {"id": ids.segments[i]}
            row |= {
                "plan_id": self.plan_id,
                "ordinal": i + 1,
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "count": self.claim.count,
                "start": s.start,
                "end": s.end,
                "status": status or PlanStatus.PENDING,
                "holds_capacity": True,
                "released_at": None,
            }
            params.update(
                {f"{key}_{i}": value for key, value in row.items()} if len(self.segments) > 1 else row
            )
        statement = _segments_insert(len(self.segments), ids is not None)
        if ids is not None:
            statement.defer(self.connection, params)
            return dict(enumerate(ids.segments, start=1))
        written = statement.rows(self.connection, params)
        return {ordinal: id_ for id_, ordinal in written}

    def _invoice(self, fee: Decimal, currency: str, paid: bool, how: str) -> int:
        invoice = {
            "account_id": self.facts.id,
            "plan_id": self.plan_id,
            "extension_id": None,
            "amount": fee,
            "currency": currency,
            "status": InvoiceStatus.PAID if paid else InvoiceStatus.PENDING,
            "created_at": self.now,
            "due_at": self.purchase.work_out().due_at,
            "settled_at": self.now if paid else None,
            "note": how,
        }
        self.runtime.db.wrote(self.session, Invoice)
        drawn = None if self.ids is None else self.ids.invoice
        return _insert_one(self.connection, _INVOICES, invoice, drawn)

    def _pay(
        self,
        invoice_id: int,
        fee: Decimal,
        how: str,
        name: str,
        status: PlanStatus,
        message: str,
        segment_ids: dict[int, int],
        statuses: Sequence[str | None],
    ) -> None:
        """What payments._pay and lifecycle.mark_paid write for a plan paid as it is bought."""
        db, session, now, facts = self.runtime.db, self.session, self.now, self.facts
        INVOICE_LIFECYCLE.check(InvoiceStatus.PENDING, InvoiceStatus.PAID)
        self._status_event(INVOICE_LIFECYCLE.kind, invoice_id, InvoiceStatus.PENDING, InvoiceStatus.PAID, how)
        budget = facts.budget
        if facts.payment_mode == "budget":
            budget -= fee
            _SET_BUDGET.defer(self.connection, {"account": facts.id, "budget": budget})
            db.wrote(session, Account, inserted=False, columns=("budget",))
        _INSERT_LEDGER.defer(
            self.connection,
            {
                "account_id": facts.id,
                "invoice_id": invoice_id,
                "at": now,
                "amount": -fee,
                "budget_after": budget,
                "description": f"Invoice {invoice_id}, plan {name}, the plan: {how}",
            },
        )
        db.wrote(session, LedgerEntry)
        self._event("paid", PlanStatus.PENDING, f"Invoice {invoice_id} {how}.")
        for ordinal, new in enumerate(statuses, start=1):
            if new is not None:
                self._status_event(
                    RESERVED_CAPACITY_LIFECYCLE.kind, segment_ids[ordinal], PlanStatus.PENDING, new, message
                )
        self._event("scheduled", status, message)

    def _await_approval(self, invoice_id: int, fee: Decimal, currency: str) -> None:
        """What payments.issue writes for an account whose invoices an administrator approves."""
        due_at = self.purchase.work_out().due_at
        message = (
            f"Awaiting an administrator's approval of invoice {invoice_id} ({fee} {currency}, the plan); "
            f"unpaid at {due_at:%Y-%m-%d %H:%M} UTC, the plan fails and its capacity is released."
        )
        _SET_MESSAGE.defer(self.connection, {"plan": self.plan_id, "message": message})
        self._event("awaiting-approval", PlanStatus.PENDING, message)
        self._schedule(lifecycle.PAYMENT_DEADLINE, due_at, json.dumps({"invoice": invoice_id}))

    def _settle_by_the_step_by_step_path(self) -> None:
        """A payment that fails at once: payments.issue invoices, fails the plan and releases what it
        holds, through the session (the rare case; the rows above are what it reads)."""
        plan = self.session.get(TrainingPlan, self.plan_id)
        assert plan is not None
        payments.issue(self.session, self.runtime.lifecycle, plan, self.now)

    def _flush_history_and_timed(self) -> None:
        """The plan's history (and a delivery of each entry to each live webhook), and the timed
        events gathered so far."""
        connection = self.connection
        if self.timed:
            _insert_all(connection, _TIMED, self.timed, deferred=True)
            self.timed = []
        if not self.history:
            return
        _insert_all(connection, _HISTORY, self.history, deferred=True)
        self.history = []
        if self.facts.webhooks:
            # Real time: the first attempt is due at once, whatever the service clock says.
            params = {"account": self.facts.id, "plan": self.plan_id, "sent_at": utcnow()}
            _QUEUE_DELIVERIES.rows(connection, params)
            self.runtime.db.wrote(self.session, WebhookDelivery)

    def _event(self, kind: str, status: str, message: str) -> None:
        self.history.append(
            {
                "plan_id": self.plan_id,
                "at": self.now,
                "kind": kind,
                "status": status,
                "message": message,
                "actor_user_id": self.caller.user_id,
            }
        )

    def _status_event(self, kind: str, entity_id: int, old: str, new: str, message: str) -> None:
        self.status_events.append(
            {
                "entity_kind": kind,
                "entity_id": entity_id,
                "from_status": old,
                "to_status": new,
                "at": self.now,
                "message": message,
            }
        )

    def _schedule(self, kind: str, when: datetime, payload: str) -> None:
        self.timed.append(
            {
                "due_at": when,
                "kind": kind,
                "subject": str(self.plan_id),
                "payload": payload,
                "done": False,
                "ran_at": None,
            }
        )
