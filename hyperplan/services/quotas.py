"""Per-account quotas (AWS: training-plan-total_count, reserved-capacity-ml-<type>).

- Plans not yet Expired or Failed.
- Reserved instances of one type held at any instant, across the account's plans and unpaid extensions.
Defaults come from the fleet file's [quotas]; an administrator sets them per account. Over quota,
search and purchase answer ResourceLimitExceeded naming the quota and its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.calendar import peak_booked
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.services.accounts import get_account
from hyperplan.services.context import ServiceContext
from hyperplan.store.schema import Account, PlanExtension, ReservedCapacity, TrainingPlan

MAX_QUOTA = 1_000_000
"""The largest quota an administrator may set: more than any fleet holds, well inside the column's
integer."""

_RAISE = (
    "An administrator can raise it with `hyperplan accounts update ACCOUNT --max-plans N --max-instances N`."
)


@dataclass(frozen=True)
class Limits:
    max_active_plans: int
    max_reserved_instances_per_type: int


def limits(runtime: ServiceContext, account: Account) -> Limits:
    defaults = runtime.fleet.quotas
    return Limits(
        account.max_active_plans or defaults.max_active_plans,
        account.max_reserved_instances_per_type or defaults.max_reserved_instances_per_type,
    )


def check_search(
    session: Session, runtime: ServiceContext, account_id: str, instance_type: str, count: int
) -> None:
    """What a search can know: the plan count now, and a count no instance quota could ever allow."""
    account = get_account(session, account_id)
    _check_plans(session, runtime, account)
    allowed = limits(runtime, account).max_reserved_instances_per_type
    if count > allowed:
        raise ResourceLimitExceeded(_instances_message(account, instance_type, allowed, 0, count))


def check_plans(session: Session, runtime: ServiceContext, account_id: str) -> None:
    _check_plans(session, runtime, get_account(session, account_id))


def _check_plans(session: Session, runtime: ServiceContext, account: Account) -> None:
    account_id = account.id
    allowed = limits(runtime, account).max_active_plans
    held = session.scalar(
        select(func.count(TrainingPlan.id)).where(
            TrainingPlan.account_id == account_id,
            TrainingPlan.status.not_in([PlanStatus.EXPIRED, PlanStatus.FAILED]),
        )
    )
    if (held or 0) >= allowed:
        raise ResourceLimitExceeded(
            f"Quota training-plan-total_count is {allowed} for account {account.name}: it already holds "
            f"{held} plans that are not Expired or Failed. {_RAISE}"
        )


def check_instances(
    session: Session,
    runtime: ServiceContext,
    account_id: str,
    instance_type: str,
    start: datetime,
    end: datetime,
    count: int,
) -> None:
    account = get_account(session, account_id)
    allowed = limits(runtime, account).max_reserved_instances_per_type
    held = peak_booked(_account_intervals(session, account_id, instance_type, start, end), start, end)
    if held + count > allowed:
        raise ResourceLimitExceeded(_instances_message(account, instance_type, allowed, held, count))


def _instances_message(account: Account, instance_type: str, allowed: int, held: int, count: int) -> str:
    return (
        f"Quota reserved-capacity-{instance_type} is {allowed} instances for account {account.name}: "
        f"it holds {held} at the busiest instant of this window and asks for {count} more. {_RAISE}"
    )


def _account_intervals(
    session: Session, account_id: str, instance_type: str, start: datetime, end: datetime
) -> list[tuple[datetime, datetime, int]]:
    rc_end = func.coalesce(ReservedCapacity.released_at, ReservedCapacity.end)
    segments = (
        select(ReservedCapacity.start, rc_end, ReservedCapacity.count)
        .join(TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id)
        .where(
            TrainingPlan.account_id == account_id,
            ReservedCapacity.instance_type == instance_type,
            ReservedCapacity.holds_capacity.is_(True),
            ReservedCapacity.start < end,
            rc_end > start,
        )
    )
    extensions = (
        select(PlanExtension.start, PlanExtension.end, PlanExtension.count)
        .join(TrainingPlan, TrainingPlan.id == PlanExtension.plan_id)
        .where(
            TrainingPlan.account_id == account_id,
            PlanExtension.instance_type == instance_type,
            PlanExtension.holds_capacity.is_(True),
            PlanExtension.start < end,
            PlanExtension.end > start,
        )
    )
    return [(s, e, n) for s, e, n in [*session.execute(segments).all(), *session.execute(extensions).all()]]


def set_limits(
    session: Session, account_ref: str, *, max_plans: int | None, max_instances: int | None
) -> Account:
    """New quotas, each from 1 to MAX_QUOTA (checked where they entered), or None to keep the current."""
    account = get_account(session, account_ref)
    if max_plans is not None:
        account.max_active_plans = max_plans
    if max_instances is not None:
        account.max_reserved_instances_per_type = max_instances
    return account
