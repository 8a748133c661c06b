"""Signed means signed: a captured or presigned request cannot be turned into another one.

Each attack is a request botocore really signed, then altered the way an attacker who holds it could:
another X-Amz-Target, another body under an unsigned payload hash, a presigned URL put to another use.
Each is refused with a 403 naming what must be signed, and nothing changes on the server.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import pytest
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotocoreCredentials

from hyperplan.signing import Credentials
from tests.harness import ADMIN, RAW_HTTP, REGION, Server, SignerLeavingOut

JSON_11 = "application/x-amz-json-1.1"
ROLE = "arn:aws:iam::123456789012:role/hyperpod"


def _signed_headers(
    server: Server,
    path: str,
    body: bytes,
    headers: dict[str, str],
    *,
    credentials: Credentials = ADMIN,
    method: str = "POST",
    leave_out: frozenset[str] = frozenset(),
    payload_signed: bool = True,
) -> dict[str, str]:
    """The headers botocore sends for this request (the Host it signed among them)."""
    request = AWSRequest(method=method, url=f"{server.url}{path}", data=body, headers=dict(headers))
    request.context["payload_signing_enabled"] = payload_signed  # False: botocore's UNSIGNED-PAYLOAD mode
    request.headers["Host"] = urlsplit(server.url).netloc
    SignerLeavingOut(
        BotocoreCredentials(credentials.access_key, credentials.secret_key),
        "sagemaker",
        REGION,
        leave_out=leave_out,
    ).add_auth(request)
    return dict(request.headers.items())


def _presigned_url(server: Server, method: str, path: str, *, unsigned_payload: bool) -> str:
    """A presigned URL from botocore's SigV4QueryAuth that signs only the host, valid five minutes.

    ``unsigned_payload``: signed as presigned URLs usually are, leaving the body out (botocore does so
    for an https URL with payload signing off; the scheme is not part of what is signed).
    """
    scheme = "https" if unsigned_payload else "http"
    request = AWSRequest(method=method, url=f"{scheme}://{urlsplit(server.url).netloc}{path}")
    request.context["payload_signing_enabled"] = not unsigned_payload
    credentials = BotocoreCredentials(ADMIN.access_key, ADMIN.secret_key)
    SigV4QueryAuth(credentials, "sagemaker", REGION, expires=300).add_auth(request)
    return server.url + request.url.split(urlsplit(server.url).netloc, 1)[1]


def _post(server: Server, headers: dict[str, str], body: bytes, path: str = "/") -> httpx.Response:
    return RAW_HTTP.post(f"{server.url}{path}", headers=headers, content=body)


def _refused(response: httpx.Response, *words: str) -> str:
    """The refusal's message, after checking it is a 403 InvalidSignatureException on either API."""
    assert response.status_code == 403, response.text
    payload = response.json()
    error = payload.get("Error", payload)
    code = error.get("Code", error.get("__type"))
    message = str(error.get("Message", error.get("message")))
    assert code == "InvalidSignatureException", payload
    for word in words:
        assert word in message, message
    return message


@pytest.fixture
def victim(fast_server: Server) -> Server:
    """An in-process server holding one cluster, "production", with no instances (so no node processes)."""
    fast_server.sagemaker().create_cluster(
        ClusterName="production",
        InstanceGroups=[
            {
                "InstanceGroupName": "controller",
                "InstanceType": "ml.m5.12xlarge",
                "InstanceCount": 0,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
            }
        ],
    )
    return fast_server


def _production_is_intact(server: Server) -> bool:
    cluster = server.sagemaker().describe_cluster(ClusterName="production")
    return bool(cluster["ClusterStatus"] not in ("Deleting", "Failed"))


def test_describe_cluster_signed_without_its_target_cannot_be_replayed_as_delete_cluster(
    victim: Server,
) -> None:
    body = json.dumps({"ClusterName": "production"}).encode()
    headers = _signed_headers(
        victim,
        "/",
        body,
        {"Content-Type": JSON_11, "X-Amz-Target": "SageMaker.DescribeCluster"},
        leave_out=frozenset({"x-amz-target"}),
    )
    assert "x-amz-target" not in headers["Authorization"]
    # The request as signed is refused already, naming the header...
    _refused(_post(victim, headers, body), "'X-Amz-Target' must be a 'SignedHeader'", "SageMaker API")
    # ...so its replay with another operation on the same body is too.
    replayed = {**headers, "X-Amz-Target": "SageMaker.DeleteCluster"}
    _refused(_post(victim, replayed, body), "'X-Amz-Target' must be a 'SignedHeader'")
    assert _production_is_intact(victim)


def test_list_training_plans_signed_by_botocore_cannot_be_replayed_as_delete_cluster(victim: Server) -> None:
    # botocore signs the target, so the swap breaks the signature: the baseline the rest must match.
    headers = _signed_headers(
        victim, "/", b"{}", {"Content-Type": JSON_11, "X-Amz-Target": "SageMaker.ListTrainingPlans"}
    )
    assert _post(victim, headers, b"{}").status_code == 200
    replayed = {**headers, "X-Amz-Target": "SageMaker.DeleteCluster"}
    _refused(_post(victim, replayed, b'{"ClusterName": "production"}'))
    assert _production_is_intact(victim)


def test_unsigned_payload_is_refused_so_a_body_cannot_be_swapped(victim: Server) -> None:
    body = json.dumps({"ClusterName": "scratch"}).encode()
    headers = _signed_headers(
        victim,
        "/",
        body,
        {"Content-Type": JSON_11, "X-Amz-Target": "SageMaker.DeleteCluster"},
        payload_signed=False,
    )
    assert headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    _refused(_post(victim, headers, body), "'UNSIGNED-PAYLOAD' is not accepted", "the body must be signed")
    _refused(_post(victim, headers, json.dumps({"ClusterName": "production"}).encode()), "UNSIGNED-PAYLOAD")
    assert _production_is_intact(victim)


def test_unsigned_payload_is_refused_on_the_native_api(fast_server: Server) -> None:
    # An administrator's request to create a modest account, its body swapped for an administrator's.
    body = json.dumps({"Name": "intern"}).encode()
    headers = _signed_headers(
        fast_server, "/api/v1/accounts", body, {"Content-Type": "application/json"}, payload_signed=False
    )
    _refused(_post(fast_server, headers, body, "/api/v1/accounts"), "'UNSIGNED-PAYLOAD' is not accepted")
    swapped = json.dumps({"Name": "intruder", "Admin": True}).encode()
    _refused(_post(fast_server, headers, swapped, "/api/v1/accounts"), "UNSIGNED-PAYLOAD")
    names = {account["Name"] for account in fast_server.native().get("/api/v1/accounts")["Accounts"]}
    assert not names & {"intern", "intruder"}


def test_declared_payload_hash_must_be_the_received_bodys(fast_shared_server: Server) -> None:
    headers = _signed_headers(
        fast_shared_server,
        "/",
        b"{}",
        {
            "Content-Type": JSON_11,
            "X-Amz-Target": "SageMaker.ListTrainingPlans",
            "X-Amz-Content-SHA256": "0" * 64,
        },
    )
    _refused(_post(fast_shared_server, headers, b"{}"), "'x-amz-content-sha256' header does not match")


def test_presigned_url_cannot_run_delete_cluster(victim: Server) -> None:
    url = _presigned_url(victim, "POST", "/", unsigned_payload=True)
    headers = {
        "Content-Type": JSON_11,
        "X-Amz-Target": "SageMaker.DeleteCluster",
        "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
    }
    response = httpx.post(url, headers=headers, content=b'{"ClusterName": "production"}', timeout=60)
    assert _refused(response) == (
        "The SageMaker API does not accept presigned URLs (X-Amz-Signature in the query string); "
        "sign the request with an Authorization header instead."
    )
    assert _production_is_intact(victim)


@pytest.mark.parametrize("unsigned_payload", [False, True], ids=["body-hashed", "body-unsigned"])
def test_presigned_url_for_a_native_route_is_refused(
    fast_shared_server: Server, unsigned_payload: bool
) -> None:
    url = _presigned_url(fast_shared_server, "GET", "/api/v1/whoami", unsigned_payload=unsigned_payload)
    headers = {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"} if unsigned_payload else {}
    response = httpx.get(url, headers=headers, timeout=60)
    assert _refused(response) == (
        "The native API does not accept presigned URLs (X-Amz-Signature in the query string); "
        "sign the request with an Authorization header instead."
    )


@pytest.mark.parametrize(
    ("path", "headers", "leave_out", "named"),
    [
        ("/", {"X-Amz-Target": "SageMaker.ListTrainingPlans"}, {"x-amz-date"}, "'X-Amz-Date'"),
        ("/", {"X-Amz-Target": "SageMaker.ListTrainingPlans"}, {"host"}, "'Host'"),
        ("/api/v1/whoami", {}, {"x-amz-date"}, "'X-Amz-Date'"),
        ("/api/v1/whoami", {}, {"host"}, "'Host'"),
    ],
    ids=["sagemaker-date", "sagemaker-host", "native-date", "native-host"],
)
def test_host_and_date_must_be_signed_on_both_apis(
    fast_shared_server: Server, path: str, headers: dict[str, str], leave_out: set[str], named: str
) -> None:
    method = "POST" if path == "/" else "GET"
    body = b"{}" if method == "POST" else b""
    signed = _signed_headers(
        fast_shared_server,
        path,
        body,
        {"Content-Type": JSON_11, **headers},
        method=method,
        leave_out=frozenset(leave_out),
    )
    response = httpx.request(
        method, f"{fast_shared_server.url}{path}", headers=signed, content=body, timeout=60
    )
    _refused(response, f"{named} must be a 'SignedHeader'")


def test_boto3_the_aws_cli_and_the_hyperplan_cli_still_work(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("signing-team")
    assert fast_shared_server.sagemaker(team).list_training_plans()["TrainingPlanSummaries"] == []
    assert fast_shared_server.aws("sagemaker", "list-clusters", credentials=team)["ClusterSummaries"] == []
    assert fast_shared_server.native(team).get("/api/v1/whoami")["AccountName"] == "signing-team"
    assert "signing-team" in fast_shared_server.cli("accounts", "list").stdout
