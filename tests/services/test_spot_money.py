"""The money of managed spot training (services/jobs/spot_money.py) on a real store: a spot run's borrower
charged per second at the spot price, rounded half up to the cent; the lending plan's owner credited its
share, rounded down, never more than the charge; each a ledger line, both budgets moved in mode `budget`;
a run settled once. Then the usage report's spot columns (services/plans/usage.py): lent hours and
credits on the owner's rows, spot hours and charges on the borrower's, neither account seeing the other.

Spot runs are inserted as the spot scheduler (services/jobs/spot.py) writes them: this file checks what
is paid for a run, not how runs are placed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select

from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ResourceLimitExceeded
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import spot_money
from hyperplan.services.orchestration import account_views
from hyperplan.services.plans import payments, plans, usage
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ReservedCapacity, SpotRun, TrainingJob, TrainingPlan
from tests.services.running import P5, ZONE, application, new_account, one_pool_fleet

# One pool of 8, 4 of them reservable: the owner's plan lends from the reservable part, on-demand spot
# work runs on the rest. Spot price: the default 0.35 x 40.00 = 14.00 an instance-hour.
FLEET = one_pool_fleet(8, reservable=4)
SPOT_PRICE = Decimal("14.00")
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Fleet:
    """The running service, the owner (who lends its plan) and the borrower (who runs spot jobs)."""

    runtime: ServiceContext
    owner: Caller
    borrower: Caller
    plan_id: int
    segment: ReservedCapacity


def _start(tmp_path: Path, mode: str) -> Iterator[Fleet]:
    with application(tmp_path, FLEET) as app:
        runtime = app.context
        # enough for the plan's fee in mode budget, granted as an administrator grants it
        budget = Decimal("100000") if mode == "budget" else None
        owner, borrower = (new_account(runtime, name, mode, budget) for name in ("vision", "speech"))
        offering = plans.search(runtime, owner, SearchRequest(P5, 2, 48, "training-job", None, None))[0]
        plans.create(runtime, owner, "vision-plan", offering.offering_id)
        with runtime.db.read() as session:
            plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "vision-plan")).one()
            segment = session.scalars(
                select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id)
            ).one()
        yield Fleet(runtime, owner, borrower, plan.id, segment)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    yield from _start(tmp_path, "auto")


@pytest.fixture
def budget_fleet(tmp_path: Path) -> Iterator[Fleet]:
    yield from _start(tmp_path, "budget")


def _spot_job(fleet: Fleet, name: str, count: int) -> int:
    """A managed spot training job of the borrower, as CreateTrainingJob stores one."""
    now = fleet.runtime.clock.now()
    with fleet.runtime.db.write() as session:
        job = TrainingJob(
            account_id=fleet.borrower.account_id,
            name=name,
            instance_type=P5,
            instance_count=count,
            availability_zone=ZONE,
            status="Completed",
            secondary_status="Completed",
            request=json.dumps({"TrainingJobName": name, "EnableManagedSpotTraining": True}),
            created_at=now,
            updated_at=now,
            spot=True,
            max_wait_seconds=86_400,
        )
        session.add(job)
        session.flush()
        return job.id


def _run(
    fleet: Fleet,
    job_id: int,
    count: int,
    start: datetime,
    end: datetime | None,
    lent: bool = True,
    attempt: int = 1,
) -> int:
    """A spot run of the job: on the owner's plan (lent) or on the pool's on-demand capacity."""
    runtime = fleet.runtime
    pool = runtime.fleet.pools_of_type(P5)[0]
    with runtime.db.write() as session:
        run = SpotRun(
            job_id=job_id,
            attempt=attempt,
            account_id=fleet.borrower.account_id,
            plan_id=fleet.plan_id if lent else None,
            reserved_capacity_id=fleet.segment.id if lent else None,
            owner_account_id=fleet.owner.account_id if lent else None,
            instance_type=P5,
            availability_zone=ZONE,
            count=count,
            price_per_instance_hour=spot_money.spot_price_of(runtime, pool),
            currency="USD",
            lender_share=runtime.fleet.spot.lender_share,
            started_at=start,
            ended_at=end,
        )
        session.add(run)
        session.flush()
        return run.id


def _settle(fleet: Fleet, run_id: int) -> SpotRun:
    runtime = fleet.runtime
    with runtime.db.write() as session:
        run = session.get(SpotRun, run_id)
        assert run is not None
        spot_money.settle(session, runtime, run, runtime.clock.now())
    with runtime.db.read() as session:
        settled = session.get(SpotRun, run_id)
        assert settled is not None
        return settled


def _ledger(fleet: Fleet, caller: Caller) -> list[account_views.LedgerLine]:
    """The account's ledger lines that are not the plan's fee or a budget grant."""
    _, lines = account_views.ledger(fleet.runtime, caller.account_name)
    grants = ("budget grant", "budget set")
    return [line for line in lines if line.invoice_id is None and line.description not in grants]


def _budget(fleet: Fleet, caller: Caller) -> Decimal:
    with fleet.runtime.db.read() as session:
        return accounts.get_account(session, caller.account_id).budget


# -- settling a run --------------------------------------------------------------------------------------


def test_a_lent_run_charges_the_borrower_per_second_and_credits_the_owner_its_share(fleet: Fleet) -> None:
    start = fleet.segment.start + HOUR
    end = start + timedelta(seconds=643.5)
    run = _settle(fleet, _run(fleet, _spot_job(fleet, "resnet-spot", 2), 2, start, end))
    # 2 x 643.5 s x 14.00 / 3600 = 5.005: half up to 5.01 (a banker's rounding would say 5.00).
    # The owner's 0.8 of it is 4.008: down to 4.00, so the credit never exceeds what was paid.
    assert (run.charged, run.credited, run.settled) == (Decimal("5.01"), Decimal("4.00"), True)

    [charge] = _ledger(fleet, fleet.borrower)
    assert (charge.amount, charge.at) == (Decimal("-5.01"), end)
    assert charge.description == (
        f"Managed spot training job resnet-spot: 2 x {P5} for 643.5 s at 0.35 x the on-demand price "
        f"(USD {SPOT_PRICE:.4f} an instance-hour)"
    )
    [credit] = _ledger(fleet, fleet.owner)
    assert (credit.amount, credit.at) == (Decimal("4.00"), end)
    assert "vision-plan" in credit.description and "1287 instance-seconds" in credit.description
    # The owner learns how much of its plan was lent, never to whom.
    for secret in ("resnet-spot", "speech", fleet.borrower.account_id):
        assert secret not in credit.description
    # The ledger adds up: what the borrower paid is the owner's credit and the operator's rest.
    assert Decimal(0) < credit.amount <= -charge.amount
    assert -charge.amount - credit.amount == Decimal("1.01")


def test_a_run_is_settled_once_and_an_open_run_not_at_all(fleet: Fleet) -> None:
    job = _spot_job(fleet, "bert-spot", 1)
    start = fleet.segment.start + HOUR
    open_run = _settle(fleet, _run(fleet, job, 1, start, None, attempt=1))
    assert (open_run.settled, open_run.charged) == (False, Decimal(0))
    assert _ledger(fleet, fleet.borrower) == []

    ended = _run(fleet, job, 1, start, start + 2 * HOUR, attempt=2)
    first = _settle(fleet, ended)
    again = _settle(fleet, ended)  # a repeated end (a restart, a second report): nothing more is paid
    assert (
        (first.charged, first.credited)
        == (again.charged, again.credited)
        == (Decimal("28.00"), Decimal("22.40"))
    )
    assert [line.amount for line in _ledger(fleet, fleet.borrower)] == [Decimal("-28.00")]
    assert [line.amount for line in _ledger(fleet, fleet.owner)] == [Decimal("22.40")]


def test_a_spot_run_on_demand_is_charged_and_credits_no_one(fleet: Fleet) -> None:
    start = fleet.segment.start + HOUR
    run = _settle(
        fleet, _run(fleet, _spot_job(fleet, "on-demand-spot", 3), 3, start, start + HOUR / 2, lent=False)
    )
    # 3 x 1800 s x 14.00 / 3600 = 21.00
    assert (run.charged, run.credited) == (Decimal("21.00"), Decimal(0))
    assert [line.amount for line in _ledger(fleet, fleet.borrower)] == [Decimal("-21.00")]
    assert _ledger(fleet, fleet.owner) == []


def test_a_run_too_short_to_cost_a_cent_writes_no_line(fleet: Fleet) -> None:
    start = fleet.segment.start + HOUR
    # 1 x 1 s x 14.00 / 3600 = 0.0039: rounds to nothing.
    run = _settle(fleet, _run(fleet, _spot_job(fleet, "tiny", 1), 1, start, start + timedelta(seconds=1)))
    assert (run.charged, run.credited, run.settled) == (Decimal(0), Decimal(0), True)
    assert _ledger(fleet, fleet.borrower) == _ledger(fleet, fleet.owner) == []


def test_in_budget_mode_the_charge_leaves_the_borrower_s_budget_and_the_credit_joins_the_owner_s(
    budget_fleet: Fleet,
) -> None:
    fleet = budget_fleet
    borrower_before, owner_before = _budget(fleet, fleet.borrower), _budget(fleet, fleet.owner)
    start = fleet.segment.start + HOUR
    _settle(fleet, _run(fleet, _spot_job(fleet, "budgeted", 2), 2, start, start + 3 * HOUR))
    # 2 x 3 h x 14.00 = 84.00; the owner's 0.8 of it 67.20.
    assert _budget(fleet, fleet.borrower) == borrower_before - Decimal("84.00")
    assert _budget(fleet, fleet.owner) == owner_before + Decimal("67.20")
    [charge], [credit] = _ledger(fleet, fleet.borrower), _ledger(fleet, fleet.owner)
    assert (charge.amount, charge.budget_after) == (Decimal("-84.00"), borrower_before - Decimal("84.00"))
    assert (credit.amount, credit.budget_after) == (Decimal("67.20"), owner_before + Decimal("67.20"))


def test_a_budget_account_starts_spot_work_only_with_an_hour_of_it_in_its_budget(budget_fleet: Fleet) -> None:
    fleet = budget_fleet
    pool = fleet.runtime.fleet.pools_of_type(P5)[0]
    with fleet.runtime.db.write() as session:
        spot_money.check_budget(session, fleet.runtime, fleet.borrower.account_id, pool, 2, "spot-job")
        # One hour of 2 instances at the spot price: 28.00. A budget of 27.99 is short of it.
        payments.update_account(
            session,
            "speech",
            mode=None,
            budget=Decimal("27.99"),
            add_budget=None,
            now=fleet.runtime.clock.now(),
        )
        with pytest.raises(ResourceLimitExceeded) as refused:
            spot_money.check_budget(session, fleet.runtime, fleet.borrower.account_id, pool, 2, "spot-job")
        assert "spot-job: account speech pays from its budget, which holds 27.99 USD" in str(refused.value)
        assert "28.00 USD: 2 x 14.0000 per instance-hour" in str(refused.value)
        payments.update_account(
            session,
            "speech",
            mode=None,
            budget=Decimal("28.00"),
            add_budget=None,
            now=fleet.runtime.clock.now(),
        )
        spot_money.check_budget(session, fleet.runtime, fleet.borrower.account_id, pool, 2, "spot-job")


# -- what the owner and the borrower see -------------------------------------------------------------------


def _usage(fleet: Fleet, caller: Caller, start: datetime, end: datetime) -> list[usage.UsageRow]:
    return usage.usage(fleet.runtime, caller, account_ref=None, start=start, end=end)


def test_usage_shows_lent_hours_and_credits_to_the_owner_and_spot_hours_and_charges_to_the_borrower(
    fleet: Fleet,
) -> None:
    runtime = fleet.runtime
    day1 = fleet.segment.start.astimezone(UTC).date()
    midnight = datetime.combine(day1 + timedelta(days=1), datetime.min.time(), UTC)
    job = _spot_job(fleet, "lent-and-not", 2)
    # Lent: 2 instances from 12:30 for 643.5 s, then 1 instance from 22:00 on (open at the report's end,
    # 02:00 the next day). On demand: 1 instance for an hour from 20:00.
    first = fleet.segment.start + HOUR
    _run(fleet, job, 2, first, first + timedelta(seconds=643.5), attempt=1)
    _run(fleet, job, 1, midnight - 4 * HOUR, midnight - 3 * HOUR, lent=False, attempt=2)
    _run(fleet, job, 1, midnight - 2 * HOUR, None, attempt=3)
    runtime.advance_clock(midnight + 2 * HOUR)
    with runtime.db.write() as session:
        for run in session.scalars(select(SpotRun)):
            spot_money.settle(session, runtime, run, runtime.clock.now())
    window = (midnight - timedelta(days=2), runtime.clock.now())
    lent_first = 2 * 643.5 / 3600

    owner_rows = _usage(fleet, fleet.owner, *window)
    assert {row.account for row in owner_rows} == {"vision"}
    owner = {row.day: row for row in owner_rows}
    assert owner[day1].lent_instance_hours == pytest.approx(lent_first + 2, abs=1e-4)
    assert owner[day1 + timedelta(days=1)].lent_instance_hours == pytest.approx(2.0)
    # The first run's credit (4.00) and the on-demand run's none (14.00 charged, nothing lent).
    assert [owner[day].lending_credited for day in sorted(owner)] == [Decimal("4.00"), Decimal("0.00")]
    assert all(row.spot_instance_hours == 0 and row.spot_charged == 0 for row in owner_rows)

    borrower_rows = _usage(fleet, fleet.borrower, *window)
    assert {row.account for row in borrower_rows} == {"speech"}
    borrower = {row.day: row for row in borrower_rows}
    assert borrower[day1].spot_instance_hours == pytest.approx(lent_first + 1 + 2, abs=1e-4)
    assert borrower[day1 + timedelta(days=1)].spot_instance_hours == pytest.approx(2.0)
    # Spot work is the account's use of the pool, and none of it is on-demand work charged by the hour.
    assert all(row.used_instance_hours == row.spot_instance_hours for row in borrower_rows)
    assert all(
        row.on_demand_instance_hours == 0 and row.reserved_instance_hours == 0 for row in borrower_rows
    )
    # Money on the day each run ended: 5.01 and 14.00 on the first; the open run has none yet.
    assert [borrower[day].spot_charged for day in sorted(borrower)] == [Decimal("19.01"), Decimal("0.00")]
    assert all(row.lent_instance_hours == 0 and row.lending_credited == 0 for row in borrower_rows)

    admin = Caller("", "admin", True, "test")
    both = _usage(fleet, admin, *window)
    assert {(row.account, row.day) for row in both} == {
        (account, day) for account in ("vision", "speech") for day in (day1, day1 + timedelta(days=1))
    }


def test_the_spot_price_is_the_fleet_s_fraction_of_the_on_demand_price(fleet: Fleet) -> None:
    pool = fleet.runtime.fleet.pools_of_type(P5)[0]
    assert spot_money.spot_price_of(fleet.runtime, pool) == SPOT_PRICE
