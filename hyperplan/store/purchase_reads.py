"""What a purchase reads before it writes (services/plans/plan_purchase.py weighs it): its account's facts
and what is held in its pools and by its account, in one or two prepared statements.

- `AccountFacts`: the account's quotas and payment mode, the drain setting, whether the plan's name or
  its offering is taken, the plans the account holds, its live webhooks.
- `Holdings`: the capacity held in the purchase's pools over its windows, and what the account holds
  that its quotas weigh.
- `NewIds` (PostgreSQL): the ids its rows will take, drawn in the same statement as the rest.

What belongs to the services (the drain setting's key, which of an account's plans its quota counts) is
given to `PurchaseReads` once, as values: this layer knows only the schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    BindParameter,
    Connection,
    Dialect,
    Select,
    Table,
    and_,
    bindparam,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.operators import custom_op

from hyperplan.core.calendar import micros, micros_slot_span, peak_in_slots, slot_span
from hyperplan.core.fleet import Pool
from hyperplan.core.quotas import Interval
from hyperplan.errors import ResourceNotFound
from hyperplan.store.prepared import Prepared
from hyperplan.store.schema import (
    SEGMENT_LENGTH,
    Account,
    Invoice,
    PlanExtension,
    ReservedCapacity,
    ReturnedWindow,
    Setting,
    TrainingPlan,
    Webhook,
)
from hyperplan.store.types import from_micros

_PLANS = cast(Table, TrainingPlan.__table__)
_SEGMENTS = cast(Table, ReservedCapacity.__table__)
_INVOICES = cast(Table, Invoice.__table__)


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
    # Capacity returned by other plans (returned_windows) in the pools over the windows: a purchase that
    # finds some may be reselling it (services/plans/resale.py); read in the same statement, so that a
    # purchase that finds none (nearly all) pays nothing for the question.
    returned: int = 0

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


@dataclass(frozen=True)
class HoldingsWindow:
    """What the holdings are read over: the purchase's pools (instance type, zone: each once, sorted),
    the span of its segments [low, high), and the span [account_low, account_high) of the account's
    own holdings its quotas weigh."""

    account_id: str
    pools: Sequence[tuple[str, str]]
    low: datetime
    high: datetime
    account_low: datetime
    account_high: datetime

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "low": self.low,
            "high": self.high,
            "alow": self.account_low,
            "ahigh": self.account_high,
            "account": self.account_id,
        }
        for i, (instance_type, zone) in enumerate(self.pools):
            params[f"t{i}"], params[f"z{i}"] = instance_type, zone
        return params


FAR_FUTURE = datetime(9999, 1, 1, tzinfo=UTC)
"""Later than any row's end (the service sells days, not millennia)."""


def ends_after(end: Any, bound: Any) -> Any:
    """`end > bound`, stated as the closed range (bound, FAR_FUTURE): the same rows, but PostgreSQL's
    planner, which weighs a prepared statement's generic plan without the bound's value, takes a range
    with both ends for a narrow one (and reads the index by end) where it takes one end alone for a
    third of the table (and reads all of it). psycopg prepares a statement run five times."""
    return and_(end > bound, end < literal(FAR_FUTURE, type_=ReservedCapacity.end.type))


def _longest_segment() -> Any:
    """The longest segment's length (microseconds; NULL when there is none), from the last entry of
    ix_rc_length: both databases read a max over an index's expression from its end."""
    return (
        select(func.max(literal_column(SEGMENT_LENGTH, BigInteger))).select_from(_SEGMENTS).scalar_subquery()
    )


def _segments_overlapping(end: Any, low: Any, high: Any) -> Any:
    """The bounds by end of the segments that may hold capacity in [low, high): `end > low` (a segment
    holds nothing after its end) and `end < high + the longest segment's length` (one that ends later
    starts at or after `high`). A range with both ends, as the indexes by end read it: what overlaps the
    window, not every segment booked after it. The caller still states the exact conditions."""
    return and_(end > low, end < high.op("+", return_type=BigInteger)(_longest_segment()))


_UNINDEXED: custom_op[Any] = custom_op("+")  # SQLite's unary +: the value as it is, from no index


def _unindexed(column: Any, sqlite: bool) -> Any:
    """`column`'s value compared as no index serves it: SQLite's `+column`; on PostgreSQL, which has no
    unary + on text, `column || ''` for text and `column + 0` for a number (the value unchanged). For a
    read whose planner would otherwise take an index that reads history (see _holdings_rows)."""
    if sqlite:
        return UnaryExpression(column, operator=_UNINDEXED)
    if column.type.python_type is str:
        return column.op("||")(literal_column("''"))
    return column.op("+")(literal_column("0"))


def _owner(table: Any) -> Any:
    """The account of the plan of `table`'s row, as a scalar subquery on the plan's id.

    Not a join: given a join, PostgreSQL's planner weighs starting from the account's plans, whose
    number it cannot know from an unindexed comparison (it guesses 0.5% of the table), and takes that
    side when the type has many segments ahead: a scan of every plan of the store, then each of the
    account's plans' segments (the 10x history bench read 15,000 rows a purchase so). A scalar
    subquery is never turned into a join by either database: each segment the window's conditions
    keep is looked up by its plan's id, after them (its cost puts it last), and nothing else is read."""
    return select(TrainingPlan.account_id).where(TrainingPlan.id == table.plan_id).scalar_subquery()


def _holdings_rows(pool_count: int, every_type: bool, *, sqlite: bool) -> Any:
    """The union _holdings_query reads (see there), as `sqlite` or PostgreSQL writes it.

    Every read is bounded by the window, not by the store's past nor by what is booked after it: a
    segment is held until its end at the latest (its released_at is before its end) and starts no
    earlier than its end less the longest segment's length, so each segments' read states the range
    `low < end < high + longest` (_segments_overlapping) besides the exact conditions, and the indexes
    by end (0031) read the segments whose end falls in it: those that overlap the window, and the few
    that end within a longest segment after it. Extensions that hold capacity (unpaid ones, a few) are
    read from ix_ext_holding by `end > low` (ends_after).

    - The pools' segments: from ix_rc_type_end, the type's range of ends (the zone checked in the
      index).
    - The account's segments: the type's (ix_rc_type_end) or, of every type, the fleet's (ix_rc_end)
      segments whose end falls in the window's range, each kept if its plan is the account's (`_owner`:
      one look at the plan by its id, for the segments the window's other conditions kept). The
      starts' comparison is made unindexed (`_unindexed`), so that no planner reads a range of starts
      (the type's whole past). Neither planner can start from the account's plans (every plan it ever
      had, then each one's segments, a scan of every plan where it misjudged their number): both grow
      with history."""
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
        # that the statement can be prepared.
        return (
            true()
            if every_type
            else or_(*(table.instance_type == bindparam(f"t{i}") for i in range(pool_count)))
        )

    low, high, alow, ahigh = (
        bindparam(n, type_=ReservedCapacity.start.type) for n in ("low", "high", "alow", "ahigh")
    )

    def held(table: Any, end: Any, by_end: Callable[[Any, Any, Any], Any]) -> tuple[Select[Any], Select[Any]]:
        """Its rows in the pools, then the account's own (the union's tags 0 and 1); `by_end(end, low,
        high)`: the range of ends its index reads for a window."""
        columns = (table.instance_type, table.availability_zone, table.start, end, table.count)
        in_pool = select(literal(0), *columns).where(
            table.holds_capacity.is_(True),
            in_pools(table),
            by_end(table.end, low, high),
            _unindexed(table.start, sqlite) < high,
            end > low,
        )
        the_accounts = select(literal(1), *columns).where(
            of_types(table),
            table.holds_capacity.is_(True),
            by_end(table.end, alow, ahigh),
            _unindexed(table.start, sqlite) < ahigh,
            end > alow,
            _owner(table) == bindparam("account"),
        )
        return in_pool, the_accounts

    def extensions_by_end(end: Any, low: Any, _high: Any) -> Any:
        return ends_after(end, low)  # ix_ext_holding holds the few unpaid ones only

    segments_in_pool, segments_of_account = held(
        rc, func.coalesce(rc.released_at, rc.end), _segments_overlapping
    )
    extensions_in_pool, extensions_of_account = held(ext, ext.end, extensions_by_end)
    rw = ReturnedWindow
    returned = select(literal(2), rw.instance_type, rw.availability_zone, rw.start, rw.end, rw.count).where(
        in_pools(rw), rw.start < high, ends_after(rw.end, low)
    )
    return union_all(
        segments_in_pool, extensions_in_pool, segments_of_account, extensions_of_account, returned
    )


@cache
def _holdings_query(pool_count: int, every_type: bool, packed: bool) -> Prepared:
    """Held capacity (segments, then unpaid extensions) in `pool_count` pools between :low and :high,
    then the account's own (of the pools' types, or of every type) between :alow and :ahigh; tagged 0
    and 1. `packed` (SQLite): every row in one, as a JSON array of arrays. The driver lets the GIL go
    for each row it steps to, and takes it back after: in the writers' turn, with the process's other
    threads at work, each take can wait (a busy pool's window holds tens of rows); one row, one wait."""
    rows = _holdings_rows(pool_count, every_type, sqlite=packed)
    if not packed:
        return Prepared(rows)
    each = rows.subquery()
    return Prepared(select(func.json_group_array(func.json_array(*each.c))))


@cache
def _account_holdings_query(every_type: bool, sqlite: bool) -> Any:
    """The account's own part of _holdings_rows alone (tag 1; of its one type :t0, or of every type),
    over [:alow, :ahigh)."""
    return union_all(*_holdings_rows(1, every_type, sqlite=sqlite).selects[2:4])


def read_account_holdings(
    session: Session, account_id: str, instance_type: str | None, low: datetime, high: datetime
) -> list[tuple[datetime, datetime, int]]:
    """What the account holds over [low, high) (segments and unpaid extensions, read as a purchase reads
    them): of one type, or of every type (None); (start, end, count) each. Through the session, which
    flushes what it holds first, as any of its queries does."""
    sqlite = session.get_bind().dialect.name == "sqlite"
    query = _account_holdings_query(instance_type is None, sqlite)
    params = {"account": account_id, "alow": low, "ahigh": high, "t0": instance_type or ""}
    return [(start, end, count) for _, _, _, start, end, count in session.execute(query, params)]


def _holdings_of(rows: Any) -> Holdings:
    found = Holdings([], [])
    times: dict[int, datetime] = {}  # segments mostly share the day grid's few instants
    returned = 0
    for tag, instance_type, zone, start, end, held in rows:
        if not tag:
            found.pools.append((instance_type, zone, start, end, held))
            continue
        if tag == 2:
            returned += 1
            continue
        if (begins := times.get(start)) is None:
            begins = times[start] = from_micros(start)
        if (ends := times.get(end)) is None:
            ends = times[end] = from_micros(end)
        found.account.append((instance_type, zone, begins, ends, held))
    return replace(found, returned=returned) if returned else found


def read_holdings(connection: Connection, window: HoldingsWindow, every_type: bool) -> Holdings:
    """What is held over `window`; the account's own of every type (`every_type`) or of the pools'."""
    packed = connection.dialect.name == "sqlite"
    rows: Any = _holdings_query(len(window.pools), every_type, packed).rows(connection, window.params())
    return _holdings_of(json.loads(rows[0][0]) if packed else rows)


# -- the ids of the rows to come ---------------------------------------------------------------------


@dataclass(frozen=True)
class NewIds:
    """A PostgreSQL purchase's rows' ids, drawn from their sequences in its locked read: its rows then
    need no answer from the server, and go with its commit (store/prepared.py `defer`), not one wait
    each with its pools' locks held. A purchase refused after the read leaves its ids unused (a
    sequence has gaps anyway: a rolled-back insert leaves one too)."""

    plan: int
    invoice: int
    segments: tuple[int, ...]  # by ordinal


def _next_id(table: Table) -> Any:
    """PostgreSQL: the next value of the sequence that numbers `table`'s rows (its SERIAL id)."""
    sequence = func.pg_get_serial_sequence(table.name, table.c.id.name)
    return func.nextval(sequence.cast(REGCLASS))


# -- the account's facts -----------------------------------------------------------------------------


class PurchaseReads:
    """A purchase's reads, prepared once: `drain_setting` is the key of the drain setting's row,
    `active_plans(account)` the count of the plans of `account` (a bind) that its quota weighs, as a
    select."""

    def __init__(self, drain_setting: str, active_plans: Callable[[Any], Select[Any]]) -> None:
        self._drain_setting = drain_setting
        self._active_plans = active_plans
        self._facts = Prepared(self._facts_query())
        self._facts_columns = len(self._facts_query().selected_columns)
        self._with_holdings: dict[tuple[int, bool, int], Prepared] = {}

    def _facts_query(self) -> Select[Any]:
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
            select(Setting.value).where(Setting.key == self._drain_setting).scalar_subquery(),
            exists().where(plans.account_id == account, plans.name == name),
            exists().where(plans.offering_id == offering),
            self._active_plans(account).scalar_subquery(),
            hooks,
        ).where(Account.id == account)

    def read_facts(
        self, connection: Connection, account_id: str, name: str, offering_id: str
    ) -> AccountFacts:
        found = self._facts.rows(connection, {"account": account_id, "name": name, "offering": offering_id})
        if not found:
            raise ResourceNotFound(f"No account {account_id!r}.")
        return _facts_of(found[0])

    def _facts_and_holdings_query(self, pool_count: int, every_type: bool, segment_ids: int) -> Prepared:
        """PostgreSQL: the account's facts and what is held, in one statement (one round trip, one
        snapshot), the holdings packed as one JSON array of arrays in the facts' row; then, when
        `segment_ids` > 0, the new plan's id, its invoice's and its `segment_ids` segments' (NewIds)."""
        key = (pool_count, every_type, segment_ids)
        prepared = self._with_holdings.get(key)
        if prepared is None:
            each = _holdings_rows(pool_count, every_type, sqlite=False).subquery()
            packed = select(func.json_agg(func.json_build_array(*each.c))).scalar_subquery()
            query = self._facts_query().add_columns(packed)
            if segment_ids:
                query = query.add_columns(
                    _next_id(_PLANS), _next_id(_INVOICES), *(_next_id(_SEGMENTS) for _ in range(segment_ids))
                )
            prepared = self._with_holdings.setdefault(key, Prepared(query))
        return prepared

    def shapes_ahead(self, dialect: Dialect, most_segments: int, every_type: bool) -> None:
        """Make the statements of a purchase of up to `most_segments` segments (for compile_every): on
        PostgreSQL the read on the snapshot and the read in the write, with the ids of its segments, for
        each number of pools they may be in; on SQLite the holdings' read, per number of pools."""
        for pools in range(1, most_segments + 1):
            if dialect.name != "postgresql":
                _holdings_query(pools, every_type, dialect.name == "sqlite")
                continue
            for segment_ids in (0, *range(pools, most_segments + 1)):
                self._facts_and_holdings_query(pools, every_type, segment_ids)

    def read_facts_and_holdings(
        self,
        connection: Connection,
        name: str,
        offering_id: str,
        window: HoldingsWindow,
        every_type: bool,
        *,
        new_segment_ids: int = 0,
    ) -> tuple[AccountFacts, Holdings, NewIds | None]:
        """PostgreSQL: read_facts and read_holdings in one statement; with `new_segment_ids` > 0 (a write
        transaction: a read-only one cannot draw from a sequence), the ids of the purchase's rows too:
        its plan's, its invoice's and that many segments'."""
        params = window.params()
        params.update(name=name, offering=offering_id)
        query = self._facts_and_holdings_query(len(window.pools), every_type, new_segment_ids)
        found = query.rows(connection, params)
        if not found:
            raise ResourceNotFound(f"No account {window.account_id!r}.")
        row, columns = found[0], self._facts_columns
        held = _holdings_of(row[columns] or [])
        ids = None
        if new_segment_ids:
            plan, invoice, *segment_ids = row[columns + 1 :]
            ids = NewIds(plan, invoice, tuple(sorted(segment_ids)))
        return _facts_of(row[:columns]), held, ids
