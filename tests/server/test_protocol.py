"""The awsJson1.1 protocol: model-checked input, modeled errors, protocol errors, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.wire import model, registry
from tests.harness import Server, signed_post
from tests.wire.badinput import bad_inputs

ARN_PREFIX = "arn:aws:sagemaker:us-west-2:123456789012:"

# One valid request for every operation the server serves. A new operation must add one here.
VALID_REQUESTS: dict[str, dict[str, Any]] = {
    "SearchTrainingPlanOfferings": {
        "InstanceType": "ml.p5.48xlarge",
        "InstanceCount": 2,
        "DurationHours": 96,
        "TargetResources": ["hyperpod-cluster"],
        "StartTimeAfter": 1_900_000_000,
        "EndTimeBefore": 1_901_000_000,
    },
    "CreateTrainingPlan": {"TrainingPlanName": "valid-name", "TrainingPlanOfferingId": "tpo-abc123"},
    "DescribeTrainingPlan": {"TrainingPlanName": "valid-name"},
    "ListTrainingPlans": {
        "MaxResults": 10,
        "SortBy": "StartTime",
        "SortOrder": "Descending",
        "Filters": [{"Name": "Status", "Value": "Active"}],
        "StartTimeAfter": 1_800_000_000,
    },
    "DescribeReservedCapacity": {"ReservedCapacityArn": ARN_PREFIX + "reserved-capacity/valid-name-rc1"},
    "ExtendTrainingPlan": {"TrainingPlanExtensionOfferingId": "tpeo-abc123"},
    "CreateCluster": {
        "ClusterName": "valid-cluster",
        "InstanceGroups": [
            {
                "InstanceGroupName": "workers",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceCount": 2,
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
                "ThreadsPerCore": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/src", "OnCreate": "on_create.sh"},
                "TrainingPlanArn": ARN_PREFIX + "training-plan/valid-name",
            }
        ],
        "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0a1b2c3d4e5f60001"]},
    },
    "UpdateCluster": {
        "ClusterName": "valid-cluster",
        "InstanceGroups": [
            {
                "InstanceGroupName": "workers",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceCount": 2,
                "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
            }
        ],
        "InstanceGroupsToDelete": ["old-workers"],
    },
    "DescribeCluster": {"ClusterName": "valid-cluster"},
    "DeleteCluster": {"ClusterName": "valid-cluster"},
    "ListClusters": {"MaxResults": 10, "SortBy": "NAME", "SortOrder": "Ascending", "NameContains": "valid"},
    "ListClusterNodes": {"ClusterName": "valid-cluster", "MaxResults": 10, "SortBy": "CREATION_TIME"},
    "DescribeClusterNode": {"ClusterName": "valid-cluster", "NodeId": "i-0123456789abcdef0"},
    "BatchDeleteClusterNodes": {"ClusterName": "valid-cluster", "NodeIds": ["i-0123456789abcdef0"]},
    "CreateTrainingJob": {
        "TrainingJobName": "valid-job",
        "RoleArn": "arn:aws:iam::123456789012:role/training",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo:latest",
            "ContainerEntrypoint": ["python", "train.py"],
            "ContainerArguments": ["--epochs", "2"],
        },
        "HyperParameters": {"lr": "0.1"},
        "Environment": {"MODE": "test"},
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://bucket/input",
                        "S3DataDistributionType": "ShardedByS3Key",
                    }
                },
                "ContentType": "text/csv",
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "CheckpointConfig": {"S3Uri": "s3://bucket/checkpoints", "LocalPath": "/opt/ml/checkpoints"},
        "ResourceConfig": {
            "InstanceType": "ml.p5.48xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 10,
            "TrainingPlanArn": ARN_PREFIX + "training-plan/valid-name",
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 1800, "MaxPendingTimeInSeconds": 7200},
    },
    "DescribeTrainingJob": {"TrainingJobName": "valid-job"},
    "StopTrainingJob": {"TrainingJobName": "valid-job"},
    "ListTrainingJobs": {
        "MaxResults": 10,
        "SortBy": "CreationTime",
        "SortOrder": "Descending",
        "NameContains": "valid",
        "StatusEquals": "InProgress",
        "TrainingPlanArnEquals": ARN_PREFIX + "training-plan/valid-name",
        "CreationTimeAfter": 1_800_000_000,
    },
    "DescribeTrainingPlanExtensionHistory": {
        "TrainingPlanArn": ARN_PREFIX + "training-plan/valid-name",
        "MaxResults": 5,
        "NextToken": "x",
    },
    "AddTags": {
        "ResourceArn": ARN_PREFIX + "training-plan/valid-name",
        "Tags": [{"Key": "team", "Value": "ml"}],
    },
    "ListTags": {"ResourceArn": ARN_PREFIX + "training-plan/valid-name", "MaxResults": 50},
    "DeleteTags": {"ResourceArn": ARN_PREFIX + "training-plan/valid-name", "TagKeys": ["team"]},
}


def test_every_served_operation_has_a_valid_example() -> None:
    assert sorted(VALID_REQUESTS) == registry.served_operations()


def _plan_count(server: Server) -> int:
    """What a refused request must not have changed: the plans and the clusters the caller sees."""
    client = server.sagemaker()
    return len(client.list_training_plans()["TrainingPlanSummaries"]) + 1000 * len(
        client.list_clusters()["ClusterSummaries"]
    )


@pytest.mark.parametrize("operation", sorted(VALID_REQUESTS))
def test_model_derived_bad_input_is_a_validation_error_naming_the_member(
    shared_server: Server, operation: str
) -> None:
    op = model.operation_model(operation)
    cases = list(bad_inputs(op, VALID_REQUESTS[operation]))
    assert cases, f"no bad inputs generated for {operation}"
    before = _plan_count(shared_server)
    for description, body, path in cases:
        response = signed_post(shared_server, f"SageMaker.{operation}", json.dumps(body).encode())
        assert response.status_code == 400, (description, response.text)
        error = response.json()
        assert error["__type"] == "ValidationException", (description, error)
        assert path in error["message"], (description, error["message"])
    assert _plan_count(shared_server) == before


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2, 3]", b'"a string"', b"\xff\xfe\x00", b'{"TrainingPlanName": ', b"null"],
)
def test_bodies_that_are_not_a_json_object_are_serialization_errors(
    shared_server: Server, body: bytes
) -> None:
    before = _plan_count(shared_server)
    response = signed_post(shared_server, "SageMaker.CreateTrainingPlan", body)
    assert response.status_code == 400
    assert response.json()["__type"] == "SerializationException"
    assert _plan_count(shared_server) == before


@pytest.mark.parametrize("target", ["SageMaker.NoSuchOperation", "Other.ListTrainingPlans", None])
def test_unknown_operations_are_refused(shared_server: Server, target: str | None) -> None:
    response = signed_post(shared_server, target, b"{}")
    assert response.status_code == 400
    assert response.json()["__type"] == "UnknownOperationException"


def test_a_real_operation_hyperplan_does_not_serve_is_unknown(shared_server: Server) -> None:
    response = signed_post(shared_server, "SageMaker.CreateEndpoint", b"{}")
    assert response.json()["__type"] == "UnknownOperationException"
    assert "does not serve" in response.json()["message"]


def test_boto3_raises_modeled_exception_classes(shared_server: Server) -> None:
    client = shared_server.sagemaker()
    with pytest.raises(client.exceptions.ResourceNotFound) as exc:
        client.describe_training_plan(TrainingPlanName="no-such-plan")
    assert "no-such-plan" in exc.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as bad:
        client.search_training_plan_offerings(
            InstanceType="ml.p5.48xlarge", InstanceCount=2, DurationHours=96, TargetResources=["endpoint"]
        )
    assert bad.value.response["Error"]["Code"] == "ValidationException"


def test_the_aws_cli_gets_modeled_errors(shared_server: Server) -> None:
    refused = shared_server.aws(
        "sagemaker", "describe-training-plan", "--training-plan-name", "nope", check=False
    )
    assert refused.returncode != 0
    assert "ResourceNotFound" in refused.stderr and "nope" in refused.stderr


def test_healthz_answers_without_a_signature(shared_server: Server) -> None:
    import httpx

    assert httpx.get(f"{shared_server.url}/healthz").json()["status"] == "ok"
