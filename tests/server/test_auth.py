"""Every request is signed by a known, unrevoked key; freshness follows the real clock, not the service's."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.routing import Route

from hyperplan import metrics
from hyperplan.errors import MethodNotAllowed
from hyperplan.server.app import create_app, no_route
from hyperplan.server.body_limit import BodyLimit
from hyperplan.server.errors import AMZ_JSON
from hyperplan.server.limits import ServerLimits
from hyperplan.server.routing import aws_endpoint, json_api
from hyperplan.server.sagemaker import LOGS, SAGEMAKER
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.signing import Credentials, sign_request
from tests.harness import ADMIN, Server, signed_post
from tests.inprocess import InProcessServer


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_unsigned_request_is_refused(fast_shared_server: Server) -> None:
    response = httpx.post(
        f"{fast_shared_server.url}/", content=b"{}", headers={"X-Amz-Target": "SageMaker.ListTrainingPlans"}
    )
    assert response.status_code == 403
    assert response.json()["__type"] == "MissingAuthenticationTokenException"


def test_unknown_access_key_is_refused(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(Credentials("AKHPNOSUCHKEY0000000", "whatever"))
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "UnrecognizedClientException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_wrong_secret_is_refused(fast_shared_server: Server) -> None:
    client = fast_shared_server.sagemaker(Credentials(ADMIN.access_key, "not-the-secret"))
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "InvalidSignatureException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_signature_twenty_minutes_old_is_refused(fast_shared_server: Server) -> None:
    twenty_minutes_ago = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=20)
    response = signed_post(
        fast_shared_server, "SageMaker.ListTrainingPlans", b"{}", signed_at=twenty_minutes_ago
    )
    assert response.status_code == 403
    assert response.json()["__type"] == "InvalidSignatureException"
    assert "expired" in response.json()["message"]


def test_fresh_signature_works_after_the_manual_clock_moves_a_week(fast_server: Server) -> None:
    fast_server.native().post("/api/v1/clock/advance", {"Duration": "7d"})
    assert fast_server.sagemaker().list_training_plans()["TrainingPlanSummaries"] == []
    response = signed_post(fast_server, "SageMaker.ListTrainingPlans", b"{}")
    assert response.status_code == 200


def test_revoked_key_is_refused_on_its_next_request(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("revoked-team")
    client = fast_shared_server.sagemaker(team)
    assert client.list_training_plans()["TrainingPlanSummaries"] == []
    fast_shared_server.native(team).post("/api/v1/keys")  # not the account's last active key
    fast_shared_server.cli("accounts", "revoke-key", team.access_key)
    with pytest.raises(ClientError) as exc:
        client.list_training_plans()
    assert _code(exc) == "UnrecognizedClientException"


def test_the_aws_cli_is_authenticated_and_refused_with_a_bad_key(fast_shared_server: Server) -> None:
    assert fast_shared_server.aws("sagemaker", "list-training-plans") == {"TrainingPlanSummaries": []}
    refused = fast_shared_server.aws(
        "sagemaker", "list-training-plans", credentials=Credentials("AKHPNOSUCHKEY0000000", "x"), check=False
    )
    assert refused.returncode != 0
    assert "UnrecognizedClientException" in refused.stderr


# -- the front door's own answers to POST / ------------------------------------------------------------
# SageMaker's and CloudWatch Logs' POST / is answered by the front door (server/routing.AwsFront) straight
# from ASGI; every other request goes through Starlette's router. Each request below is sent, in this
# process, both to the app and to the same context behind only the body cap and the router, as POST /
# was served before the front door answered it: the answers must be the same, but for the request id.

Answer = tuple[int, list[tuple[bytes, bytes]], bytes]
SMALL_CAP = 512  # bytes: the body cap of both apps here


def _scope(method: str, headers: dict[str, str], body: bytes, query: bytes = b"") -> dict[str, Any]:
    raw = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    if body:
        raw.append((b"content-length", str(len(body)).encode()))
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/",
        "raw_path": b"/",
        "query_string": query,
        "root_path": "",
        "headers": raw,
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }


def _call(app: Any, scope: dict[str, Any], body: bytes) -> Answer:
    """The app's answer, its request id (header and text) written as REQUEST-ID."""
    sent: list[dict[str, Any]] = []
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(dict(scope), receive, send))
    start, *rest = sent
    content = b"".join(message.get("body", b"") for message in rest)
    ids = [v for k, v in start["headers"] if k in (b"x-amzn-requestid", b"x-amz-request-id")]
    for request_id in ids:
        content = content.replace(request_id, b"REQUEST-ID")
    headers = [(k, b"REQUEST-ID" if v in ids else v) for k, v in start["headers"]]
    # The length of a text that held the id: the same once the ids are the same length (UUIDs).
    return start["status"], headers, content


def _routed(context: ServiceContext, limits: ServerLimits) -> Starlette:
    """POST / as the router serves it: the body cap, then aws_endpoint (404s and 405s as the app's)."""
    app = Starlette(
        routes=[Route("/", aws_endpoint, methods=["POST"])],
        middleware=[Middleware(BodyLimit, limits=limits)],
        exception_handlers={404: no_route, 405: no_route},
    )
    app.state.runtime = context
    return app


def _context(server: InProcessServer) -> ServiceContext:
    assert server.runtime is not None, "the server is running"
    return server.runtime.context


def _signed(context: ServiceContext, service: str, target: str | None, body: bytes) -> dict[str, str]:
    headers = {"Content-Type": "application/x-amz-json-1.1"}
    if target is not None:
        headers["X-Amz-Target"] = target
    return sign_request(
        "POST",
        "http://127.0.0.1:8080/",
        headers=headers,
        body=body,
        access_key=ADMIN.access_key,
        secret_key=ADMIN.secret_key,
        region=context.region,
        service=service,
    )


FRONT_DOOR_CASES = {
    "a served operation": ("sagemaker", "SageMaker.ListTrainingPlans", b"{}"),
    "an unknown target": ("sagemaker", "SageMaker.NoSuchOperation", b"{}"),
    "a real operation not served": ("sagemaker", "SageMaker.ListModels", b"{}"),
    "a target of another API": ("sagemaker", "Logs_20140328.DescribeLogGroups", b"{}"),
    "no target": ("sagemaker", None, b"{}"),
    "a body that is not JSON": ("sagemaker", "SageMaker.ListTrainingPlans", b"{not json"),
    "a bad member": ("sagemaker", "SageMaker.ListTrainingPlans", b'{"MaxResults": "many"}'),
    "an unknown service": ("ec2", "SageMaker.ListTrainingPlans", b"{}"),
    "CloudWatch Logs": ("logs", "Logs_20140328.DescribeLogGroups", b"{}"),
    "CloudWatch Logs, a bad member": ("logs", "Logs_20140328.DescribeLogGroups", b'{"limit": "x"}'),
    "CloudWatch Logs, an unknown target": ("logs", "Logs_20140328.NoSuchOperation", b"{}"),
    "STS": ("sts", None, b"Action=GetCallerIdentity&Version=2011-06-15"),
    "a body over the cap": (
        "sagemaker",
        "SageMaker.ListTrainingPlans",
        b'{"NameContains": "' + b"x" * SMALL_CAP + b'"}',
    ),
}


@pytest.mark.parametrize("case", FRONT_DOOR_CASES)
def test_the_front_door_answers_post_slash_as_the_router_did(
    fast_shared_server: InProcessServer, case: str
) -> None:
    service, target, body = FRONT_DOOR_CASES[case]
    context = _context(fast_shared_server)
    limits = ServerLimits(max_body_bytes=SMALL_CAP)
    scope = _scope("POST", _signed(context, service, target, body), body)
    front = _call(create_app(context, limits=limits), scope, body)
    assert front == _call(
        _routed(context, limits), _scope("POST", _signed(context, service, target, body), body), body
    )
    taken = json_api(scope)
    assert (taken is None) == (service == "sts"), "STS alone goes on to the router"
    if case == "a served operation":  # the headers Starlette's Response would have written
        status, headers, content = front
        expected = Response(content, media_type=AMZ_JSON, headers={"x-amzn-RequestId": "REQUEST-ID"})
        assert (status, headers) == (200, expected.raw_headers)
    if case == "a body over the cap":
        assert front[0] == 413 and (b"connection", b"close") in front[1]


def test_an_unsigned_post_slash_is_refused_by_the_front_door_as_by_the_router(
    fast_shared_server: InProcessServer,
) -> None:
    context = _context(fast_shared_server)
    body = b"{}"
    scope = _scope("POST", {"X-Amz-Target": "SageMaker.ListTrainingPlans"}, body)
    front = _call(create_app(context), scope, body)
    assert json_api(scope) is SAGEMAKER
    assert front == _call(_routed(context, ServerLimits()), scope, body)
    assert front[0] == 403 and b"MissingAuthenticationTokenException" in front[2]


def test_the_front_door_leaves_s3_and_other_methods_to_whom_they_were_for(
    fast_shared_server: InProcessServer,
) -> None:
    context = _context(fast_shared_server)
    app = create_app(context)
    # An unsigned GET / looks like S3's ListBuckets: S3 refuses it in its XML.
    status, _, content = _call(app, _scope("GET", {}, b""), b"")
    assert status == 403 and b"<Code>AccessDenied</Code>" in content
    # A POST / signed for S3 is S3's, never SageMaker's.
    s3_signed = _signed(context, "s3", None, b"")
    status, _, content = _call(app, _scope("POST", s3_signed, b""), b"")
    assert b"<Error>" in content and b"__type" not in content
    assert json_api(_scope("POST", s3_signed, b"")) is SAGEMAKER  # S3 is decided first, by is_s3
    # A GET / signed for SageMaker: POST is the only method of /, answered in SageMaker's shape.
    signed = _signed(context, "sagemaker", "SageMaker.ListTrainingPlans", b"")
    status, _, content = _call(app, _scope("GET", signed, b""), b"")
    assert status == 405 and json.loads(content)["__type"] == MethodNotAllowed("").code
    assert json_api(_scope("GET", signed, b"")) is None
    # A POST / signed for Logs goes to Logs' adapter: its own error codes.
    assert json_api(_scope("POST", _signed(context, "logs", None, b"{}"), b"{}")) is LOGS


def test_the_front_door_counts_its_answers(fast_shared_server: InProcessServer) -> None:
    context = _context(fast_shared_server)
    app = create_app(context)

    def answered(operation: str, code: str) -> float:
        labels = {"api": "sagemaker", "operation": operation, "code": code}
        return metrics.INSTRUMENTS.get_sample_value("hyperplan_requests_total", labels) or 0.0

    before = answered("ListTrainingPlans", "200"), answered("unknown", "400")
    for target in ("SageMaker.ListTrainingPlans", "SageMaker.NoSuchOperation"):
        _call(app, _scope("POST", _signed(context, "sagemaker", target, b"{}"), b"{}"), b"{}")
    assert (answered("ListTrainingPlans", "200"), answered("unknown", "400")) == (
        before[0] + 1,
        before[1] + 1,
    )
