"""Names that become paths on this machine are refused when they would leave their directory.

A channel's objects go to input/data/CHANNEL of each instance's tree: the model's pattern allows `.` and
`..`, which would put them over the job's own input/config/*.json. A group's OnCreate names a script
inside its lifecycle source: an absolute path or one through `..` would run a file of the server's.
Each is a ValidationException naming the member, and nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.harness import Server
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """In process (tests/inprocess.py): refusals are rules, answered before any back end is asked."""
    server = InProcessServer(data_dir=tmp_path_factory.mktemp("names") / "data", fleet=SMALL_FLEET).start()
    yield server
    server.close()


def _channel(name: str) -> dict[str, Any]:
    source = {
        "S3DataType": "S3Prefix",
        "S3Uri": "s3://bucket/input",
        "S3DataDistributionType": "FullyReplicated",
    }
    return {"ChannelName": name, "DataSource": {"S3DataSource": source}}


def _job(name: str, channels: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::111122223333:role/hyperplan",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "local/python:3",
            "ContainerEntrypoint": ["python", "-c", "pass"],
        },
        "InputDataConfig": channels,
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _refused(call: Any, **request: Any) -> str:
    with pytest.raises(ClientError) as refused:
        call(**request)
    assert refused.value.response["Error"]["Code"] == "ValidationException"
    return str(refused.value.response["Error"]["Message"])


@pytest.mark.parametrize("name", ["..", "."])
def test_a_channel_named_dot_or_dot_dot_is_refused_naming_it(small: Server, name: str) -> None:
    client = small.sagemaker()
    message = _refused(client.create_training_job, **_job("dots", [_channel("training"), _channel(name)]))
    assert message.startswith(
        f"InputDataConfig[1].ChannelName: {name!r} names input/data itself or its parent"
    )
    assert client.list_training_jobs()["TrainingJobSummaries"] == []


def test_channels_that_would_set_one_variable_are_refused(small: Server) -> None:
    client = small.sagemaker()
    message = _refused(
        client.create_training_job, **_job("clash", [_channel("train-data"), _channel("train.data")])
    )
    assert "'train-data' and 'train.data' would both set SM_CHANNEL_TRAIN_DATA" in message
    assert client.list_training_jobs()["TrainingJobSummaries"] == []


@pytest.mark.parametrize("script", ["/bin/true", "../../../../bin/true"])
def test_an_on_create_outside_the_lifecycle_source_is_refused(small: Server, script: str) -> None:
    client = small.sagemaker()
    group = {
        "InstanceGroupName": "controller",
        "InstanceType": "ml.m5.12xlarge",
        "InstanceCount": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": script},
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
    }
    message = _refused(client.create_cluster, ClusterName="escape", InstanceGroups=[group])
    assert message.startswith(f"InstanceGroups[0].LifeCycleConfig.OnCreate: {script!r} must be a path inside")
    assert client.list_clusters()["ClusterSummaries"] == []
