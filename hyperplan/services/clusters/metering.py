"""On-demand use metered per started instance-hour of service time and debited to the ledger
(docs/DECISIONS.md, "On-demand use").

A holder of on-demand instances (a cluster node of an on-demand group, from its launch until it fails
or is Terminated; one attempt of a training job without a plan, while it holds its instances) gets one meter
(`OnDemandMeter`) when it starts, in the transaction that starts it. Hour 1 is charged then; each later
hour at its start, by a timed event (``on-demand.meter``) of the lifecycle loop, which plans the next.
When the holder gives its instances back its end is recorded (:func:`stop`) and no later hour starts;
the meter closes once every hour it started is charged. The meter counts the hours it charged, in the
same transaction as their ledger lines: a restart, a repeated event or a late settlement never charges
an hour twice, and missed events run in order at the next start.

Each hour costs count x the pool's on-demand price (taken when the meter starts), rounded half up to the
currency's minor unit, and is a ledger line whatever the payment mode; in mode `budget` it is taken from
the budget, which running work may take below zero. New on-demand work of a `budget` account must find
its first hour in the budget (:func:`check_budget`).
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.fleet import Pool
from hyperplan.core.jobs import HOLDING
from hyperplan.core.metering import HOUR, hour_start, hours_started
from hyperplan.core.status import NodeStatus
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.events.loop import DueEvent, EventHandler, schedule
from hyperplan.services.accounts.accounts import get_account
from hyperplan.services.plans.on_demand import NODE_GONE
from hyperplan.services.plans.payments import currency_places
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, ClusterNode, LedgerEntry, OnDemandMeter, TrainingJob

METER_EVENT = "on-demand.meter"


def node_holder(node: ClusterNode) -> str:
    # By instance id, not row id: a deleted cluster's node rows go, and SQLite may give their ids again.
    return f"node:{node.instance_id}"


def job_holder(job: TrainingJob) -> str:
    return f"job:{job.id}:{job.attempt}"


def hour_cost(pool: Pool, count: int) -> Decimal:
    """What ``count`` instances of the pool cost for one on-demand hour."""
    return _cost(pool.on_demand_price_per_instance_hour, count, pool.currency)


def _cost(price: Decimal, count: int, currency: str) -> Decimal:
    """count x price, rounded half up to the currency's minor unit."""
    places = Decimal(1).scaleb(-currency_places(currency))
    return (price * count).quantize(places, rounding=ROUND_HALF_UP)


def check_budget(session: Session, account_id: str, pool: Pool, count: int, what: str) -> None:
    """An account paying from its budget starts on-demand work only if the budget holds its first hour."""
    account = get_account(session, account_id)
    if account.payment_mode != "budget" or count <= 0:
        return
    first = hour_cost(pool, count)
    if account.budget <= 0 or account.budget < first:
        raise ResourceLimitExceeded(
            f"{what}: account {account.name} pays from its budget, which holds {account.budget} "
            f"{pool.currency}, less than the first on-demand hour of {count} {pool.instance_type} "
            f"({first} {pool.currency}: {count} x {pool.on_demand_price_per_instance_hour} per "
            "instance-hour). Ask an administrator to raise the budget (`hyperplan accounts update ACCOUNT "
            "--add-budget AMOUNT`), or name a training plan."
        )


def pool_of(runtime: ServiceContext, instance_type: str, zone: str) -> Pool | None:
    """The pool on-demand work of a type uses in a zone; None if the fleet file no longer has it."""
    pools = [p for p in runtime.fleet.pools_of_type(instance_type) if p.availability_zone == zone]
    return pools[0] if pools else None


def start(
    session: Session,
    account_id: str,
    holder: str,
    name: str,
    pool: Pool | None,
    count: int,
    now: datetime,
) -> OnDemandMeter | None:
    """Meter a holder that takes its on-demand instances now: hour 1 is charged at once. Work in a pool
    the fleet file no longer has (it was placed before the file changed) has no price: not metered."""
    if pool is None:
        return None
    meter = OnDemandMeter(
        account_id=account_id,
        holder=holder,
        name=name,
        instance_type=pool.instance_type,
        availability_zone=pool.availability_zone,
        count=count,
        price_per_instance_hour=pool.on_demand_price_per_instance_hour,
        currency=pool.currency,
        started_at=now,
        hours_charged=0,
        charged=Decimal("0"),
        closed=False,
    )
    session.add(meter)
    session.flush()
    _catch_up(session, meter, now)
    _plan_next(session, meter)
    return meter


def stop(session: Session, holder: str, now: datetime) -> None:
    """The holder gave its instances back now: no later hour starts; what it started is charged."""
    meter = session.scalar(select(OnDemandMeter).where(OnDemandMeter.holder == holder))
    if meter is None or meter.closed:
        return
    if meter.ended_at is None:
        meter.ended_at = max(now, meter.started_at)
    _catch_up(session, meter, now)


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    """The start of a metered holder's next hour, for the lifecycle loop."""

    def next_hour(session: Session, event: DueEvent) -> None:
        meter = session.get(OnDemandMeter, int(event.subject))
        if meter is None or meter.closed:
            return
        if meter.ended_at is None and not _still_holding(session, meter):
            meter.ended_at = event.due_at  # ended without telling the meter: no hour from here on
        _catch_up(session, meter, event.due_at)
        _plan_next(session, meter)

    return {METER_EVENT: next_hour}


def _still_holding(session: Session, meter: OnDemandMeter) -> bool:
    kind, _, rest = meter.holder.partition(":")
    if kind == "node":
        node = session.scalar(select(ClusterNode).where(ClusterNode.instance_id == rest))
        # A failed node works no more (a store from before its failure stopped the meter: it ends here).
        return node is not None and node.status not in (NodeStatus.FAILURE, NODE_GONE)
    job_id, _, attempt = rest.partition(":")
    job = session.get(TrainingJob, int(job_id))
    return job is not None and job.attempt == int(attempt) and job.attempt_state in HOLDING


def _catch_up(session: Session, meter: OnDemandMeter, now: datetime) -> None:
    """Charge every hour the holder started by ``now`` and not charged yet; close a meter whose holder
    ended once all its hours are charged."""
    due = hours_started(meter.started_at, now, meter.ended_at)
    if due > meter.hours_charged:
        account = get_account(session, meter.account_id)
        for hour in range(meter.hours_charged + 1, due + 1):
            _charge(session, account, meter, hour)
    if meter.ended_at is not None and meter.hours_charged >= hours_started(
        meter.started_at, meter.ended_at, meter.ended_at
    ):
        meter.closed = True


def _plan_next(session: Session, meter: OnDemandMeter) -> None:
    if not meter.closed:
        due = meter.started_at + meter.hours_charged * HOUR
        schedule(session, METER_EVENT, due, subject=str(meter.id))


def _charge(session: Session, account: Account, meter: OnDemandMeter, hour: int) -> None:
    amount = _cost(meter.price_per_instance_hour, meter.count, meter.currency)
    if account.payment_mode == "budget":
        account.budget -= amount
    meter.hours_charged = hour
    meter.charged += amount
    session.add(
        LedgerEntry(
            account_id=account.id,
            invoice_id=None,
            at=hour_start(meter.started_at, hour),
            amount=-amount,
            budget_after=account.budget,
            description=(
                f"On-demand {meter.name}: {meter.count} x {meter.instance_type} in "
                f"{meter.availability_zone}, hour {hour}, at {meter.price_per_instance_hour} "
                f"{meter.currency} per instance-hour"
            ),
        )
    )


def charged(session: Session, account_id: str) -> Decimal:
    """What the account's on-demand use has been charged so far."""
    amounts = session.scalars(select(OnDemandMeter.charged).where(OnDemandMeter.account_id == account_id))
    return sum(amounts, start=Decimal("0"))
