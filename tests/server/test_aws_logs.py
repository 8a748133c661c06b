"""One endpoint for the AWS toolchain: CloudWatch Logs and STS beside SageMaker, told apart by the
signature's credential scope (server/routing.py), on one in-process server for the module.

A training job's output comes from the fake back end, whose world stamps each line with a wall time the
test chooses (so the events' times are known exactly). That a real job's lines carry the times the
wrapper took, and that a resumed job's stream goes on, is shown on the local back end in
tests/server/test_jobs.py (the resume test).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from botocore.exceptions import ClientError

from hyperplan.backends.fake import FakeWorld, Program
from hyperplan.signing import Credentials
from hyperplan.wire import model
from tests.harness import (
    REGION,
    SignerLeavingOut,
    check_query_response,
    check_response_shape,
    wait_until,
)
from tests.inprocess import InProcessServer, Templates
from tests.wire.badinput import bad_inputs

pytestmark = pytest.mark.aws

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
M5 = "ml.m5.12xlarge"  # on-demand in the small fleet: a job starts at once
GROUP = "/aws/sagemaker/TrainingJobs"
WRITTEN_AT = 1_900_000_000.25  # the wall time the fake world gives the job's lines (chosen, not read)
OUTPUT = b"epoch 1 loss 0.9\nepoch 2 loss 0.5\nepoch 3 loss 0.2\n"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, store_templates: Templates) -> Iterator[dict[str, Any]]:
    """The server, two accounts, and the first one's finished job "fit" (one instance)."""
    world = FakeWorld(wall=lambda: WRITTEN_AT)
    data_dir = tmp_path_factory.mktemp("logs") / "data"
    server = InProcessServer(data_dir=data_dir, fleet=SMALL_FLEET, world=world, templates=store_templates)
    (data_dir / "s3" / "bucket" / "input").mkdir(parents=True)
    (data_dir / "s3" / "bucket" / "input" / "data.csv").write_text("1,2\n")
    server.start()
    try:
        alpha, beta = server.new_account("alpha"), server.new_account("beta")
        server.native().post("/api/v1/buckets/bucket/grants", {"Account": "alpha"})
        command = list(world.command(Program.exits(0, stdout=OUTPUT, stderr=b"a warning\n")))
        server.sagemaker(alpha).create_training_job(**_job("fit", command))
        job = wait_until(
            lambda: (
                (d := server.sagemaker(alpha).describe_training_job(TrainingJobName="fit"))[
                    "TrainingJobStatus"
                ]
                == "Completed"
                and d
            )
        )
        assert job, server.log()[-3000:]
        stream = f"fit/algo-1-{int(job['CreationTime'].timestamp())}"
        yield {"server": server, "alpha": alpha, "beta": beta, "stream": stream}
        assert "Traceback" not in server.log(), server.log()[-5000:]
    finally:
        server.close()


def _job(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": command[:2],
        },
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://bucket/input",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _client(server: InProcessServer, service: str, credentials: Credentials) -> Any:
    """A boto3 client whose every successful answer is checked against botocore's output shape (the
    server's serializer checks it before sending too: wire/serialize.py)."""
    client = boto3.client(
        service,
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=credentials.access_key,
        aws_secret_access_key=credentials.secret_key,
        config=Config(retries={"max_attempts": 1}),
    )
    check = check_response_shape if service == "logs" else check_query_response
    client.meta.events.register(f"before-parse.{service}.*", check)
    return client


def test_the_aws_cli_reads_a_jobs_output_from_cloudwatch_logs(served: dict[str, Any]) -> None:
    """The CLI's describe-log-groups and filter-log-events here (its describe-log-streams and
    get-log-events on a real job's output: tests/server/test_jobs.py); boto3 for the rest."""
    server, alpha, stream = served["server"], served["alpha"], served["stream"]
    groups = server.aws("logs", "describe-log-groups", credentials=alpha)["logGroups"]
    assert [group["logGroupName"] for group in groups] == [GROUP]
    logs = _client(server, "logs", alpha)
    streams = logs.describe_log_streams(logGroupName=GROUP, logStreamNamePrefix="fit/")["logStreams"]
    assert [s["logStreamName"] for s in streams] == [stream]
    assert streams[0]["firstEventTimestamp"] == streams[0]["lastEventTimestamp"] == 1_900_000_000_250
    events = logs.get_log_events(logGroupName=GROUP, logStreamName=stream, startFromHead=True)["events"]
    assert [e["message"] for e in events] == [
        "epoch 1 loss 0.9", "epoch 2 loss 0.5", "epoch 3 loss 0.2", "a warning",
    ]  # fmt: skip
    assert {e["timestamp"] for e in events} == {1_900_000_000_250}  # when each line was written
    found = server.aws(
        "logs", "filter-log-events", "--log-group-name", GROUP, "--filter-pattern", "loss -0.5",
        credentials=alpha,
    )["events"]  # fmt: skip
    assert [(e["logStreamName"], e["message"]) for e in found] == [
        (stream, "epoch 1 loss 0.9"), (stream, "epoch 3 loss 0.2"),
    ]  # fmt: skip


def test_get_log_events_pages_forward_and_backward_and_keeps_to_its_times(served: dict[str, Any]) -> None:
    server, alpha, stream = served["server"], served["alpha"], served["stream"]
    logs = _client(server, "logs", alpha)
    at = {"logGroupName": GROUP, "logStreamName": stream}
    first = logs.get_log_events(**at, startFromHead=True, limit=3)
    assert [e["message"] for e in first["events"]] == [
        "epoch 1 loss 0.9",
        "epoch 2 loss 0.5",
        "epoch 3 loss 0.2",
    ]
    rest = logs.get_log_events(**at, nextToken=first["nextForwardToken"], limit=3)
    assert [e["message"] for e in rest["events"]] == ["a warning"]
    end = logs.get_log_events(**at, nextToken=rest["nextForwardToken"])
    assert end["events"] == [] and end["nextForwardToken"] == rest["nextForwardToken"]  # the end: it repeats
    back = logs.get_log_events(**at, nextToken=rest["nextBackwardToken"], limit=2)
    assert [e["message"] for e in back["events"]] == ["epoch 2 loss 0.5", "epoch 3 loss 0.2"]
    latest = logs.get_log_events(**at, limit=1)  # without startFromHead: the latest events
    assert [e["message"] for e in latest["events"]] == ["a warning"]
    assert logs.get_log_events(**at, startTime=1_900_000_000_251)["events"] == []
    assert (
        len(logs.get_log_events(**at, startTime=1_900_000_000_250, endTime=1_900_000_000_251)["events"]) == 4
    )
    # Tokens are signed: one altered to name another place in the stream is refused, not read.
    token = first["nextForwardToken"]
    direction, ref, line, mac = token.split("/")
    for forged in ("f/not-a-token", f"{direction}/{ref}/{int(line) + 1}/{mac}", f"b/{ref}/{line}/{mac}"):
        with pytest.raises(ClientError) as refused:
            logs.get_log_events(**at, nextToken=forged)
        assert refused.value.response["Error"]["Code"] == "InvalidParameterException", forged
    # FilterLogEvents a line a page: each event once, in order, until no token is given back.
    messages: list[str] = []
    token_arg: dict[str, str] = {}
    while True:
        page = logs.filter_log_events(logGroupName=GROUP, limit=1, **token_arg)
        messages += [event["message"] for event in page["events"]]
        if "nextToken" not in page:
            break
        token_arg = {"nextToken": page["nextToken"]}
    assert messages == ["epoch 1 loss 0.9", "epoch 2 loss 0.5", "epoch 3 loss 0.2", "a warning"]


def test_sts_names_the_caller(served: dict[str, Any]) -> None:
    server, alpha = served["server"], served["alpha"]
    identity = server.aws("sts", "get-caller-identity", credentials=alpha)
    account = server.native(alpha).get("/api/v1/whoami")
    assert identity["Account"] == account["AccountId"]
    assert identity["Arn"].startswith(f"arn:aws:iam::{identity['Account']}:user/")
    assert _client(server, "sts", alpha).get_caller_identity()["UserId"] == identity["UserId"]


def test_another_accounts_logs_are_invisible_and_refused(served: dict[str, Any]) -> None:
    server, alpha, beta, stream = served["server"], served["alpha"], served["beta"], served["stream"]
    logs = _client(server, "logs", beta)
    assert logs.describe_log_groups()["logGroups"] == []
    alpha_arn = _client(server, "logs", alpha).describe_log_groups()["logGroups"][0]["logGroupArn"]
    attempts = [
        lambda: logs.get_log_events(logGroupName=GROUP, logStreamName=stream),
        lambda: logs.get_log_events(logGroupIdentifier=alpha_arn, logStreamName=stream),
        lambda: logs.describe_log_streams(logGroupName=GROUP),
        lambda: logs.filter_log_events(logGroupName=GROUP, logStreamNames=[stream]),
    ]
    for attempt in attempts:
        with pytest.raises(ClientError) as refused:
            attempt()
        assert refused.value.response["Error"]["Code"] == "ResourceNotFoundException"


VALID_LOGS_REQUESTS: dict[str, dict[str, Any]] = {
    "DescribeLogGroups": {"logGroupNamePrefix": "/aws/sagemaker", "limit": 5, "nextToken": "0"},
    "DescribeLogStreams": {
        "logGroupName": GROUP,
        "logStreamNamePrefix": "fit/",
        "orderBy": "LogStreamName",
        "descending": False,
        "limit": 5,
    },
    "GetLogEvents": {
        "logGroupName": GROUP,
        "logStreamName": "fit/algo-1-1",
        "startTime": 0,
        "endTime": 1,
        "limit": 10,
        "startFromHead": True,
    },
    "FilterLogEvents": {
        "logGroupName": GROUP,
        "logStreamNames": ["fit/algo-1-1"],
        "startTime": 0,
        "endTime": 1,
        "filterPattern": "loss",
        "limit": 10,
    },
}


def test_model_derived_bad_input_to_cloudwatch_logs_is_refused_naming_the_member(
    served: dict[str, Any],
) -> None:
    server, alpha = served["server"], served["alpha"]
    with httpx.Client(timeout=60) as http:  # one connection for them all
        for operation, valid in VALID_LOGS_REQUESTS.items():
            cases = list(bad_inputs(model.operation_model(operation, model.LOGS), valid))
            assert cases, operation
            for description, body, path in cases:
                headers = {
                    "Content-Type": "application/x-amz-json-1.1",
                    "X-Amz-Target": f"Logs_20140328.{operation}",
                }
                response = _signed(http, server, "logs", json.dumps(body).encode(), headers, alpha)
                assert response.status_code == 400, (operation, description, response.text)
                error = response.json()
                assert error["__type"] == "InvalidParameterException", (operation, description, error)
                assert path in error["message"], (operation, description, error["message"])


def _signed(
    http: httpx.Client,
    server: InProcessServer,
    service: str,
    body: bytes,
    headers: dict[str, str],
    who: Credentials,
) -> httpx.Response:
    request = AWSRequest(method="POST", url=f"{server.url}/", data=body, headers=headers)
    SigV4Auth(BotoCredentials(who.access_key, who.secret_key), service, REGION).add_auth(request)
    prepared = request.prepare()
    return http.post(prepared.url, content=body, headers=dict(prepared.headers))


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"Action=GetCallerIdentity&Version=2011-06-15&Unknown=1", "ValidationError"),
        (b"Action=GetCallerIdentity&Version=1999-01-01", "MalformedInput"),
        (b"Action=AssumeRole&Version=2011-06-15", "InvalidAction"),
        (b"Version=2011-06-15", "InvalidAction"),
    ],
)
def test_bad_sts_requests_get_the_query_protocols_error(
    served: dict[str, Any], body: bytes, code: str
) -> None:
    server, alpha = served["server"], served["alpha"]
    form = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    with httpx.Client(timeout=60) as http:
        response = _signed(http, server, "sts", body, form, alpha)
    assert 400 <= response.status_code < 500, response.text
    assert f"<Code>{code}</Code>" in response.text and "<Type>Sender</Type>" in response.text, response.text


def test_the_operation_header_must_be_signed_on_cloudwatch_logs(served: dict[str, Any]) -> None:
    server, alpha = served["server"], served["alpha"]
    headers = {
        "Content-Type": "application/x-amz-json-1.1",
        "X-Amz-Target": "Logs_20140328.DescribeLogGroups",
    }
    request = AWSRequest(method="POST", url=f"{server.url}/", data=b"{}", headers=headers)
    credentials = BotoCredentials(alpha.access_key, alpha.secret_key)
    SignerLeavingOut(credentials, "logs", REGION, leave_out=frozenset({"X-Amz-Target"})).add_auth(request)
    prepared = request.prepare()
    response = httpx.post(prepared.url, content=b"{}", headers=dict(prepared.headers), timeout=60)
    assert response.status_code == 403 and "'X-Amz-Target'" in response.json()["message"], response.text


def test_unsigned_requests_reach_no_api(served: dict[str, Any]) -> None:
    server = served["server"]
    target = {"X-Amz-Target": "Logs_20140328.DescribeLogGroups", "Content-Type": "application/x-amz-json-1.1"}
    response = httpx.post(f"{server.url}/", content=b"{}", headers=target, timeout=60)
    assert response.status_code in (400, 403) and "MissingAuthenticationToken" in response.text
    assert httpx.get(f"{server.url}/healthz", timeout=60).status_code == 200
