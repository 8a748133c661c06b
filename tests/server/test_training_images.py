"""A training job's image, resolved at CreateTrainingJob through the fleet's image map (the demo fleet's):
boto3 against a real server, our CLI as a process.

The reference is recorded with the job and shown where a person looks (the job's first transition, the
native job view, `hyperplan jobs describe`); DescribeTrainingJob keeps the TrainingImage as sent, as AWS
does; a malformed TrainingImage is a ValidationException and nothing is written.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from tests.inprocess import InProcessServer

ECR = "763104351884.dkr.ecr.us-west-2.amazonaws.com"
M5 = "ml.m5.12xlarge"  # on-demand only in the demo fleet: no plan to buy
DEV_PYTHON = "127.0.0.1:5000/hyperplan/python:3"
DEV_SAGEMAKER = "127.0.0.1:5000/hyperplan/sagemaker-python:3"


def job(name: str, image: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": image,
            "ContainerEntrypoint": ["python", "-c", "pass"],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://images-test/output"},
        "ResourceConfig": {"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def test_each_job_records_the_reference_its_image_resolved_to(fast_server: InProcessServer) -> None:
    client = fast_server.sagemaker()
    cases = {
        "exact": ("local/python:3", DEV_PYTHON),
        "framework": (f"{ECR}/pytorch-training:2.3.0-gpu-py311", DEV_SAGEMAKER),
        "unmapped": ("123456789012.dkr.ecr.us-west-2.amazonaws.com/algo:1", None),
        "pinned": ("team/algo@sha256:" + "ab" * 32, None),
    }
    for name, (image, _) in cases.items():
        client.create_training_job(**job(name, image))
    for name, (image, expected) in cases.items():
        resolved = expected or image  # an unmapped image is pulled as written
        described = client.describe_training_job(TrainingJobName=name)
        assert described["AlgorithmSpecification"]["TrainingImage"] == image  # as sent
        first = described["SecondaryStatusTransitions"][0]
        assert first["Status"] == "Starting"
        assert first["StatusMessage"].endswith(f"; its image resolves to {resolved}."), first
        view = fast_server.native().get(f"/api/v1/training-jobs/{name}")
        assert (view["TrainingImage"], view["ResolvedImage"]) == (image, resolved)
    for name in cases:
        client.stop_training_job(TrainingJobName=name)

    shown = fast_server.cli("jobs", "describe", "framework").stdout
    assert f"Image: {ECR}/pytorch-training:2.3.0-gpu-py311 (resolves to {DEV_SAGEMAKER})" in shown
    as_json = json.loads(fast_server.cli("jobs", "describe", "framework", "--json").stdout)
    assert as_json["ResolvedImage"] == DEV_SAGEMAKER
    assert as_json["AlgorithmSpecification"]["TrainingImage"] == f"{ECR}/pytorch-training:2.3.0-gpu-py311"
    # Another account cannot read the job's view.
    with pytest.raises(ApiError) as hidden:
        fast_server.native(fast_server.new_account("images-other")).get("/api/v1/training-jobs/framework")
    assert hidden.value.code == "ResourceNotFound"


@pytest.mark.parametrize(
    ("image", "complaint"),
    [
        ("Local/Python:3", "the repository path component 'Python' must be lower-case"),
        ("local/python:-3", "the tag '-3' must be 1-128"),
        ("local//python:3", "empty component"),
        ("local/python@sha256:abc", "the digest 'sha256:abc' must be ALGORITHM:HEX"),
        ("127.0.0.1:99999/hyperplan/python:3", "port 99999"),
        ("local/python 3", "space or a control character"),
    ],
)
def test_a_malformed_image_is_a_validation_exception_and_nothing_is_written(
    fast_server: InProcessServer, image: str, complaint: str
) -> None:
    client = fast_server.sagemaker()
    with pytest.raises(ClientError) as refused:
        client.create_training_job(**job("malformed", image))
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert error["Message"].startswith("AlgorithmSpecification.TrainingImage: "), error["Message"]
    assert complaint in error["Message"], error["Message"]
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert client.list_training_jobs()["TrainingJobSummaries"] == []
