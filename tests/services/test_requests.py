"""The decoders of the requests services keep (services/jobs/job_request.py,
services/clusters/cluster_request.py): what they read, that the stored JSON reads back the same (and stays the
form older stores hold), and that a request the rules refuse gets the ValidationException message it always
got."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from hyperplan.errors import ValidationError
from hyperplan.services.clusters.cluster_request import (
    ClusterSettings,
    ClusterSpec,
    ClusterUpdate,
    InstanceGroupSpec,
)
from hyperplan.services.jobs.job_request import DEFAULT_MAX_RUNTIME, TrainingJobSpec
from hyperplan.training.contract import DEFAULT_CHECKPOINT_PATH

JOB: dict[str, Any] = {
    "TrainingJobName": "job",
    "RoleArn": "arn:aws:iam::123456789012:role/training",
    "AlgorithmSpecification": {
        "TrainingInputMode": "FastFile",
        "ContainerEntrypoint": ["python", "train.py"],
        "ContainerArguments": ["--epochs", "3"],
        "TrainingImage": "example/pytorch:2",
    },
    "InputDataConfig": [
        {"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://bucket/train/"}}},
        {
            "ChannelName": "test",
            "InputMode": "File",
            "ContentType": "text/csv",
            "DataSource": {
                "S3DataSource": {
                    "S3Uri": "s3://bucket/test/",
                    "S3DataType": "S3Prefix",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
        },
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
    "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints"},
    "ResourceConfig": {
        "InstanceType": "ml.m5.12xlarge",
        "InstanceCount": 2,
        "TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p",
    },
    "StoppingCondition": {"MaxPendingTimeInSeconds": 7200},
    "HyperParameters": {"lr": "0.1"},
    "Environment": {"MODE": "fast"},
}


NO_PLAN = {k: v for k, v in JOB["ResourceConfig"].items() if k != "TrainingPlanArn"}


def _with(**members: Any) -> dict[str, Any]:
    return {**JOB, **members}


def test_a_spot_request_is_decoded_with_its_wait() -> None:
    spec = TrainingJobSpec.from_wire(
        _with(
            EnableManagedSpotTraining=True,
            ResourceConfig=NO_PLAN,
            StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
        )
    )
    assert (spec.spot, spec.plan_arn, spec.stopping.max_wait_seconds) == (True, None, 7200)


def test_a_job_request_is_decoded_into_what_the_services_read() -> None:
    spec = TrainingJobSpec.from_wire(JOB)
    assert (spec.name, spec.instance_type, spec.instance_count) == ("job", "ml.m5.12xlarge", 2)
    assert spec.plan_arn == JOB["ResourceConfig"]["TrainingPlanArn"]
    assert spec.algorithm.entrypoint == ("python", "train.py")
    assert spec.algorithm.arguments == ("--epochs", "3")
    assert spec.algorithm.image == "example/pytorch:2"
    train, test = spec.channels
    assert (train.name, train.uri, train.input_mode) == ("train", "s3://bucket/train/", "FastFile")
    assert (test.input_mode, test.content_type, test.distribution) == ("File", "text/csv", "ShardedByS3Key")
    assert spec.output_path == "s3://bucket/output"
    assert spec.checkpoint_uri == "s3://bucket/checkpoints"
    assert spec.checkpoints is not None and spec.checkpoints.local_path == DEFAULT_CHECKPOINT_PATH
    assert spec.stopping.max_pending_seconds == 7200
    assert spec.stopping.max_runtime == DEFAULT_MAX_RUNTIME
    assert spec.stopping_condition_echo() == {"MaxPendingTimeInSeconds": 7200, "MaxRuntimeInSeconds": 86400}
    assert dict(spec.hyperparameters) == {"lr": "0.1"} and dict(spec.environment) == {"MODE": "fast"}
    instance = spec.instance("algo-2", datetime(2030, 1, 1, tzinfo=UTC), "/usr/bin/python3")
    assert instance.hosts == ("algo-1", "algo-2") and instance.current_host == "algo-2"
    assert instance.segment_end_epoch == int(datetime(2030, 1, 1, tzinfo=UTC).timestamp())
    assert instance.interpreter == "/usr/bin/python3"


def test_a_job_request_round_trips_through_its_stored_json() -> None:
    spec = TrainingJobSpec.from_wire(JOB)
    assert TrainingJobSpec.from_json(spec.to_json()) == spec
    assert json.loads(spec.to_json()) == JOB  # the request as it was given, as the store always kept it


def test_a_job_stored_before_the_decoder_existed_reads_the_same() -> None:
    stored = json.dumps(
        {
            "TrainingJobName": "old",
            "AlgorithmSpecification": {"TrainingInputMode": "File", "ContainerEntrypoint": ["true"]},
            "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
            "ResourceConfig": {"InstanceType": "ml.m5.large", "InstanceCount": 1},
        }
    )
    spec = TrainingJobSpec.from_json(stored)
    assert (spec.name, spec.plan_arn, spec.checkpoints, spec.channels) == ("old", None, None, ())
    assert spec.stopping.max_runtime == DEFAULT_MAX_RUNTIME
    assert spec.volume_size_gb == 30  # the SDK's default, where the request gave none
    assert spec.to_json() == stored


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        ({k: v for k, v in JOB.items() if k != "ResourceConfig"}, "ResourceConfig is required: give "),
        (_with(EnableManagedSpotTraining=True), "ResourceConfig.TrainingPlanArn: a managed spot training"),
        (
            _with(EnableManagedSpotTraining=True, ResourceConfig=NO_PLAN),
            "StoppingCondition.MaxWaitTimeInSeconds is required",
        ),
        (
            _with(
                EnableManagedSpotTraining=True,
                ResourceConfig=NO_PLAN,
                StoppingCondition={"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 3600},
            ),
            "StoppingCondition.MaxWaitTimeInSeconds (3600) must be at least MaxRuntimeInSeconds (7200)",
        ),
        (_with(RetryStrategy={"MaximumRetryAttempts": 2}), "RetryStrategy: this deployment does not serve "),
        (
            _with(ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 0}),
            "ResourceConfig.InstanceCount must be at least 1.",
        ),
        (
            _with(
                ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 16385}
            ),
            "ResourceConfig.VolumeSizeInGB: at most 16384",
        ),
        (
            _with(
                ResourceConfig={
                    "InstanceType": "ml.m5.large",
                    "InstanceCount": 1,
                    "KeepAlivePeriodInSeconds": 60,
                }
            ),
            "ResourceConfig.KeepAlivePeriodInSeconds: this deployment has no warm pools.",
        ),
        (
            _with(AlgorithmSpecification={"TrainingInputMode": "Pipe", "ContainerEntrypoint": ["true"]}),
            "AlgorithmSpecification.TrainingInputMode: Pipe mode is not served",
        ),
        (
            _with(AlgorithmSpecification={"TrainingInputMode": "File", "AlgorithmName": "xgboost"}),
            "AlgorithmSpecification.AlgorithmName: this deployment runs commands",
        ),
        (
            _with(InputDataConfig=[JOB["InputDataConfig"][0]] * 2),
            "InputDataConfig: channel name(s) train appear",
        ),
        (_with(OutputDataConfig={"S3OutputPath": "https://bucket/out"}), "OutputDataConfig.S3OutputPath: "),
        (_with(CheckpointConfig={"S3Uri": "file:///data/checkpoints"}), "CheckpointConfig.S3Uri: "),
        (
            _with(StoppingCondition={"MaxWaitTimeInSeconds": 60}),
            "StoppingCondition.MaxWaitTimeInSeconds: it is for managed spot training",
        ),
        (
            _with(AlgorithmSpecification={"TrainingInputMode": "File"}),
            "AlgorithmSpecification: ",  # nothing to run: the contract says why
        ),
    ],
)
def test_a_job_request_the_rules_refuse_gets_its_message(request_: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        TrainingJobSpec.from_wire(request_)
    assert str(refused.value).startswith(message), str(refused.value)


def test_where_instances_run_in_their_image_the_image_runs_itself_and_network_isolation_is_served() -> None:
    bare = _with(AlgorithmSpecification={"TrainingInputMode": "File", "TrainingImage": "example/train:1"})
    isolated = {**bare, "EnableNetworkIsolation": True}
    with pytest.raises(ValidationError, match="EnableNetworkIsolation: instances run as local processes"):
        TrainingJobSpec.from_wire(isolated)
    with pytest.raises(ValidationError, match="AlgorithmSpecification: "):
        TrainingJobSpec.from_wire(bare)  # no command, and no image run here
    spec = TrainingJobSpec.from_wire(isolated, runs_images=True)
    assert spec.network_isolation and spec.algorithm.entrypoint == ()
    with pytest.raises(ValidationError, match="TrainingImage is required: instances run in their image"):
        TrainingJobSpec.from_wire(
            _with(AlgorithmSpecification={"TrainingInputMode": "File", "ContainerEntrypoint": ["true"]}),
            runs_images=True,
        )


def test_on_slurm_network_isolation_is_served_for_one_instance_and_refused_for_several() -> None:
    """A job's instances on several Slurm nodes talk over the nodes' network: only a one-instance job can be
    cut off from it (docs/SLURM.md, "Containers on Slurm")."""
    isolated = _with(EnableNetworkIsolation=True)  # InstanceCount 2
    with pytest.raises(ValidationError) as refused:
        TrainingJobSpec.from_wire(isolated, runs_images=True, across_nodes=True)
    assert str(refused.value).startswith(
        "EnableNetworkIsolation: the 2 instances of a job run on 2 Slurm nodes here and talk over the nodes' "
        "network, so only a one-instance job can be cut off from the network (InstanceCount 1)"
    )
    alone = {**isolated, "ResourceConfig": {**JOB["ResourceConfig"], "InstanceCount": 1}}
    assert TrainingJobSpec.from_wire(alone, runs_images=True, across_nodes=True).network_isolation
    assert TrainingJobSpec.from_wire(isolated, runs_images=True).network_isolation  # one machine: served


GROUP: dict[str, Any] = {
    "InstanceGroupName": "workers",
    "InstanceType": "ml.m5.large",
    "InstanceCount": 2,
    "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lifecycle/", "OnCreate": "on_create.sh"},
    "ExecutionRole": "arn:aws:iam::123456789012:role/cluster",
    "TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p",
    "OverrideVpcConfig": {"Subnets": ["subnet-a"], "SecurityGroupIds": ["sg-1"]},
}


def test_an_instance_group_is_decoded_into_what_the_services_read() -> None:
    group = InstanceGroupSpec.from_wire(GROUP)
    assert (group.name, group.instance_type, group.instance_count) == ("workers", "ml.m5.large", 2)
    assert group.plan_arn == GROUP["TrainingPlanArn"]
    assert (group.lifecycle.source_uri, group.lifecycle.on_create) == (
        "s3://bucket/lifecycle/",
        "on_create.sh",
    )
    assert group.override_subnets == ("subnet-a",)
    assert not group.capacity_requirements
    bare = InstanceGroupSpec.from_wire(
        {"InstanceGroupName": "g", "InstanceCount": 1, "OverrideVpcConfig": {}}
    )
    # No instance type: the service refuses it, naming the group; an empty override is no override.
    assert (bare.instance_type, bare.override_subnets, bare.plan_arn) == (None, None, None)
    assert bare.lifecycle.source_uri is None and bare.lifecycle.on_create is None
    assert bare.volume_gb is None  # the fleet's [backend] node_disk_gb, then
    volumes = [
        {"EbsVolumeConfig": {"RootVolume": True, "VolumeKmsKeyId": "key"}},  # the root volume: no size
        {"EbsVolumeConfig": {"VolumeSizeInGB": 500}},
    ]
    sized = InstanceGroupSpec.from_wire({**GROUP, "InstanceStorageConfigs": volumes})
    assert sized.volume_gb == 500  # the secondary volume, /opt/sagemaker


def test_an_instance_group_round_trips_through_its_stored_json() -> None:
    group = InstanceGroupSpec.from_wire(GROUP)
    assert InstanceGroupSpec.from_json(group.to_json()) == group
    assert json.loads(group.to_json()) == GROUP


def test_cluster_requests_keep_their_settings_and_groups() -> None:
    request = {
        "ClusterName": "c",
        "InstanceGroups": [GROUP],
        "VpcConfig": {"Subnets": ["subnet-b"], "SecurityGroupIds": ["sg-2"]},
        "Orchestrator": {"Eks": {"ClusterArn": "arn:aws:eks:us-east-1:123456789012:cluster/e"}},
        "Tags": [{"Key": "team", "Value": "ml"}],
    }
    spec = ClusterSpec.from_wire(request)
    assert spec.name == "c" and spec.groups == (InstanceGroupSpec.from_wire(GROUP),)
    assert set(spec.settings.as_given) == {"VpcConfig", "Orchestrator"}  # what the store keeps as given
    assert spec.settings.subnets == ("subnet-b",)
    assert ClusterSettings.from_json(spec.settings.to_json()) == spec.settings
    assert ClusterSettings.from_json("{}").subnets == ()
    assert ClusterSpec.from_wire({"ClusterName": "empty"}).groups == ()  # refused by the service, by name
    update = ClusterUpdate.from_wire({"ClusterName": "c", "InstanceGroupsToDelete": ["old"]})
    assert (update.name, update.groups, update.groups_to_delete) == ("c", (), ("old",))
