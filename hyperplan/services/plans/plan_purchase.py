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

This module holds the purchase's rules: what it checks, its terms, which rows it writes. The statements
are the store's (store/purchase_reads.py, store/purchase_rows.py); the rows' shapes and messages are
core/status_rows.py's, which the step-by-step path (lifecycle.py, payments.py) builds its rows with too:
the same rows, the same history in the same order, the same messages. A payment that fails at once (a
budget short of the fee) is the one case left to that path: the plan is written as bought, then
payments.issue settles and fails it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.core import status_rows
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
from hyperplan.core.pricing import segment_price
from hyperplan.core.status import INVOICE_LIFECYCLE, InvoiceStatus
from hyperplan.core.status_rows import Entry
from hyperplan.errors import ResourceInUse, ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import lifecycle, payments, quotas
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import refuse_if_full
from hyperplan.store import purchase_reads, purchase_rows
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change, counter_shapes_ahead
from hyperplan.store.locks import lock_account, lock_pools
from hyperplan.store.prepared import compile_every
from hyperplan.store.purchase_reads import AccountFacts, Holdings, HoldingsWindow, NewIds, PurchaseReads
from hyperplan.store.schema import (
    Account,
    Invoice,
    LedgerEntry,
    PlanEvent,
    ReservedCapacity,
    ScheduledEvent,
    StatusEvent,
    TrainingPlan,
    WebhookDelivery,
)

Segments = Sequence[tuple[Pool, OfferingSegment]]

# Prepared once (store/purchase_reads.py); what counts is the services': the drain setting, the plans a
# quota weighs.
_READS = PurchaseReads(drain_state.SETTING, quotas.active_plans)

# A purchase's statements depend on how many segments (and so pools) it has; compile_ahead compiles
# them for up to this many (the fleet's max_segments, at most this), and up to _EVENT_ROWS rows of events
# a table. A larger purchase compiles its own at its first.
_SHAPES_AHEAD = 3
_EVENT_ROWS = 12
_COUNTERS_AHEAD = 4  # the change counters one commit moves (a purchase: 3, with webhooks 4)


def compile_ahead(runtime: ServiceContext) -> int:
    """Compile, at the server's start, every statement prepared so far and those a purchase of up to
    max_segments segments runs (store/prepared.py compile_every); how many. A purchase compiled its own
    at its first, in its write, under its pools' locks: a new server's first purchases took over 100 ms
    (the first alone, one client, on PostgreSQL: 101 ms against 15-20 ms after), and eight at once held
    one another up as long."""
    dialect = runtime.db.engine.dialect
    most = min(runtime.fleet.policy.max_segments, _SHAPES_AHEAD)
    every_type = runtime.fleet.quotas.max_reserved_instance_hours_per_30_days is not None
    _READS.shapes_ahead(dialect, most, every_type)
    purchase_rows.shapes_ahead(dialect, range(1, most + 1), _EVENT_ROWS)
    counter_shapes_ahead(_COUNTERS_AHEAD)
    return compile_every(dialect)


# As payments.issue settles at once: the note of each payment mode that pays when the invoice is issued.
_PAID_HOW = {"auto": status_rows.PAID_AUTOMATICALLY, "budget": status_rows.PAID_FROM_BUDGET}


def _window(account_id: str, segments: Segments, count: int, every_type: bool) -> HoldingsWindow:
    """What the purchase's holdings are read over: its pools and windows, and the span of the account's
    own holdings its quotas weigh (of every type: the instance-hours quota's span)."""
    low = min(s.start for _, s in segments)
    high = max(s.end for _, s in segments)
    alow, ahigh = (
        quotas.hours_span([(s.start, s.end, count) for _, s in segments]) if every_type else (low, high)
    )
    pools = sorted({pool.key for pool, _ in segments})
    return HoldingsWindow(account_id, pools, low, high, alow, ahigh)


# -- the purchase ------------------------------------------------------------------------------------


def price_of(segments: Segments, count: int) -> Decimal:
    """The fee follows from the segments, the fleet's prices and each segment's multiplier (which the
    offering carries), exactly as the search priced it."""
    return sum(
        (segment_price(pool, s.start, s.end, count, s.multiplier) for pool, s in segments), start=Decimal("0")
    )


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
    bought: Entry


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
        bought=status_rows.bought(offering_id, fee, currency),
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
        # Whether its pools held returned capacity over its windows (read with the holdings): only then
        # may it be reselling some (services/plans/resale.py).
        self.returned_seen = False
        self._terms: Terms | None = None

    def work_out(self) -> Terms:
        """The purchase's terms, worked out once (a refused purchase needs none of them)."""
        if self._terms is None:
            self._terms = _terms(self.runtime, self.offering_id, self.claim, self.segments, self.now)
        return self._terms

    def likely_passes(self) -> bool:
        """Whether the live calendar, as of this request's sync, has room for every segment. Then a read
        of the refusals on a snapshot would almost surely not refuse (what it most often refuses is
        capacity taken since the search, which the calendar shows as soon as it is committed), and on
        PostgreSQL it is skipped (CheckedWrite.likely_passes): `check` reads them under the locks
        anyway. The rarer refusals (a quota reached, a name taken) are then made there, holding the
        pools' locks for the read, as any purchase does."""
        calendar, count = self.runtime.calendar, self.claim.count
        return all(calendar.can_book(pool.key, s.start, s.end, count) for pool, s in self.segments)

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
            facts = _READS.read_facts(connection, account, self.name, self.offering_id)
        checked = _check(
            self.runtime, connection, facts, self.name, self.offering_id, self.claim, self.segments, held
        )
        self.returned_seen = checked.returned > 0
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
        account, segments, count = self.caller.account_id, self.segments, self.claim.count
        for _ in range(_FACTS_READS):
            facts, read, ids = _READS.read_facts_and_holdings(
                connection,
                self.name,
                self.offering_id,
                _window(account, segments, count, every_type),
                every_type,
                new_segment_ids=len(segments) if new_ids else 0,
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
) -> Holdings:
    """Every refusal a purchase can meet in the store, in the order the wire has always given them;
    `already`: what is held, already read (read_facts_and_holdings), and whether of every type. Returns
    what is held, as read."""
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
        window = _window(facts.id, segments, claim.count, every_type)
        held = purchase_reads.read_holdings(connection, window, every_type)
    for pool, s in segments:
        booked = held.booked_in_pool(pool, s.start, s.end)
        refuse_if_full(runtime.calendar.bookable(pool), booked, s.start, s.end, claim.count)
        mine = held.of_account(pool.instance_type, s.start, s.end)
        quotas.check_instances_held(runtime, facts, pool.instance_type, mine, s.start, s.end, claim.count)
    if every_type:
        adding = [(s.start, s.end, claim.count) for _, s in segments]
        low, high = quotas.hours_span(adding)
        quotas.check_hours_held(runtime, facts, held.of_account(None, low, high), adding)
    return held


class _Rows:
    """The rows of one checked purchase, gathered per table and written one statement a table
    (store/purchase_rows.py), each shaped as the step-by-step path shapes it (core/status_rows.py)."""

    def __init__(self, purchase: Purchase, session: Session, facts: AccountFacts) -> None:
        self.purchase, self.runtime, self.session = purchase, purchase.runtime, session
        self.connection = session.connection()
        self.caller, self.facts, self.claim, self.now = purchase.caller, facts, purchase.claim, purchase.now
        self.segments = purchase.segments
        self.ids = purchase.new_ids  # PostgreSQL: every row deferred, none waits for its id
        self.plan_id = 0
        self.history: list[status_rows.Row] = []
        self.status_events: list[status_rows.Row] = []
        self.timed: list[status_rows.Row] = []

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
        status, message = PlanStatus.PENDING, status_rows.AWAITING_PAYMENT
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
        self.plan_id = purchase_rows.insert_plan(
            self.connection, plan, None if self.ids is None else self.ids.plan
        )
        statuses = terms.paid_segments if paid else [None] * len(segments)
        segment_ids = self._insert_segments(statuses)
        self._event(terms.bought, PlanStatus.PENDING)
        for kind, when, payload in terms.timed:
            self.timed.append(status_rows.timed_event(kind, when, str(self.plan_id), payload))
        booked = purchase.booked
        # Booked in memory once committed; a payment that fails below releases it again, in that order.
        session = self.session
        after_commit(
            session, lambda: runtime.calendar.book(booked, committed_change(session, CALENDAR)), early=True
        )
        for model in (TrainingPlan, ReservedCapacity, PlanEvent, ScheduledEvent):
            db.wrote(session, model)
        if fails:
            self._flush_history_and_timed()
            self._settle_by_the_step_by_step_path()
            return
        invoice_id = self._invoice(fee, currency, how)
        what = status_rows.paid_for(None)
        self._event(status_rows.invoiced(invoice_id, fee, currency, what), PlanStatus.PENDING)
        if how is not None:
            self._pay(invoice_id, fee, how, name, status, message, segment_ids, statuses)
        else:
            self._await_approval(invoice_id, fee, currency)
        self._flush_history_and_timed()
        if self.status_events:
            purchase_rows.insert_status_events(self.connection, self.status_events)
            db.wrote(session, StatusEvent)

    def _insert_segments(self, statuses: Sequence[str | None]) -> dict[int, int]:
        """The plan's segments, each in the status it ends up in (None: still pending); returns their
        ids by ordinal."""
        rows = [
            {
                "plan_id": self.plan_id,
                "ordinal": i,
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "count": self.claim.count,
                "start": s.start,
                "end": s.end,
                "status": status or PlanStatus.PENDING,
                "holds_capacity": True,
                "released_at": None,
            }
            for i, ((pool, s), status) in enumerate(zip(self.segments, statuses, strict=True), start=1)
        ]
        drawn = None if self.ids is None else self.ids.segments
        return purchase_rows.insert_segments(self.connection, rows, drawn)

    def _invoice(self, fee: Decimal, currency: str, how: str | None) -> int:
        """The plan's invoice: Pending, or (`how`) already paid."""
        now = self.now
        row = status_rows.invoice(
            self.facts.id, self.plan_id, None, fee, currency, now, self.purchase.work_out().due_at
        )
        if how is not None:
            row.update(status=InvoiceStatus.PAID, settled_at=now, note=how)
        self.runtime.db.wrote(self.session, Invoice)
        drawn = None if self.ids is None else self.ids.invoice
        return purchase_rows.insert_invoice(self.connection, row, drawn)

    def _pay(
        self,
        invoice_id: int,
        fee: Decimal,
        how: str,
        name: str,
        status: PlanStatus,
        message: str,
        segment_ids: dict[int, int],
        statuses: Sequence[PlanStatus | None],
    ) -> None:
        """What payments._pay and lifecycle.mark_paid write for a plan paid as it is bought."""
        db, session, now, facts = self.runtime.db, self.session, self.now, self.facts
        self.status_events.append(
            status_rows.status_event(
                INVOICE_LIFECYCLE, invoice_id, InvoiceStatus.PENDING, InvoiceStatus.PAID, now, how
            )
        )
        budget = facts.budget
        if facts.payment_mode == "budget":
            budget -= fee
            purchase_rows.set_budget(self.connection, facts.id, budget)
            db.wrote(session, Account, inserted=False, columns=("budget",))
        line = status_rows.payment_line(invoice_id, name, status_rows.paid_for(None), how)
        entry = status_rows.ledger_entry(facts.id, invoice_id, now, -fee, budget, line)
        purchase_rows.insert_ledger_entry(self.connection, entry)
        db.wrote(session, LedgerEntry)
        self._event(status_rows.paid(status_rows.invoice_paid(invoice_id, how)), PlanStatus.PENDING)
        for ordinal, new in enumerate(statuses, start=1):
            if new is not None:
                self.status_events.append(
                    status_rows.status_event(
                        RESERVED_CAPACITY_LIFECYCLE,
                        segment_ids[ordinal],
                        PlanStatus.PENDING,
                        new,
                        now,
                        message,
                    )
                )
        self._event(Entry(status_rows.SCHEDULED, message), status)

    def _await_approval(self, invoice_id: int, fee: Decimal, currency: str) -> None:
        """What payments.issue writes for an account whose invoices an administrator approves."""
        due_at = self.purchase.work_out().due_at
        waiting = status_rows.awaiting_approval(invoice_id, fee, currency, status_rows.paid_for(None), due_at)
        purchase_rows.set_status_message(self.connection, self.plan_id, waiting.message)
        self._event(waiting, PlanStatus.PENDING)
        self.timed.append(status_rows.payment_deadline(self.plan_id, invoice_id, due_at))

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
            purchase_rows.insert_timed_events(connection, self.timed)
            self.timed = []
        if not self.history:
            return
        purchase_rows.insert_history(connection, self.history)
        self.history = []
        if self.facts.webhooks:
            # Real time: the first attempt is due at once, whatever the service clock says.
            purchase_rows.queue_deliveries(connection, self.facts.id, self.plan_id, utcnow())
            self.runtime.db.wrote(self.session, WebhookDelivery)

    def _event(self, entry: Entry, status: str) -> None:
        self.history.append(
            status_rows.plan_event(self.plan_id, self.now, entry, status, self.caller.user_id)
        )
