"""Extending a plan: priced extension offerings, buying one, and the extension history.

An extension offering starts at the plan's current end, in the same pool with the same count. Buying
one holds its capacity (re-checked under the write lock, like a plan) and invoices its fee; once paid,
the plan's last reserved capacity ends later under the same ARN (`lifecycle.apply_extension`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from hyperplan.core import offering_ids
from hyperplan.core.extensions import check_extendable, extension_days
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.offering_ids import ExtensionClaim, OfferingIdError
from hyperplan.core.pricing import segment_price
from hyperplan.core.status import ExtensionPaymentStatus
from hyperplan.errors import ResourceInUse, ResourceNotFound
from hyperplan.services.accounts import acting
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import lifecycle, payments, plans, quotas
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import require_room
from hyperplan.store.changes import CALENDAR
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.locks import lock_account, lock_pools
from hyperplan.store.schema import PlanExtension, ReservedCapacity, TrainingPlan


@dataclass(frozen=True)
class ExtensionOffering:
    offering_id: str
    availability_zone: str
    start: datetime
    end: datetime
    fee: object
    currency: str

    @property
    def duration_hours(self) -> int:
        return int((self.end - self.start) / timedelta(hours=1))


def search(
    runtime: ServiceContext, caller: Caller, plan_arn: str, duration_hours: int
) -> list[ExtensionOffering]:
    """At most one offering: the plan's pool and count from its current end; none when it is taken."""

    days = extension_days(duration_hours)
    now = runtime.clock.now()
    with runtime.db.read() as session:
        plan = plans.get(session, runtime, caller, plan_arn)
        last = _check(session, plan, now)
        start, end = last.end, last.end + timedelta(days=days)
        quotas.check_instances(
            session, runtime, caller.account_id, last.instance_type, start, end, last.count
        )
        quotas.check_instance_hours(session, runtime, caller.account_id, [(start, end, last.count)])
    pool = runtime.fleet.pool((last.instance_type, last.availability_zone))
    if not runtime.calendar.can_book(pool.key, start, end, last.count):
        return []
    claim = ExtensionClaim(
        caller.account_id, now + runtime.fleet.policy.offering_validity, plan.id, start, end
    )
    offering_id = offering_ids.encode_extension(claim, key=runtime.offering_key, fleet=runtime.fleet)
    fee = segment_price(pool, start, end, last.count)
    return [ExtensionOffering(offering_id, pool.availability_zone, start, end, fee, pool.currency)]


def _check(session: Session, plan: TrainingPlan, now: datetime) -> ReservedCapacity:
    """The plan's last segment, once the plan's state and the timing allow an extension."""
    last = lifecycle.segments_of(session, plan.id)[-1]
    pending = session.scalar(
        select(PlanExtension.id).where(
            PlanExtension.plan_id == plan.id, PlanExtension.payment_status == ExtensionPaymentStatus.PENDING
        )
    )
    check_extendable(plan.status, last.end, now, payment_pending=pending is not None)
    return last


def extend(runtime: ServiceContext, caller: Caller, offering_id: str) -> str:
    """ExtendTrainingPlan: buys the extension offering; returns the plan's ARN."""
    now = runtime.clock.now()
    claim = _claim_for(runtime, caller, offering_id, now)
    try:
        # Concurrent on PostgreSQL, as a purchase is (services/plans/plans.py): relies on the account's row
        # lock (one extension at a time per plan, quotas, budget), the pool's lock and the unique constraints.
        with runtime.db.write(concurrent=True) as session:
            acting.act(session, caller.user_id)
            drain_state.refuse_if_drained(session, "ExtendTrainingPlan")
            lock_account(session, caller.account_id)
            plan = session.get(TrainingPlan, claim.plan_id)
            if plan is None or plan.account_id != caller.account_id:
                raise _not_found(offering_id)
            last = _check(session, plan, now)
            if last.end != claim.start:
                raise ResourceNotFound(
                    f"Training plan extension offering {offering_id} was made for the plan's earlier end; "
                    "search again."
                )
            pool = runtime.fleet.pool((last.instance_type, last.availability_zone))
            lock_pools(session, [pool.key])
            require_room(session, runtime.calendar.bookable(pool), claim.start, claim.end, last.count)
            quotas.check_instances(
                session, runtime, caller.account_id, last.instance_type, claim.start, claim.end, last.count
            )
            quotas.check_instance_hours(
                session, runtime, caller.account_id, [(claim.start, claim.end, last.count)]
            )
            extension = PlanExtension(
                plan_id=plan.id,
                offering_id=offering_id,
                instance_type=last.instance_type,
                availability_zone=last.availability_zone,
                count=last.count,
                start=claim.start,
                end=claim.end,
                upfront_fee=segment_price(pool, claim.start, claim.end, last.count),
                currency=pool.currency,
                payment_status=ExtensionPaymentStatus.PENDING,
                extended_at=now,
                holds_capacity=True,
            )
            session.add(extension)
            session.flush()
            booked = [(pool.key, claim.start, claim.end, last.count)]
            after_commit(
                session,
                lambda: runtime.calendar.book(booked, committed_change(session, CALENDAR)),
                early=True,
            )
            payments.issue(session, runtime.lifecycle, plan, now, extension=extension)
    except IntegrityError:
        raise ResourceInUse(f"Training plan extension offering {offering_id} was just bought.") from None
    runtime.wakes.lifecycle.notify()
    return plans.plan_arn(runtime, plan)


def _claim_for(runtime: ServiceContext, caller: Caller, offering_id: str, now: datetime) -> ExtensionClaim:
    try:
        claim = offering_ids.decode_extension(offering_id, key=runtime.offering_key, fleet=runtime.fleet)
    except OfferingIdError:
        raise _not_found(offering_id) from None
    if claim.account_id != caller.account_id or now > claim.expires_at:
        raise _not_found(offering_id)
    return claim


def _not_found(offering_id: str) -> ResourceNotFound:
    return ResourceNotFound(
        f"Training plan extension offering {offering_id} does not exist, has expired or was already bought "
        "(offerings are valid for 30 minutes, for the account that searched); search again."
    )


def history(session: Session, plan: TrainingPlan) -> list[PlanExtension]:
    return list(
        session.scalars(
            select(PlanExtension).where(PlanExtension.plan_id == plan.id).order_by(PlanExtension.id)
        )
    )


def status_of(extension: PlanExtension, now: datetime) -> str:
    """Pending while unpaid, Failed if payment failed; once paid, from the time like any segment."""
    if extension.payment_status == ExtensionPaymentStatus.PENDING:
        return PlanStatus.PENDING
    if extension.payment_status == ExtensionPaymentStatus.FAILED:
        return PlanStatus.FAILED
    if now < extension.start:
        return PlanStatus.SCHEDULED
    return PlanStatus.ACTIVE if now < extension.end else PlanStatus.EXPIRED
