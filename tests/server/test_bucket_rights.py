"""Buckets have owners (issue 15): another account's bucket is refused with AccessDenied when a request
names it and again when the server transfers for a job; administrators grant and revoke rights.

In process, over the fake back end (tests/inprocess.py): the server, boto3 and the store are real, and a
job's launch really fetches its channels through the account's rights before the fake task starts. One
test runs `hyperplan serve` itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import Server, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_clusters import _group
from tests.server.test_jobs import JOB_PERIODS, M5, _buy, _sleeper

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


@pytest.fixture
def shared(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    """The small fleet, plus a mapped directory bucket that the account `beta` owns."""
    share = tmp_path / "share"
    (share / "data").mkdir(parents=True)
    (share / "data" / "part-0.csv").write_text("1,2\n")
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        SMALL_FLEET.read_text() + f'\n[buckets]\n"beta-share" = {{ path = "{share}", accounts = ["beta"] }}\n'
    )
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet, env=JOB_PERIODS).start()
    dataset = server.data_dir / "s3" / "datasets" / "mnist"  # made by hand: the administrators'
    dataset.mkdir(parents=True)
    (dataset / "train.csv").write_text("3,4\n")
    return server


def _job(name: str, channel: str, output: str, **extra: Any) -> dict[str, Any]:
    request = _sleeper(name, instance_type=M5, OutputDataConfig={"S3OutputPath": output}, **extra)
    request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = channel
    return request


def _denied(call: Any, *words: str) -> None:
    with pytest.raises(ClientError) as caught:
        call()
    error = caught.value.response["Error"]
    assert error["Code"] == "AccessDeniedException", error
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert all(word in error["Message"] for word in words), (words, error["Message"])


def _buckets(server: InProcessServer, who: Credentials | None = None) -> dict[str, dict[str, Any]]:
    listed = (server.native(who) if who else server.native()).get("/api/v1/buckets")["Buckets"]
    return {bucket["Name"]: bucket for bucket in listed}


def _job_status(server: InProcessServer, who: Credentials, name: str) -> dict[str, Any]:
    return dict(server.sagemaker(who).describe_training_job(TrainingJobName=name))


def test_owners_grants_and_revokes_hold_at_create_and_at_transfer(shared: InProcessServer) -> None:
    server = shared
    alpha, beta = server.new_account("alpha"), server.new_account("beta")
    a, b = server.sagemaker(alpha), server.sagemaker(beta)

    # A dataset every account may read; an output bucket that alpha's job creates is alpha's.
    server.native().post("/api/v1/buckets/datasets/grants", {"Account": "*"})
    a.create_training_job(
        **_job(
            "a1",
            "s3://datasets/mnist",
            "s3://alpha-out/models",
            CheckpointConfig={"S3Uri": "s3://alpha-out/ckpt"},
        )
    )
    seen = _buckets(server)
    assert [o["AccountName"] for o in seen["alpha-out"]["Owners"]] == ["alpha"]
    assert seen["datasets"]["OwnedByAdministrators"] and seen["datasets"]["Grants"] == [
        {"Account": "*", "AccountName": "*", "Access": "read"}
    ]
    assert [o["AccountName"] for o in seen["beta-share"]["Owners"]] == ["beta"]  # the fleet file's accounts
    wait_until(lambda: _job_status(server, alpha, "a1")["SecondaryStatus"] == "Training")
    (server.data_dir / "s3" / "alpha-out" / "data").mkdir(parents=True, exist_ok=True)
    (server.data_dir / "s3" / "alpha-out" / "data" / "x.csv").write_text("5,6\n")

    # beta may neither read alpha's bucket nor write to it, nor to the administrators' dataset; alpha
    # may not read beta's share. Each refusal names the member and the URI.
    _denied(
        lambda: b.create_training_job(**_job("b1", "s3://alpha-out/data", "s3://beta-out/models")),
        "InputDataConfig[0].DataSource.S3DataSource.S3Uri",
        "s3://alpha-out/data",
        "account 'beta' may not read bucket 'alpha-out'",
    )
    _denied(
        lambda: b.create_training_job(**_job("b1", "s3://datasets/mnist", "s3://datasets/out")),
        "OutputDataConfig.S3OutputPath",
        "s3://datasets/out",
        "may not write to bucket 'datasets'",
    )
    _denied(
        lambda: a.create_training_job(**_job("a2", "s3://beta-share/data", "s3://alpha-out/models")),
        "s3://beta-share/data",
    )
    group = _group("controllers", 1, instance_type=M5)
    group["LifeCycleConfig"]["SourceS3Uri"] = "s3://alpha-out/src"
    _denied(
        lambda: b.create_cluster(ClusterName="c", InstanceGroups=[group]),
        "InstanceGroups[0].LifeCycleConfig.SourceS3Uri",
        "s3://alpha-out/src",
    )
    assert b.list_training_jobs()["TrainingJobSummaries"] == []
    assert b.list_clusters()["ClusterSummaries"] == []
    assert set(_buckets(server, beta)) == {"datasets", "beta-share"}  # what beta may use

    # Read-only: beta reads alpha's data as a channel, but may not keep checkpoints there.
    server.native().post("/api/v1/buckets/alpha-out/grants", {"Account": "beta", "ReadOnly": True})
    _denied(
        lambda: b.create_training_job(
            **_job(
                "b1", "s3://alpha-out/data", "s3://beta-out/m", CheckpointConfig={"S3Uri": "s3://alpha-out/b"}
            )
        ),
        "CheckpointConfig.S3Uri",
        "s3://alpha-out/b",
        "may not write to bucket 'alpha-out'",
    )
    b.create_training_job(**_job("b1", "s3://alpha-out/data", "s3://beta-share/models"))
    wait_until(lambda: _job_status(server, beta, "b1")["SecondaryStatus"] == "Training")
    b.stop_training_job(TrainingJobName="b1")
    assert _buckets(server, beta)["alpha-out"]["Access"] == "read"

    # Revoked: a job created while beta could read fails at launch, and a running job whose checkpoints
    # went there fails at its next sync, each with the refusal.
    server.native().post("/api/v1/buckets/alpha-out/grants", {"Account": "beta"})  # now read and write
    b.create_training_job(
        **_job(
            "b2", "s3://alpha-out/data", "s3://beta-share/m", CheckpointConfig={"S3Uri": "s3://alpha-out/b2"}
        )
    )
    wait_until(lambda: _job_status(server, beta, "b2")["SecondaryStatus"] == "Training")
    arn = _buy(server, beta, "later", 1, 1)
    start = b.describe_training_plan(TrainingPlanName="later")["StartTime"]
    late = _sleeper("late", plan=arn)
    late["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = "s3://alpha-out/data"
    late["OutputDataConfig"] = {"S3OutputPath": "s3://beta-share/models"}
    b.create_training_job(**late)
    server.cli("buckets", "revoke", "alpha-out", "beta")
    server.set_clock(start)
    for name, words in (
        ("late", "s3://alpha-out/data: Access Denied: account 'beta' may not read bucket 'alpha-out'"),
        ("b2", "s3://alpha-out/b2: Access Denied: account 'beta' may not write to bucket 'alpha-out'"),
    ):
        ended = wait_until(
            lambda name=name: (
                (job := _job_status(server, beta, name))["TrainingJobStatus"] == "Failed" and job
            )
        )
        assert words in ended["FailureReason"], ended["FailureReason"]
    assert "alpha-out" not in _buckets(server, beta)
    a.stop_training_job(TrainingJobName="a1")


def test_buckets_create_takes_a_free_name_only(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    owner, other = server.new_account("creator"), server.new_account("latecomer")
    made = server.native(owner).post("/api/v1/buckets", {"Name": "creator-bucket"})
    assert [o["AccountName"] for o in made["Owners"]] == ["creator"]
    assert (server.data_dir / "s3" / "creator-bucket").is_dir()
    for who in (other, owner):
        with pytest.raises(ApiError) as taken:
            server.native(who).post("/api/v1/buckets", {"Name": "creator-bucket"})
        assert (taken.value.code, taken.value.status) == ("BucketAlreadyExists", 409)
    with pytest.raises(ApiError) as bad:
        server.native(owner).post("/api/v1/buckets", {"Name": "Not_A_Bucket"})
    assert bad.value.code == "ValidationException" and "lowercase" in str(bad.value)
    with pytest.raises(ApiError) as not_admin:
        server.native(owner).post("/api/v1/buckets/creator-bucket/grants", {"Account": "latecomer"})
    assert not_admin.value.code == "AccessDeniedException"
    # The command line: grant to everyone, list, revoke.
    granted = server.cli("buckets", "grant", "creator-bucket", "*")
    assert "every account: read" in granted.stdout
    listed = server.cli("buckets", "list", credentials=other).stdout
    assert "creator-bucket" in listed and "creator" in listed and "every account: read" in listed
    server.cli("buckets", "revoke", "creator-bucket", "*")
    assert "creator-bucket" not in server.cli("buckets", "list", credentials=other).stdout


def test_a_real_server_refuses_another_accounts_bucket_through_boto3(
    server_factory: type[Server], tmp_path: Path
) -> None:
    """The same refusal from `hyperplan serve` itself, its bucket made by the `hyperplan` command."""
    server = server_factory(data_dir=tmp_path / "data", fleet=SMALL_FLEET).start()
    alpha, beta = server.new_account("alpha"), server.new_account("beta")
    server.cli("buckets", "create", "alpha-data", credentials=alpha)
    taken = server.cli("buckets", "create", "alpha-data", credentials=beta, check=False)
    assert taken.returncode != 0 and "BucketAlreadyExists" in taken.stderr + taken.stdout
    _denied(
        lambda: server.sagemaker(beta).create_training_job(
            **_job("b1", "s3://alpha-data/train", "s3://beta-out/models")
        ),
        "InputDataConfig[0].DataSource.S3DataSource.S3Uri",
        "s3://alpha-data/train: Access Denied: account 'beta' may not read bucket 'alpha-data'",
    )
    buckets = {b["Name"]: b for b in server.native().get("/api/v1/buckets")["Buckets"]}
    assert list(buckets) == ["alpha-data"]  # the refused request claimed nothing
    assert [o["AccountName"] for o in buckets["alpha-data"]["Owners"]] == ["alpha"]
