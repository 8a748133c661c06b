"""Extensions (priced, bought, listed; every precondition refused by name) and per-account quotas."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests.harness import Server, service_now
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    """In process (tests/inprocess.py): these are rules, and they speak the same HTTP there."""
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


def _buy(
    server: Server, credentials: Credentials, name: str, count: int = 4, days: int = 2, **window: Any
) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=["hyperpod-cluster"],
        **window,
    )["TrainingPlanOfferings"][0]
    return str(
        client.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )["TrainingPlanArn"]
    )


def _refusal(call: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as exc:
        call(**kwargs)
    error = exc.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


def test_extension_search_purchase_and_history(small: Server) -> None:
    team = small.new_account("extender")
    client = small.sagemaker(team)
    arn = _buy(small, team, "grow")
    plan = client.describe_training_plan(TrainingPlanName="grow")
    found = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=48)
    assert found["TrainingPlanOfferings"] == []
    [offer] = found["TrainingPlanExtensionOfferings"]
    assert offer["TrainingPlanExtensionOfferingId"].startswith("tpeo-")
    assert offer["StartDate"] == plan["EndTime"]
    assert offer["EndDate"] == plan["EndTime"] + timedelta(days=2)
    assert offer["AvailabilityZone"] == plan["ReservedCapacitySummaries"][0]["AvailabilityZone"]
    assert offer["DurationHours"] == 48
    price = Decimal("50.00") if offer["AvailabilityZone"] == "us-west-2a" else Decimal("40.00")
    assert Decimal(offer["UpfrontFee"]) == 4 * 48 * price and offer["CurrencyCode"] == "USD"

    extended = client.extend_training_plan(
        TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"]
    )
    [extension] = extended["TrainingPlanExtensions"]
    assert (extension["Status"], extension["PaymentStatus"]) == ("Scheduled", "Paid")
    assert extension["EndDate"] == offer["EndDate"]
    after = client.describe_training_plan(TrainingPlanName="grow")
    assert after["EndTime"] == offer["EndDate"]
    assert (
        after["ReservedCapacitySummaries"][-1]["ReservedCapacityArn"]
        == plan["ReservedCapacitySummaries"][-1]["ReservedCapacityArn"]
    )
    assert after["ReservedCapacitySummaries"][-1]["EndTime"] == offer["EndDate"]

    again = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=24)[
        "TrainingPlanExtensionOfferings"
    ][0]
    client.extend_training_plan(TrainingPlanExtensionOfferingId=again["TrainingPlanExtensionOfferingId"])
    pages = list(
        client.get_paginator("describe_training_plan_extension_history").paginate(
            TrainingPlanArn=arn, PaginationConfig={"PageSize": 1}
        )
    )
    assert [len(p["TrainingPlanExtensions"]) for p in pages] == [1, 1]
    assert [p["TrainingPlanExtensions"][0]["DurationHours"] for p in pages] == [48, 24]
    # the bought offering cannot be bought twice
    code, _ = _refusal(
        client.extend_training_plan, TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"]
    )
    assert code == "ResourceNotFound"
    events = json.loads(small.cli("plans", "events", "grow", "--json", credentials=team).stdout)["Events"]
    assert [e["Kind"] for e in events].count("extended") == 2


def test_a_plan_extended_while_active_stays_active_past_its_old_end(small: Server) -> None:
    team = small.new_account("runner")
    client = small.sagemaker(team)
    arn = _buy(small, team, "running")
    old_end = client.describe_training_plan(TrainingPlanName="running")["EndTime"]
    small.set_clock(old_end - timedelta(hours=5))
    assert client.describe_training_plan(TrainingPlanName="running")["Status"] == "Active"
    offer = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=24)[
        "TrainingPlanExtensionOfferings"
    ][0]
    client.extend_training_plan(TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"])
    small.set_clock(old_end + timedelta(hours=2))
    plan = client.describe_training_plan(TrainingPlanName="running")
    assert plan["Status"] == "Active" and plan["ReservedCapacitySummaries"][-1]["Status"] == "Active"
    events = json.loads(small.cli("plans", "events", "running", "--json", credentials=team).stdout)["Events"]
    assert not [e for e in events if e["Kind"] in ("reclaim-begins", "segment-ended")]
    small.set_clock(old_end + timedelta(days=1, minutes=1))
    events = json.loads(small.cli("plans", "events", "running", "--json", credentials=team).stdout)["Events"]
    reclaims = [datetime.fromisoformat(e["At"]) for e in events if e["Kind"] == "reclaim-begins"]
    assert reclaims == [old_end + timedelta(days=1) - timedelta(minutes=30)]
    assert client.describe_training_plan(TrainingPlanName="running")["Status"] == "Expired"


def test_each_extension_precondition_is_refused_with_its_rule(small: Server) -> None:
    team = small.new_account("rules", PaymentMode="approval")
    client = small.sagemaker(team)
    arn = _buy(small, team, "unpaid")
    code, message = _refusal(client.search_training_plan_offerings, TrainingPlanArn=arn, DurationHours=24)
    assert (
        code == "ValidationException"
        and "only an Active or Scheduled plan" in message
        and "Pending" in message
    )

    invoice = small.native().get("/api/v1/invoices", account="rules", status="Pending")["Invoices"][0]
    small.native().post(f"/api/v1/invoices/{invoice['InvoiceId']}/approve")
    code, message = _refusal(
        client.search_training_plan_offerings, TrainingPlanArn=arn, DurationHours=15 * 24
    )
    assert code == "ValidationException" and "7-day steps" in message
    offer = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=21 * 24)[
        "TrainingPlanExtensionOfferings"
    ]
    assert offer and offer[0]["DurationHours"] == 21 * 24
    small_offer = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=24)[
        "TrainingPlanExtensionOfferings"
    ][0]
    client.extend_training_plan(
        TrainingPlanExtensionOfferingId=small_offer["TrainingPlanExtensionOfferingId"]
    )
    code, message = _refusal(client.search_training_plan_offerings, TrainingPlanArn=arn, DurationHours=24)
    assert code == "ValidationException" and "awaiting payment" in message

    far = _buy(
        small,
        team,
        "far-away",
        StartTimeAfter=service_now(small) + timedelta(days=55),
        EndTimeBefore=service_now(small) + timedelta(days=60),
    )
    for pending in small.native().get("/api/v1/invoices", account="rules", status="Pending")["Invoices"]:
        if pending["TrainingPlanName"] == "far-away":
            small.native().post(f"/api/v1/invoices/{pending['InvoiceId']}/approve")
    code, message = _refusal(client.search_training_plan_offerings, TrainingPlanArn=far, DurationHours=24)
    assert code == "ValidationException" and "57 days" in message

    team2 = small.new_account("late")
    late_client = small.sagemaker(team2)
    late = _buy(small, team2, "nearly-over", count=1)
    end = late_client.describe_training_plan(TrainingPlanName="nearly-over")["EndTime"]
    small.set_clock(end - timedelta(minutes=30))
    code, message = _refusal(
        late_client.search_training_plan_offerings, TrainingPlanArn=late, DurationHours=24
    )
    assert code == "ValidationException" and "at least 1 hour" in message
    small.set_clock(end + timedelta(minutes=1))
    code, message = _refusal(
        late_client.search_training_plan_offerings, TrainingPlanArn=late, DurationHours=24
    )
    assert code == "ValidationException" and "Expired" in message
    code, _ = _refusal(
        small.sagemaker(team).search_training_plan_offerings, TrainingPlanArn=late, DurationHours=24
    )
    assert code == "ResourceNotFound"  # another account's plan


def test_an_unpaid_extension_fails_alone(small: Server) -> None:
    team = small.new_account("tight", PaymentMode="budget")
    small.cli("accounts", "update", "tight", "--budget", "5000.00")  # the plan, not its 14-day extension
    client = small.sagemaker(team)
    arn = _buy(small, team, "kept", count=1)
    offer = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=14 * 24)[
        "TrainingPlanExtensionOfferings"
    ][0]
    [extension] = client.extend_training_plan(
        TrainingPlanExtensionOfferingId=offer["TrainingPlanExtensionOfferingId"]
    )["TrainingPlanExtensions"]
    assert (extension["Status"], extension["PaymentStatus"]) == ("Failed", "Failed")
    plan = client.describe_training_plan(TrainingPlanName="kept")
    assert plan["Status"] == "Scheduled" and plan["EndTime"] == offer["StartDate"]
    # its capacity went back at once: the same extension is offered again
    assert client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=14 * 24)[
        "TrainingPlanExtensionOfferings"
    ]


def test_quotas_refuse_with_their_name_and_value_until_raised(small: Server) -> None:
    team = small.new_account("quota-team")
    client = small.sagemaker(team)
    small.cli("accounts", "update", "quota-team", "--max-plans", "1", "--max-instances", "4")
    request = {
        "InstanceType": P5,
        "InstanceCount": 8,
        "DurationHours": 24,
        "TargetResources": ["training-job"],
    }
    code, message = _refusal(client.search_training_plan_offerings, **request)
    assert code == "ResourceLimitExceeded" and "reserved-capacity-ml.p5.48xlarge is 4" in message
    _buy(small, team, "first", count=4)
    code, message = _refusal(client.search_training_plan_offerings, **{**request, "InstanceCount": 4})
    assert code == "ResourceLimitExceeded" and "training-plan-total_count is 1" in message

    small.cli("accounts", "update", "quota-team", "--max-plans", "5")
    offering = client.search_training_plan_offerings(**{**request, "InstanceCount": 4})[
        "TrainingPlanOfferings"
    ]
    overlapping = [
        o
        for o in offering
        if o["ReservedCapacityOfferings"][0]["StartTime"] < service_now(small) + timedelta(days=2)
    ]
    assert overlapping
    code, message = _refusal(
        client.create_training_plan,
        TrainingPlanName="second",
        TrainingPlanOfferingId=overlapping[0]["TrainingPlanOfferingId"],
    )
    assert code == "ResourceLimitExceeded" and "holds 4" in message

    small.cli("accounts", "update", "quota-team", "--max-instances", "8")
    client.create_training_plan(
        TrainingPlanName="second", TrainingPlanOfferingId=overlapping[0]["TrainingPlanOfferingId"]
    )
    accounts = {a["Name"]: a for a in small.native().get("/api/v1/accounts")["Accounts"]}
    assert accounts["quota-team"]["Quotas"] == {
        "MaxActivePlans": 5,
        "MaxReservedInstancesPerType": 8,
        "MaxReservedSharePerType": None,  # small.toml sets no share, and the account has its own number
        "MaxReservedInstanceHoursPer30Days": None,
        "MaxOnDemandInstancesPerType": None,  # small.toml sets no on-demand quota
        "MaxOnDemandSharePerType": None,
    }
    assert accounts["admin"]["Quotas"]["MaxActivePlans"] == 1000  # the fleet's default


def test_extension_cli(small: Server) -> None:
    _buy(small, small.new_account("cli-ext"), "x")  # someone else's plan does not matter
    arn = _buy(small, Credentials("AKHPTESTADMIN0000001", "test-admin-secret-key-000000000000000000"), "mine")
    del arn
    found = json.loads(small.cli("plans", "extend-search", "mine", "--days", "3", "--json").stdout)
    small.cli("plans", "extend", "mine", "--offering-id", found[0]["TrainingPlanExtensionOfferingId"])
    listed = json.loads(small.cli("plans", "extensions", "mine", "--json").stdout)
    assert [e["PaymentStatus"] for e in listed] == ["Paid"]
    assert datetime.fromisoformat(listed[0]["EndDate"]) > service_now(small)
