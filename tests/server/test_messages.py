"""What a user is told, through boto3, when a search window or an instance type will not do: a window in
the past says so, and an instance type this fleet lacks, or has on demand only, is named with the types
this fleet has (never AWS's whole list); and a fleet's own type, outside AWS's lists, is served. The
rules run on one in-process server on the demo fleet for the module; each test makes its own account."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.harness import Server, service_now
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"
PLAN_TYPES = "ml.p4d.24xlarge, ml.p5.48xlarge, ml.p5e.48xlarge, ml.p5en.48xlarge or ml.trn2.48xlarge"
ROLE = "arn:aws:iam::123456789012:role/messages"
SUBNET_2A = "subnet-0a1b2c3d4e5f60001"  # hyperplan/fleet/demo.toml: us-west-2a's first subnet


def refusal(call: Any, **request: Any) -> str:
    with pytest.raises(ClientError) as exc:
        call(**request)
    error = exc.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return str(error["Message"])


def show(moment: datetime) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%S}Z"


def test_a_search_for_a_type_no_plan_can_reserve_lists_those_plans_can(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(fast_shared_server.new_account("searcher"))
    search = client.search_training_plan_offerings
    asked = {"InstanceCount": 1, "DurationHours": 24, "TargetResources": ["training-job"]}

    # The demo's controllers' type: in its fleet on demand only (and not in AWS's list for plans).
    assert refusal(search, InstanceType="ml.m5.12xlarge", **asked) == (
        "InstanceType: ml.m5.12xlarge is on-demand only here (for clusters' on-demand instance groups and "
        f"training jobs without a plan), so no plan can reserve it. Training plans here reserve {PLAN_TYPES}."
    )
    # In AWS's list, not in this fleet; and in neither.
    for absent in ("ml.p6-b200.48xlarge", "ml.g5.48xlarge"):
        assert refusal(search, InstanceType=absent, **asked) == (
            f"InstanceType: this fleet has no {absent}. Training plans here reserve {PLAN_TYPES}."
        )
    # What is not spelt as an instance type at all is refused by the model's list, as AWS refuses it.
    assert "must satisfy enum value set" in refusal(search, InstanceType="p5.48xlarge", **asked)


def test_a_search_window_in_the_past_says_so(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(fast_shared_server.new_account("late"))
    search = client.search_training_plan_offerings
    now = service_now(fast_shared_server)
    asked = {"InstanceType": P5, "InstanceCount": 1, "DurationHours": 24, "TargetResources": ["training-job"]}
    start, end, soonest = now - timedelta(days=10), now - timedelta(days=5), now + timedelta(minutes=30)
    assert refusal(search, StartTimeAfter=start, EndTimeBefore=end, **asked) == (
        f"EndTimeBefore: {show(end)} is in the past: the service's time is {show(now)} (and StartTimeAfter, "
        f"{show(start)}, too). A window must end at least 24 hours after the earliest start, {show(soonest)} "
        "(plans start at the soonest 30 minutes after the service's time): at "
        f"{show(soonest + timedelta(days=1))} or later. Or leave EndTimeBefore out to search all the time "
        "plans may be booked in."
    )
    # In the future but too short: the message it always had.
    later, short = now + timedelta(days=2), now + timedelta(days=2, hours=20)
    assert refusal(search, StartTimeAfter=later, EndTimeBefore=short, **asked) == (
        f"EndTimeBefore: {show(short)} must be at least 24 hours after the earliest start, {show(later)}."
    )


def test_a_job_or_a_group_asking_for_a_type_this_fleet_lacks_hears_what_it_has(
    fast_shared_server: Server,
) -> None:
    team = fast_shared_server.new_account("builders")
    fast_shared_server.native(team).post("/api/v1/buckets", {"Name": "builders-data"})
    client = fast_shared_server.sagemaker(team)
    algorithm = {"TrainingInputMode": "File", "TrainingImage": "python:3.11", "ContainerEntrypoint": ["true"]}
    job = {
        "TrainingJobName": "wrong-type",
        "RoleArn": ROLE,
        "AlgorithmSpecification": algorithm,
        "OutputDataConfig": {"S3OutputPath": "s3://builders-data/output"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }
    plans = f"training plans here reserve {PLAN_TYPES}."
    # ml.mi300x.48xlarge is in none of AWS's lists (a fleet may have it); ml.g5.xlarge is in them.
    for absent in ("ml.mi300x.48xlarge", "ml.g5.xlarge"):
        resources = {"InstanceType": absent, "InstanceCount": 1, "VolumeSizeInGB": 10}
        assert refusal(client.create_training_job, ResourceConfig=resources, **job) == (
            f"ResourceConfig.InstanceType: this fleet has no {absent}. A training job without a "
            "TrainingPlanArn runs on on-demand instances of ml.m5.12xlarge, ml.p4d.24xlarge, ml.p5.48xlarge "
            f"or ml.t3.xlarge; {plans}"
        )

    group = {
        "InstanceGroupName": "workers",
        "InstanceCount": 1,
        "ExecutionRole": ROLE,
        "LifeCycleConfig": {"SourceS3Uri": "s3://builders-data/lifecycle", "OnCreate": "on_create.sh"},
    }
    vpc = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": [SUBNET_2A]}
    cluster = {"ClusterName": "wrong-type", "VpcConfig": vpc}
    create = client.create_cluster
    assert refusal(create, InstanceGroups=[{**group, "InstanceType": "ml.mi300x.48xlarge"}], **cluster) == (
        "InstanceGroups[0].InstanceType: this fleet has no ml.mi300x.48xlarge. In us-west-2a, the zone of "
        "the group's subnets, an instance group without a TrainingPlanArn runs on on-demand instances of "
        f"ml.m5.12xlarge, ml.p4d.24xlarge or ml.t3.xlarge; {plans}"
    )
    # The demo has its p5en in us-west-2c alone, all of it for plans.
    assert refusal(create, InstanceGroups=[{**group, "InstanceType": "ml.p5en.48xlarge"}], **cluster) == (
        "InstanceGroups[0].InstanceType: this fleet has no ml.p5en.48xlarge in us-west-2a, the zone of the "
        "group's subnets; it has ml.p5en.48xlarge in us-west-2c for training plans only (a group on such a "
        "plan names its TrainingPlanArn and a subnet of the plan's zone). In us-west-2a an instance group "
        "without a TrainingPlanArn runs on on-demand instances of ml.m5.12xlarge, ml.p4d.24xlarge or "
        "ml.t3.xlarge."
    )
    assert client.list_clusters()["ClusterSummaries"] == []
    assert client.list_training_jobs()["TrainingJobSummaries"] == []


OWN_FLEET = """
region = "us-west-2"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-00000000000000a01"]

[[pools]]
instance_type = "ml.mi300x.48xlarge"
zone = "us-west-2a"
count = 8
reservable = 4
price_per_instance_hour = "40.00"

[instance_types."ml.mi300x.48xlarge"]
vcpus = 192
memory_gib = 2048
accelerators = 8
accelerator_kind = "AMD MI300X"
"""


def test_a_fleet_serves_a_type_aws_does_not_list(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    """Its plans, jobs and clusters are asked for, answered and described with it (every answer checked
    against botocore's model by the test's clients), as any type of AWS's lists."""
    fleet = tmp_path / "own.toml"
    fleet.write_text(OWN_FLEET)
    server = fast_server_factory(data_dir=tmp_path / "own", fleet=fleet).start()
    team = server.new_account("own-types")
    server.native(team).post("/api/v1/buckets", {"Name": "own-data"})
    client = server.sagemaker(team)
    own = "ml.mi300x.48xlarge"

    offering = client.search_training_plan_offerings(
        InstanceType=own, InstanceCount=2, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    assert offering["ReservedCapacityOfferings"][0]["InstanceType"] == own
    client.create_training_plan(
        TrainingPlanName="own", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    described = client.describe_training_plan(TrainingPlanName="own")
    assert [s["InstanceType"] for s in described["ReservedCapacitySummaries"]] == [own]

    client.create_training_job(
        TrainingJobName="on-demand",
        RoleArn=ROLE,
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": "python:3.11",
            "ContainerEntrypoint": ["true"],
        },
        OutputDataConfig={"S3OutputPath": "s3://own-data/output"},
        ResourceConfig={"InstanceType": own, "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    assert client.describe_training_job(TrainingJobName="on-demand")["ResourceConfig"]["InstanceType"] == own

    client.create_cluster(
        ClusterName="own",
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-00000000000000a01"]},
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": own,
                "InstanceCount": 1,
                "ExecutionRole": ROLE,
                "LifeCycleConfig": {"SourceS3Uri": "s3://own-data/lifecycle", "OnCreate": "on_create.sh"},
            }
        ],
    )
    assert [g["InstanceType"] for g in client.describe_cluster(ClusterName="own")["InstanceGroups"]] == [own]
