"""Bucket URIs on the wire: CreateTrainingJob and CreateCluster refuse, at create time and naming it, a URI
whose bucket name S3 would refuse or whose key could leave its bucket (issue 15: a bucket named `..`
reached DATA_DIR). Nothing is created and nothing is copied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.inprocess import InProcessServer
from tests.server.test_clusters import _group
from tests.server.test_jobs import M5, _job

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
COMMAND = ["python", "-c", "print('never runs')"]

BAD_URIS = [
    ("s3://../credentials", "bucket name '..'"),
    ("s3://./", "bucket name '.'"),
    ("s3://a..b/data", "two dots in a row"),
    ("s3://Team-Data/data", "lowercase letters"),
    ("s3://192.168.0.1/data", "IP address"),
    ("s3://%2e%2e/credentials", "bucket name '%2e%2e'"),
    ("s3://bucket/input/%2e%2e/%2e%2e/credentials", "encoded character '%2e'"),
    ("s3://bucket/input/../../credentials", "'..' path segment"),
    ("s3://bucket//etc/passwd", "'empty' path segment"),
]


@pytest.fixture
def fast_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


def _refused(call: Any, member: str, uri: str, words: str) -> None:
    with pytest.raises(ClientError) as caught:
        call()
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    assert member in error["Message"] and uri in error["Message"] and words in error["Message"], error


def _data_dir_files(server: InProcessServer) -> set[Path]:
    return {path for path in server.data_dir.rglob("*") if "hyperplan.db" not in path.name}


@pytest.mark.parametrize(("uri", "words"), BAD_URIS, ids=[uri for uri, _ in BAD_URIS])
def test_create_training_job_refuses_a_bad_uri_in_every_member_naming_it(
    fast_small: InProcessServer, uri: str, words: str
) -> None:
    client = fast_small.sagemaker(fast_small.new_account("uris"))
    before = _data_dir_files(fast_small)
    channel = _job("j", COMMAND, instance_type=M5)
    channel["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = uri
    output = _job("j", COMMAND, instance_type=M5, OutputDataConfig={"S3OutputPath": uri})
    checkpoint = _job("j", COMMAND, instance_type=M5, CheckpointConfig={"S3Uri": uri})
    script = _job(
        "j",
        COMMAND,
        instance_type=M5,
        hyperparameters={"sagemaker_program": '"train.py"', "sagemaker_submit_directory": f'"{uri}"'},
    )
    for request, member in (
        (channel, "InputDataConfig[0].DataSource.S3DataSource.S3Uri"),
        (output, "OutputDataConfig.S3OutputPath"),
        (checkpoint, "CheckpointConfig.S3Uri"),
        (script, "HyperParameters.sagemaker_submit_directory"),
    ):
        _refused(lambda request=request: client.create_training_job(**request), member, uri, words)
    assert client.list_training_jobs()["TrainingJobSummaries"] == []
    assert _data_dir_files(fast_small) == before  # nothing copied anywhere


@pytest.mark.parametrize(("uri", "words"), BAD_URIS, ids=[uri for uri, _ in BAD_URIS])
def test_create_cluster_refuses_a_bad_lifecycle_source_naming_it(
    fast_small: InProcessServer, uri: str, words: str
) -> None:
    client = fast_small.sagemaker(fast_small.new_account("lifecycles"))
    before = _data_dir_files(fast_small)
    group = _group("controllers", 1, instance_type=M5)
    group["LifeCycleConfig"]["SourceS3Uri"] = uri
    _refused(
        lambda: client.create_cluster(ClusterName="refused", InstanceGroups=[group]),
        "InstanceGroups[0].LifeCycleConfig.SourceS3Uri",
        uri,
        words,
    )
    assert client.list_clusters()["ClusterSummaries"] == []
    assert _data_dir_files(fast_small) == before
