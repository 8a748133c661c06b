"""The money of managed spot training (docs/DECISIONS.md, "On-demand use" and its spot exception): a
spot run's borrower charged per second it held its instances, and the lending plan's owner credited its
share of that charge.

A spot run (`SpotRun`, services/jobs/spot.py) is settled once, when it has ended (:func:`settle`, in the
transaction that ends it): the charge is count x seconds x the spot price taken at its start, rounded half
up to the currency's minor unit (core/spot.py run_charge); on a lending plan the owner's credit is the
share taken at the start of that charge, rounded down (owner_credit), so a credit never exceeds what was
paid. Each is a ledger line, written as services/clusters/metering.py writes on-demand hours: whatever the
payment mode, and in mode `budget` the charge is taken from the borrower's budget (which running work
may take below zero) and the credit given to the owner's. `run.settled` makes a second settlement a no-op.

The owner's line names its plan and the instance-seconds lent, never the borrower's job or account:
accounts never see each other (administrators see the runs through the lending view).

New spot work of a `budget` account must find one hour of it at the spot price in the budget
(:func:`check_budget`), as on-demand work must find its first hour.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy.orm import Session

from hyperplan.core import spot
from hyperplan.core.fleet import Pool
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.services.accounts.accounts import get_account
from hyperplan.services.clusters.metering import pool_of
from hyperplan.services.plans.payments import currency_places
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, LedgerEntry, SpotRun, TrainingJob, TrainingPlan

HOUR_SECONDS = 3600


def spot_price_of(runtime: ServiceContext, pool: Pool) -> Decimal:
    """What one instance of the pool costs a spot job for an hour now (the fleet's fraction of its
    on-demand price)."""
    return spot.spot_price(pool.on_demand_price_per_instance_hour, runtime.fleet.spot)


def check_budget(
    session: Session, runtime: ServiceContext, account_id: str, pool: Pool, count: int, what: str
) -> None:
    """An account paying from its budget starts spot work only if the budget holds one hour of it at the
    spot price (spot work is charged per second, but a budget that cannot pay an hour is spent)."""
    account = get_account(session, account_id)
    if account.payment_mode != "budget" or count <= 0:
        return
    price = spot_price_of(runtime, pool)
    hour = spot.run_charge(price, count, HOUR_SECONDS, currency_places(pool.currency))
    if account.budget <= 0 or account.budget < hour:
        raise ResourceLimitExceeded(
            f"{what}: account {account.name} pays from its budget, which holds {account.budget} "
            f"{pool.currency}, less than one hour of managed spot training on {count} {pool.instance_type} "
            f"({hour} {pool.currency}: {count} x {price} per instance-hour, the spot price). Ask an "
            "administrator to raise the budget (`hyperplan accounts update ACCOUNT --add-budget AMOUNT`)."
        )


def settle(session: Session, runtime: ServiceContext, run: SpotRun, now: datetime) -> None:
    """Charge an ended run's borrower and credit its lending plan's owner, once. An open run, or one
    settled already, is left as it is. The ledger lines are dated at the run's end (what they pay for),
    however late the settlement (``now``) comes."""
    if run.settled or run.ended_at is None:
        return
    places = currency_places(run.currency)
    seconds = max((run.ended_at - run.started_at).total_seconds(), 0.0)
    charge = spot.run_charge(run.price_per_instance_hour, run.count, seconds, places)
    credit = Decimal(0)
    if charge > 0:
        _charge_borrower(session, runtime, run, charge, seconds)
        plan = session.get(TrainingPlan, run.plan_id) if run.plan_id is not None else None
        if plan is not None:
            credit = spot.owner_credit(charge, run.lender_share, places)
            if credit > 0:
                _credit_owner(session, run, plan, credit, charge, seconds)
    run.charged = charge
    run.credited = credit
    run.settled = True


def _charge_borrower(
    session: Session, runtime: ServiceContext, run: SpotRun, charge: Decimal, seconds: float
) -> None:
    borrower = get_account(session, run.account_id)
    job = session.get(TrainingJob, run.job_id)
    name = job.name if job is not None else f"#{run.job_id}"
    _write(
        session,
        borrower,
        run,
        -charge,
        f"Managed spot training job {name}: {run.count} x {run.instance_type} for {_seconds(seconds)} s "
        f"at {_price_words(runtime, run)}",
    )


def _credit_owner(
    session: Session, run: SpotRun, plan: TrainingPlan, credit: Decimal, charge: Decimal, seconds: float
) -> None:
    owner = get_account(session, plan.account_id)
    _write(
        session,
        owner,
        run,
        credit,
        f"Lending credit for training plan {plan.name}: {_seconds(run.count * seconds)} instance-seconds of "
        f"{run.instance_type} in {run.availability_zone} lent to managed spot training, {run.lender_share} "
        f"of the {run.currency} {charge} paid for them",
    )


def _write(session: Session, account: Account, run: SpotRun, amount: Decimal, description: str) -> None:
    """One ledger line; in mode `budget` the amount moves the budget too (metering._charge's rule)."""
    assert run.ended_at is not None
    if account.payment_mode == "budget":
        account.budget += amount
    session.add(
        LedgerEntry(
            account_id=account.id,
            invoice_id=None,
            at=run.ended_at,
            amount=amount,
            budget_after=account.budget,
            description=description,
        )
    )


def _price_words(runtime: ServiceContext, run: SpotRun) -> str:
    """The run's price, and the fleet's fraction of the on-demand price when that is what it was (the
    fleet file may have changed the fraction or the pool since the run started)."""
    price = f"{run.currency} {run.price_per_instance_hour} an instance-hour"
    pool = pool_of(runtime, run.instance_type, run.availability_zone)
    if pool is not None and spot_price_of(runtime, pool) == run.price_per_instance_hour:
        return f"{runtime.fleet.spot.price_fraction} x the on-demand price ({price})"
    return f"the spot price ({price})"


def _seconds(seconds: float) -> str:
    """Seconds as a person reads them: 312, 312.5 (never 3.12e+02)."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".")
