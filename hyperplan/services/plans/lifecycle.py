"""The one place a plan's status changes, and the timed events that change it.

Every change goes through `transition`, which moves the plan with `hyperplan.services.runtime.status.change`
(checked against `hyperplan.core.lifecycle.PLAN_LIFECYCLE`), sets the status message, and appends the
plan's history. Its segments move the same way (`RESERVED_CAPACITY_LIFECYCLE`), recorded as status events.
Once a plan is paid its status follows from its segments and the service time (`refresh`); the timed
events (segment start, capacity reclaim, segment end, payment deadline) only say when to look again.
A plan paid as it is bought is written already moved, with the same history, by
services/plans/plan_purchase.py (the purchase's few statements); what it writes is what `mark_paid` would:
both build their rows and messages with core/status_rows.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import event as orm_event
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from hyperplan.core import reclaim_warnings, status_rows
from hyperplan.core.lifecycle import (
    PLAN_LIFECYCLE,
    RESERVED_CAPACITY_LIFECYCLE,
    PlanStatus,
    Window,
    status_at,
    status_message,
)
from hyperplan.core.status import EXTENSION_LIFECYCLE, ExtensionPaymentStatus
from hyperplan.core.status_rows import (
    PAYMENT_DEADLINE as PAYMENT_DEADLINE,  # the timed events' kinds, named here for the lifecycle loop
)
from hyperplan.core.status_rows import (
    RECLAIM_REMINDER,
    SEGMENT_END,
    SEGMENT_RECLAIM,
    SEGMENT_START,
    START_REMINDER,
    Entry,
)
from hyperplan.events.loop import DueEvent, EventHandler
from hyperplan.services.accounts import acting
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime import status
from hyperplan.services.runtime.context import LifecycleContext, Policies
from hyperplan.services.webhooks import webhooks
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.schema import PlanEvent, PlanExtension, ReservedCapacity, ScheduledEvent, TrainingPlan


def segments_of(session: Session, plan_id: int) -> list[ReservedCapacity]:
    """The plan's segments in order; from a lifecycle batch's one read of its plans' segments when this
    transaction holds it (SegmentEvents.prepare), else read."""
    read = _segments_read(session).get(plan_id)
    if read is not None:
        return list(read)
    return list(
        session.scalars(
            select(ReservedCapacity)
            .where(ReservedCapacity.plan_id == plan_id)
            .order_by(ReservedCapacity.ordinal)
        )
    )


def record(session: Session, plan: TrainingPlan, kind: str, message: str, now: datetime) -> None:
    """Append to the plan's history without changing its status; its account's webhooks will hear of it."""
    record_entry(session, plan, Entry(kind, message), now)


def record_entry(session: Session, plan: TrainingPlan, entry: Entry, now: datetime) -> None:
    """`record` of an entry core/status_rows.py words."""
    event = PlanEvent(**status_rows.plan_event(plan.id, now, entry, plan.status, acting.actor(session)))
    session.add(event)
    webhooks.enqueue(session, event, plan)


def schedule_event(session: Session, event: status_rows.Row) -> None:
    """A timed event of a plan (status_rows.timed_event), in the caller's transaction."""
    session.add(ScheduledEvent(**event))


def transition(
    session: Session, plan: TrainingPlan, new: PlanStatus, message: str, kind: str, now: datetime
) -> None:
    """Move the plan to `new` (or, when it is there already, only give it a new message) and append
    the entry to its history."""

    def history() -> None:
        plan.status_message = message
        plan.updated_at = now
        record(session, plan, kind, message, now)

    if new == plan.status:
        history()  # a new message for the same status: an entry in the history, no move
    else:
        status.change(session, PLAN_LIFECYCLE, plan, new, now, message, record=history)


def _move_segment(
    session: Session, rc: ReservedCapacity, new: PlanStatus, now: datetime, message: str
) -> None:
    status.change(session, RESERVED_CAPACITY_LIFECYCLE, rc, new, now, message)


def _move_extension(
    session: Session, extension: PlanExtension, new: ExtensionPaymentStatus, now: datetime, message: str
) -> None:
    status.change(session, EXTENSION_LIFECYCLE, extension, new, now, message, column="payment_status")


def schedule_segments(
    session: Session,
    ctx: LifecycleContext,
    plan: TrainingPlan,
    now: datetime,
    segments: Sequence[ReservedCapacity] | None = None,
) -> None:
    """The timed events of a new plan's segments, written with the plan; `segments`: the rows just
    added, in order (saves reading them back), else read from the store."""
    for rc in segments if segments is not None else segments_of(session, plan.id):
        schedule_segment(session, plan, rc, ctx.policies(plan.target), now)


def schedule_segment(
    session: Session,
    plan: TrainingPlan,
    rc: ReservedCapacity,
    policy: Policies,
    now: datetime,
    *,
    only_end: bool = False,
) -> None:
    """Start, reclaim and end of one segment, and the reminders before its start and its reclaim."""
    for kind, when, payload in segment_events(rc.start, rc.end, rc.ordinal, policy, now, only_end=only_end):
        schedule_event(session, status_rows.timed_event(kind, when, str(plan.id), json.dumps(payload)))


def segment_events(
    start: datetime, end: datetime, ordinal: int, policy: Policies, now: datetime, *, only_end: bool = False
) -> list[tuple[str, datetime, dict[str, Any]]]:
    """The timed events of one segment still to come, in the order they are written: (kind, due,
    payload)."""
    reclaim = max(start, end - policy.reclaim_lead)
    times = [
        (SEGMENT_RECLAIM, reclaim),
        (SEGMENT_END, end),
    ]
    reminder = max(start, reclaim - policy.reclaim_reminder)
    if not only_end:
        times += [(SEGMENT_START, start), (START_REMINDER, start - policy.start_reminder)]
    events: list[tuple[str, datetime, dict[str, Any]]] = [
        (kind, when, {"segment": ordinal}) for kind, when in times if when > now
    ]
    if reminder > now:
        events.append((RECLAIM_REMINDER, reminder, {"segment": ordinal, "reclaim_at": reclaim.isoformat()}))
    first_warning = reclaim_warnings.first_check(reclaim, now)
    if first_warning is not None:  # the account's reclaim warnings (services/plans/reclaim_warnings.py)
        warnings = {"segment": ordinal, "since": now.isoformat()}
        events.append((reclaim_warnings.RECLAIM_WARNING, first_warning, warnings))
    return events


def _cancel_segment_end(session: Session, plan: TrainingPlan, ordinal: int) -> None:
    """Drop the pending reclaim and end events (and the reclaim reminder and warnings) of one segment."""
    kinds = (SEGMENT_RECLAIM, SEGMENT_END, RECLAIM_REMINDER, reclaim_warnings.RECLAIM_WARNING)
    cancel_segment_events(session, plan, ordinal, kinds)


def cancel_segment_events(session: Session, plan: TrainingPlan, ordinal: int, kinds: Sequence[str]) -> None:
    """Drop one segment's pending timed events of these kinds (an extension or a return moves them)."""
    pending = session.scalars(
        select(ScheduledEvent).where(
            ScheduledEvent.subject == str(plan.id),
            ScheduledEvent.done.is_(False),
            ScheduledEvent.kind.in_(kinds),
        )
    )
    for event in pending:
        if json.loads(event.payload).get("segment") == ordinal:
            event.done = True


def apply_extension(
    session: Session,
    ctx: LifecycleContext,
    plan: TrainingPlan,
    extension: PlanExtension,
    now: datetime,
    how: str,
) -> None:
    """A paid extension: the plan's last segment now ends later (same ARN); its old end events go away."""
    _move_extension(session, extension, ExtensionPaymentStatus.PAID, now, how)
    last = segments_of(session, plan.id)[-1]
    _cancel_segment_end(session, plan, last.ordinal)
    last.end = extension.end
    extension.holds_capacity = False  # the segment holds it from now on
    schedule_segment(session, plan, last, ctx.policies(plan.target), now, only_end=True)
    record_entry(session, plan, status_rows.extended(extension.end, how, plan.name, last.ordinal), now)
    refresh(session, plan, now, "extended")


def fail_extension(
    session: Session,
    ctx: LifecycleContext,
    plan: TrainingPlan,
    extension: PlanExtension,
    message: str,
    kind: str,
    now: datetime,
) -> None:
    _move_extension(session, extension, ExtensionPaymentStatus.FAILED, now, message)
    extension.holds_capacity = False
    record(session, plan, kind, message, now)
    released = [
        (
            (extension.instance_type, extension.availability_zone),
            extension.start,
            extension.end,
            extension.count,
        )
    ]
    after_commit(
        session, lambda: ctx.calendar.release(released, committed_change(session, CALENDAR)), early=True
    )


def refresh(session: Session, plan: TrainingPlan, now: datetime, kind: str = "status") -> None:
    """Set a paid plan's status and its segments' statuses from the time; record a change if there is one."""
    if PlanStatus(plan.status) in (PlanStatus.PENDING, PlanStatus.FAILED, PlanStatus.EXPIRED):
        return
    _follow_time(session, plan, now, kind)


def mark_paid(
    session: Session,
    plan: TrainingPlan,
    now: datetime,
    message: str,
    segments: Sequence[ReservedCapacity] | None = None,
) -> None:
    """Payment settled: the plan leaves Pending for whatever its segments say now; `segments`: all of
    the plan's, in order, when the caller has them (saves reading them back), else read from the store."""
    record_entry(session, plan, status_rows.paid(message), now)
    _follow_time(session, plan, now, status_rows.SCHEDULED, segments)


def _follow_time(
    session: Session,
    plan: TrainingPlan,
    now: datetime,
    kind: str,
    segments: Sequence[ReservedCapacity] | None = None,
) -> None:
    rcs = list(segments) if segments is not None else segments_of(session, plan.id)
    windows = [Window(rc.start, rc.end) for rc in rcs]
    new = status_at(windows, now)
    message = status_message(windows, new, now)
    for rc, window in zip(rcs, windows, strict=True):
        segment_new = status_at([window], now)
        # Only forwards: a timed event run late looks at an earlier instant than a change already made.
        if RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus(rc.status), segment_new):
            _move_segment(session, rc, segment_new, now, message)
    if new != plan.status or message != plan.status_message:
        transition(session, plan, new, message, kind, now)


def fail(
    session: Session, ctx: LifecycleContext, plan: TrainingPlan, message: str, kind: str, now: datetime
) -> None:
    """Fail a plan and give back, at once, every instance it still holds."""
    transition(session, plan, PlanStatus.FAILED, message, kind, now)
    capacity_claims.release_plan(session, plan.id, now)
    released = []
    for rc in segments_of(session, plan.id):
        if rc.status != PlanStatus.EXPIRED:  # a segment that has run its course stays Expired
            _move_segment(session, rc, PlanStatus.FAILED, now, message)
        if not rc.holds_capacity or rc.end <= now or (rc.released_at and rc.released_at <= now):
            continue
        key = (rc.instance_type, rc.availability_zone)
        if rc.start >= now:
            rc.holds_capacity = False
            released.append((key, rc.start, rc.end, rc.count))
        else:  # an open segment: held until now, free from now on
            rc.released_at = now
            released.append((key, now, rc.end, rc.count))
    for extension in session.scalars(
        select(PlanExtension).where(PlanExtension.plan_id == plan.id, PlanExtension.holds_capacity.is_(True))
    ):
        extension.holds_capacity = False
        if extension.payment_status == ExtensionPaymentStatus.PENDING:
            _move_extension(session, extension, ExtensionPaymentStatus.FAILED, now, message)
        key = (extension.instance_type, extension.availability_zone)
        released.append((key, extension.start, extension.end, extension.count))
    _cancel_events(session, plan)
    after_commit(
        session, lambda: ctx.calendar.release(released, committed_change(session, CALENDAR)), early=True
    )
    ctx.plan_changed(session, plan.id, now)


def _cancel_events(session: Session, plan: TrainingPlan) -> None:
    session.execute(
        update(ScheduledEvent)
        .where(ScheduledEvent.subject == str(plan.id), ScheduledEvent.done.is_(False))
        .values(done=True)
    )


def event_handlers(ctx: LifecycleContext) -> dict[str, EventHandler]:
    """The timed events of plans' segments, for the lifecycle loop."""
    kinds = (SEGMENT_START, SEGMENT_RECLAIM, SEGMENT_END, START_REMINDER, RECLAIM_REMINDER)
    return dict.fromkeys(kinds, SegmentEvents(ctx))


_PLANS_READ = "lifecycle_plans_read"
_SEGMENTS_READ = "lifecycle_segments_read"  # {plan id: its segments in order}, read once for a batch


def _segments_read(session: Session) -> dict[int, list[ReservedCapacity]]:
    """The batch's segments as read, unless a segment has been added or deleted in this transaction
    since (a return cuts a plan's segments into new rows): then they are read again, from the store."""
    read: dict[int, list[ReservedCapacity]] = session.info.get(_SEGMENTS_READ, {})
    if read and any(isinstance(row, ReservedCapacity) for row in (*session.new, *session.deleted)):
        read.clear()
    return read


def _forget_segments_read(session: Session, instance: object) -> None:
    if isinstance(instance, ReservedCapacity):
        session.info.get(_SEGMENTS_READ, {}).clear()


class SegmentEvents:
    """The segment events' handler. A batch's plans and their segments are read in two statements
    (events/loop.py's BatchReader), not two per event: each event's `session.get` of its plan finds it
    in the session, and `segments_of` its segments (the same objects, so what an event before it in the
    batch changed is seen). A segment added or deleted later in the transaction (a return's cut) drops
    what was read: `segments_of` reads from the store again."""

    def __init__(self, ctx: LifecycleContext) -> None:
        self.ctx = ctx

    def prepare(self, session: Session, events: Sequence[DueEvent]) -> None:
        plan_ids = {int(event.subject) for event in events if event.subject.isdigit()}
        if len(plan_ids) < 2:
            return  # a read of one plan, as the event itself would make
        read = session.scalars(select(TrainingPlan).where(TrainingPlan.id.in_(plan_ids))).all()
        # Held for the transaction: the session's identity map keeps unchanged rows only weakly.
        session.info.setdefault(_PLANS_READ, []).extend(read)
        segments: dict[int, list[ReservedCapacity]] = {plan_id: [] for plan_id in plan_ids}
        for rc in session.scalars(
            select(ReservedCapacity)
            .where(ReservedCapacity.plan_id.in_(plan_ids))
            .order_by(ReservedCapacity.plan_id, ReservedCapacity.ordinal)
        ):
            segments[rc.plan_id].append(rc)
        if _SEGMENTS_READ not in session.info:  # rows added or deleted later in the batch: read again
            orm_event.listen(session, "pending_to_persistent", _forget_segments_read)
            orm_event.listen(session, "persistent_to_deleted", _forget_segments_read)
        session.info[_SEGMENTS_READ] = segments

    def __call__(self, session: Session, event: DueEvent) -> None:
        # At its due time, not when the loop got to it: the history says when things happened.
        on_segment_event(session, self.ctx, event.kind, event.subject, event.payload, event.due_at)


def on_segment_event(
    session: Session,
    ctx: LifecycleContext,
    event_kind: str,
    plan_id: str,
    payload: Mapping[str, Any],
    now: datetime,
) -> None:
    segment = int(payload.get("segment", 0))
    plan = session.get(TrainingPlan, int(plan_id))
    if plan is None or PlanStatus(plan.status).is_final:
        return
    if event_kind == START_REMINDER:
        rc = _segment(session, plan, segment)
        record_entry(session, plan, status_rows.start_reminder(plan.name, segment, rc.start), now)
        return
    if event_kind == RECLAIM_REMINDER:
        rc = _segment(session, plan, segment)
        reminder = status_rows.reclaim_reminder(plan.name, segment, payload.get("reclaim_at", ""), rc.end)
        record_entry(session, plan, reminder, now)
        return
    if event_kind == SEGMENT_RECLAIM:
        capacity_claims.release_plan(session, plan.id, now)
        record_entry(session, plan, status_rows.reclaim_begins(plan.name, segment), now)
        ctx.plan_changed(session, plan.id, now)
        return
    refresh(session, plan, now, "segment-started" if event_kind == SEGMENT_START else "segment-ended")
    ctx.plan_changed(session, plan.id, now)


def _segment(session: Session, plan: TrainingPlan, ordinal: int) -> ReservedCapacity:
    return next(rc for rc in segments_of(session, plan.id) if rc.ordinal == ordinal)
