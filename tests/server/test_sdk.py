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
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.harness import ADMIN, BIN, REGION, Server, boundary_after, free_port, service_now, wait_until

# Found, not imported: importing the SDK takes seconds, and every run collects this module, the core
# part's too (a mark deselects tests after their modules are imported). The SDK runs in subprocesses.
pytestmark = [
    pytest.mark.sdk,  # a part of its own (tests/parts.py)
    pytest.mark.skipif(find_spec("sagemaker") is None, reason="the SageMaker Python SDK is not installed"),
]

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


# -- the shortest form: one endpoint variable, the SDK's defaults (examples/sdk/fit_defaults.py) ----------

DEFAULT_BUCKET = "team-bucket"


@pytest.fixture
def one_endpoint(server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The small fleet with short real-time periods (the reclaim's grace, checkpoint syncs), images run by
    this Python, and hyperplan's own S3: no other server."""
    for name, value in {
        "HYPERPLAN_JOB_RECLAIM_GRACE": "5",
        "HYPERPLAN_JOB_STOP_GRACE": "5",
        "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3",
    }.items():
        monkeypatch.setenv(name, value)
    fleet = tmp_path / "fleet.toml"
    images = f'\n[images]\n"123456789012.dkr.ecr.us-west-2.amazonaws.com/train:*" = "{sys.executable}"\n'
    fleet.write_text(SMALL_FLEET.read_text() + images)
    return server_factory(data_dir=tmp_path / "data", fleet=fleet).start()


def _one_endpoint_env(server: Server, home: Path) -> dict[str, str]:
    """Only AWS_ENDPOINT_URL, keys and a region; the SDK's config file in HOME holds the default bucket and
    the telemetry opt-out. Nothing else may reach AWS: no config files, no instance metadata."""
    config = home / ".config" / "sagemaker" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"
        f"      Session:\n        DefaultS3Bucket: {DEFAULT_BUCKET}\n"
    )
    inherited = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "SAGEMAKER_")) and k not in ("HOME", "XDG_CONFIG_HOME")
    }
    return {
        **inherited,
        "HOME": str(home),
        "AWS_ENDPOINT_URL": server.url,
        "AWS_ACCESS_KEY_ID": ADMIN.access_key,
        "AWS_SECRET_ACCESS_KEY": ADMIN.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "SAGEMAKER_SUPPRESS_V2_WARNING": "1",
        # Any request that is not to loopback goes to a proxy that refuses it: nothing reaches AWS.
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_PROXY": "127.0.0.1,localhost",
    }


def test_the_sdk_with_its_defaults_against_one_endpoint(one_endpoint: Server, tmp_path: Path) -> None:
    server = one_endpoint
    client = server.sagemaker()
    # A plan of two one-day segments two days apart: another team holds every p5 in between.
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    blocker = server.new_account("blocker")
    for count, name in ((8, "block-a"), (4, "block-b")):
        _buy(
            client_for=server.sagemaker(blocker),
            name=name,
            count=count,
            StartTimeAfter=start + timedelta(days=1),
            EndTimeBefore=start + timedelta(days=3),
        )
    arn = _buy(
        client_for=client,
        name="two-segments",
        count=1,
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=4),
    )
    segments = client.describe_training_plan(TrainingPlanName="two-segments")["ReservedCapacitySummaries"]
    assert len(segments) == 2, segments
    data = tmp_path / "notebook-data"
    data.mkdir()
    (data / "a.csv").write_text("1 2 3")
    (data / "b.csv").write_text("4 5")

    s3 = boto3.client(
        "s3",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=ADMIN.access_key,
        aws_secret_access_key=ADMIN.secret_key,
    )
    assert DEFAULT_BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]  # the SDK creates it

    output = tmp_path / "notebook.txt"
    with output.open("w") as notebook:
        fit = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "examples" / "sdk" / "fit_defaults.py"),
                arn,
                str(data),
                "sdk-job",
                "--hold",
            ],
            env=_one_endpoint_env(server, tmp_path / "home"),
            stdout=notebook,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        job = _wait_for_job(client, fit)
        assert job["SecondaryStatus"] == "Pending"  # the plan has not started: fit() waits, streaming
        server.set_clock(start + timedelta(minutes=1))
        assert wait_until(lambda: "holding until the segment ends" in output.read_text(), 120), (
            output.read_text()
        )
        server.set_clock(start + timedelta(days=1, minutes=-30))  # the first segment's reclaim
        assert wait_until(lambda: "interrupted by the end of the segment" in output.read_text(), 60), (
            output.read_text()
        )
        server.set_clock(start + timedelta(days=3, minutes=1))  # the second segment
        fit.wait(timeout=180)
    finally:
        if fit.poll() is None:
            fit.kill()
            fit.wait()
    notebook_output = output.read_text()
    assert fit.returncode == 0, notebook_output
    described = client.describe_training_job(TrainingJobName="sdk-job")
    assert described["TrainingJobStatus"] == "Completed", described.get("FailureReason")
    statuses = [t["Status"] for t in described["SecondaryStatusTransitions"]]
    assert statuses[:2] == ["Starting", "Pending"] and statuses.count("Pending") == 2, statuses
    # The training script's lines, before and after the resume, reached the notebook through fit()'s logs.
    lines = notebook_output.splitlines()
    order = [
        next(i for i, line in enumerate(lines) if text in line)
        for text in (
            "first segment: checkpoint saved",
            "interrupted by the end of the segment",
            "resuming from checkpoint",
            "trained on 5 rows: 6.0",
        )
    ]
    assert order == sorted(order), notebook_output
    # The defaults: the configured bucket, created on first use in hyperplan's own S3, holds the data, the
    # source and the model.
    model_uri = described["ModelArtifacts"]["S3ModelArtifacts"]
    assert model_uri == f"s3://{DEFAULT_BUCKET}/sdk-job/output/model.tar.gz", model_uri
    assert f"MODEL {model_uri}" in notebook_output
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=DEFAULT_BUCKET)["Contents"]}
    assert {"data/a.csv", "data/b.csv", "sdk-job/source/sourcedir.tar.gz"} <= keys, keys
    body = s3.get_object(Bucket=DEFAULT_BUCKET, Key="sdk-job/output/model.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as archive:
        member = archive.extractfile("model.json")
        assert member is not None
        assert json.loads(member.read()) == {"estimate": 6.0, "rows": 5, "hosts": ["algo-1"]}


def _buy(client_for: Any, name: str, count: int, **window: Any) -> str:
    offering = client_for.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge",
        InstanceCount=count,
        DurationHours=48,
        TargetResources=["training-job"],
        **window,
    )["TrainingPlanOfferings"][0]
    return str(
        client_for.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )["TrainingPlanArn"]
    )
