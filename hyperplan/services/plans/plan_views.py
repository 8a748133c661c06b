"""Training plans as the handlers show them: each function owns its read transaction and returns frozen
views, so that no handler touches the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import capacity_claims, extensions, lifecycle, plans, quotas
from hyperplan.services.plans.capacity_claims import Counters
from hyperplan.services.plans.plans import ListQuery, plan_arn
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ReservedCapacity, TrainingPlan


@dataclass(frozen=True)
class SegmentView:
    """One reserved capacity (a segment) of a plan."""

    arn: str
    instance_type: str
    count: int
    status: str
    availability_zone: str
    start: datetime
    end: datetime
    holds_capacity: bool


@dataclass(frozen=True)
class PlanView:
    arn: str
    name: str
    status: str
    status_message: str
    upfront_fee: Decimal
    currency: str
    target: str
    segments: tuple[SegmentView, ...]  # in time order
    counters: Counters


@dataclass(frozen=True)
class ExtensionView:
    offering_id: str
    extended_at: datetime
    start: datetime
    end: datetime
    status: str
    payment_status: str
    availability_zone: str
    upfront_fee: Decimal
    currency: str


def describe(runtime: ServiceContext, caller: Caller, name_or_arn: str) -> PlanView:
    with runtime.db.read() as session:
        return _plan_view(runtime, session, plans.get(session, runtime, caller, name_or_arn))


def list_plans(
    runtime: ServiceContext, caller: Caller, query: ListQuery
) -> tuple[list[PlanView], str | None]:
    """One page of the caller's plans, and the token of the next."""
    with runtime.db.read() as session:
        rows, token = plans.list_plans(session, caller, query)
        return [_plan_view(runtime, session, plan) for plan in rows], token


def live_plans(runtime: ServiceContext, caller: Caller) -> list[PlanView]:
    """The caller's plans that are neither Expired nor Failed, oldest first: read through the account's
    live plans' index, never its past (a year of expired plans)."""
    query = select(TrainingPlan).where(*quotas.live_plan_filter(caller.account_id)).order_by(TrainingPlan.id)
    with runtime.db.read() as session:
        return [_plan_view(runtime, session, plan) for plan in session.scalars(query)]


def reserved_capacity(runtime: ServiceContext, caller: Caller, arn: str) -> tuple[SegmentView, int]:
    """One reserved capacity and how many of its instances are in use."""
    with runtime.db.read() as session:
        rc = plans.get_reserved_capacity(session, runtime, caller, arn)
        plan = session.get(TrainingPlan, rc.plan_id)
        assert plan is not None
        return _segment_view(runtime, plan, rc), capacity_claims.in_use(session, plan.id, rc.id)


def extension_history(
    runtime: ServiceContext, caller: Caller, name_or_arn: str
) -> tuple[str, list[ExtensionView]]:
    """The plan's name (it scopes paging tokens) and its extensions, oldest first."""
    with runtime.db.read() as session:
        plan = plans.get(session, runtime, caller, name_or_arn)
        return plan.name, _extension_views(runtime, session, plan)


def _extension_views(runtime: ServiceContext, session: Session, plan: TrainingPlan) -> list[ExtensionView]:
    now = runtime.clock.now()
    return [
        ExtensionView(
            offering_id=extension.offering_id,
            extended_at=extension.extended_at,
            start=extension.start,
            end=extension.end,
            status=extensions.status_of(extension, now),
            payment_status=extension.payment_status,
            availability_zone=extension.availability_zone,
            upfront_fee=extension.upfront_fee,
            currency=extension.currency,
        )
        for extension in extensions.history(session, plan)
    ]


def _segment_view(runtime: ServiceContext, plan: TrainingPlan, rc: ReservedCapacity) -> SegmentView:
    return SegmentView(
        arn=runtime.arn(plan.account_id, f"reserved-capacity/{plan.name}-rc{rc.ordinal}"),
        instance_type=rc.instance_type,
        count=rc.count,
        status=rc.status,
        availability_zone=rc.availability_zone,
        start=rc.start,
        end=rc.end,
        holds_capacity=rc.holds_capacity,
    )


def _plan_view(runtime: ServiceContext, session: Session, plan: TrainingPlan) -> PlanView:
    rcs = lifecycle.segments_of(session, plan.id)
    return PlanView(
        arn=plan_arn(runtime, plan),
        name=plan.name,
        status=plan.status,
        status_message=plan.status_message,
        upfront_fee=plan.upfront_fee,
        currency=plan.currency,
        target=plan.target,
        segments=tuple(_segment_view(runtime, plan, rc) for rc in rcs),
        counters=capacity_claims.counters(session, plan, max(rc.count for rc in rcs)),
    )
