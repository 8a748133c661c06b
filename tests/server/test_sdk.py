"""The SageMaker Python SDK v2, unchanged, against hyperplan and an S3-compatible server on loopback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness import ADMIN, BIN, REGION, Server, free_port

pytestmark = pytest.mark.sdk  # a part of its own (tests/parts.py)

pytest.importorskip("sagemaker")

ROOT = Path(__file__).parent.parent.parent
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
S3_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """moto's S3 server in a process of its own, bound to loopback."""
    port = free_port()
    process = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=url, region_name=REGION, **S3_KEYS)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def sdk_server(server_factory: type[Server], tmp_path: Path, s3_endpoint: str) -> Server:
    """The small fleet, with two buckets mapped to the S3-compatible server."""
    fleet = tmp_path / "fleet.toml"
    buckets = "".join(
        f'\n[buckets.{name}]\nendpoint_url = "{s3_endpoint}"\nregion = "{REGION}"\n'
        f'access_key_id = "testing"\nsecret_access_key = "testing"\n'
        for name in ("sdk-bucket", "missing-remote")
    )
    # The fleet names the Python that runs this image's programs: a wrapper that leaves a mark, then runs.
    wrapper = tmp_path / "image-python"
    wrapper.write_text(
        f'#!/bin/sh\necho "$0" > "$SM_MODEL_DIR/interpreter.txt"\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    images = f'\n[images]\n"123456789012.dkr.ecr.us-west-2.amazonaws.com/train:*" = "{wrapper}"\n'
    fleet.write_text(SMALL_FLEET.read_text() + images + "\n[buckets]\n" + buckets)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION, **S3_KEYS)
    s3.create_bucket(Bucket="sdk-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    for part, values in (("a", "1 2 3"), ("b", "4 5")):
        s3.put_object(Bucket="sdk-bucket", Key=f"data/{part}.csv", Body=values.encode())
    return server_factory(data_dir=tmp_path / "data", fleet=fleet).start()


def _sdk_env(server: Server, s3_endpoint: str, tmp_path: Path) -> dict[str, str]:
    config = tmp_path / "sagemaker-config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
    )
    return {
        **os.environ,
        "AWS_ENDPOINT_URL_SAGEMAKER": server.url,
        "AWS_ENDPOINT_URL_S3": s3_endpoint,
        "AWS_ACCESS_KEY_ID": ADMIN.access_key,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "SAGEMAKER_USER_CONFIG_OVERRIDE": str(config),
        "SAGEMAKER_ADMIN_CONFIG_OVERRIDE": str(config),
    }


def test_estimator_fit_on_a_training_plan(sdk_server: Server, s3_endpoint: str, tmp_path: Path) -> None:
    client = sdk_server.sagemaker()
    offering = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    arn = client.create_training_plan(
        TrainingPlanName="sdk-plan", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    fit = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "sdk" / "fit_on_plan.py"), arn, "sdk-bucket", "sdk-job"],
        env=_sdk_env(sdk_server, s3_endpoint, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        job = _wait_for_job(client, fit)
        assert job["ResourceConfig"]["TrainingPlanArn"] == arn
        assert job["SecondaryStatus"] == "Pending"  # the plan has not started: fit() waits
        assert json.loads(job["HyperParameters"]["sagemaker_program"]) == "train.py"
        start = client.describe_training_plan(TrainingPlanName="sdk-plan")["StartTime"]
        sdk_server.set_clock(start + timedelta(minutes=1))
        output, _ = fit.communicate(timeout=300)
    finally:
        if fit.poll() is None:
            fit.kill()
    assert fit.returncode == 0, output
    described = client.describe_training_job(TrainingJobName="sdk-job")
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    model_uri = described["ModelArtifacts"]["S3ModelArtifacts"]
    assert (
        model_uri == "s3://sdk-bucket/output/sdk-job/output/model.tar.gz" and f"MODEL {model_uri}" in output
    )
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name=REGION, **S3_KEYS)
    body = s3.get_object(Bucket="sdk-bucket", Key="output/sdk-job/output/model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        member = archive.extractfile("model.json")
        assert member is not None
        model = json.loads(member.read())
        interpreter = archive.extractfile("interpreter.txt")
        assert interpreter is not None and interpreter.read().decode().strip().endswith("image-python")
    assert model == {"estimate": 6.0, "rows": 5, "hosts": ["algo-1"]}  # 2 x mean(1..5)


def _wait_for_job(client: Any, fit: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if fit.poll() is not None:
            raise AssertionError(
                f"fit() ended before the job existed: {fit.stdout.read() if fit.stdout else ''}"
            )
        found = client.list_training_jobs(NameContains="sdk-job")["TrainingJobSummaries"]
        if found:
            return dict(client.describe_training_job(TrainingJobName="sdk-job"))
        time.sleep(0.5)
    raise AssertionError("the SDK never created the training job")


def test_a_job_whose_input_bucket_does_not_exist_fails_naming_it(sdk_server: Server) -> None:
    client = sdk_server.sagemaker()
    client.create_training_job(
        TrainingJobName="no-input",
        RoleArn="arn:aws:iam::123456789012:role/SageMakerRole",
        AlgorithmSpecification={
            "TrainingImage": "img:1",
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", "-c", "print('never runs')"],
        },
        InputDataConfig=[
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://missing-remote/data"}
                },
            }
        ],
        OutputDataConfig={"S3OutputPath": "s3://sdk-bucket/output"},
        ResourceConfig={"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        StoppingCondition={"MaxRuntimeInSeconds": 3600},
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.describe_training_job(TrainingJobName="no-input")
        if job["TrainingJobStatus"] in ("Failed", "Completed", "Stopped"):
            break
        time.sleep(0.3)
    assert job["TrainingJobStatus"] == "Failed"
    assert "s3://missing-remote/data" in job["FailureReason"] and "no such bucket" in job["FailureReason"]
