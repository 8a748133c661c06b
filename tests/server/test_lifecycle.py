"""A plan's life under the manual clock, checked through boto3 at every step; payment modes; cancellation."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import Server, boundary_after, service_now
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"


def _buy(server: Server, credentials: Credentials, name: str, **search: Any) -> dict[str, Any]:
    client = server.sagemaker(credentials)
    request = {"InstanceType": P5, "TargetResources": ["hyperpod-cluster"], **search}
    offering = client.search_training_plan_offerings(**request)["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return offering


def _state(server: Server, credentials: Credentials, name: str) -> tuple[str, list[str], dict[str, int], str]:
    plan = server.sagemaker(credentials).describe_training_plan(TrainingPlanName=name)
    counters = {k: plan[k] for k in ("TotalInstanceCount", "AvailableInstanceCount", "InUseInstanceCount")}
    return (
        plan["Status"],
        [s["Status"] for s in plan["ReservedCapacitySummaries"]],
        counters,
        plan["StatusMessage"],
    )


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    """In process (tests/inprocess.py): these are rules, and they speak the same HTTP there."""
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


@pytest.fixture
def two_segment_plan(small: Server) -> tuple[Server, Credentials, datetime]:
    """A plan of two one-day segments in us-west-2a, split around two days another team holds."""
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    blocker = small.new_account("blocker")
    _buy(
        small,
        blocker,
        "block",
        InstanceCount=8,
        DurationHours=48,
        StartTimeAfter=start + timedelta(days=1),
        EndTimeBefore=start + timedelta(days=3),
    )
    owner = small.new_account("owner", PaymentMode="approval")
    offering = _buy(
        small,
        owner,
        "walk",
        InstanceCount=8,
        DurationHours=48,
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=4),
    )
    segments = offering["ReservedCapacityOfferings"]
    assert [(s["StartTime"], s["EndTime"]) for s in segments] == [
        (start, start + timedelta(days=1)),
        (start + timedelta(days=3), start + timedelta(days=4)),
    ]
    return small, owner, start


def test_a_two_segment_plan_walks_through_every_status(
    two_segment_plan: tuple[Server, Credentials, datetime],
) -> None:
    server, owner, start = two_segment_plan
    status, rcs, counters, message = _state(server, owner, "walk")
    assert (status, rcs) == ("Pending", ["Pending", "Pending"])
    assert "approval" in message and counters["AvailableInstanceCount"] == 0

    invoice = server.native().get("/api/v1/invoices", status="Pending")["Invoices"]
    assert [i["TrainingPlanName"] for i in invoice] == ["walk"]
    server.cli("invoices", "approve", str(invoice[0]["InvoiceId"]))
    status, rcs, counters, message = _state(server, owner, "walk")
    assert (status, rcs) == ("Scheduled", ["Scheduled", "Scheduled"])
    assert message == "Payment confirmed, training plan scheduled."
    assert counters == {"TotalInstanceCount": 8, "AvailableInstanceCount": 8, "InUseInstanceCount": 0}

    server.set_clock(start)
    status, rcs, counters, message = _state(server, owner, "walk")
    assert (status, rcs) == ("Active", ["Active", "Scheduled"])
    assert "active until" in message and counters["AvailableInstanceCount"] == 8

    server.set_clock(start + timedelta(days=1))
    status, rcs, _, message = _state(server, owner, "walk")
    assert (status, rcs) == ("Scheduled", ["Expired", "Scheduled"])
    assert "next one starts" in message

    server.set_clock(start + timedelta(days=3, hours=1))
    status, rcs, _, _ = _state(server, owner, "walk")
    assert (status, rcs) == ("Active", ["Expired", "Active"])

    server.advance_clock("1d")
    status, rcs, counters, message = _state(server, owner, "walk")
    assert (status, rcs) == ("Expired", ["Expired", "Expired"])
    assert "ended" in message and counters["AvailableInstanceCount"] == 0

    events = json.loads(server.cli("plans", "events", "walk", "--json", credentials=owner).stdout)["Events"]
    kinds = [e["Kind"] for e in events]
    assert kinds[:4] == ["created", "invoiced", "awaiting-approval", "paid"]
    assert kinds.count("segment-started") == 2 and kinds.count("reclaim-begins") == 2
    assert [e["Status"] for e in events][-1] == "Expired"
    reclaims = [datetime.fromisoformat(e["At"]) for e in events if e["Kind"] == "reclaim-begins"]
    assert reclaims == [start + timedelta(days=1, minutes=-30), start + timedelta(days=4, minutes=-30)]


def test_rc_status_through_describe_reserved_capacity(
    two_segment_plan: tuple[Server, Credentials, datetime],
) -> None:
    server, owner, start = two_segment_plan
    client = server.sagemaker(owner)
    invoice = server.native().get("/api/v1/invoices", status="Pending")["Invoices"][0]
    server.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    arns = [
        s["ReservedCapacityArn"]
        for s in client.describe_training_plan(TrainingPlanName="walk")["ReservedCapacitySummaries"]
    ]
    server.set_clock(start + timedelta(hours=2))
    assert [client.describe_reserved_capacity(ReservedCapacityArn=a)["Status"] for a in arns] == [
        "Active",
        "Scheduled",
    ]


def test_auto_payment_schedules_at_once_and_records_spend(small: Server) -> None:
    team = small.new_account("auto-team")
    offering = _buy(small, team, "auto", InstanceCount=2, DurationHours=24)
    assert _state(small, team, "auto")[0] == "Scheduled"
    account = next(a for a in small.native().get("/api/v1/accounts")["Accounts"] if a["Name"] == "auto-team")
    assert Decimal(account["Spend"]) == Decimal(offering["UpfrontFee"])


def test_budget_sufficient_is_debited_exactly(small: Server) -> None:
    team = small.new_account("budget-team", PaymentMode="budget")
    small.cli("accounts", "update", "budget-team", "--budget", "100000.00")
    offering = _buy(small, team, "paid", InstanceCount=2, DurationHours=24)
    assert _state(small, team, "paid")[0] == "Scheduled"
    ledger = json.loads(small.cli("accounts", "ledger", "budget-team", "--json").stdout)["Entries"]
    fee = Decimal(offering["UpfrontFee"])
    assert [Decimal(e["Amount"]) for e in ledger] == [Decimal("100000.00"), -fee]
    assert Decimal(ledger[-1]["BudgetAfter"]) == Decimal("100000.00") - fee
    table = small.cli("accounts", "list").stdout
    assert "budget-team" in table and str(Decimal("100000.00") - fee) in table


def test_budget_short_fails_the_plan_and_releases_its_capacity(small: Server) -> None:
    team = small.new_account("poor-team", PaymentMode="budget")
    small.cli("accounts", "update", "poor-team", "--budget", "10.00")
    offering = _buy(
        small, team, "too-dear", InstanceCount=8, DurationHours=24, TargetResources=["training-job"]
    )
    status, rcs, _, message = _state(small, team, "too-dear")
    assert (status, rcs[0]) == ("Failed", "Failed")
    assert "budget" in message and "10.00" in message
    _assert_capacity_can_be_bought_again(small, offering)


def test_approval_refused_fails_the_plan_with_the_reason(small: Server) -> None:
    team = small.new_account("needs-ok", PaymentMode="approval")
    offering = _buy(
        small, team, "refused", InstanceCount=8, DurationHours=24, TargetResources=["training-job"]
    )
    invoice = small.native().get("/api/v1/invoices", account="needs-ok")["Invoices"][0]
    assert invoice["Status"] == "Pending"
    small.cli("invoices", "reject", str(invoice["InvoiceId"]), "--reason", "over the quarter's limit")
    status, _, _, message = _state(small, team, "refused")
    assert status == "Failed" and "over the quarter's limit" in message
    _assert_capacity_can_be_bought_again(small, offering)
    with pytest.raises(ApiError) as exc:
        small.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    assert exc.value.code == "ConflictException"


def test_approval_times_out_five_minutes_before_the_start(small: Server) -> None:
    team = small.new_account("slow-ok", PaymentMode="approval")
    offering = _buy(small, team, "soon", InstanceCount=8, DurationHours=24, TargetResources=["training-job"])
    start = offering["ReservedCapacityOfferings"][0]["StartTime"]
    assert start - service_now(small) < timedelta(hours=12)  # the soonest offering starts within the day
    small.set_clock(start - timedelta(minutes=6))
    assert _state(small, team, "soon")[0] == "Pending"
    small.advance_clock("1m")
    status, _, _, message = _state(small, team, "soon")
    assert status == "Failed" and "deadline" in message
    _assert_capacity_can_be_bought_again(small, offering, require_same=False)


def test_approval_times_out_twelve_hours_after_purchase(small: Server) -> None:
    team = small.new_account("later-ok", PaymentMode="approval")
    bought_at = service_now(small)
    _buy(
        small,
        team,
        "later",
        InstanceCount=8,
        DurationHours=24,
        TargetResources=["training-job"],
        StartTimeAfter=bought_at + timedelta(days=3),
    )
    small.advance_clock("11h59m")
    assert _state(small, team, "later")[0] == "Pending"
    small.advance_clock("2m")
    status, _, _, message = _state(small, team, "later")
    assert status == "Failed" and "12 hours" in message


def test_an_administrator_cancels_an_active_plan_with_a_reason(small: Server) -> None:
    team = small.new_account("cancelled-team")
    offering = _buy(
        small, team, "doomed", InstanceCount=8, DurationHours=72, TargetResources=["training-job"]
    )
    small.cli(
        "clock",
        "set",
        (offering["ReservedCapacityOfferings"][0]["StartTime"] + timedelta(hours=1)).isoformat(),
    )
    assert _state(small, team, "doomed")[0] == "Active"
    small.cli("plans", "cancel", "doomed", "--account", "cancelled-team", "--reason", "hardware maintenance")
    status, _, counters, message = _state(small, team, "doomed")
    assert status == "Failed" and "hardware maintenance" in message
    assert counters["AvailableInstanceCount"] == 0
    refused = small.cli(
        "plans", "cancel", "doomed", "--account", "cancelled-team", "--reason", "again", check=False
    )
    assert refused.returncode == 1 and "ConflictException" in refused.stderr
    # what was left of it can be bought again at once
    again = small.sagemaker().search_training_plan_offerings(
        InstanceType=P5, InstanceCount=8, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"]
    assert again and again[0]["ReservedCapacityOfferings"][0]["AvailabilityZone"] == "us-west-2a"
    assert (
        again[0]["ReservedCapacityOfferings"][0]["EndTime"]
        <= offering["ReservedCapacityOfferings"][0]["EndTime"]
    )


def test_a_cancelled_plans_invoice_is_failed_and_can_no_longer_be_approved_or_rejected(
    small: Server,
) -> None:
    team = small.new_account("cancel-unpaid", PaymentMode="approval")
    _buy(small, team, "unpaid", InstanceCount=1, DurationHours=24)
    invoice = small.native().get("/api/v1/invoices", account="cancel-unpaid")["Invoices"][0]
    assert invoice["Status"] == "Pending"
    small.cli("plans", "cancel", "unpaid", "--account", "cancel-unpaid", "--reason", "the team was dissolved")
    (settled,) = small.native().get("/api/v1/invoices", account="cancel-unpaid")["Invoices"]
    assert settled["Status"] == "Failed"
    for decision, body in (("approve", None), ("reject", {"Reason": "too late"})):
        with pytest.raises(ApiError) as exc:
            small.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/{decision}", body)
        assert exc.value.code == "ConflictException", decision
    assert _state(small, team, "unpaid")[0] == "Failed"


def test_non_administrators_cannot_cancel_or_approve(small: Server) -> None:
    team = small.new_account("sneaky", PaymentMode="approval")
    _buy(small, team, "mine", InstanceCount=1, DurationHours=24)
    invoice = small.native(team).get("/api/v1/invoices")["Invoices"][0]
    with pytest.raises(ApiError) as exc:
        small.native(team).post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    assert exc.value.code == "AccessDeniedException"
    with pytest.raises(ApiError):
        small.native(team).post("/api/v1/accounts/sneaky/plans/mine/cancel", {"Reason": "x"})


def _assert_capacity_can_be_bought_again(
    server: Server, offering: dict[str, Any], require_same: bool = True
) -> None:
    """A failed plan's capacity is free at once: the same segments are offered, and sold, again."""
    other = server.new_account(f"rebuyer-{len(server.native().get('/api/v1/accounts')['Accounts'])}")
    client = server.sagemaker(other)
    segment = offering["ReservedCapacityOfferings"][0]
    found = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=segment["InstanceCount"],
        DurationHours=offering["DurationHours"],
        TargetResources=offering["TargetResources"],
    )["TrainingPlanOfferings"]
    same = [o for o in found if o["ReservedCapacityOfferings"] == offering["ReservedCapacityOfferings"]]
    if require_same:
        assert same, "the released capacity is not offered again"
    pick = (same or found)[0]
    client.create_training_plan(
        TrainingPlanName="rebought", TrainingPlanOfferingId=pick["TrainingPlanOfferingId"]
    )
    assert client.describe_training_plan(TrainingPlanName="rebought")["Status"] in ("Scheduled", "Active")
