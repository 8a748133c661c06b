"""Returning a plan's capacity: a quote first, then the return it quoted (issue 53; docs/RETURNS.md).

`quote` asks core/returns.py what a scope (the whole plan, a segment, K of its instances, its tail from a
boundary) would give back and refund now, under the policy of the pool it is in, within the account's
refund cap, and keeps the answer as a ReturnQuote valid for the policy's `quote_validity` of service
time, tied to the plan's segments as they were (their fingerprint).

`carry_out` does what the quote said, in one write transaction, or refuses with a Conflict when the quote
is stale (expired, used, or the plan changed since): a quote is a promise about one state of the plan,
and money moves only for the state it priced. Within its validity the quoted refund holds even if a
tier's threshold passed meanwhile: that is what quoting first is for.

What a return writes:
- the segments as the rules left them: a segment cut at a boundary ends there (its end events move, as
  an extension moves them the other way); K instances of a segment that has not started leave it with
  fewer; K of a started one split it at the next boundary into a new segment; a segment returned whole
  is deleted (it never started, so nothing refers to it), so that the plan's status and every consumer
  read only what is left. A plan returned whole (nothing started) keeps its rows, which hold nothing
  any more, and is Expired.
- PlanReturn and its ReturnedWindow rows (what a later booking may resell: services/plans/resale.py);
- the refund: a ledger line (a budget grows by it), or, while the plan's invoice still awaits approval,
  a smaller invoice (cancelled when nothing is left to pay for);
- a plan event ("returned"), an audit record, and the plan's consumers told (`plan_changed`): clusters
  and jobs on a part that ends earlier are taken back at its new reclaim time, as at any segment's end,
  or at once when that time has passed.
The capacity is free in the calendar as the transaction commits (its change counter moves with the
ReservedCapacity rows; this process's calendar releases the windows after the commit).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from hyperplan.core import reclaim_warnings, status_rows
from hyperplan.core.fleet import Fleet
from hyperplan.core.lifecycle import RESERVED_CAPACITY_LIFECYCLE, PlanStatus
from hyperplan.core.returns import (
    CancellationPolicy,
    ReturnPlan,
    Scope,
    Segment,
    Window,
    capped,
    fingerprint,
    plan_return,
    refund,
)
from hyperplan.core.status import ExtensionPaymentStatus, InvoiceStatus
from hyperplan.errors import Conflict, ResourceNotFound, ValidationError
from hyperplan.services.accounts import acting, audit
from hyperplan.services.accounts.accounts import Caller, get_account
from hyperplan.services.plans import capacity_claims, lifecycle, payments
from hyperplan.services.plans.plan_refs import plan_named
from hyperplan.services.runtime import status
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.schema import (
    Invoice,
    LedgerEntry,
    PlanExtension,
    PlanReturn,
    ReservedCapacity,
    ReturnedWindow,
    ReturnQuote,
    ScheduledEvent,
    TrainingPlan,
)

RETURNED = "returned"  # the plan event's kind
# The timed events of one segment, by the ordinal in their payload: a segment deleted loses all of them,
# one that ends earlier its end's (written again for the new end).
_END_EVENTS = (
    status_rows.SEGMENT_RECLAIM,
    status_rows.SEGMENT_END,
    status_rows.RECLAIM_REMINDER,
    reclaim_warnings.RECLAIM_WARNING,
)
_ALL_EVENTS = (*_END_EVENTS, status_rows.SEGMENT_START, status_rows.START_REMINDER)


@dataclass(frozen=True)
class QuoteView:
    """What a return would do, as quoted: valid until `valid_until` (service time)."""

    quote_id: str
    account_id: str
    plan_name: str
    valid_until: datetime
    returned: tuple[Window, ...]
    segments: tuple[Segment, ...]  # the plan's segments after the return
    refund: Decimal
    currency: str
    policy: CancellationPolicy


@dataclass(frozen=True)
class ReturnView:
    """A return carried out. `settled`: where the refund went ("ledger", "budget", "invoice reduced",
    "invoice cancelled", or "nothing" for no refund)."""

    quote_id: str
    account_id: str
    plan_name: str
    plan_status: str
    returned: tuple[Window, ...]
    segments: tuple[Segment, ...]
    refund: Decimal
    currency: str
    settled: str


@dataclass(frozen=True)
class _Priced:
    """A scope worked out now: what it does, its policy, and the refund within the account's cap."""

    plan: ReturnPlan
    policy: CancellationPolicy
    paid: Decimal
    held_instance_hours: float
    refund: Decimal


# -- quote ---------------------------------------------------------------------------------------------


def quote(runtime: ServiceContext, caller: Caller, plan_ref: str, scope: Scope) -> QuoteView:
    """Quote returning `scope` of the plan (the caller's, by name or ARN; any account's by ARN for an
    administrator); nothing is written when it cannot be returned (a ValidationError says why)."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        plan = plan_named(session, runtime, caller, plan_ref)
        _check_returnable(session, plan)
        segments = _segments(lifecycle.segments_of(session, plan.id))
        priced = _price(session, runtime.fleet, plan, segments, scope, now)
        row = ReturnQuote(
            id=f"rq-{secrets.token_hex(16)}",
            plan_id=plan.id,
            account_id=plan.account_id,
            scope=json.dumps(_scope_json(scope)),
            windows=_windows_text(priced.plan.windows),
            refund=priced.refund,
            currency=plan.currency,
            fingerprint=fingerprint(segments),
            created_at=now,
            valid_until=now + priced.policy.quote_validity,
            used_at=None,
        )
        session.add(row)
        return QuoteView(
            row.id,
            plan.account_id,
            plan.name,
            row.valid_until,
            priced.plan.windows,
            priced.plan.kept,
            priced.refund,
            plan.currency,
            priced.policy,
        )


def _check_returnable(session: Session, plan: TrainingPlan) -> None:
    if PlanStatus(plan.status).is_final:
        raise ValidationError(f"Training plan {plan.name} is {plan.status}: it has nothing left to return.")
    pending = session.scalar(
        select(PlanExtension.id).where(
            PlanExtension.plan_id == plan.id,
            PlanExtension.payment_status == ExtensionPaymentStatus.PENDING,
        )
    )
    if pending is not None:
        raise ValidationError(
            f"Training plan {plan.name} has an extension awaiting payment; return capacity once it is paid "
            "or has failed."
        )


def _segments(rows: Sequence[ReservedCapacity]) -> list[Segment]:
    return [
        Segment(rc.ordinal, rc.instance_type, rc.availability_zone, rc.count, rc.start, rc.end)
        for rc in rows
        if rc.holds_capacity
    ]


def _price(
    session: Session, fleet: Fleet, plan: TrainingPlan, segments: list[Segment], scope: Scope, now: datetime
) -> _Priced:
    """What `scope` does to the plan now and what it refunds: the plan's paid amount spread over every
    instance-hour it ever held, each returned window at its tier's fraction, within the account's cap."""
    policy = _policy(fleet, plan, segments, scope)
    returned = plan_return(
        segments, scope, now, fleet.policy.segment_end, fleet.policy.allowed_counts, policy
    )
    paid = _paid(session, plan)
    held = sum(_instance_hours(s) for s in segments) + _returned_instance_hours(session, plan)
    full = refund(paid, held, returned, payments.currency_places(plan.currency))
    within = capped(full, _refunded_since(session, plan.account_id, now - policy.cap_period), policy)
    return _Priced(returned, policy, paid, held, within)


def _policy(fleet: Fleet, plan: TrainingPlan, segments: list[Segment], scope: Scope) -> CancellationPolicy:
    """The policy of the pools the scope returns from; a whole plan across pools whose policies differ
    is returned segment by segment."""
    concerned = [s for s in segments if scope.kind == "plan" or s.ordinal == scope.ordinal] or segments
    policies: list[CancellationPolicy] = []
    for segment in concerned:
        policy = fleet.cancellation_for(segment.instance_type, segment.availability_zone)
        if policy not in policies:
            policies.append(policy)
    if not policies:
        return fleet.cancellation
    if len(policies) > 1:
        names = " and ".join(policy.name for policy in policies)
        raise ValidationError(
            f"Training plan {plan.name}'s segments lie in pools with different cancellation policies "
            f"({names}): return it segment by segment."
        )
    return policies[0]


def _paid(session: Session, plan: TrainingPlan) -> Decimal:
    """The plan's upfront fee and its paid extensions' fees: what its instance-hours cost."""
    # Summed here, not in SQL: a fee is a decimal kept as text, which PostgreSQL does not sum.
    fees = session.scalars(
        select(PlanExtension.upfront_fee).where(
            PlanExtension.plan_id == plan.id, PlanExtension.payment_status == ExtensionPaymentStatus.PAID
        )
    )
    return plan.upfront_fee + sum(fees, start=Decimal(0))


def _instance_hours(segment: Segment) -> float:
    return segment.count * (segment.end - segment.start).total_seconds() / 3600


def _returned_instance_hours(session: Session, plan: TrainingPlan) -> float:
    earlier = session.scalar(
        select(func.coalesce(func.sum(PlanReturn.instance_hours), 0.0)).where(PlanReturn.plan_id == plan.id)
    )
    return float(earlier or 0.0)


def _refunded_since(session: Session, account_id: str, since: datetime) -> Decimal:
    """What the account was refunded since `since` (its refund cap's period)."""
    refunds = session.scalars(
        select(PlanReturn.refund).where(PlanReturn.account_id == account_id, PlanReturn.at > since)
    )
    return sum(refunds, start=Decimal(0))


def _scope_json(scope: Scope) -> dict[str, Any]:
    return {
        "Kind": scope.kind,
        "Segment": scope.ordinal,
        "Instances": scope.instances,
        "From": None if scope.start is None else scope.start.astimezone(UTC).isoformat(),
    }


def _scope_from(text: str) -> Scope:
    given = json.loads(text)
    start = None if given["From"] is None else datetime.fromisoformat(given["From"])
    return Scope(given["Kind"], given["Segment"], given["Instances"], start)


def _windows_text(windows: Sequence[Window]) -> str:
    return json.dumps(
        [
            {
                "InstanceType": w.instance_type,
                "AvailabilityZone": w.availability_zone,
                "StartTime": w.start.astimezone(UTC).isoformat(),
                "EndTime": w.end.astimezone(UTC).isoformat(),
                "InstanceCount": w.count,
            }
            for w in windows
        ]
    )


# -- carry out -----------------------------------------------------------------------------------------


def carry_out(runtime: ServiceContext, caller: Caller, quote_id: str) -> ReturnView:
    """Return what quote `quote_id` (the caller's; any for an administrator) quoted, at its refund; a
    Conflict when it is stale: used, expired, or the plan changed since."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        row = session.get(ReturnQuote, quote_id)
        if row is None or (row.account_id != caller.account_id and not caller.is_admin):
            raise ResourceNotFound(f"Return quote {quote_id} does not exist.")
        plan = session.get(TrainingPlan, row.plan_id)
        assert plan is not None
        rows = lifecycle.segments_of(session, plan.id)
        priced = _still_valid(session, runtime.fleet, row, plan, rows, now)
        view = _apply(session, runtime, caller, row, plan, rows, priced, now)
    runtime.wakes.lifecycle.notify()
    return view


def _still_valid(
    session: Session,
    fleet: Fleet,
    row: ReturnQuote,
    plan: TrainingPlan,
    rows: list[ReservedCapacity],
    now: datetime,
) -> _Priced:
    """The quote's scope worked out again now; a Conflict unless it does and refunds what was quoted."""
    again = "ask for a new quote (hyperplan plans quote-return)"
    if row.used_at is not None:
        raise Conflict(f"Return quote {row.id} was already used at {_when(row.used_at)}; {again}.")
    if now > row.valid_until:
        raise Conflict(f"Return quote {row.id} is stale: it expired at {_when(row.valid_until)}; {again}.")
    segments = _segments(rows)
    changed = Conflict(f"Return quote {row.id} is stale: training plan {plan.name} changed since; {again}.")
    if PlanStatus(plan.status).is_final or fingerprint(segments) != row.fingerprint:
        raise changed
    try:
        _check_returnable(session, plan)
        priced = _price(session, fleet, plan, segments, _scope_from(row.scope), now)
    except ValidationError:
        raise changed from None
    if _windows_text(priced.plan.windows) != row.windows:
        raise changed
    refunded = _refunded_since(session, plan.account_id, now - priced.policy.cap_period)
    if capped(row.refund, refunded, priced.policy) != row.refund:
        raise Conflict(
            f"Return quote {row.id} is stale: the account's refund cap no longer leaves room for its "
            f"refund of {row.refund} {row.currency}; {again}."
        )
    return priced


def _apply(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    row: ReturnQuote,
    plan: TrainingPlan,
    rows: list[ReservedCapacity],
    priced: _Priced,
    now: datetime,
) -> ReturnView:
    returned = priced.plan
    if returned.kept:
        _follow_kept(session, runtime, plan, rows, returned.kept, now)
    else:
        _close(session, plan, rows, now)
    row.used_at = now
    record = _record_return(session, row, plan, priced, now)
    settled = _settle_refund(session, plan, row, bool(returned.kept), now)
    record.settled = "ledger" if settled in ("ledger", "budget") else settled
    lifecycle.record(session, plan, RETURNED, _message(row, returned.windows, settled), now)
    audit.record(
        session,
        now,
        caller,
        "plan.return",
        account_id=plan.account_id,
        target=plan.name,
        detail={"Quote": row.id, "Refund": str(row.refund), "InstanceHours": record.instance_hours},
    )
    runtime.lifecycle.plan_changed(session, plan.id, now)
    bookings = [((w.instance_type, w.availability_zone), w.start, w.end, w.count) for w in returned.windows]
    after_commit(
        session,
        lambda: runtime.calendar.release(bookings, committed_change(session, CALENDAR), returned=True),
        early=True,
    )
    return ReturnView(
        row.id,
        plan.account_id,
        plan.name,
        plan.status,
        returned.windows,
        returned.kept,
        row.refund,
        row.currency,
        settled,
    )


def _follow_kept(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    rows: list[ReservedCapacity],
    kept: Sequence[Segment],
    now: datetime,
) -> None:
    """The plan's rows become `kept`: deleted, shortened, fewer, or a new later part; each timed event
    follows its segment. A started segment whose new reclaim time has passed is taken back now."""
    policies = runtime.lifecycle.policies(plan.target)
    wanted = {s.ordinal: s for s in kept}
    taken_back = False
    for rc in rows:
        segment = wanted.pop(rc.ordinal, None)
        if segment is None:
            lifecycle.cancel_segment_events(session, plan, rc.ordinal, _ALL_EVENTS)
            session.delete(rc)
            continue
        rc.count = segment.count
        if segment.end != rc.end:
            lifecycle.cancel_segment_events(session, plan, rc.ordinal, _END_EVENTS)
            rc.end = segment.end
            lifecycle.schedule_segment(session, plan, rc, policies, now, only_end=True)
            if rc.start <= now and rc.end - policies.reclaim_lead <= now:  # its reclaim time has passed
                taken_back = True
                lifecycle.record_entry(session, plan, status_rows.reclaim_begins(plan.name, rc.ordinal), now)
    for segment in wanted.values():  # the later part of a started segment, split
        new = ReservedCapacity(
            plan_id=plan.id,
            ordinal=segment.ordinal,
            instance_type=segment.instance_type,
            availability_zone=segment.availability_zone,
            count=segment.count,
            start=segment.start,
            end=segment.end,
            status=PlanStatus.PENDING if plan.status == PlanStatus.PENDING else PlanStatus.SCHEDULED,
            holds_capacity=True,
            released_at=None,
        )
        session.add(new)
        lifecycle.schedule_segment(session, plan, new, policies, now)
    session.flush()
    if taken_back:
        capacity_claims.release_plan(session, plan.id, now)
    lifecycle.refresh(session, plan, now)


def _close(session: Session, plan: TrainingPlan, rows: list[ReservedCapacity], now: datetime) -> None:
    """A plan returned whole before any segment started: it holds nothing and is over (Expired); its
    rows stay, the record of what it was."""
    message = f"Returned before it started: training plan {plan.name} holds no capacity any more."
    for rc in rows:
        rc.holds_capacity = False
        if RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus(rc.status), PlanStatus.EXPIRED):
            status.change(session, RESERVED_CAPACITY_LIFECYCLE, rc, PlanStatus.EXPIRED, now, message)
    session.execute(
        update(ScheduledEvent)
        .where(ScheduledEvent.subject == str(plan.id), ScheduledEvent.done.is_(False))
        .values(done=True)
    )
    lifecycle.transition(session, plan, PlanStatus.EXPIRED, message, "status", now)


def _record_return(
    session: Session, row: ReturnQuote, plan: TrainingPlan, priced: _Priced, now: datetime
) -> PlanReturn:
    """The return and the windows it gave back, each priced at what the plan paid per instance-hour
    (what a resale of it credits a share of)."""
    windows = priced.plan.windows
    record = PlanReturn(
        plan_id=plan.id,
        account_id=plan.account_id,
        quote_id=row.id,
        at=now,
        scope=row.scope,
        instance_hours=sum(w.instance_hours() for w in windows),
        refund=row.refund,
        currency=row.currency,
    )
    session.add(record)
    session.flush()
    price = _price_per_instance_hour(priced)
    for w in windows:
        session.add(
            ReturnedWindow(
                return_id=record.id,
                plan_id=plan.id,
                account_id=plan.account_id,
                instance_type=w.instance_type,
                availability_zone=w.availability_zone,
                start=w.start,
                end=w.end,
                count=w.count,
                price_per_instance_hour=price,
                resale_share=priced.policy.resale_share,
            )
        )
    return record


def _price_per_instance_hour(priced: _Priced) -> Decimal:
    if priced.held_instance_hours <= 0:
        return Decimal(0)
    exact = priced.paid / Decimal(repr(priced.held_instance_hours))
    return exact.quantize(Decimal("0.000001"))


def _settle_refund(session: Session, plan: TrainingPlan, row: ReturnQuote, kept: bool, now: datetime) -> str:
    """The refund paid back: a ledger line (a budget grows by it); or, while the plan's invoice awaits
    approval, less to pay (nothing, when nothing is left to pay for)."""
    invoice = session.scalar(
        select(Invoice).where(Invoice.plan_id == plan.id, Invoice.extension_id.is_(None)).order_by(Invoice.id)
    )
    if invoice is not None and invoice.status == InvoiceStatus.PENDING:
        if not kept or invoice.amount <= row.refund:
            payments.fail_pending(session, plan.id, f"cancelled: the plan was returned ({row.id})", now)
            return "invoice cancelled"
        if row.refund <= 0:
            return "nothing"
        invoice.amount -= row.refund
        return "invoice reduced"
    if row.refund <= 0:
        return "nothing"
    account = get_account(session, plan.account_id)
    if account.payment_mode == "budget":
        account.budget += row.refund
    line = f"Refund for training plan {plan.name}: return quote {row.id}"
    invoice_id = invoice.id if invoice is not None else None
    session.add(
        LedgerEntry(**status_rows.ledger_entry(account.id, invoice_id, now, row.refund, account.budget, line))
    )
    return "budget" if account.payment_mode == "budget" else "ledger"


def _message(row: ReturnQuote, windows: Sequence[Window], settled: str) -> str:
    parts = [
        f"{w.count} x {w.instance_type} in {w.availability_zone} from {_when(w.start)} to {_when(w.end)}"
        for w in windows
    ]
    money = {
        "nothing": "no refund",
        "ledger": f"refunded {row.refund} {row.currency}",
        "budget": f"refunded {row.refund} {row.currency} to the budget",
        "invoice reduced": f"the invoice reduced by {row.refund} {row.currency}",
        "invoice cancelled": "the invoice cancelled",
    }[settled]
    return f"Returned {'; '.join(parts)} ({row.id}): {money}."


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
