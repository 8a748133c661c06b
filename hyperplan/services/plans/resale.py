"""Resale of returned capacity, in the purchase's own transaction (issue 53; the rules: core/resale.py).

A return (services/plans/returns.py) gives a plan's capacity back to the calendar and records it as
ReturnedWindow rows. When a later purchase books a segment of the same pool over a window, the instances
it could not have had otherwise (the pool had no free instance of its own then) are resold: a Resale
row each run of them, and the returning account is credited the window's resale share of what it paid
for them: one LedgerEntry per account credited (mode `budget`: its budget grows), never more in all
than it paid for the plan less what it was refunded and credited already.

`credit_for` runs in every purchase (services/plans/plans.py). With no returned window of the bought
pools over the bought times it costs one statement: an indexed probe (ix_returned_windows_pool),
prepared (store/prepared.py), which on PostgreSQL goes in the round trip of the purchase's deferred rows.
Only when a window is found does it read the rest, through the ORM.

It runs under the purchase's pool locks (store/locks.py): two purchases of one pool credit one after
the other, each seeing the other's Resale rows, so an instance-hour is never resold twice. The returning
accounts' rows are locked (sorted) before their budgets are read, as every budget change is. A return's
own account buying back what it returned earns nothing: its windows are left out, their instances count
as the pool's free room for that purchase.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, literal, or_, select
from sqlalchemy.orm import Session

from hyperplan.core import resale as rules
from hyperplan.core.calendar import slot_after, slot_of, slot_span, slot_start
from hyperplan.core.fleet import PoolKey
from hyperplan.core.status import InvoiceStatus
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.plans.payments import currency_places
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.locks import lock_account
from hyperplan.store.prepared import Prepared
from hyperplan.store.purchase_reads import ends_after
from hyperplan.store.schema import (
    Account,
    Invoice,
    LedgerEntry,
    PlanExtension,
    PlanReturn,
    Resale,
    ReservedCapacity,
    ReturnedWindow,
    TrainingPlan,
)

Booked = tuple[PoolKey, datetime, datetime, int]  # a segment as a purchase books it (Purchase.booked)

_WINDOWS = cast(Table, ReturnedWindow.__table__)


@dataclass(frozen=True)
class NewPlan:
    """The plan a purchase just wrote, as the purchase knows it: its account, its name and what it
    booked (pool, start, end, count per segment). Its id is read only when a returned window is found."""

    account_id: str
    name: str
    booked: Sequence[Booked]


@cache
def _probe(segments: int) -> Prepared:
    """Any returned window of the segments' pools overlapping their times: one statement per number of
    segments, each pool and window an ordinary bind (no expanding list: it can be prepared)."""
    w = _WINDOWS.c
    overlaps = [
        and_(
            w.instance_type == bindparam(f"t{i}"),
            w.availability_zone == bindparam(f"z{i}"),
            w.end > bindparam(f"s{i}", type_=w.end.type),
            w.start < bindparam(f"e{i}", type_=w.start.type),
        )
        for i in range(segments)
    ]
    return Prepared(select(literal(1)).select_from(_WINDOWS).where(or_(*overlaps)).limit(1))


def _any_window(session: Session, booked: Sequence[Booked]) -> bool:
    params: dict[str, Any] = {}
    for i, ((instance_type, zone), start, end, _count) in enumerate(booked):
        params |= {f"t{i}": instance_type, f"z{i}": zone, f"s{i}": start, f"e{i}": end}
    return bool(_probe(len(booked)).rows(session.connection(), params))


def credit_for(session: Session, runtime: ServiceContext, plan: NewPlan, now: datetime) -> int | None:
    """Resell what `plan`'s segments took from returned windows, in the purchase's transaction after its
    rows are written; their returners' credits are settled in a transaction of their own (`settle`, once
    the purchase has committed; a timed event in case the process stops first). The new plan's id when
    credits await settling, else None."""
    if not plan.booked or not _any_window(session, plan.booked):
        return None
    bought = session.scalar(
        select(TrainingPlan).where(TrainingPlan.account_id == plan.account_id, TrainingPlan.name == plan.name)
    )
    if bought is None:
        return None
    credits = _Credits()
    segments = session.scalars(
        select(ReservedCapacity)
        .where(ReservedCapacity.plan_id == bought.id, ReservedCapacity.holds_capacity.is_(True))
        .order_by(ReservedCapacity.ordinal)
    )
    for segment in list(segments):
        _resell(session, runtime, bought, segment, now, credits)
    if not credits.by_plan:
        return None
    # The returners' accounts are locked and credited in a transaction of their own: this purchase holds
    # its pools' locks, and an account's lock is always taken before any pool's (store/locks.py).
    schedule(session, CREDIT_EVENT, now, subject=str(bought.id))
    return bought.id


def settle(runtime: ServiceContext, buyer_plan_id: int, now: datetime) -> None:
    """A committed purchase's resale credits, at once (the timed event then finds none left)."""
    with runtime.db.write() as session:
        settle_credits(session, buyer_plan_id, now)


# -- one segment ----------------------------------------------------------------------------------------


@dataclass
class _Credits:
    """What a purchase's resales earn, per returning plan (the cap is a plan's) and then per account."""

    by_plan: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    hours_by_plan: dict[int, Decimal] = field(default_factory=lambda: defaultdict(Decimal))
    room: dict[int, Decimal] = field(default_factory=dict)  # what each returning plan may still earn


def _resell(
    session: Session,
    runtime: ServiceContext,
    bought: TrainingPlan,
    segment: ReservedCapacity,
    now: datetime,
    credits: _Credits,
) -> None:
    """The Resale rows of one new segment, each window drawn from as core/resale.py says."""
    key = (segment.instance_type, segment.availability_zone)
    start, end = segment.start, segment.released_at or segment.end
    windows = _windows(session, key, start, end, bought.account_id)
    if not windows:
        return
    first = slot_of(max(start, min(w.start for w in windows)))
    stop = slot_after(min(end, max(w.end for w in windows)))
    if first >= stop:
        return
    held = _held(session, key, first, stop, bought.id)
    unsold = [_unsold(session, w, first, stop) for w in windows]
    reservable = runtime.calendar.bookable(runtime.fleet.pool(key)).reservable
    free = rules.free_of_its_own(reservable, held, unsold)
    taken = rules.resold(segment.count, free, unsold)
    for window, counts in zip(windows, taken, strict=True):
        for span in rules.spans(first, counts, max(start, window.start), min(end, window.end)):
            _record(session, window, bought, span, now, credits)


def _windows(
    session: Session, key: PoolKey, start: datetime, end: datetime, buyer_account: str
) -> list[ReturnedWindow]:
    """The pool's returned windows over [start, end), the earliest returned first; the buyer's own
    returns left out (nothing is resold to the account that returned it)."""
    instance_type, zone = key
    return list(
        session.scalars(
            select(ReturnedWindow)
            .where(
                ReturnedWindow.instance_type == instance_type,
                ReturnedWindow.availability_zone == zone,
                ReturnedWindow.end > start,
                ReturnedWindow.start < end,
                ReturnedWindow.account_id != buyer_account,
            )
            .order_by(ReturnedWindow.id)
        )
    )


def _held(session: Session, key: PoolKey, first: int, stop: int, new_plan_id: int) -> list[int]:
    """Per slot of [first, stop): the instances the pool's other bookings hold there (segments that hold
    capacity, until their release; unpaid extensions), each holding every slot it touches, as the
    calendar counts them."""
    instance_type, zone = key
    low, high = slot_start(first), slot_start(stop)
    rc, ext = ReservedCapacity, PlanExtension
    rc_end = func.coalesce(rc.released_at, rc.end)
    segments = session.execute(
        select(rc.start, rc_end, rc.count).where(
            rc.instance_type == instance_type,
            rc.availability_zone == zone,
            rc.holds_capacity.is_(True),
            rc.start < high,
            rc_end > low,
            ends_after(rc.end, low),  # implied by the line above, and read by index (ix_rc_type_end)
            rc.plan_id != new_plan_id,
        )
    )
    extensions = session.execute(
        select(ext.start, ext.end, ext.count).where(
            ext.instance_type == instance_type,
            ext.availability_zone == zone,
            ext.holds_capacity.is_(True),
            ext.start < high,
            ext.end > low,
            ext.plan_id != new_plan_id,
        )
    )
    rows: list[tuple[datetime, datetime, int]] = [(s, e, n) for s, e, n in segments]
    rows += [(s, e, n) for s, e, n in extensions]
    return _per_slot(rows, first, stop)


def _unsold(session: Session, window: ReturnedWindow, first: int, stop: int) -> list[int]:
    """Per slot of [first, stop): the window's instances not resold yet (0 outside it)."""
    whole = _per_slot([(window.start, window.end, window.count)], first, stop)
    sales = session.execute(
        select(Resale.start, Resale.end, Resale.count).where(Resale.window_id == window.id)
    )
    sold = _per_slot([(s, e, n) for s, e, n in sales], first, stop)
    return [max(0, have - gone) for have, gone in zip(whole, sold, strict=True)]


def _per_slot(rows: Iterable[tuple[datetime, datetime, int]], first: int, stop: int) -> list[int]:
    counts = [0] * (stop - first)
    for start, end, count in rows:
        low, high = slot_span(start, end)
        for slot in range(max(low, first), min(high, stop)):
            counts[slot - first] += count
    return counts


# -- the money --------------------------------------------------------------------------------------------


def _record(
    session: Session,
    window: ReturnedWindow,
    bought: TrainingPlan,
    span: rules.Span,
    now: datetime,
    credits: _Credits,
) -> None:
    """One Resale row, credited its share, within what the returning plan may still earn."""
    returning = session.get(TrainingPlan, window.plan_id)
    assert returning is not None, "a returned window belongs to a plan"
    hours = span.instance_hours()
    earned = rules.credit(
        hours, window.price_per_instance_hour, window.resale_share, currency_places(returning.currency)
    )
    if window.plan_id not in credits.room:
        credits.room[window.plan_id] = _room(session, returning)
    amount = min(earned, credits.room[window.plan_id])
    credits.room[window.plan_id] -= amount
    credits.by_plan[window.plan_id] += amount
    credits.hours_by_plan[window.plan_id] += hours
    session.add(
        Resale(
            window_id=window.id,
            buyer_plan_id=bought.id,
            start=span.start,
            end=span.end,
            count=span.count,
            credited=amount,
            at=now,
        )
    )


def _room(session: Session, plan: TrainingPlan) -> Decimal:
    """What a returning plan may still be credited: what it paid (its paid invoices, extensions too),
    less its refunds and the resale credits it earned already."""
    paid = session.scalars(
        select(Invoice.amount).where(Invoice.plan_id == plan.id, Invoice.status == InvoiceStatus.PAID)
    )
    refunded = session.scalars(select(PlanReturn.refund).where(PlanReturn.plan_id == plan.id))
    credited = session.scalars(
        select(Resale.credited)
        .join(ReturnedWindow, ReturnedWindow.id == Resale.window_id)
        .where(ReturnedWindow.plan_id == plan.id)
    )
    zero = Decimal(0)
    return rules.room(sum(paid, start=zero), sum(refunded, start=zero), sum(credited, start=zero))


CREDIT_EVENT = "plan.resale-credit"  # a purchase's resales credited to their returners (subject: its plan)


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The resale credits a purchase left to settle, for the lifecycle loop."""

    def settle(session: Session, event: DueEvent) -> None:
        settle_credits(session, int(event.subject), event.due_at)

    return {CREDIT_EVENT: settle}


def settle_credits(session: Session, buyer_plan_id: int, now: datetime) -> Decimal:
    """The unsettled resales of a purchase credited: one ledger line per returning account, its budget
    grown in mode `budget`; each resale settled once (a repeated event finds none left)."""
    rows = session.execute(
        select(Resale, ReturnedWindow.plan_id)
        .join(ReturnedWindow, ReturnedWindow.id == Resale.window_id)
        .where(Resale.buyer_plan_id == buyer_plan_id, Resale.settled.is_(False))
        .order_by(Resale.id)
    ).all()
    credits = _Credits()
    for resale, plan_id in rows:
        resale.settled = True
        credits.by_plan[plan_id] += resale.credited
        credits.hours_by_plan[plan_id] += rules.Span(resale.start, resale.end, resale.count).instance_hours()
    return _credit_accounts(session, credits, now)


def _credit_accounts(session: Session, credits: _Credits, now: datetime) -> Decimal:
    """One ledger line per returning account credited, its budget grown in mode `budget`."""
    by_account: dict[str, list[TrainingPlan]] = defaultdict(list)
    for plan_id, amount in credits.by_plan.items():
        plan = session.get(TrainingPlan, plan_id)
        if plan is not None and amount > 0:
            by_account[plan.account_id].append(plan)
    total = Decimal(0)
    for account_id in sorted(by_account):
        lock_account(session, account_id)
    for account_id in sorted(by_account):
        plans = by_account[account_id]
        amount = sum((credits.by_plan[p.id] for p in plans), start=Decimal(0))
        account = session.scalars(
            select(Account).where(Account.id == account_id).execution_options(populate_existing=True)
        ).one()
        if account.payment_mode == "budget":
            account.budget += amount
        session.add(
            LedgerEntry(
                account_id=account_id,
                invoice_id=None,
                at=now,
                amount=amount,
                budget_after=account.budget,
                description=_description(plans, credits),
            )
        )
        total += amount
    return total


def _description(plans: Sequence[TrainingPlan], credits: _Credits) -> str:
    parts = [
        f"training plan {p.name}: {_hours(credits.hours_by_plan[p.id])} returned instance-hours "
        f"bought again, {credits.by_plan[p.id]} {p.currency}"
        for p in plans
    ]
    return "Resale credit for " + "; ".join(parts)


def _hours(hours: Decimal) -> str:
    return f"{hours.normalize():f}"
