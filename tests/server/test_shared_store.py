"""Two processes' worth of servers on one store (in this process: one leads, one only serves): what one
keeps in memory follows what the other writes at once (the capacity calendar, access keys, the manual
clock), and a clock move asked of the one that does not lead is carried out by the leader."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from tests.harness import service_now
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


def test_a_serving_process_follows_the_leaders_writes_and_has_it_move_the_clock(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    leader = fast_server_factory(data_dir=tmp_path / "one", fleet=SMALL_FLEET).start()
    other = fast_server_factory(
        data_dir=leader.data_dir, fleet=SMALL_FLEET, role="api", world=leader.world
    ).start()
    assert leader.runtime is not None and other.runtime is not None
    assert leader.runtime.leadership is not None and leader.runtime.leadership.is_leader
    assert other.runtime.leadership is not None and not other.runtime.leadership.is_leader

    team = leader.new_account("team")
    at_other = other.sagemaker(team)  # a key made through one works through the other at once
    wanted = {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4, "DurationHours": 48}
    before = at_other.search_training_plan_offerings(**wanted, TargetResources=["training-job"])
    offering = before["TrainingPlanOfferings"][0]
    bought = leader.sagemaker(team).create_training_plan(
        TrainingPlanName="first", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    # The other's calendar reloads from the counter: the capacity just sold is not offered again there.
    after = at_other.search_training_plan_offerings(**wanted, TargetResources=["training-job"])
    assert after["TrainingPlanOfferings"] != before["TrainingPlanOfferings"]
    reloads = other.runtime.context.calendar.reloads
    at_other.search_training_plan_offerings(**wanted, TargetResources=["training-job"])
    assert other.runtime.context.calendar.reloads == reloads  # nothing changed since: no reload

    # The clock moved through the process that does not lead: the leader runs the events, both agree.
    start = service_now(other)
    into = offering["ReservedCapacityOfferings"][0]["StartTime"] + timedelta(hours=1)
    moved = other.native().post("/api/v1/clock/set", {"Time": into.isoformat()})
    assert moved["EventsRun"] > 0
    assert service_now(other) == service_now(leader) > start
    plan = at_other.describe_training_plan(TrainingPlanName=bought["TrainingPlanArn"])
    assert plan["Status"] == "Active"
    with pytest.raises(ApiError) as refused_move:  # refused by the leader, answered by the other
        other.native().post("/api/v1/clock/advance", {"Duration": "400d"})
    assert refused_move.value.code == "ValidationException"

    # A key revoked through the leader signs nothing at the other, whose cache had it.
    spare = leader.native(team).post("/api/v1/keys")
    spare_credentials = type(team)(spare["AccessKeyId"], spare["SecretAccessKey"])
    other.sagemaker(spare_credentials).list_training_plans()
    leader.native(team).delete(f"/api/v1/keys/{spare['AccessKeyId']}")
    with pytest.raises(ClientError) as refused:
        other.sagemaker(spare_credentials).list_training_plans()
    assert refused.value.response["Error"]["Code"] == "UnrecognizedClientException"


def test_a_plan_another_server_sold_is_cancelled_here_and_its_capacity_offered_again(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    """This server's calendar has not read the other's sale when it cancels that plan: the release
    cannot be applied to a copy that does not hold it, so the copy is reloaded (before, the cancel
    committed and then answered 500)."""
    leader = fast_server_factory(data_dir=tmp_path / "one", fleet=SMALL_FLEET).start()
    other = fast_server_factory(
        data_dir=leader.data_dir, fleet=SMALL_FLEET, role="api", world=leader.world
    ).start()
    team = leader.new_account("team")
    wanted = {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 4, "DurationHours": 48}
    here = leader.sagemaker(team)
    before = here.search_training_plan_offerings(**wanted, TargetResources=["training-job"])
    offering = before["TrainingPlanOfferings"][0]
    other.sagemaker(team).create_training_plan(
        TrainingPlanName="sold-there", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    cancelled = leader.native().post("/api/v1/accounts/team/plans/sold-there/cancel", {"Reason": "test"})
    assert cancelled["Status"] == "Failed"  # SageMaker has no Cancelled: a cancelled plan reads Failed
    again = here.search_training_plan_offerings(**wanted, TargetResources=["training-job"])
    starts = [o["ReservedCapacityOfferings"][0]["StartTime"] for o in again["TrainingPlanOfferings"]]
    assert offering["ReservedCapacityOfferings"][0]["StartTime"] in starts
