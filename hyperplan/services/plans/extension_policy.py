"""A plan's extension policy: extend it by itself at its last segment's reclaim warnings.

Set, read and cleared by the plan's account (native API, CLI, console). At each reclaim warning of the
plan's last segment (services/plans/reclaim_warnings.py) the policy tries once: the attempt is written
in the warning's transaction (its unique key: plan, segment end, lead time; so a crash never buys twice
for one warning), and the purchase runs after that commits, through the same path as
ExtendTrainingPlan (services/plans/extensions.py: search, then extend: its own transaction, payment mode,
budget, approval). Its outcome finishes the attempt and is a plan event. Every extension bought counts
against MaxDays in total; core/reclaim_warnings.py chooses which to buy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.reclaim_warnings import (
    MAX_POLICY_DAYS,
    POLICY_KIND,
    Price,
    bought_message,
    choose,
    not_bought_message,
    policy_lengths,
)
from hyperplan.core.status import ExtensionPaymentStatus
from hyperplan.errors import HyperplanError, ValidationError
from hyperplan.services.accounts import acting
from hyperplan.services.accounts.accounts import Caller, get_account
from hyperplan.services.plans import extensions, lifecycle, payments, plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import ExtensionAttempt, ExtensionPolicy, PlanExtension, TrainingPlan

SHOWN_ATTEMPTS = 20
TRYING = "Extension policy: trying."
"""An attempt's message until its outcome is written; one left so was cut short by a stop or a crash."""


@dataclass(frozen=True)
class PolicyAttempt:
    at: datetime
    bought: bool
    message: str


@dataclass(frozen=True)
class PolicyView:
    plan_name: str
    max_days: int
    max_price: Decimal | None
    currency: str
    attempts: tuple[PolicyAttempt, ...]  # newest first, at most 20
    days_bought: int = 0


def get_policy(runtime: ServiceContext, caller: Caller, plan: str) -> PolicyView | None:
    """The plan's policy (plan: its name or ARN), or None when it has none."""
    with runtime.db.read() as session:
        row = plans.get(session, runtime, caller, plan)
        policy = session.get(ExtensionPolicy, row.id)
        return None if policy is None else _view(session, row, policy)


def set_policy(
    runtime: ServiceContext, caller: Caller, plan: str, max_days: int, max_price: Decimal | None
) -> PolicyView:
    """Set or change the plan's policy; the days it has bought still count against the new MaxDays."""
    check_limits(max_days, max_price)
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        row = plans.get(session, runtime, caller, plan)
        if PlanStatus(row.status).is_final:
            raise ValidationError(f"Training plan {row.name} is {row.status}: it can no longer be extended.")
        policy = session.get(ExtensionPolicy, row.id)
        if policy is None:
            policy = ExtensionPolicy(plan_id=row.id, days_bought=0)
            session.add(policy)
        policy.max_days, policy.max_price = max_days, max_price
        policy.currency = payments.fleet_currency(runtime.fleet)
        policy.updated_at = now
        limit = f", each at most {max_price} {policy.currency}" if max_price is not None else ""
        message = f"Extension policy set: up to {max_days} days in all{limit}."
        lifecycle.record(session, row, POLICY_KIND, message, now)
        session.flush()
        return _view(session, row, policy)


def clear_policy(runtime: ServiceContext, caller: Caller, plan: str) -> None:
    """Remove the plan's policy (its attempts stay in the plan's history); nothing to remove is fine."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        row = plans.get(session, runtime, caller, plan)
        if session.get(ExtensionPolicy, row.id) is None:
            return
        session.execute(delete(ExtensionPolicy).where(ExtensionPolicy.plan_id == row.id))
        lifecycle.record(session, row, POLICY_KIND, "Extension policy removed.", now)


def check_limits(max_days: int, max_price: Decimal | None) -> None:
    if isinstance(max_days, bool) or not isinstance(max_days, int) or not 1 <= max_days <= MAX_POLICY_DAYS:
        raise ValidationError(f"MaxDays must be a whole number of days from 1 to {MAX_POLICY_DAYS}.")
    if max_price is not None and max_price <= 0:
        raise ValidationError(f"MaxPrice must be more than 0, not {max_price}.")


def _view(session: Session, plan: TrainingPlan, policy: ExtensionPolicy) -> PolicyView:
    attempts = session.scalars(
        select(ExtensionAttempt)
        .where(ExtensionAttempt.plan_id == plan.id)
        .order_by(ExtensionAttempt.id.desc())
        .limit(SHOWN_ATTEMPTS)
    )
    return PolicyView(
        plan.name,
        policy.max_days,
        policy.max_price,
        policy.currency,
        tuple(PolicyAttempt(a.at, a.bought, a.message) for a in attempts),
        policy.days_bought,
    )


# -- acting at a warning --------------------------------------------------------------------------------


def on_warning(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    segment_end: datetime,
    lead_hours: int,
    now: datetime,
) -> None:
    """In the warning's transaction (the lifecycle loop's): write the attempt, buy once that commits."""
    policy = session.get(ExtensionPolicy, plan.id)
    if policy is None or policy.days_bought >= policy.max_days:
        return
    tried = session.scalar(
        select(ExtensionAttempt.id).where(
            ExtensionAttempt.plan_id == plan.id,
            ExtensionAttempt.segment_end == segment_end,
            ExtensionAttempt.lead_hours == lead_hours,
        )
    )
    if tried is not None:
        return
    attempt = ExtensionAttempt(
        plan_id=plan.id, at=now, segment_end=segment_end, lead_hours=lead_hours, bought=False, message=TRYING
    )
    session.add(attempt)
    session.flush()
    attempt_id, plan_id = attempt.id, plan.id
    after_commit(session, lambda: _attempt(runtime, plan_id, attempt_id))


def _attempt(runtime: ServiceContext, plan_id: int, attempt_id: int) -> None:
    """Search, choose, buy (each in its own transaction), then write the outcome."""
    with runtime.db.read() as session:
        plan = session.get(TrainingPlan, plan_id)
        policy = session.get(ExtensionPolicy, plan_id)
        if plan is None or policy is None:
            return
        account = get_account(session, plan.account_id)
        caller = Caller(account.id, account.name, account.is_admin, access_key_id="")
        budget = account.budget if account.payment_mode == "budget" else None
        max_days, max_price, days_bought = policy.max_days, policy.max_price, policy.days_bought
        arn = plans.plan_arn(runtime, plan)
    days, message = 0, ""
    try:
        free, offering_ids = _free_extensions(runtime, caller, arn, policy_lengths(max_days, days_bought))
        choice = choose(free, max_price, budget, max_days - days_bought)
        if choice.buy is None:
            message = not_bought_message(choice.reason)
        else:
            extensions.extend(runtime, caller, offering_ids[choice.buy.days])
            days = choice.buy.days
            message = _bought(runtime, plan_id, choice.buy)
    except HyperplanError as error:  # the plan can no longer be extended, a quota, a race: say so
        message = not_bought_message(str(error).rstrip("."))
    _finish(runtime, plan_id, attempt_id, days, message)


def _free_extensions(
    runtime: ServiceContext, caller: Caller, arn: str, lengths: list[int]
) -> tuple[list[Price], dict[int, str]]:
    free: list[Price] = []
    offering_ids: dict[int, str] = {}
    for days in lengths:
        for offer in extensions.search(runtime, caller, arn, days * 24):
            free.append(Price(days, Decimal(str(offer.fee)), offer.currency))
            offering_ids[days] = offer.offering_id
    return free, offering_ids


def _bought(runtime: ServiceContext, plan_id: int, price: Price) -> str:
    with runtime.db.read() as session:
        extension = session.scalars(
            select(PlanExtension).where(PlanExtension.plan_id == plan_id).order_by(PlanExtension.id.desc())
        ).first()
    assert extension is not None  # extend just wrote it
    how = {
        ExtensionPaymentStatus.PAID: "paid",
        ExtensionPaymentStatus.PENDING: "awaiting an administrator's approval",
    }.get(ExtensionPaymentStatus(extension.payment_status), "its payment failed")
    return bought_message(price.days, price.fee, price.currency, extension.end, how)


def _finish(runtime: ServiceContext, plan_id: int, attempt_id: int, days: int, message: str) -> None:
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, None)
        attempt = session.get(ExtensionAttempt, attempt_id)
        plan = session.get(TrainingPlan, plan_id)
        if attempt is None or plan is None:
            return
        attempt.bought, attempt.message = days > 0, message
        policy = session.get(ExtensionPolicy, plan_id)
        if policy is not None and days:
            policy.days_bought += days
        lifecycle.record(session, plan, POLICY_KIND, message, now)
