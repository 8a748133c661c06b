"""Usage per account: instance-hours reserved by plans, how many of them the plans' clusters and jobs
used, and on-demand instance-hours beside them, in service time, per account, pool and UTC day
(docs/OPERATIONS.md). It tells a platform team which teams leave their reservations idle, and which
work ran on demand.

Reserved: each segment that holds capacity (not one whose plan failed before it began), from its start
to its end, or to the moment a cancellation released it. Plan used: what the plan's consumers (its
clusters' instance groups, its training jobs) held of it, from their capacity claims (the plan's
InUseInstanceCount over time), never more than the plan reserved in that pool at that instant
(core/usage.py). On demand: each node of an on-demand instance group from its launch until it ended (or
now), one instance; each training job without a plan while it was Downloading or Training (its
transitions), times its instance count; a managed spot training job is not on demand here, it has
columns of its own. Spot (its spot runs, services/jobs/spot.py): on the borrower's rows, each run of
its spot jobs while it held its instances (lent by a plan or on demand), times its count, and what
the run was charged; on the lending plan owner's rows, each run its plans lent instances to (open
ones until now), and the owner's credit for it. Money counts on the UTC day its run ended (when it
was settled, services/jobs/spot_money.py). Hours are cut at UTC midnights and at the asked window.
Returns (services/plans/returns.py): on the returning account's rows, the instance-hours each return gave
back (its returned windows, on the days they cover), its refund whole on the UTC day of the return (when
it was money back, a ledger line; not when it made an invoice awaiting approval smaller), and
the credit for each resale of a returned window whole on the UTC day of the resale (services/plans/
resale.py). A return whose windows lie in several pools has its refund split over them by their value.
Grouped by a tag key, reserved, plan-used, lent and returned hours, credits and refunds carry the plan's
value of that tag, on-demand and spot hours and charges the cluster's or the job's ("" when it has none).

The monthly books (`monthly_usage`) fold the same days per account and calendar month, with what the
account paid (core/usage.py `months`): every ledger line that took money out (plans' and extensions'
fees, on-demand and spot charges), a budget set lower aside.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from sqlalchemy import Select, or_, select
from sqlalchemy.orm import Session

from hyperplan.core import status_rows
from hyperplan.core.jobs import RUNNING
from hyperplan.core.usage import (
    NOTHING,
    Amount,
    DayBooks,
    MonthBooks,
    PoolDay,
    Span,
    Window,
    amounts_per_day,
    instance_time,
    months,
    plan_days,
    split,
)
from hyperplan.errors import AccessDenied, ValidationError
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans.payments import currency_places, fleet_currency
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import (
    Account,
    CapacityClaim,
    Cluster,
    ClusterNode,
    EndedNodeUsage,
    InstanceGroup,
    LedgerEntry,
    PlanReturn,
    Resale,
    ReservedCapacity,
    ResourceTag,
    ReturnedWindow,
    SpotRun,
    TrainingJob,
    TrainingJobTransition,
    TrainingPlan,
)

MAX_DAYS = 400
DEFAULT_DAYS = 30
DEFAULT_MONTHS = 3  # the monthly report's default: this month and the two before
HOUR = timedelta(hours=1)
SECOND = timedelta(seconds=1)
MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class UsageRow:
    account: str
    instance_type: str
    zone: str
    day: date
    reserved_instance_hours: float
    plan_used_instance_hours: float  # of the reserved hours, those used: never more than them
    on_demand_instance_hours: float
    used_instance_hours: float  # plan used, on demand and spot: everything the account ran in the pool
    lent_instance_hours: float  # its plans' instances that other accounts' spot jobs ran on
    spot_instance_hours: float  # its spot jobs' runs, on lent instances or on demand
    spot_charged: Decimal  # what its spot runs that ended that day were charged
    lending_credited: Decimal  # what its plans were credited for runs that ended that day
    tag_value: str | None = None  # grouped by a tag: its value ("" untagged)
    returned_instance_hours: float = 0.0  # of its plans' capacity, given back by returns (those days)
    refunded: Decimal = Decimal(0)  # what its returns made that day were refunded
    resale_credited: Decimal = Decimal(0)  # what resales that day of capacity it returned credited it


@dataclass
class _Hours:
    reserved: timedelta = NOTHING
    plan_used: timedelta = NOTHING
    on_demand: timedelta = NOTHING
    lent: timedelta = NOTHING
    spot: timedelta = NOTHING
    spot_charged: Decimal = Decimal(0)
    lending_credited: Decimal = Decimal(0)
    returned: timedelta = NOTHING
    refunded: Decimal = Decimal(0)
    resale_credited: Decimal = Decimal(0)


@dataclass(frozen=True)
class MonthRow:
    """One account's calendar month (the part of it inside the report's window): the monthly books."""

    account: str
    month: str  # "2027-01"
    reserved_instance_hours: float
    plan_used_instance_hours: float  # of the reserved hours, those its plans' consumers used
    idle_instance_hours: float  # reserved, neither used nor lent; never below 0
    lent_instance_hours: float
    returned_instance_hours: float
    paid: Decimal  # plans' and extensions' fees paid that month, on-demand and spot charges
    refunded: Decimal
    credited: Decimal  # resales of returned capacity and lending to spot jobs
    net_cost: Decimal  # paid - refunded - credited


Key = tuple[str, str | None, PoolDay]  # account id, tag value, pool and day
Statement = TypeVar("Statement", bound=Select[*tuple[Any, ...]])
Tagger = Callable[[str], str | None]  # a resource's ARN -> the row's tag value


def usage(
    runtime: ServiceContext,
    caller: Caller,
    *,
    account_ref: str | None,
    start: datetime | None,
    end: datetime | None,
    tag_key: str | None = None,
) -> list[UsageRow]:
    now = runtime.clock.now()
    window = _window(start, end, now, _days_before)
    with runtime.db.read() as session:
        account_id = _scope(session, caller, account_ref)
        names = _names(session)
        hours = _collect(session, runtime, account_id, window, now, _tagger(session, tag_key))
    return _rows(hours, names, _places(runtime))


def monthly_usage(
    runtime: ServiceContext,
    caller: Caller,
    *,
    account_ref: str | None,
    start: datetime | None,
    end: datetime | None,
) -> list[MonthRow]:
    """Per account and calendar month: the daily figures added up, and what the account paid. Without
    `start`, from the first of the month two months before `end`'s (three calendar months). Without
    `end`, up to and including now: a fee paid at this very instant (under a manual clock, a purchase
    just made) is in the books at once; the microsecond added is far below the hours' precision."""
    now = runtime.clock.now()
    window = _window(start, end or now + MICROSECOND, now, _months_before)
    with runtime.db.read() as session:
        account_id = _scope(session, caller, account_ref)
        names = _names(session)
        hours = _collect(session, runtime, account_id, window, now, _tagger(session, None))
        paid = list(_payments(session, account_id, window))
    days = [_day_books(key, figures) for key, figures in hours.items()]
    return _month_rows(months(days + paid), names, _places(runtime))


def _collect(
    session: Session,
    runtime: ServiceContext,
    account_id: str | None,
    window: Window,
    now: datetime,
    tag_of: Tagger,
) -> dict[Key, _Hours]:
    """Every figure of the report per account, tag value, pool and day."""
    hours: dict[Key, _Hours] = defaultdict(_Hours)
    for plan, segments, claims in _plans(session, account_id, window, now):
        tag = tag_of(runtime.arn(plan.account_id, f"training-plan/{plan.name}"))
        for pool_day, day in plan_days(segments, claims, window).items():
            into = hours[(plan.account_id, tag, pool_day)]
            into.reserved += day.reserved
            into.plan_used += day.used
    for owner, arn, span in _on_demand(session, runtime, account_id, window, now):
        for pool_day, time in instance_time([span], window).items():
            hours[(owner, tag_of(arn), pool_day)].on_demand += time
    _add_spot(hours, _spot_runs(session, runtime, account_id, window, now), tag_of, window, account_id)
    _add_returns(hours, session, runtime, account_id, window, tag_of)
    return hours


def _window(
    start: datetime | None, end: datetime | None, now: datetime, default_start: Callable[[datetime], datetime]
) -> Window:
    end = end or now
    start = start or default_start(end)
    if end <= start:
        raise ValidationError(f"from ({start.isoformat()}) must be before to ({end.isoformat()}).")
    if end - start > timedelta(days=MAX_DAYS):
        raise ValidationError(f"A usage report covers at most {MAX_DAYS} days; ask for a shorter window.")
    return Window(start, end)


def _days_before(end: datetime) -> datetime:
    """The daily report's default start: 30 days before the midnight before its end."""
    return _midnight(end) - timedelta(days=DEFAULT_DAYS)


def _months_before(end: datetime) -> datetime:
    """The monthly report's default start: the first of the month two months before its end's month."""
    first = _midnight(end).replace(day=1)
    for _ in range(DEFAULT_MONTHS - 1):
        first = (first - timedelta(days=1)).replace(day=1)
    return first


def _plans(
    session: Session, account_id: str | None, window: Window, now: datetime
) -> Iterator[tuple[TrainingPlan, list[Span], list[Span]]]:
    """Each plan with capacity in the window: its segments, and the claims its consumers held on them."""
    segments = (
        select(ReservedCapacity, TrainingPlan)
        .join(TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id)
        .where(
            ReservedCapacity.holds_capacity.is_(True),
            ReservedCapacity.start < window.end,
            ReservedCapacity.end > window.start,
        )
    )
    reserved: dict[int, list[Span]] = defaultdict(list)
    plans: dict[int, TrainingPlan] = {}
    for segment, plan in session.execute(_of_account(segments, TrainingPlan.account_id, account_id)):
        until = min(segment.end, segment.released_at) if segment.released_at else segment.end
        reserved[plan.id].append(Span(_pool(segment), segment.start, until, segment.count))
        plans[plan.id] = plan
    claims = (
        select(CapacityClaim, ReservedCapacity)
        .join(ReservedCapacity, ReservedCapacity.id == CapacityClaim.reserved_capacity_id)
        .join(TrainingPlan, TrainingPlan.id == CapacityClaim.plan_id)
        .where(
            CapacityClaim.claimed_at < window.end,
            or_(CapacityClaim.released_at.is_(None), CapacityClaim.released_at > window.start),
        )
    )
    held: dict[int, list[Span]] = defaultdict(list)
    for claim, segment in session.execute(_of_account(claims, TrainingPlan.account_id, account_id)):
        span = Span(_pool(segment), claim.claimed_at, claim.released_at or now, claim.count)
        held[claim.plan_id].append(span)
    for plan_id, plan in plans.items():
        yield plan, reserved[plan_id], held[plan_id]


def _on_demand(
    session: Session, runtime: ServiceContext, account_id: str | None, window: Window, now: datetime
) -> Iterator[tuple[str, str, Span]]:
    """Work on the pools' on-demand capacity: (its account's id, its cluster's or job's ARN, its span)."""
    nodes = (
        select(ClusterNode, InstanceGroup, Cluster)
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .join(Cluster, Cluster.id == ClusterNode.cluster_id)
        .where(
            ClusterNode.on_plan.is_(False),
            ClusterNode.launched_at < window.end,
            or_(ClusterNode.ended_at.is_(None), ClusterNode.ended_at > window.start),
        )
    )
    for node, group, cluster in session.execute(_of_account(nodes, Cluster.account_id, account_id)):
        arn = runtime.arn(cluster.account_id, f"cluster/{cluster.cluster_id}")
        pool = (group.instance_type, node.availability_zone)
        yield cluster.account_id, arn, Span(pool, node.launched_at, node.ended_at or now, 1)
    ended = select(EndedNodeUsage).where(
        EndedNodeUsage.on_plan.is_(False),
        EndedNodeUsage.launched_at < window.end,
        EndedNodeUsage.ended_at > window.start,
    )
    for record in session.scalars(_of_account(ended, EndedNodeUsage.account_id, account_id)):
        arn = runtime.arn(record.account_id, f"cluster/{record.cluster_id}")
        pool = (record.instance_type, record.availability_zone)
        yield record.account_id, arn, Span(pool, record.launched_at, record.ended_at, 1)
    jobs = (
        select(TrainingJobTransition, TrainingJob)
        .join(TrainingJob, TrainingJob.id == TrainingJobTransition.job_id)
        .where(
            TrainingJob.plan_id.is_(None),
            TrainingJob.spot.is_(False),  # a spot job's hours are its runs' (_spot_runs)
            TrainingJobTransition.status.in_([s.value for s in RUNNING]),
            TrainingJobTransition.started_at < window.end,
            or_(TrainingJobTransition.ended_at.is_(None), TrainingJobTransition.ended_at > window.start),
        )
    )
    for transition, job in session.execute(_of_account(jobs, TrainingJob.account_id, account_id)):
        arn = runtime.arn(job.account_id, f"training-job/{job.name}")
        pool = (job.instance_type, job.availability_zone or "")
        span = Span(pool, transition.started_at, transition.ended_at or now, job.instance_count)
        yield job.account_id, arn, span


@dataclass(frozen=True)
class _SpotSide:
    """One side of a spot run: the account whose row it is on, the ARN its tag value comes from."""

    account_id: str
    arn: str


@dataclass(frozen=True)
class _SpotRunSeen:
    borrower: _SpotSide  # the spot job's account and the job
    owner: _SpotSide | None  # the lending plan's account and the plan; None on on-demand capacity
    span: Span
    charged: Amount | None  # at the run's end; None while it is open or not yet settled
    credited: Amount | None  # likewise, and None on on-demand capacity


def _spot_runs(
    session: Session, runtime: ServiceContext, account_id: str | None, window: Window, now: datetime
) -> Iterator[_SpotRunSeen]:
    """Spot runs that held instances in the window, or ended in it, of the account as borrower or as
    lender (every account's for an administrator's report)."""
    runs = (
        select(SpotRun, TrainingJob, TrainingPlan)
        .join(TrainingJob, TrainingJob.id == SpotRun.job_id)
        .outerjoin(TrainingPlan, TrainingPlan.id == SpotRun.plan_id)
        .where(
            SpotRun.started_at < window.end,
            or_(SpotRun.ended_at.is_(None), SpotRun.ended_at >= window.start),
        )
    )
    if account_id:
        runs = runs.where(or_(SpotRun.account_id == account_id, SpotRun.owner_account_id == account_id))
    for run, job, plan in session.execute(runs):
        pool = (run.instance_type, run.availability_zone)
        borrower = _SpotSide(run.account_id, runtime.arn(run.account_id, f"training-job/{job.name}"))
        owner = None
        if plan is not None:
            owner = _SpotSide(plan.account_id, runtime.arn(plan.account_id, f"training-plan/{plan.name}"))
        settled_at = run.ended_at if run.settled and run.ended_at is not None else None
        yield _SpotRunSeen(
            borrower=borrower,
            owner=owner,
            span=Span(pool, run.started_at, run.ended_at or now, run.count),
            charged=Amount(pool, settled_at, run.charged) if settled_at else None,
            credited=Amount(pool, settled_at, run.credited) if settled_at and owner else None,
        )


def _add_spot(
    hours: dict[Key, _Hours],
    runs: Iterator[_SpotRunSeen],
    tag_of: Tagger,
    window: Window,
    account_id: str | None,
) -> None:
    """Each run's hours and charge on its borrower's rows, its hours and credit on its lender's; only
    the sides of the report's account (all for an administrator's report): an owner never sees a row
    of the account that borrowed its instances, nor a borrower the lender's."""
    for run in runs:
        if account_id in (None, run.borrower.account_id):
            into = _into(hours, run.borrower, tag_of)
            for pool_day, time in instance_time([run.span], window).items():
                into(pool_day).spot += time
            for pool_day, amount in amounts_per_day(_present(run.charged), window).items():
                into(pool_day).spot_charged += amount
        if run.owner is not None and account_id in (None, run.owner.account_id):
            into = _into(hours, run.owner, tag_of)
            for pool_day, time in instance_time([run.span], window).items():
                into(pool_day).lent += time
            for pool_day, amount in amounts_per_day(_present(run.credited), window).items():
                into(pool_day).lending_credited += amount


def _into(hours: dict[Key, _Hours], side: _SpotSide, tag_of: Tagger) -> Callable[[PoolDay], _Hours]:
    """The figures of one side's row for a pool and day."""
    tag = tag_of(side.arn)
    return lambda pool_day: hours[(side.account_id, tag, pool_day)]


def _present(amount: Amount | None) -> list[Amount]:
    return [amount] if amount is not None else []


@dataclass(frozen=True)
class _ReturnedSeen:
    """A returned window with what the report needs of it: its account, its plan's ARN, its span."""

    window: ReturnedWindow
    plan_arn: str
    span: Span


def _add_returns(
    hours: dict[Key, _Hours],
    session: Session,
    runtime: ServiceContext,
    account_id: str | None,
    window: Window,
    tag_of: Tagger,
) -> None:
    """On the returning account's rows: the windows its returns gave back (on the days they cover), each
    return's refund (on its day, over its windows' pools), each resale's credit (on the resale's day)."""
    places = _places(runtime)
    returned = (
        select(ReturnedWindow, TrainingPlan)
        .join(TrainingPlan, TrainingPlan.id == ReturnedWindow.plan_id)
        .where(ReturnedWindow.start < window.end, ReturnedWindow.end > window.start)
    )
    for seen in _returned(session, runtime, _of_account(returned, ReturnedWindow.account_id, account_id)):
        key = (seen.window.account_id, tag_of(seen.plan_arn))
        for pool_day, time in instance_time([seen.span], window).items():
            hours[(*key, pool_day)].returned += time
    for plan_return, plan_arn, amounts in _refunds(session, runtime, account_id, window, places):
        for pool_day, amount in amounts_per_day(amounts, window).items():
            hours[(plan_return.account_id, tag_of(plan_arn), pool_day)].refunded += amount
    resales = (
        select(Resale, ReturnedWindow, TrainingPlan)
        .join(ReturnedWindow, ReturnedWindow.id == Resale.window_id)
        .join(TrainingPlan, TrainingPlan.id == ReturnedWindow.plan_id)
        .where(Resale.at >= window.start, Resale.at < window.end)
    )
    for resale, returned_window, plan in session.execute(
        _of_account(resales, ReturnedWindow.account_id, account_id)
    ):
        tag = tag_of(runtime.arn(plan.account_id, f"training-plan/{plan.name}"))
        credit = Amount(_pool(returned_window), resale.at, resale.credited)
        for pool_day, amount in amounts_per_day([credit], window).items():
            hours[(returned_window.account_id, tag, pool_day)].resale_credited += amount


def _returned(session: Session, runtime: ServiceContext, statement: Any) -> Iterator[_ReturnedSeen]:
    for returned_window, plan in session.execute(statement):
        arn = runtime.arn(plan.account_id, f"training-plan/{plan.name}")
        span = Span(_pool(returned_window), returned_window.start, returned_window.end, returned_window.count)
        yield _ReturnedSeen(returned_window, arn, span)


def _refunds(
    session: Session, runtime: ServiceContext, account_id: str | None, window: Window, places: int
) -> Iterator[tuple[PlanReturn, str, list[Amount]]]:
    """Each return made in the window: its plan's ARN and its refund as amounts at its instant, one per
    pool of its windows, in proportion to the value each pool gave back (one pool: all of it there)."""
    made = (
        select(PlanReturn, TrainingPlan)
        .join(TrainingPlan, TrainingPlan.id == PlanReturn.plan_id)
        .where(PlanReturn.at >= window.start, PlanReturn.at < window.end)
    )
    for plan_return, plan in session.execute(_of_account(made, PlanReturn.account_id, account_id)):
        if not _paid_back(session, plan_return):
            continue
        windows = session.scalars(
            select(ReturnedWindow)
            .where(ReturnedWindow.return_id == plan_return.id)
            .order_by(ReturnedWindow.id)
        ).all()
        value: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for returned_window in windows:
            seconds = (returned_window.end - returned_window.start) // SECOND * returned_window.count
            value[_pool(returned_window)] += seconds * returned_window.price_per_instance_hour
        pools = list(value) or [(plan.instance_type, "")]
        weights = [value[pool] for pool in pools] if any(value.values()) else [Decimal(1)] * len(pools)
        shares = split(plan_return.refund, weights, places)
        arn = runtime.arn(plan.account_id, f"training-plan/{plan.name}")
        yield (
            plan_return,
            arn,
            [Amount(pool, plan_return.at, share) for pool, share in zip(pools, shares, strict=True)],
        )


def _paid_back(session: Session, plan_return: PlanReturn) -> bool:
    """Whether the return's refund was money back (a ledger line). A refund that reduced or cancelled an
    invoice still awaiting approval was not: it shows as less paid, and counting it refunded too would
    count it twice."""
    return plan_return.settled == "ledger"


def _payments(session: Session, account_id: str | None, window: Window) -> Iterator[DayBooks]:
    """What each account paid, per ledger line that took money out in the window: plans' and extensions'
    fees, on-demand and spot charges. A budget set lower is a negative line too, but no payment."""
    budget_lines = (status_rows.budget_line(True), status_rows.budget_line(False))
    lines = select(LedgerEntry).where(
        LedgerEntry.at >= window.start,
        LedgerEntry.at < window.end,
        LedgerEntry.description.not_in(budget_lines),
    )
    for line in session.scalars(_of_account(lines, LedgerEntry.account_id, account_id)):
        if line.amount < 0:  # the store keeps amounts as decimal text: compared here, not in SQL
            yield DayBooks(line.account_id, line.at.astimezone(UTC).date(), paid=-line.amount)


def _day_books(key: Key, figures: _Hours) -> DayBooks:
    account, _tag, (_pool_of_day, day) = key
    return DayBooks(
        account=account,
        day=day,
        reserved=figures.reserved,
        used=figures.plan_used,
        lent=figures.lent,
        returned=figures.returned,
        refunded=figures.refunded,
        credited=figures.resale_credited + figures.lending_credited,
    )


def _month_rows(books: list[MonthBooks], names: dict[str, str], places: int) -> list[MonthRow]:
    minor_unit = Decimal(1).scaleb(-places)
    rows = [
        MonthRow(
            account=names.get(month.account, month.account),
            month=month.month.strftime("%Y-%m"),
            reserved_instance_hours=_hours(month.reserved),
            plan_used_instance_hours=_hours(month.used),
            idle_instance_hours=_hours(month.idle),
            lent_instance_hours=_hours(month.lent),
            returned_instance_hours=_hours(month.returned),
            paid=month.paid.quantize(minor_unit),
            refunded=month.refunded.quantize(minor_unit),
            credited=month.credited.quantize(minor_unit),
            net_cost=month.net_cost.quantize(minor_unit),
        )
        for month in books
    ]
    return sorted(rows, key=lambda row: (row.account, row.month))


def _names(session: Session) -> dict[str, str]:
    return {a.id: a.name for a in session.scalars(select(Account))}


def _places(runtime: ServiceContext) -> int:
    return currency_places(fleet_currency(runtime.fleet))


def _rows(hours: dict[Key, _Hours], names: dict[str, str], places: int) -> list[UsageRow]:
    def order(key: Key) -> tuple[str, str, str, str, date]:
        account, tag, ((instance_type, zone), day) = key
        return names.get(account, account), tag or "", instance_type, zone, day

    minor_unit = Decimal(1).scaleb(-places)  # every amount written in the currency's minor unit: "0.00"
    rows = []
    for key in sorted(hours, key=order):
        account, tag, ((instance_type, zone), day) = key
        h = hours[key]
        rows.append(
            UsageRow(
                account=names.get(account, account),
                instance_type=instance_type,
                zone=zone,
                day=day,
                reserved_instance_hours=_hours(h.reserved),
                plan_used_instance_hours=_hours(h.plan_used),
                on_demand_instance_hours=_hours(h.on_demand),
                used_instance_hours=_hours(h.plan_used + h.on_demand + h.spot),
                lent_instance_hours=_hours(h.lent),
                spot_instance_hours=_hours(h.spot),
                spot_charged=h.spot_charged.quantize(minor_unit),
                lending_credited=h.lending_credited.quantize(minor_unit),
                tag_value=tag,
                returned_instance_hours=_hours(h.returned),
                refunded=h.refunded.quantize(minor_unit),
                resale_credited=h.resale_credited.quantize(minor_unit),
            )
        )
    return rows


def _hours(time: timedelta) -> float:
    return round(time / HOUR, 4)


def _pool(segment: ReservedCapacity | ReturnedWindow) -> tuple[str, str]:
    return segment.instance_type, segment.availability_zone


def _of_account(statement: Statement, column: Any, account_id: str | None) -> Statement:
    """The statement kept to one account's rows, or all of them (an administrator's report)."""
    return statement.where(column == account_id) if account_id else statement


def _scope(session: Session, caller: Caller, account_ref: str | None) -> str | None:
    """Administrators: every account, or the one named. Others: their own."""
    if not caller.is_admin:
        if account_ref and account_ref not in (caller.account_id, caller.account_name):
            raise AccessDenied(
                f"Only administrators read other accounts' usage; {caller.account_name!r} is not one."
            )
        return caller.account_id
    return accounts.get_account(session, account_ref).id if account_ref else None


def _tagger(session: Session, key: str | None) -> Tagger:
    """The row's tag value of a resource: None when the report is not grouped by a tag."""
    if key is None:
        return lambda _arn: None
    rows = session.execute(select(ResourceTag.resource_arn, ResourceTag.value).where(ResourceTag.key == key))
    values = {arn: value for arn, value in rows}
    return lambda arn: values.get(arn, "")


def _midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
