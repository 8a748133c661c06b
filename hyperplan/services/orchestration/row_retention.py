"""Retention of rows: what the store need not keep for ever, removed (or, for the metering ledger,
compacted) once the fleet's ``[retention]`` periods have passed (docs/DECISIONS.md, "Retention of rows";
docs/OPERATIONS.md, "Retention"). Run by the retention worker (retention.py), on the leader, off every
request's path.

What goes, each kind only when its period is set:
- ``events``: the status events (status_events) of the segments, invoices and extensions of plans that
  ended (Expired, Failed) longer ago than the period, and those plans' timed events that are done; and
  every other done timed event (on-demand meters' hours, jobs' deadlines, spot runs') due longer ago.
  A done timed event is never read again (the loop and every cancellation look at pending ones only);
  status events are read by nothing a user sees. A live plan's rows all stay, whatever their age.
- ``audit``: audit rows older than the period (service time): `audit list` no longer shows them.
- ``leases``: the rate limiter's buckets (rate_buckets) untouched for the period, real time, as the
  buckets count: such a bucket is full again (for any limit whose burst refills within the period) and
  is made again, full, by the next lease.
- ``metering``: hourly on-demand ledger lines older than the period, one line per holder and day in
  their place with the same total (metering_compaction.py).
What stays for ever: plans, their segments and history (plan_events), invoices, the ledger's totals.

Deletes go by batches of ids selected first (`BATCH` rows a read, `DELETE_BATCH` a write transaction,
the rule repeated in the delete itself), so no request waits long behind one, and a crash between two
batches leaves a store where every remaining row is whole. Each delete is a concurrent write (on
PostgreSQL it runs beside purchases, not between them: it deletes only rows no writer's check reads)
that does not wait for the disk (a batch lost in a crash is deleted again by the next pass), and after
each one the pass waits as long as it took (`_paced`), so that it holds the writers' turn at most half
the time, and the requests waiting for that turn (every write on SQLite) get it in between.

Ended plans are visited once: the store keeps the cutoff up to which they were (`PLANS_THROUGH`), moved
only once a pass has handled them all, in a durable commit, which makes every delete before it durable
too (Database.write). Running a pass twice changes nothing the second time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, CursorResult, Result, Table, delete, select, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from hyperplan.core.lifecycle import FINAL, RESERVED_CAPACITY_LIFECYCLE
from hyperplan.core.reclaim_warnings import RECLAIM_WARNING
from hyperplan.core.status import EXTENSION_LIFECYCLE, INVOICE_LIFECYCLE
from hyperplan.core.status_rows import (
    PAYMENT_DEADLINE,
    RECLAIM_REMINDER,
    SEGMENT_END,
    SEGMENT_RECLAIM,
    SEGMENT_START,
    START_REMINDER,
)
from hyperplan.services.orchestration import metering_compaction
from hyperplan.services.plans.resale import CREDIT_EVENT
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import settings as stored
from hyperplan.store.schema import (
    AuditEvent,
    Base,
    Invoice,
    PlanExtension,
    RateBucket,
    ReservedCapacity,
    ScheduledEvent,
    StatusEvent,
    TrainingPlan,
)

T = TypeVar("T")

PLANS_THROUGH = "retention.plans-through"  # ended plans up to this cutoff have had their events removed
BATCH = 1000  # rows whose ids one read gathers
# Rows a delete transaction removes at most. The first pass over the bench's 100x store (1.5 million rows)
# on SQLite, a purchase every 100 ms beside it (a scratch script, one or two runs each): with 1,000 rows
# a transaction, back to back, purchases took p99 164-172 ms (p50 3 ms before the pass), and it 80 s;
# with 250, paced, p99 108 ms and the pass 490 s. On the 10x store: p99 32 ms against 19 ms. The rest of
# a purchase's wait there is SQLite's own, its statements and commit slower beside the deletes.
DELETE_BATCH = 250
PLANS_AT_ONCE = 200  # ended plans whose rows are gathered in one read
# The timed events whose subject is a plan (its id): kept while the plan lives, whatever their age.
PLAN_TIMED_KINDS = (
    SEGMENT_START,
    SEGMENT_RECLAIM,
    SEGMENT_END,
    START_REMINDER,
    RECLAIM_REMINDER,
    PAYMENT_DEADLINE,
    RECLAIM_WARNING,
    CREDIT_EVENT,
)


@dataclass(frozen=True)
class RowPass:
    status_events: int = 0
    timed_events: int = 0
    audit_events: int = 0
    rate_buckets: int = 0
    hourly_lines: int = 0  # metering lines compacted away
    day_lines: int = 0  # and the lines written in their place

    @property
    def changed(self) -> int:
        return (
            self.status_events + self.timed_events + self.audit_events + self.rate_buckets + self.hourly_lines
        )


def run_once(
    runtime: ServiceContext,
    *,
    wall: Callable[[], float] = time.time,
    stopping: Callable[[], bool] = lambda: False,
) -> RowPass:
    """One pass over every kind of row whose period is set. `wall`: real time (seconds since the
    epoch), which the rate buckets count in; `stopping`: checked between batches, to end a long pass."""
    retention = runtime.fleet.retention
    now = runtime.clock.now()
    status_events = timed_events = audit_events = rate_buckets = 0
    if retention.events is not None:
        status_events, timed_events = _ended_plans_events(runtime, now - retention.events, stopping)
        timed_events += _other_done_timed_events(runtime, now - retention.events, stopping)
    if retention.audit is not None:
        audit_events = _audit_events(runtime, now - retention.audit, stopping)
    if retention.leases is not None:
        rate_buckets = _rate_buckets(runtime, wall() - retention.leases.total_seconds(), stopping)
    compacted = metering_compaction.Compacted()
    if retention.metering is not None:
        compacted = metering_compaction.compact(runtime, retention.metering, stopping)
    return RowPass(
        status_events, timed_events, audit_events, rate_buckets, compacted.hourly_lines, compacted.day_lines
    )


# -- events ------------------------------------------------------------------------------------------


def _ended_plans_events(
    runtime: ServiceContext, cutoff: datetime, stopping: Callable[[], bool]
) -> tuple[int, int]:
    """The status events and done timed events of plans that ended by `cutoff` (and after the last
    pass's cutoff): how many of each were removed."""
    with runtime.db.read() as session:
        since = stored.get_time(session, PLANS_THROUGH)
        if since is not None and since >= cutoff:
            return 0, 0
        ended = select(TrainingPlan.id).where(
            TrainingPlan.status.in_([s.value for s in FINAL]), TrainingPlan.updated_at <= cutoff
        )
        if since is not None:
            ended = ended.where(TrainingPlan.updated_at > since)
        plan_ids = list(session.scalars(ended.order_by(TrainingPlan.id)))
    status_events = timed_events = 0
    for chunk in _chunks(plan_ids, PLANS_AT_ONCE):
        if stopping():
            return status_events, timed_events  # the cutoff stays: the next pass visits them again
        with runtime.db.read() as session:
            status_ids = _status_event_ids(session, chunk)
            timed_ids = _done_plan_timed_event_ids(session, chunk)
        status_events += _delete_ids(runtime, StatusEvent, status_ids)
        timed_events += _delete_ids(runtime, ScheduledEvent, timed_ids, ScheduledEvent.done.is_(True))
    with runtime.db.write() as session:
        stored.put_time(session, PLANS_THROUGH, cutoff)
    return status_events, timed_events


def _status_event_ids(session: Session, plan_ids: Sequence[int]) -> list[int]:
    """The status events of these plans' segments, invoices and extensions."""
    parts = (
        (
            RESERVED_CAPACITY_LIFECYCLE.kind,
            select(ReservedCapacity.id).where(ReservedCapacity.plan_id.in_(plan_ids)),
        ),
        (INVOICE_LIFECYCLE.kind, select(Invoice.id).where(Invoice.plan_id.in_(plan_ids))),
        (EXTENSION_LIFECYCLE.kind, select(PlanExtension.id).where(PlanExtension.plan_id.in_(plan_ids))),
    )
    ids: list[int] = []
    for kind, entities in parts:
        entity_ids = list(session.scalars(entities))
        for chunk in _chunks(entity_ids, BATCH):
            ids += session.scalars(
                select(StatusEvent.id).where(
                    StatusEvent.entity_kind == kind, StatusEvent.entity_id.in_(chunk)
                )
            )
    return ids


def _done_plan_timed_event_ids(session: Session, plan_ids: Sequence[int]) -> list[int]:
    # Read by subject, `done` sifted here: with `done` in the WHERE, SQLite (without statistics) took the
    # pending index (done, ...) and read every done event of the store for each page of plans (197 s
    # for a 100x store's first pass, against PostgreSQL's 19 s). A plan has a few dozen events at most.
    rows = session.execute(
        select(ScheduledEvent.id, ScheduledEvent.done).where(
            ScheduledEvent.subject.in_([str(plan_id) for plan_id in plan_ids]),
            ScheduledEvent.kind.in_(PLAN_TIMED_KINDS),
        )
    )
    return [event_id for event_id, done in rows if done]


def _other_done_timed_events(runtime: ServiceContext, cutoff: datetime, stopping: Callable[[], bool]) -> int:
    """Done timed events of anything but a plan (meters' hours, jobs' and spot runs' deadlines) due by
    `cutoff`, oldest first in the pending index's order (done, due_at, id)."""
    old_and_done = (
        ScheduledEvent.done.is_(True),
        ScheduledEvent.due_at <= cutoff,
        ScheduledEvent.kind.not_in(PLAN_TIMED_KINDS),
    )
    return _delete_pages(runtime, ScheduledEvent, old_and_done, ScheduledEvent.due_at, stopping)


# -- audit and rate buckets ------------------------------------------------------------------------------


def _audit_events(runtime: ServiceContext, cutoff: datetime, stopping: Callable[[], bool]) -> int:
    """Audit rows dated before `cutoff` (service time), oldest first by their (at, id) index."""
    return _delete_pages(runtime, AuditEvent, (AuditEvent.at < cutoff,), AuditEvent.at, stopping)


def _rate_buckets(runtime: ServiceContext, cutoff: float, stopping: Callable[[], bool]) -> int:
    """Rate buckets last counted before `cutoff` (real time, seconds since the epoch). The delete says
    so again: a bucket leased from since it was read stays (PostgreSQL checks the row again once the
    lease's lock is gone; SQLite's writers take turns)."""
    removed = 0
    untouched = RateBucket.counted_at < cutoff
    while not stopping():
        with runtime.db.read() as session:
            keys = [
                tuple(row)
                for row in session.execute(
                    select(RateBucket.account_id, RateBucket.request_class).where(untouched).limit(BATCH)
                )
            ]
        if not keys:
            break
        key = tuple_(RateBucket.account_id, RateBucket.request_class)
        for chunk in _chunks(keys, DELETE_BATCH):
            with _paced(), runtime.db.write(concurrent=True, durable=False) as session:
                removed += _rowcount(session.execute(delete(RateBucket).where(key.in_(chunk), untouched)))
    return removed


# -- batches ---------------------------------------------------------------------------------------------


def _delete_pages(
    runtime: ServiceContext,
    model: type[Base],
    conditions: Sequence[ColumnElement[bool]],
    when: InstrumentedAttribute[datetime],
    stopping: Callable[[], bool],
) -> int:
    """Delete the rows of `model` that meet `conditions`, a page of BATCH at a time, oldest (`when`)
    first: each page's ids read, then deleted in a transaction of its own under the same conditions;
    the next page is the next read's first, the rows before it gone."""
    table = cast(Table, model.__table__)
    page = select(table.c.id).where(*conditions).order_by(when, table.c.id).limit(BATCH)
    removed = 0
    while not stopping():
        with runtime.db.read() as session:
            ids = list(session.scalars(page))
        gone = _delete_ids(runtime, model, ids, *conditions) if ids else 0
        if not gone:
            break  # nothing left (or what was found is no longer old: a clock set back)
        removed += gone
    return removed


def _delete_ids(
    runtime: ServiceContext, model: type[Base], ids: Sequence[int], *still: ColumnElement[bool]
) -> int:
    """Delete these rows of `model`, BATCH a transaction, each only if `still` holds for it then."""
    table = cast(Table, model.__table__)
    removed = 0
    for chunk in _chunks(ids, DELETE_BATCH):
        with _paced(), runtime.db.write(concurrent=True, durable=False) as session:
            removed += _rowcount(session.execute(delete(table).where(table.c.id.in_(chunk), *still)))
    return removed


@contextmanager
def _paced() -> Iterator[None]:
    """A delete's transaction, then a wait as long as it took: the pass holds the writers' turn at most
    half the time, whatever the store's speed, and a writer waiting for it gets it in between."""
    began = time.monotonic()
    yield
    time.sleep(time.monotonic() - began)


def _rowcount(result: Result[Any]) -> int:
    return cast(CursorResult[Any], result).rowcount


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
