"""Quotas that fit the fleet: a share of a type per account, and instance-hours in any 30 days."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.core.fleet_file import parse_fleet
from tests.harness import service_now
from tests.inprocess import InProcessServer

FLEETS = Path(__file__).parent.parent / "fleets"
P5 = "ml.p5.48xlarge"  # small.toml: 8 + 4 reservable
QUOTAS = """
[quotas]
max_reserved_share_per_type = 0.5
max_reserved_instance_hours_per_30_days = 300
"""


@pytest.fixture
def fair(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text((FLEETS / "small.toml").read_text() + QUOTAS)
    return fast_server_factory(data_dir=tmp_path / "data", fleet=fleet).start()


def _search(client: Any, count: int, hours: int = 24, **extra: Any) -> list[dict[str, Any]]:
    return client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=hours, TargetResources=["training-job"], **extra
    )["TrainingPlanOfferings"]


def _refused(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as refused:
        call(*args, **kwargs)
    assert refused.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    return str(refused.value.response["Error"]["Message"])


def test_one_account_holds_at_most_half_a_type_and_administrators_too(fair: InProcessServer) -> None:
    for client in (fair.sagemaker(fair.new_account("greedy")), fair.sagemaker()):
        message = _refused(_search, client, 8)
        assert "reserved-capacity-ml.p5.48xlarge is 6" in message
        assert _search(client, 4)  # within half of the 12
        # Refused again once a search of the type passed (what it read is remembered, not the count).
        assert "reserved-capacity-ml.p5.48xlarge is 6" in _refused(_search, client, 8)


def test_an_administrator_raises_one_account_past_the_share(fair: InProcessServer) -> None:
    client = fair.sagemaker(fair.new_account("trusted"))
    _refused(_search, client, 8)
    fair.cli("accounts", "update", "trusted", "--max-instances", "8")
    assert _search(client, 8)
    quotas = {a["Name"]: a for a in fair.native().get("/api/v1/accounts")["Accounts"]}["trusted"]["Quotas"]
    assert quotas["MaxReservedInstancesPerType"] == 8 and quotas["MaxReservedSharePerType"] is None


def test_instance_hours_in_any_30_days_are_capped_and_a_month_later_is_free(fair: InProcessServer) -> None:
    client = fair.sagemaker(fair.new_account("hoarder"))
    first = _search(client, 4, hours=48)[0]  # 192 instance-hours
    client.create_training_plan(
        TrainingPlanName="first", TrainingPlanOfferingId=first["TrainingPlanOfferingId"]
    )
    soon = service_now(fair) + timedelta(days=5)  # after the first ends: the instance quota is not met
    second = _search(client, 4, hours=48, StartTimeAfter=soon)[0]  # 192 more within 30 days: 384 > 300
    message = _refused(
        client.create_training_plan,
        TrainingPlanName="second",
        TrainingPlanOfferingId=second["TrainingPlanOfferingId"],
    )
    assert "reserved-instance-hours-per-30-days is 300" in message and "384" in message and "192" in message
    later = service_now(fair) + timedelta(days=40)
    far = _search(client, 4, hours=48, StartTimeAfter=later)[0]
    client.create_training_plan(TrainingPlanName="far", TrainingPlanOfferingId=far["TrainingPlanOfferingId"])
    fair.cli("accounts", "update", "hoarder", "--max-instance-hours", "1000")
    client.create_training_plan(
        TrainingPlanName="second", TrainingPlanOfferingId=second["TrainingPlanOfferingId"]
    )


def test_the_demo_fleet_keeps_each_account_to_half_of_a_type() -> None:
    import importlib.resources

    demo = parse_fleet(importlib.resources.files("hyperplan.fleet").joinpath("demo.toml").read_text())
    assert demo.quotas.max_reserved_share_per_type == 0.5
    assert demo.quotas.max_reserved_instance_hours_per_30_days is not None
    assert demo.quotas.max_on_demand_share_per_type == 0.5
