"""The one place a plan's status changes, and the timed events that change it.

Every change goes through `transition`, which checks it against the state machine
(`hyperplan.core.lifecycle.PLAN_TRANSITIONS`), sets the status message, and appends the plan's history.
Once a plan is paid its status follows from its segments and the service time (`refresh`); the timed
events (segment start, capacity reclaim, segment end, payment deadline) only say when to look again.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hyperplan.core.lifecycle import PlanStatus, Window, check_transition, status_at, status_message
from hyperplan.scheduler import schedule
from hyperplan.services import plan_capacity
from hyperplan.services.capacity import LiveCalendar
from hyperplan.store.db import after_commit
from hyperplan.store.schema import PlanEvent, ReservedCapacity, ScheduledEvent, TrainingPlan

SEGMENT_START = "segment.start"
SEGMENT_RECLAIM = "segment.reclaim"
SEGMENT_END = "segment.end"
PAYMENT_DEADLINE = "payment.deadline"


def segments_of(session: Session, plan_id: int) -> list[ReservedCapacity]:
    return list(
        session.scalars(
            select(ReservedCapacity)
            .where(ReservedCapacity.plan_id == plan_id)
            .order_by(ReservedCapacity.ordinal)
        )
    )


def record(session: Session, plan: TrainingPlan, kind: str, message: str, now: datetime) -> None:
    """Append to the plan's history without changing its status."""
    session.add(PlanEvent(plan_id=plan.id, at=now, kind=kind, status=plan.status, message=message))


def transition(
    session: Session, plan: TrainingPlan, status: PlanStatus, message: str, kind: str, now: datetime
) -> None:
    check_transition(PlanStatus(plan.status), status)
    plan.status = status
    plan.status_message = message
    plan.updated_at = now
    record(session, plan, kind, message, now)


def schedule_segments(session: Session, plan: TrainingPlan, reclaim_lead: object, now: datetime) -> None:
    """The timed events of a new plan's segments, written with the plan."""
    from datetime import timedelta

    assert isinstance(reclaim_lead, timedelta)
    for rc in segments_of(session, plan.id):
        for kind, when in (
            (SEGMENT_START, rc.start),
            (SEGMENT_RECLAIM, max(rc.start, rc.end - reclaim_lead)),
            (SEGMENT_END, rc.end),
        ):
            if when > now:
                schedule(session, kind, when, subject=str(plan.id), segment=rc.ordinal)


def refresh(session: Session, plan: TrainingPlan, now: datetime, kind: str = "status") -> None:
    """Set a paid plan's status and its segments' statuses from the time; record a change if there is one."""
    if PlanStatus(plan.status) in (PlanStatus.PENDING, PlanStatus.FAILED, PlanStatus.EXPIRED):
        return
    _follow_time(session, plan, now, kind)


def mark_paid(session: Session, plan: TrainingPlan, now: datetime, message: str) -> None:
    """Payment settled: the plan leaves Pending for whatever its segments say now."""
    record(session, plan, "paid", message, now)
    _follow_time(session, plan, now, "scheduled")


def _follow_time(session: Session, plan: TrainingPlan, now: datetime, kind: str) -> None:
    rcs = segments_of(session, plan.id)
    windows = [Window(rc.start, rc.end) for rc in rcs]
    for rc, window in zip(rcs, windows, strict=True):
        rc.status = status_at([window], now)
    status = status_at(windows, now)
    message = status_message(windows, status, now)
    if status != plan.status or message != plan.status_message:
        transition(session, plan, status, message, kind, now)


def fail(
    session: Session, calendar: LiveCalendar, plan: TrainingPlan, message: str, kind: str, now: datetime
) -> None:
    """Fail a plan and give back, at once, every instance it still holds."""
    transition(session, plan, PlanStatus.FAILED, message, kind, now)
    plan_capacity.release_plan(session, plan.id, now)
    released = []
    for rc in segments_of(session, plan.id):
        rc.status = PlanStatus.FAILED
        if not rc.holds_capacity or rc.end <= now or (rc.released_at and rc.released_at <= now):
            continue
        key = (rc.instance_type, rc.availability_zone)
        if rc.start >= now:
            rc.holds_capacity = False
            released.append((key, rc.start, rc.end, rc.count))
        else:  # an open segment: held until now, free from now on
            rc.released_at = now
            released.append((key, now, rc.end, rc.count))
    _cancel_events(session, plan)
    after_commit(session, lambda: calendar.release(released))


def _cancel_events(session: Session, plan: TrainingPlan) -> None:
    session.execute(
        update(ScheduledEvent)
        .where(ScheduledEvent.subject == str(plan.id), ScheduledEvent.done.is_(False))
        .values(done=True)
    )


def on_segment_event(session: Session, event_kind: str, plan_id: str, segment: int, now: datetime) -> None:
    plan = session.get(TrainingPlan, int(plan_id))
    if plan is None or PlanStatus(plan.status).is_final:
        return
    if event_kind == SEGMENT_RECLAIM:
        plan_capacity.release_plan(session, plan.id, now)
        record(
            session,
            plan,
            "reclaim-begins",
            f"Capacity of reserved capacity {plan.name}-rc{segment} is being taken back before it ends.",
            now,
        )
        return
    refresh(session, plan, now, "segment-started" if event_kind == SEGMENT_START else "segment-ended")
