"""Buying a plan, written as a handful of SQLAlchemy Core statements in the buyer's transaction.

A purchase is the service's busiest write (issue 20). Through the ORM's unit of work it cost ~32
statements and most of its CPU in SQLAlchemy; here, in one transaction (store/db.py's `write`):

1. PostgreSQL only: the account's row and the pools' locks (store/locks.py), before any read.
2. One read of the account: its quotas and payment mode, the drain setting, whether the name or the
   offering is taken, the plans it holds and its live webhooks.
3. One read of what is held: the pools' capacity over the segments' windows and the account's own
   holdings the quotas weigh.
4. The rows as they end up, each table in one statement: the plan (already Scheduled when it is paid at
   once), its segments, the invoice (already settled), the ledger line, the plan's history, the status
   events, the timed events and any webhook deliveries. The change counters move in the one statement
   the commit makes (Database.wrote).

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
    CompoundSelect,
    Connection,
    Select,
    String,
    Table,
    and_,
    bindparam,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
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
from hyperplan.core.search import segment_price
from hyperplan.core.status import INVOICE_LIFECYCLE, InvoiceStatus
from hyperplan.errors import ResourceInUse, ResourceNotFound
from hyperplan.services import drain_state, lifecycle, payments, quotas
from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext
from hyperplan.services.live_calendar import check_room
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.locks import lock_account, lock_pools
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

# Statements made once: SQLAlchemy then finds their compiled form by a cache key it builds per call, the
# cheaper the smaller the statement.
_INSERT_PLAN = insert(_PLANS).returning(_PLANS.c.id)
_INSERT_SEGMENTS = insert(_SEGMENTS).returning(_SEGMENTS.c.id, _SEGMENTS.c.ordinal)
_INSERT_INVOICE = insert(_INVOICES).returning(_INVOICES.c.id)
_INSERT_HISTORY = insert(_HISTORY).returning(_HISTORY.c.id, sort_by_parameter_order=True)
_INSERT_HISTORY_BLIND = insert(_HISTORY)  # without webhooks nobody needs the events' ids
_SET_BUDGET = (
    update(_ACCOUNTS).where(_ACCOUNTS.c.id == bindparam("account")).values(budget=bindparam("budget"))
)


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
    webhook_ids: list[int]


def _facts_query() -> Select[Any]:
    account: BindParameter[str] = bindparam("account")
    name: BindParameter[str] = bindparam("name")
    offering: BindParameter[str] = bindparam("offering")
    plans = TrainingPlan
    hooks = (
        select(func.aggregate_strings(sql_cast(Webhook.id, String), ","))
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


_FACTS = _facts_query()


def read_facts(connection: Connection, account_id: str, name: str, offering_id: str) -> AccountFacts:
    row = connection.execute(
        _FACTS, {"account": account_id, "name": name, "offering": offering_id}
    ).one_or_none()
    if row is None:
        raise ResourceNotFound(f"No account {account_id!r}.")
    return AccountFacts(
        id=row[0],
        name=row[1],
        payment_mode=row[2],
        budget=row[3],
        max_active_plans=row[4],
        max_reserved_instances_per_type=row[5],
        max_reserved_instance_hours_per_30_days=row[6],
        max_on_demand_instances_per_type=row[7],
        drain=row[8],
        name_taken=bool(row[9]),
        offering_taken=bool(row[10]),
        active_plans=row[11] or 0,
        webhook_ids=sorted(int(part) for part in row[12].split(",")) if row[12] else [],
    )


# -- what is held ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holdings:
    """Capacity held in the purchase's pools over its windows, and what the account holds that its
    quotas weigh: (instance type, availability zone, start, end, count) each."""

    pools: list[tuple[str, str, datetime, datetime, int]]
    account: list[tuple[str, str, datetime, datetime, int]]

    def in_pool(self, pool: Pool, start: datetime, end: datetime) -> list[Interval]:
        return [
            (s, e, n)
            for t, z, s, e, n in self.pools
            if (t, z) == pool.key and s < end and e > start and e > s
        ]

    def of_account(self, instance_type: str | None, start: datetime, end: datetime) -> list[Interval]:
        return [
            (s, e, n)
            for t, _, s, e, n in self.account
            if (instance_type is None or t == instance_type) and s < end and e > start
        ]


@cache
def _holdings_query(pool_count: int, every_type: bool) -> CompoundSelect[Any]:
    """Held capacity (segments, then unpaid extensions) in `pool_count` pools between :low and :high,
    then the account's own (of :types, or of every type) between :alow and :ahigh; tagged 0 and 1."""
    rc, ext = ReservedCapacity, PlanExtension

    def in_pools(table: Any) -> Any:
        return or_(
            *(
                and_(table.instance_type == bindparam(f"t{i}"), table.availability_zone == bindparam(f"z{i}"))
                for i in range(pool_count)
            )
        )

    def of_types(table: Any) -> Any:
        return true() if every_type else table.instance_type.in_(bindparam("types", expanding=True))

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


def read_holdings(
    connection: Connection, account_id: str, segments: Segments, count: int, every_type: bool
) -> Holdings:
    pools = sorted({pool.key for pool, _ in segments})
    low = min(s.start for _, s in segments)
    high = max(s.end for _, s in segments)
    alow, ahigh = (
        quotas.hours_span([(s.start, s.end, count) for _, s in segments]) if every_type else (low, high)
    )
    params: dict[str, Any] = {"low": low, "high": high, "alow": alow, "ahigh": ahigh, "account": account_id}
    for i, (instance_type, zone) in enumerate(pools):
        params[f"t{i}"], params[f"z{i}"] = instance_type, zone
    if not every_type:
        params["types"] = sorted({t for t, _ in pools})
    found = Holdings([], [])
    for tag, *row in connection.execute(_holdings_query(len(pools), every_type), params):
        (found.account if tag else found.pools).append(tuple(row))
    return found


# -- the purchase ------------------------------------------------------------------------------------


def price_of(segments: Segments, count: int) -> Decimal:
    """The fee follows from the segments and the fleet's prices, exactly as the search priced it."""
    return sum((segment_price(pool, s.start, s.end, count) for pool, s in segments), start=Decimal("0"))


def write(
    runtime: ServiceContext,
    session: Session,
    caller: Caller,
    name: str,
    offering_id: str,
    claim: OfferingClaim,
    segments: Segments,
    now: datetime,
) -> None:
    """Check and write the purchase in the caller's write transaction (concurrent=True); refuses, with
    nothing written, as the checks say."""
    # Before any read this purchase checks: what it reads can change only once it commits or rolls back.
    lock_account(session, caller.account_id)
    lock_pools(session, [pool.key for pool, _ in segments])
    connection = session.connection()
    facts = read_facts(connection, caller.account_id, name, offering_id)
    _check(runtime, connection, facts, name, offering_id, claim, segments)
    purchase = _Purchase(runtime, session, caller, facts, claim, segments, now)
    purchase.write(name, offering_id)


def _check(
    runtime: ServiceContext,
    connection: Connection,
    facts: AccountFacts,
    name: str,
    offering_id: str,
    claim: OfferingClaim,
    segments: Segments,
) -> None:
    """Every refusal a purchase can meet in the store, in the order the wire has always given them."""
    drain_state.refuse_if(drain_state.from_setting(facts.drain), "CreateTrainingPlan")
    if facts.name_taken:
        raise ResourceInUse(f"A training plan named {name!r} already exists in this account.")
    if facts.offering_taken:
        raise ResourceNotFound(f"Training plan offering {offering_id} has already been bought; search again.")
    quotas.check_plans_held(runtime, facts, facts.active_plans)
    every_type = quotas.limits(runtime, facts).max_reserved_instance_hours_per_30_days is not None
    held = read_holdings(connection, facts.id, segments, claim.count, every_type)
    for pool, s in segments:
        check_room(
            runtime.calendar.bookable(pool), held.in_pool(pool, s.start, s.end), s.start, s.end, claim.count
        )
        mine = held.of_account(pool.instance_type, s.start, s.end)
        quotas.check_instances_held(runtime, facts, pool.instance_type, mine, s.start, s.end, claim.count)
    if every_type:
        adding = [(s.start, s.end, claim.count) for _, s in segments]
        low, high = quotas.hours_span(adding)
        quotas.check_hours_held(runtime, facts, held.of_account(None, low, high), adding)


class _Purchase:
    """The rows of one checked purchase, gathered per table and written one statement a table."""

    def __init__(
        self,
        runtime: ServiceContext,
        session: Session,
        caller: Caller,
        facts: AccountFacts,
        claim: OfferingClaim,
        segments: Segments,
        now: datetime,
    ) -> None:
        self.runtime, self.session, self.connection = runtime, session, session.connection()
        self.caller, self.facts, self.claim, self.segments, self.now = caller, facts, claim, segments, now
        self.plan_id = 0
        self.history: list[dict[str, Any]] = []
        self.status_events: list[dict[str, Any]] = []
        self.timed: list[dict[str, Any]] = []
        self.windows = [Window(s.start, s.end) for _, s in segments]

    def write(self, name: str, offering_id: str) -> None:
        runtime, now, facts, claim, segments = self.runtime, self.now, self.facts, self.claim, self.segments
        db = runtime.db
        fee, currency = price_of(segments, claim.count), segments[0][0].currency
        # As payments.issue settles: auto pays, a budget pays if it can, any other mode (approval) waits
        # for an administrator.
        fails = facts.payment_mode == "budget" and facts.budget < fee
        how = None if fails else _PAID_HOW.get(facts.payment_mode)
        paid = how is not None
        status, message = PlanStatus.PENDING, "Awaiting payment of the upfront fee."
        if paid:
            status = status_at(self.windows, now)
            PLAN_LIFECYCLE.check(PlanStatus.PENDING, status)
            message = status_message(self.windows, status, now)
        self.plan_id = self.connection.execute(
            _INSERT_PLAN,
            {
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
            },
        ).scalar_one()
        moved = [paid and self._segment_moves(window) for window in self.windows]
        segment_ids = self._insert_segments(moved)
        self._event("created", PlanStatus.PENDING, f"Bought offering {offering_id} for {fee} {currency}.")
        policy = runtime.lifecycle.policies(claim.target)
        for ordinal, (_, s) in enumerate(segments, start=1):
            for kind, when, payload in lifecycle.segment_events(s.start, s.end, ordinal, policy, now):
                self._schedule(kind, when, payload)
        booked = [(pool.key, s.start, s.end, claim.count) for pool, s in segments]
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
            self._pay(invoice_id, fee, how or "", name, status, message, segment_ids, moved)
        else:
            self._await_approval(invoice_id, fee, currency)
        self._flush_history_and_timed()
        if self.status_events:
            self.connection.execute(insert(_STATUS_EVENTS), self.status_events)
            db.wrote(session, StatusEvent)

    def _segment_moves(self, window: Window) -> bool:
        return RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus.PENDING, status_at([window], self.now))

    def _insert_segments(self, moved: list[bool]) -> dict[int, int]:
        """The plan's segments, each in the status it ends up in; returns their ids by ordinal."""
        rows = [
            {
                "plan_id": self.plan_id,
                "ordinal": ordinal,
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "count": self.claim.count,
                "start": s.start,
                "end": s.end,
                "status": status_at([window], self.now) if move else PlanStatus.PENDING,
                "holds_capacity": True,
                "released_at": None,
            }
            for ordinal, ((pool, s), window, move) in enumerate(
                zip(self.segments, self.windows, moved, strict=True), start=1
            )
        ]
        return {ordinal: id_ for id_, ordinal in self.connection.execute(_INSERT_SEGMENTS, rows)}

    def _invoice(self, fee: Decimal, currency: str, paid: bool, how: str) -> int:
        first_start = min(s.start for _, s in self.segments)
        self.due_at = payments.payment_deadline(first_start, self.now)
        invoice_id: int = self.connection.execute(
            _INSERT_INVOICE,
            {
                "account_id": self.facts.id,
                "plan_id": self.plan_id,
                "extension_id": None,
                "amount": fee,
                "currency": currency,
                "status": InvoiceStatus.PAID if paid else InvoiceStatus.PENDING,
                "created_at": self.now,
                "due_at": self.due_at,
                "settled_at": self.now if paid else None,
                "note": how,
            },
        ).scalar_one()
        self.runtime.db.wrote(self.session, Invoice)
        return invoice_id

    def _pay(
        self,
        invoice_id: int,
        fee: Decimal,
        how: str,
        name: str,
        status: PlanStatus,
        message: str,
        segment_ids: dict[int, int],
        moved: list[bool],
    ) -> None:
        """What payments._pay and lifecycle.mark_paid write for a plan paid as it is bought."""
        db, session, now, facts = self.runtime.db, self.session, self.now, self.facts
        INVOICE_LIFECYCLE.check(InvoiceStatus.PENDING, InvoiceStatus.PAID)
        self._status_event(INVOICE_LIFECYCLE.kind, invoice_id, InvoiceStatus.PENDING, InvoiceStatus.PAID, how)
        budget = facts.budget
        if facts.payment_mode == "budget":
            budget -= fee
            self.connection.execute(_SET_BUDGET, {"account": facts.id, "budget": budget})
            db.wrote(session, Account, inserted=False, columns=("budget",))
        self.connection.execute(
            insert(_LEDGER),
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
        for ordinal, (window, move) in enumerate(zip(self.windows, moved, strict=True), start=1):
            if move:
                new = status_at([window], now)
                self._status_event(
                    RESERVED_CAPACITY_LIFECYCLE.kind, segment_ids[ordinal], PlanStatus.PENDING, new, message
                )
        self._event("scheduled", status, message)

    def _await_approval(self, invoice_id: int, fee: Decimal, currency: str) -> None:
        """What payments.issue writes for an account whose invoices an administrator approves."""
        message = (
            f"Awaiting an administrator's approval of invoice {invoice_id} ({fee} {currency}, the plan); "
            f"unpaid at {self.due_at:%Y-%m-%d %H:%M} UTC, the plan fails and its capacity is released."
        )
        self.connection.execute(
            update(_PLANS).where(_PLANS.c.id == self.plan_id).values(status_message=message)
        )
        self._event("awaiting-approval", PlanStatus.PENDING, message)
        self._schedule(lifecycle.PAYMENT_DEADLINE, self.due_at, {"invoice": invoice_id})

    def _settle_by_the_step_by_step_path(self) -> None:
        """A payment that fails at once: payments.issue invoices, fails the plan and releases what it
        holds, through the session (the rare case; the rows above are what it reads)."""
        plan = self.session.get(TrainingPlan, self.plan_id)
        assert plan is not None
        known: dict[str, list[int]] = self.session.info.setdefault("webhook_ids", {})
        known[self.facts.id] = self.facts.webhook_ids
        payments.issue(self.session, self.runtime.lifecycle, plan, self.now)

    def _flush_history_and_timed(self) -> None:
        """The plan's history (and a delivery of each entry to each live webhook), and the timed
        events gathered so far."""
        connection, hooks = self.connection, self.facts.webhook_ids
        if self.timed:
            connection.execute(insert(_TIMED), self.timed)
            self.timed = []
        if not self.history:
            return
        if not hooks:
            connection.execute(_INSERT_HISTORY_BLIND, self.history)
            self.history = []
            return
        event_ids = [row[0] for row in connection.execute(_INSERT_HISTORY, self.history)]
        self.history = []
        sent_at = utcnow()  # real time: the first attempt is due at once, whatever the service clock says
        deliveries = [
            {
                "webhook_id": hook,
                "plan_id": self.plan_id,
                "plan_event_id": event_id,
                "attempts": 0,
                "next_attempt_at": sent_at,
                "last_error": "",
                "delivered_at": None,
            }
            for event_id in event_ids
            for hook in hooks
        ]
        connection.execute(insert(_DELIVERIES), deliveries)
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

    def _schedule(self, kind: str, when: datetime, payload: dict[str, Any]) -> None:
        self.timed.append(
            {
                "due_at": when,
                "kind": kind,
                "subject": str(self.plan_id),
                "payload": json.dumps(payload),
                "done": False,
                "ran_at": None,
            }
        )
