"""One endpoint for the AWS toolchain: which service a request is for, from its SigV4 credential scope.

Every AWS client signs with a credential scope ``KEY/DATE/REGION/SERVICE/aws4_request``, in the
``Authorization`` header or, for a presigned URL, the ``X-Amz-Credential`` query parameter. The service
part says which API the client means: ``sagemaker`` (the SageMaker API on POST /, and the native API
under /api/v1/), ``logs`` (CloudWatch Logs on POST /), ``sts`` (STS on POST /), ``s3`` (S3, on any path).
The scope read here is only a hint for routing: each API verifies the whole signature for its own
service, so a request that lies about its scope fails there. Unsigned requests reach only /healthz and
the console (and the SageMaker adapter, which refuses them as AWS does).
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from hyperplan.server.sagemaker import logs_endpoint, sagemaker_endpoint
from hyperplan.server.sts import sts_endpoint

S3_SERVICE = "s3"


def credential_service(headers: Mapping[str, str], query: str = "") -> str | None:
    """The service of the request's credential scope, or None when it carries none (unsigned)."""
    authorization = headers.get("authorization")
    credential: str | None = None
    if authorization is not None:
        for part in authorization.partition(" ")[2].split(","):
            name, _, value = part.strip().partition("=")
            if name == "Credential":
                credential = value.strip()
                break
    elif "X-Amz-Credential" in query:
        credential = dict(parse_qsl(query, keep_blank_values=True)).get("X-Amz-Credential")
    if not credential:
        return None
    parts = credential.rsplit("/", 4)
    return parts[3] if len(parts) == 5 else None


async def aws_endpoint(request: Request) -> Response:
    """POST /: SageMaker, CloudWatch Logs or STS by the credential scope. Anything else (unsigned, an
    unknown service) goes to SageMaker's adapter, whose verifier gives AWS's answer for it."""
    service = credential_service(request.headers, request.url.query)
    if service == "logs":
        return await logs_endpoint(request)
    if service == "sts":
        return await sts_endpoint(request)
    return await sagemaker_endpoint(request)


class ServiceRouter:
    """The front of the app: requests scoped ``s3``, on any path and method, go to the S3 app (before the
    JSON APIs' body cap: S3 streams its bodies); everything else to the routes. The S3 handler (issue 22,
    point 4) plugs in here through ``create_app(s3=...)``; without one, S3 requests meet the routes and
    are refused there."""

    def __init__(self, app: ASGIApp, s3: ASGIApp | None = None) -> None:
        self.app = app
        self.s3 = s3

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.s3 is not None and scope["type"] == "http":
            headers = {
                key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]
            }
            query = scope.get("query_string", b"").decode("latin-1")
            if credential_service(headers, query) == S3_SERVICE:
                await self.s3(scope, receive, send)
                return
        await self.app(scope, receive, send)
