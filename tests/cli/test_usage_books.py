"""The books of returns (docs/OPERATIONS.md, "Usage per account"): `hyperplan usage` shows on the
returning account's daily rows the instance-hours a return gave back (on the days they cover), its refund
(on the day of the return) and the credit of each resale (on the day of the resale), in three columns
added at the end of the CSV; `hyperplan usage --monthly` (GET /api/v1/usage/monthly) folds each
account's days into calendar months with what it paid, idle hours and the net cost.

The return and the resale are written into the store as the returns and resale services write them
(this file checks the report, not the return): the segment shortened, a PlanReturn with its
ReturnedWindow, the refund's ledger line, a Resale of the returned window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from hyperplan.cli.client import ApiError
from hyperplan.services.accounts import accounts
from hyperplan.signing import Credentials
from hyperplan.store.schema import (
    Invoice,
    LedgerEntry,
    PlanReturn,
    Resale,
    ReservedCapacity,
    ReturnedWindow,
    ReturnQuote,
    TrainingPlan,
)
from tests.cli.test_usage import CSV_HEADER, P5, SHARED_POOL, ZONE
from tests.inprocess import InProcessServer

HOUR = timedelta(hours=1)
PLAN_START = datetime(2027, 1, 1, 11, 30, tzinfo=UTC)  # 2 instances for 48 h
RETURNED_FROM = PLAN_START + 24 * HOUR  # the second day given back, before the plan began
RETURN_AT = datetime(2027, 1, 1, 6, 0, tzinfo=UTC)
RESALE_AT = datetime(2027, 1, 2, 12, 0, tzinfo=UTC)
REPORT_END = datetime(2027, 1, 4, 0, 0, tzinfo=UTC)
WINDOW = {"from": "2026-12-31T00:00:00Z", "to": REPORT_END.isoformat()}


@pytest.fixture
def pool(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "shared-pool.toml"
    fleet.write_text(SHARED_POOL)
    return fast_server_factory(data_dir=tmp_path / "data", fleet=fleet).start()


def _buy(
    server: InProcessServer, credentials: Credentials, name: str, start: datetime, hours: int
) -> Decimal:
    """A plan of 2 instances bought at the server's start (paid at once): its upfront fee."""
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=2,
        DurationHours=hours,
        TargetResources=["training-job"],
        StartTimeAfter=start,
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    plan = client.describe_training_plan(TrainingPlanName=name)
    assert plan["StartTime"] == start
    return Decimal(plan["UpfrontFee"])


def _return_second_day(
    server: InProcessServer, fee: Decimal, refund: Decimal, credit: Decimal, *, paid_back: bool = True
) -> None:
    """The plan `returning` gives its second day back at RETURN_AT and is refunded `refund` (paid_back: a
    ledger line; otherwise its invoice awaiting approval is made smaller, as returns.py does); 2 instances
    of it for 12 h are resold at RESALE_AT to the plan `buyer`, crediting `credit`."""
    assert server.runtime is not None
    with server.runtime.context.db.write() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "returning")).one()
        buyer = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "buyer")).one()
        segment = session.scalars(select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id)).one()
        segment.end = RETURNED_FROM
        quote = ReturnQuote(
            id="rq-books",
            plan_id=plan.id,
            account_id=plan.account_id,
            scope='{"Kind": "tail"}',
            windows="[]",
            refund=refund,
            currency="USD",
            fingerprint="0" * 64,
            created_at=RETURN_AT,
            valid_until=RETURN_AT + timedelta(minutes=10),
            used_at=RETURN_AT,
        )
        session.add(quote)
        session.flush()
        returned = PlanReturn(
            plan_id=plan.id,
            account_id=plan.account_id,
            quote_id=quote.id,
            at=RETURN_AT,
            scope=quote.scope,
            instance_hours=48.0,
            refund=refund,
            currency="USD",
            settled="ledger" if paid_back else "invoice reduced",
        )
        session.add(returned)
        session.flush()
        window = ReturnedWindow(
            return_id=returned.id,
            plan_id=plan.id,
            account_id=plan.account_id,
            instance_type=P5,
            availability_zone=ZONE,
            start=RETURNED_FROM,
            end=RETURNED_FROM + 24 * HOUR,
            count=2,
            price_per_instance_hour=fee / 96,
            resale_share=Decimal("0.5"),
        )
        session.add(window)
        session.flush()
        session.add(
            Resale(
                window_id=window.id,
                buyer_plan_id=buyer.id,
                start=RESALE_AT,
                end=RESALE_AT + 12 * HOUR,
                count=2,
                credited=credit,
                at=RESALE_AT,
            )
        )
        owner = accounts.get_account(session, "vision")
        lines = [(RESALE_AT, credit, "Resale credit for training plan returning")]
        if paid_back:
            lines.append((RETURN_AT, refund, f"Refund for training plan returning: return quote {quote.id}"))
        else:
            invoice = session.scalars(select(Invoice).where(Invoice.plan_id == plan.id)).one()
            invoice.amount -= refund
        for at, amount, what in lines:
            session.add(
                LedgerEntry(
                    account_id=owner.id,
                    invoice_id=None,
                    at=at,
                    amount=amount,
                    budget_after=owner.budget,
                    description=what,
                )
            )


@pytest.fixture
def returned(pool: InProcessServer) -> dict[str, Any]:
    """vision's plan (2 x 48 h) with its second day returned and partly resold; speech's plan elsewhere."""
    server = pool
    vision, speech = server.new_account("vision"), server.new_account("speech")
    fee = _buy(server, vision, "returning", PLAN_START, 48)
    speech_fee = _buy(server, speech, "buyer", PLAN_START + 5 * 24 * HOUR, 24)
    refund = fee / 2  # the whole second day, a day before it starts: a full refund of its share
    credit = (fee / 96 * 2 * 12 / 2).quantize(Decimal("0.01"))  # 24 instance-hours resold, half credited
    _return_second_day(server, fee, refund, credit)
    server.set_clock(REPORT_END)
    return {
        "vision": vision,
        "speech": speech,
        "fee": fee,
        "speech_fee": speech_fee,
        "refund": refund,
        "credit": credit,
    }


def _money(amount: Decimal) -> str:
    return str(amount.quantize(Decimal("0.01")))


def test_a_return_shows_its_hours_on_their_days_its_refund_on_its_day_and_each_resale_on_its_own(
    pool: InProcessServer, returned: dict[str, Any]
) -> None:
    server = pool
    rows = server.native(returned["vision"]).get("/api/v1/usage", **WINDOW)["Usage"]
    found = {
        r["Day"]: (r["ReservedInstanceHours"], r["ReturnedInstanceHours"], r["Refunded"], r["ResaleCredited"])
        for r in rows
    }
    refund, credit = _money(returned["refund"]), _money(returned["credit"])
    assert found == {
        # 12.5 h of 2 instances kept on the first day; the refund on the day of the return.
        "2027-01-01": (25.0, 0.0, refund, "0.00"),
        # 11.5 h kept, then the returned 12.5 h; the resale's credit on the day of the resale.
        "2027-01-02": (23.0, 25.0, "0.00", credit),
        "2027-01-03": (0.0, 23.0, "0.00", "0.00"),
    }
    # The existing columns keep their order; the new three come after them.
    csv = server.cli(
        "usage", "--csv", "--from", WINDOW["from"], "--to", WINDOW["to"], credentials=returned["vision"]
    )
    header, *lines = csv.stdout.strip().splitlines()
    assert header == CSV_HEADER and header.endswith(
        ",lending_credited,returned_instance_hours,refunded,resale_credited"
    )
    assert lines == [
        f"vision,{P5},{ZONE},2027-01-01,25.0,0.0,0.0,0.0,0.0,0.0,0.00,0.00,0.0,{refund},0.00",
        f"vision,{P5},{ZONE},2027-01-02,23.0,0.0,0.0,0.0,0.0,0.0,0.00,0.00,25.0,0.00,{credit}",
        f"vision,{P5},{ZONE},2027-01-03,0.0,0.0,0.0,0.0,0.0,0.0,0.00,0.00,23.0,0.00,0.00",
    ]
    # The buyer's rows know nothing of the seller's return.
    theirs = server.native(returned["speech"]).get("/api/v1/usage", **WINDOW)["Usage"]
    assert {
        (r["Account"], r["ReturnedInstanceHours"], r["Refunded"], r["ResaleCredited"]) for r in theirs
    } <= {("speech", 0.0, "0.00", "0.00")}
    # The table shows the returns' columns when a row has some.
    table = server.cli(
        "usage", "--from", WINDOW["from"], "--to", WINDOW["to"], credentials=returned["vision"]
    )
    assert "Returned h" in table.stdout and "Resale credited" in table.stdout and refund in table.stdout


def test_the_monthly_books_add_up_per_account_and_month(
    pool: InProcessServer, returned: dict[str, Any]
) -> None:
    server = pool
    fee, refund, credit = returned["fee"], returned["refund"], returned["credit"]
    books = server.native(returned["vision"]).get("/api/v1/usage/monthly", **WINDOW)
    assert books["Currency"] == "USD"
    assert books["Months"] == [
        # Bought (and paid) at the server's start, ten minutes before the year's end.
        {
            "Account": "vision",
            "Month": "2026-12",
            "ReservedInstanceHours": 0.0,
            "PlanUsedInstanceHours": 0.0,
            "IdleInstanceHours": 0.0,
            "LentInstanceHours": 0.0,
            "ReturnedInstanceHours": 0.0,
            "Paid": _money(fee),
            "Refunded": "0.00",
            "Credited": "0.00",
            "NetCost": _money(fee),
        },
        # 48 h of 2 instances kept and 48 given back; nothing ran on the plan: all its hours idle. The
        # refund and the resale's credit came back this month: money back, a negative cost.
        {
            "Account": "vision",
            "Month": "2027-01",
            "ReservedInstanceHours": 48.0,
            "PlanUsedInstanceHours": 0.0,
            "IdleInstanceHours": 48.0,
            "LentInstanceHours": 0.0,
            "ReturnedInstanceHours": 48.0,
            "Paid": "0.00",
            "Refunded": _money(refund),
            "Credited": _money(credit),
            "NetCost": _money(-refund - credit),
        },
    ]
    # Without --from: this month and the two before, so the same months here.
    assert server.native(returned["vision"]).get("/api/v1/usage/monthly")["Months"] == books["Months"]
    # An account sees its own books only; an administrator any account's, or all of them.
    with pytest.raises(ApiError) as refused:
        server.native(returned["speech"]).get("/api/v1/usage/monthly", account="vision", **WINDOW)
    assert refused.value.code == "AccessDeniedException"
    everyone = server.native().get("/api/v1/usage/monthly", **WINDOW)["Months"]
    assert [(m["Account"], m["Month"]) for m in everyone] == [
        ("speech", "2026-12"),
        ("vision", "2026-12"),
        ("vision", "2027-01"),
    ]
    assert everyone[0]["Paid"] == _money(returned["speech_fee"])

    csv = server.cli(
        "usage",
        "--monthly",
        "--csv",
        "--from",
        WINDOW["from"],
        "--to",
        WINDOW["to"],
        credentials=returned["vision"],
    )
    assert csv.stdout.strip().splitlines() == [
        "account,month,reserved_instance_hours,plan_used_instance_hours,idle_instance_hours,"
        "lent_instance_hours,returned_instance_hours,paid,refunded,credited,net_cost",
        f"vision,2026-12,0.0,0.0,0.0,0.0,0.0,{_money(fee)},0.00,0.00,{_money(fee)}",
        f"vision,2027-01,48.0,0.0,48.0,0.0,48.0,0.00,{_money(refund)},{_money(credit)},"
        f"{_money(-refund - credit)}",
    ]
    table = server.cli("usage", "--monthly", credentials=returned["vision"])
    assert "Net cost" in table.stdout and _money(-refund - credit) in table.stdout
    refused_tag = server.cli(
        "usage", "--monthly", "--by-tag", "team", credentials=returned["vision"], check=False
    )
    assert refused_tag.returncode != 0 and "--by-tag" in refused_tag.stderr


def test_a_refund_that_made_an_invoice_smaller_is_paid_less_not_refunded(pool: InProcessServer) -> None:
    server = pool
    vision = server.new_account("vision", PaymentMode="approval")
    speech = server.new_account("speech")
    fee = _buy(server, vision, "returning", PLAN_START, 48)
    _buy(server, speech, "buyer", PLAN_START + 5 * 24 * HOUR, 24)
    refund = fee / 2
    _return_second_day(server, fee, refund, Decimal("0.00"), paid_back=False)
    [invoice] = server.native().get("/api/v1/invoices", account="vision")["Invoices"]
    server.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    server.set_clock(REPORT_END)
    [december, january] = server.native(vision).get("/api/v1/usage/monthly", **WINDOW)["Months"]
    # What was left to pay was paid; the refund is in it, not in a refund of its own.
    assert (december["Paid"], december["Refunded"], december["NetCost"]) == (
        _money(fee - refund),
        "0.00",
        _money(fee - refund),
    )
    assert (january["ReturnedInstanceHours"], january["Refunded"], january["NetCost"]) == (
        48.0,
        "0.00",
        "0.00",
    )
