"""The demo fleet's background load, held as real plans by an account of its own.

Stored like any other plan, the load is what the purchase transaction re-checks against, what the
calendar is rebuilt from after a restart, and what `hyperplan plans list` shows its account. A daily
timed event adds the next stretch as the service clock moves on, so the calendar stays busy.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.demo_load import background_bookings
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.offerings import Segment
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.accounts import accounts
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.schema import Account, ReservedCapacity, ScheduledEvent, TrainingPlan

ACCOUNT_NAME = "background-load"
TOP_UP = "background.top-up"
TOP_UP_EVERY = timedelta(days=1)


def top_up(runtime: ServiceContext, session: Session, now: datetime) -> list[Segment]:
    """Store the load over the coming horizon that is not stored yet; returns what it added."""
    load = runtime.fleet.background_load
    if load is None:
        return []
    account = _account(session, runtime, now)
    known = set(
        session.scalars(select(TrainingPlan.offering_id).where(TrainingPlan.account_id == account.id))
    )
    added = [
        (s, key) for s, key in _keyed(background_bookings(runtime.fleet, now, load.seed)) if key not in known
    ]
    _store(runtime, session, account, added, now)
    schedule(session, TOP_UP, now + TOP_UP_EVERY)
    return [segment for segment, _ in added]


def store_initial_load(runtime: ServiceContext) -> int:
    """On the first start of a demo fleet, store its load; later top-ups are timed events. Returns how
    many bookings it stored."""
    if runtime.fleet.background_load is None:
        return 0
    with runtime.db.write() as session:
        if is_scheduled(session):
            return 0
        return len(top_up(runtime, session, runtime.clock.now()))


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The daily top-up of the load, for the lifecycle loop."""

    def top_up_background(session: Session, event: DueEvent) -> None:
        added = top_up(runtime, session, runtime.clock.now())
        # The calendar learns of them only once this transaction commits.
        bookings = [(s.pool_key, s.start, s.end, s.count) for s in added]
        after_commit(
            session, lambda: runtime.calendar.book(bookings, committed_change(session, CALENDAR)), early=True
        )

    return {TOP_UP: top_up_background}


def is_scheduled(session: Session) -> bool:
    pending = select(ScheduledEvent.id).where(ScheduledEvent.kind == TOP_UP, ScheduledEvent.done.is_(False))
    return session.scalar(pending.limit(1)) is not None


def _account(session: Session, runtime: ServiceContext, now: datetime) -> Account:
    account = session.scalar(select(Account).where(Account.name == ACCOUNT_NAME))
    if account is None:
        accounts.create_account(session, ACCOUNT_NAME, box=runtime.secret_box, now=now)
        account = session.scalar(select(Account).where(Account.name == ACCOUNT_NAME))
    assert account is not None
    return account


def _keyed(segments: list[Segment]) -> list[tuple[Segment, str]]:
    """A stable identity per booking, so that a later top-up recognises what is already stored."""
    seen: Counter[tuple[object, ...]] = Counter()
    keyed = []
    for segment in segments:
        identity = (segment.pool_key, segment.start.isoformat(), segment.end.isoformat(), segment.count)
        seen[identity] += 1
        digest = hashlib.sha256(repr((identity, seen[identity])).encode()).hexdigest()[:32]
        keyed.append((segment, f"background-{digest}"))
    return keyed


def _store(
    runtime: ServiceContext,
    session: Session,
    account: Account,
    bookings: list[tuple[Segment, str]],
    now: datetime,
) -> None:
    """Store the bookings as paid plans of one segment each, as a purchase would leave them.

    A demo's first start stores about 300 of them, which took a third of its start-up CPU when each plan
    was flushed and read back on its own: here the plans are inserted together, then their segments,
    each plan is handed its segment rather than reading it back, and the rest (timed events, history,
    statuses) goes to the store in the commit's flush. Rows are added in the same order as one plan at
    a time would add them, so they get the same ids.
    """
    plans = [_plan(runtime, account, segment, key, now) for segment, key in bookings]
    session.add_all(plans)
    session.flush()  # the plans' ids, for their segments
    segments = [_segment(plan, segment) for plan, (segment, _) in zip(plans, bookings, strict=True)]
    session.add_all(segments)
    session.flush()  # the segments' ids, for their status history
    for plan, rc in zip(plans, segments, strict=True):
        lifecycle.schedule_segments(session, runtime.lifecycle, plan, now, [rc])
        lifecycle.mark_paid(
            session, plan, now, "Background load: held by the demo, paid for by nobody.", [rc]
        )


def _plan(
    runtime: ServiceContext, account: Account, segment: Segment, key: str, now: datetime
) -> TrainingPlan:
    instance_type, _zone = segment.pool_key
    return TrainingPlan(
        account_id=account.id,
        name=f"load-{key.removeprefix('background-')[:12]}",
        offering_id=key,
        target="training-job",
        instance_type=instance_type,
        status=PlanStatus.PENDING,
        status_message="",
        upfront_fee=Decimal("0"),
        currency=runtime.fleet.pool(segment.pool_key).currency,
        created_at=now,
        updated_at=now,
    )


def _segment(plan: TrainingPlan, segment: Segment) -> ReservedCapacity:
    instance_type, zone = segment.pool_key
    return ReservedCapacity(
        plan_id=plan.id,
        ordinal=1,
        instance_type=instance_type,
        availability_zone=zone,
        count=segment.count,
        start=segment.start,
        end=segment.end,
        status=PlanStatus.PENDING,
    )
