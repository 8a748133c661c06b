"""Per-account quotas (AWS: training-plan-total_count, reserved-capacity-ml-<type>).

- Plans not yet Expired or Failed.
- Reserved instances of one type held at any instant, across the account's plans and unpaid extensions:
  the account's own number if an administrator set one, else the fleet's number, or a share of the
  type's reservable instances if the fleet's [quotas] give one and it is less.
- Reserved instance-hours (all types) in any 30 days, if the fleet or an administrator sets it: an
  account cannot hoard over time either.
- On-demand instances of one type held at any instant (cluster nodes of on-demand groups, instances of
  training jobs without a plan): the account's own number, else the fleet's number and share of the
  type's on-demand instances, if it gives them.
Defaults come from the fleet file's [quotas]; an administrator sets them per account. Administrators'
own accounts are held to them too. Over quota, search and purchase (and, for on-demand, CreateCluster,
UpdateCluster and CreateTrainingJob) answer ResourceLimitExceeded naming the quota and its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Select, func, literal_column, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnClause, ColumnElement

from hyperplan.core.calendar import peak_booked
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.quotas import Interval, busiest_window, on_demand_cap, share_cap
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.services.accounts.accounts import get_account
from hyperplan.services.plans import on_demand
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.purchase_reads import read_account_holdings
from hyperplan.store.schema import Account, TrainingPlan

MAX_QUOTA = 1_000_000
"""The largest quota an administrator may set: more than any fleet holds, well inside the column's
integer."""
MAX_HOURS_QUOTA = 1_000_000_000
"""The largest instance-hours quota: a million instances for 30 days is 720 million."""

_RAISE = (
    "An administrator can raise it with `hyperplan accounts update ACCOUNT --max-plans N --max-instances N "
    "--max-instance-hours N`."
)
WINDOW = timedelta(days=30)


@dataclass(frozen=True)
class Limits:
    max_active_plans: int
    max_reserved_instances_per_type: int
    # The fleet's share of a type's reservable instances, when it binds this account (it has no
    # max_reserved_instances_per_type of its own); None otherwise.
    max_reserved_share_per_type: float | None = None
    max_reserved_instance_hours_per_30_days: int | None = None
    # The account's own on-demand number, else the fleet's (None: no such quota), and the fleet's share
    # of a type's on-demand instances when it binds this account.
    max_on_demand_instances_per_type: int | None = None
    max_on_demand_share_per_type: float | None = None


class QuotaHolder(Protocol):
    """What the quotas read of an account: its row (Account), or the columns a purchase read of it in
    its one query (store/purchase_reads.py)."""

    @property
    def name(self) -> str: ...
    @property
    def max_active_plans(self) -> int | None: ...
    @property
    def max_reserved_instances_per_type(self) -> int | None: ...
    @property
    def max_reserved_instance_hours_per_30_days(self) -> int | None: ...
    @property
    def max_on_demand_instances_per_type(self) -> int | None: ...


def limits(runtime: ServiceContext, account: QuotaHolder) -> Limits:
    defaults = runtime.fleet.quotas
    own_instances = account.max_reserved_instances_per_type
    return Limits(
        account.max_active_plans or defaults.max_active_plans,
        own_instances or defaults.max_reserved_instances_per_type,
        None if own_instances else defaults.max_reserved_share_per_type,
        account.max_reserved_instance_hours_per_30_days or defaults.max_reserved_instance_hours_per_30_days,
        account.max_on_demand_instances_per_type or defaults.max_on_demand_instances_per_type,
        None if account.max_on_demand_instances_per_type else defaults.max_on_demand_share_per_type,
    )


def instances_allowed(runtime: ServiceContext, account: QuotaHolder, instance_type: str) -> int:
    """The instances of this type the account may hold at any instant."""
    quota = limits(runtime, account)
    allowed = quota.max_reserved_instances_per_type
    reservable = sum(p.reservable for p in runtime.fleet.pools_of_type(instance_type))
    # A type with nothing to reserve has no share to cap: the search says what is wrong with it.
    if quota.max_reserved_share_per_type is not None and reservable > 0:
        allowed = min(allowed, share_cap(reservable, quota.max_reserved_share_per_type))
    return allowed


def search_allowance(
    session: Session, runtime: ServiceContext, account_id: str, instance_type: str
) -> SearchAllowance:
    """What a search can know from the store, for any count of the type: raises if the account holds
    its plan quota already; else what `check_search_count` checks a count against."""
    account = get_account(session, account_id)
    _check_plans(session, runtime, account)
    return SearchAllowance(account.name, instance_type, instances_allowed(runtime, account, instance_type))


@dataclass(frozen=True)
class SearchAllowance:
    """The instances of a type an account may hold at once, read from the store (and its name for the
    refusal): what a search for any count is checked against."""

    account_name: str
    instance_type: str
    allowed: int


def check_search_count(allowance: SearchAllowance, count: int) -> None:
    if count > allowance.allowed:
        raise ResourceLimitExceeded(
            _instances_message(allowance.account_name, allowance.instance_type, allowance.allowed, 0, count)
        )


def check_plans(session: Session, runtime: ServiceContext, account_id: str) -> None:
    _check_plans(session, runtime, get_account(session, account_id))


def _check_plans(session: Session, runtime: ServiceContext, account: Account) -> None:
    held = session.scalar(active_plans(account.id))
    check_plans_held(runtime, account, held or 0)


# The statuses of a plan that does not count against the account's quota, as the partial index of the
# plans that do writes them (store/schema.py LIVE_PLAN): literal values, not bound parameters, so that
# each database sees the index's own predicate in the query (and the statement can still be prepared).
_NOT_HELD: list[ColumnClause[Any]] = [
    literal_column(f"'{status}'") for status in (PlanStatus.EXPIRED, PlanStatus.FAILED)
]


def live_plan_filter(account_id: Any) -> list[ColumnElement[bool]]:
    """The account's plans that are neither Expired nor Failed, as ix_plan_account_live holds them."""
    return [TrainingPlan.account_id == account_id, TrainingPlan.status.not_in(_NOT_HELD)]


def active_plans(account_id: Any) -> Select[int]:
    """How many plans the account holds that count against its quota (`account_id`: a value, or a
    column to correlate with)."""
    # `status NOT IN ('Expired', 'Failed')`: the predicate of ix_plan_account_live (0031), which holds
    # the plans that count and nothing else, so the count reads the account's live plans, never the
    # expired ones of its past (the (account_id, status) index with one equality per live status was
    # read plan by plan on PostgreSQL, expired ones included). SQLite takes the partial index too
    # (tests/store/test_history_query_plans.py checks both).
    return select(func.count()).select_from(TrainingPlan).where(*live_plan_filter(account_id))


def check_plans_held(runtime: ServiceContext, account: QuotaHolder, held: int) -> None:
    """Refuse one more plan to an account that holds `held` plans not Expired or Failed."""
    allowed = limits(runtime, account).max_active_plans
    if held >= allowed:
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
    intervals = _account_intervals(session, account_id, instance_type, start, end)
    check_instances_held(runtime, account, instance_type, intervals, start, end, count)


def check_instances_held(
    runtime: ServiceContext,
    account: QuotaHolder,
    instance_type: str,
    held_intervals: Sequence[Interval],
    start: datetime,
    end: datetime,
    count: int,
) -> None:
    """Refuse `count` more instances of the type over [start, end) to an account that holds
    `held_intervals` of that type (any that overlap the window; others count for nothing)."""
    allowed = instances_allowed(runtime, account, instance_type)
    held = peak_booked(held_intervals, start, end)
    if held + count > allowed:
        raise ResourceLimitExceeded(_instances_message(account.name, instance_type, allowed, held, count))


def _instances_message(account_name: str, instance_type: str, allowed: int, held: int, count: int) -> str:
    return (
        f"Quota reserved-capacity-{instance_type} is {allowed} instances for account {account_name}: "
        f"it holds {held} at the busiest instant of this window and asks for {count} more. {_RAISE}"
    )


def check_instance_hours(
    session: Session, runtime: ServiceContext, account_id: str, adding: Sequence[Interval]
) -> None:
    """The reserved instance-hours in any 30 days, with ``adding`` held too, stay within the quota."""
    account = get_account(session, account_id)
    if limits(runtime, account).max_reserved_instance_hours_per_30_days is None or not adding:
        return
    low, high = hours_span(adding)
    check_hours_held(runtime, account, _account_intervals(session, account_id, None, low, high), adding)


def hours_span(adding: Sequence[Interval]) -> tuple[datetime, datetime]:
    """The span whose holdings the instance-hours quota weighs against `adding`."""
    return min(s for s, _, _ in adding) - WINDOW, max(e for _, e, _ in adding) + WINDOW


def check_hours_held(
    runtime: ServiceContext, account: QuotaHolder, held: Sequence[Interval], adding: Sequence[Interval]
) -> None:
    """Refuse `adding` to an account that holds `held` (every type, over `hours_span(adding)`) when its
    busiest 30 days would go over its instance-hours quota."""
    allowed = limits(runtime, account).max_reserved_instance_hours_per_30_days
    if allowed is None or not adding:
        return
    busiest = busiest_window([*held, *adding], WINDOW, adding)
    if busiest > allowed + 1e-6:
        before = busiest_window(held, WINDOW, adding)
        raise ResourceLimitExceeded(
            f"Quota reserved-instance-hours-per-30-days is {allowed} for account {account.name}: with this "
            f"purchase it would hold {busiest:,.0f} instance-hours in its busiest 30 days ({before:,.0f} "
            f"without it). {_RAISE}"
        )


def _account_intervals(
    session: Session, account_id: str, instance_type: str | None, start: datetime, end: datetime
) -> list[tuple[datetime, datetime, int]]:
    """What the account holds between start and end: of one type, or of every type (None). Read as a
    purchase reads it (store/purchase_reads.py): from the segments that end after `start`, not from
    every plan the account ever had."""
    return read_account_holdings(session, account_id, instance_type, start, end)


def set_limits(
    session: Session,
    account_ref: str,
    *,
    max_plans: int | None,
    max_instances: int | None,
    max_instance_hours: int | None = None,
    max_on_demand_instances: int | None = None,
) -> Account:
    """New quotas, each from 1 to MAX_HOURS_QUOTA or MAX_QUOTA (checked where they entered), or None to
    keep the current."""
    account = get_account(session, account_ref)
    if max_plans is not None:
        account.max_active_plans = max_plans
    if max_instances is not None:
        account.max_reserved_instances_per_type = max_instances
    if max_instance_hours is not None:
        account.max_reserved_instance_hours_per_30_days = max_instance_hours
    if max_on_demand_instances is not None:
        account.max_on_demand_instances_per_type = max_on_demand_instances
    return account


def on_demand_allowed(runtime: ServiceContext, account: Account, instance_type: str) -> int | None:
    """The on-demand instances of this type the account may hold at any instant (None: no quota)."""
    defaults = runtime.fleet.quotas
    total = sum(p.on_demand for p in runtime.fleet.pools_of_type(instance_type))
    return on_demand_cap(
        total,
        account.max_on_demand_instances_per_type,
        defaults.max_on_demand_instances_per_type,
        defaults.max_on_demand_share_per_type,
    )


def check_on_demand(
    session: Session,
    runtime: ServiceContext,
    account_id: str,
    instance_type: str,
    count: int,
    exclude_group: int | None = None,
) -> None:
    """``count`` more on-demand instances of the type (for a group, its whole target: its own nodes are
    left out of what the account holds) stay within the account's on-demand quota."""
    account = get_account(session, account_id)
    allowed = on_demand_allowed(runtime, account, instance_type)
    if allowed is None:
        return
    held = on_demand.held_by_account(session, account_id, instance_type, exclude_group)
    if held + count > allowed:
        raise ResourceLimitExceeded(
            f"Quota on-demand-capacity-{instance_type} is {allowed} instances for account {account.name}: "
            f"it holds {held} on-demand now and asks for {count} more. An administrator can raise it with "
            "`hyperplan accounts update ACCOUNT --max-on-demand-instances N`."
        )
