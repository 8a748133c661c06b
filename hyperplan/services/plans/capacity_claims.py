"""The single place where consumers take and give back a plan's capacity.

A consumer (a HyperPod instance group, a training job) takes instances of the plan's open segment with
`take` and gives them back with `give_back`; each is a `CapacityClaim` row. A plan's counters are
derived from the open claims, so they stay true whatever consumer holds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.lifecycle import PlanStatus
from hyperplan.store.schema import CapacityClaim, ReservedCapacity, TrainingPlan


@dataclass(frozen=True)
class Counters:
    total: int
    in_use: int
    available: int
    unhealthy: int = 0


def open_segment(session: Session, plan: TrainingPlan, now: datetime) -> ReservedCapacity | None:
    return session.scalar(
        select(ReservedCapacity).where(
            ReservedCapacity.plan_id == plan.id,
            ReservedCapacity.start <= now,
            ReservedCapacity.end > now,
            ReservedCapacity.holds_capacity.is_(True),
        )
    )


def in_use(session: Session, plan_id: int, reserved_capacity_id: int | None = None) -> int:
    stmt = select(func.coalesce(func.sum(CapacityClaim.count), 0)).where(
        CapacityClaim.plan_id == plan_id, CapacityClaim.released_at.is_(None)
    )
    if reserved_capacity_id is not None:
        stmt = stmt.where(CapacityClaim.reserved_capacity_id == reserved_capacity_id)
    return int(session.scalar(stmt) or 0)


def counters(session: Session, plan: TrainingPlan, total: int) -> Counters:
    used = in_use(session, plan.id)
    usable = PlanStatus(plan.status) in (PlanStatus.SCHEDULED, PlanStatus.ACTIVE)
    return Counters(total=total, in_use=used, available=max(total - used, 0) if usable else 0)


def take(session: Session, plan: TrainingPlan, consumer: str, wanted: int, now: datetime) -> int:
    """Claim up to `wanted` instances of the open segment for `consumer`; returns how many it got.

    Nothing is granted outside an open segment, or from a plan that is not Active. The caller holds the
    write transaction, so two consumers never take the same instances.
    """
    if plan.status != PlanStatus.ACTIVE or wanted <= 0:
        return 0
    segment = open_segment(session, plan, now)
    if segment is None:
        return 0
    granted = min(wanted, segment.count - in_use(session, plan.id, segment.id))
    if granted > 0:
        session.add(
            CapacityClaim(
                plan_id=plan.id,
                reserved_capacity_id=segment.id,
                consumer=consumer,
                count=granted,
                claimed_at=now,
            )
        )
    return max(granted, 0)


def give_back(session: Session, consumer: str, now: datetime, plan_id: int | None = None) -> int:
    """Release every open claim of `consumer` (on one plan, or all); returns how many instances."""
    stmt = select(CapacityClaim).where(
        CapacityClaim.consumer == consumer, CapacityClaim.released_at.is_(None)
    )
    if plan_id is not None:
        stmt = stmt.where(CapacityClaim.plan_id == plan_id)
    returned = 0
    for claim in session.scalars(stmt):
        claim.released_at = now
        returned += claim.count
    return returned


def release_plan(session: Session, plan_id: int, now: datetime) -> None:
    """At a segment's reclaim time or when a plan fails, every consumer gives its instances back."""
    for claim in session.scalars(
        select(CapacityClaim).where(CapacityClaim.plan_id == plan_id, CapacityClaim.released_at.is_(None))
    ):
        claim.released_at = now
