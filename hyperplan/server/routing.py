"""One endpoint for the AWS toolchain: which service a request is for, from its SigV4 credential scope.

Every AWS client signs with a credential scope ``KEY/DATE/REGION/SERVICE/aws4_request``, in the
``Authorization`` header or, for a presigned URL, the ``X-Amz-Credential`` query parameter. The service
part says which API the client means: ``sagemaker`` (the SageMaker API on POST /, and the native API
under /api/v1/), ``logs`` (CloudWatch Logs on POST /), ``sts`` (STS on POST /), ``s3`` (S3, on any path).
The scope read here is only a hint for routing: each API verifies the whole signature for its own
service, so a request that lies about its scope fails there. Unsigned requests reach only /healthz and
the console and its /favicon.ico (and the SageMaker adapter, which refuses them as AWS does); an unsigned
request that looks like S3's gets S3's AccessDenied.
"""

from __future__ import annotations

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from hyperplan.server.limits import ServerLimits
from hyperplan.server.s3 import endpoint as s3_endpoint
from hyperplan.server.sagemaker import LOGS, SAGEMAKER, JsonApi, logs_endpoint, sagemaker_endpoint, serve_json
from hyperplan.server.sts import sts_endpoint
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire.sigv4 import credential_service
from hyperplan.wire.sigv4_claim import credential_service_of

S3_SERVICE = "s3"


async def aws_endpoint(request: Request) -> Response:
    """POST /: SageMaker, CloudWatch Logs or STS by the credential scope. Anything else (unsigned, an
    unknown service) goes to SageMaker's adapter, whose verifier gives AWS's answer for it."""
    service = credential_service(request.headers, request.url.query)
    if service == "logs":
        return await logs_endpoint(request)
    if service == "sts":
        return await sts_endpoint(request)
    return await sagemaker_endpoint(request)


_NOT_S3_PREFIXES = ("/console", "/api/")
_NOT_S3_PATHS = frozenset({"/healthz", "/favicon.ico"})  # the icon: browsers ask for it on every page
_S3_POSTS = frozenset({"delete", "uploads", "uploadId"})


def is_s3(scope: Scope) -> bool:
    """Whether S3 answers the request: its credential scope names the service ``s3``; or it is unsigned
    and looks like S3's (not the health check, the console, the site's icon or the native API, and a POST
    only with S3's ``?delete``, ``?uploads`` or ``?uploadId``; other POSTs are SageMaker's), so that S3
    refuses it with its own AccessDenied."""
    # Only the Authorization header names a scope (servers give header names in lower case).
    sent = [value for name, value in scope["headers"] if name == b"authorization"]
    headers = {"authorization": sent[-1].decode("latin-1")} if sent else {}  # the last, as a dict keeps
    service = credential_service(headers, scope.get("query_string", b"").decode("latin-1"))
    if service is not None:
        return service == S3_SERVICE
    path = scope["path"]
    if path in _NOT_S3_PATHS or path.startswith(_NOT_S3_PREFIXES):
        return False
    if scope["method"] == "POST":  # SageMaker's, unless it is one of S3's POSTs
        return any(name in _S3_POSTS for name in _query_names(scope.get("query_string", b"")))
    return True


def _query_names(raw: bytes) -> list[str]:
    return [part.split(b"=", 1)[0].decode("latin-1") for part in raw.split(b"&") if part]


class AwsFront:
    """The front of the app, before Starlette's middleware and router:

    - S3's requests (``is_s3``), on any path and method, go to server/s3 before the JSON APIs' body cap
      (server/body_limit.py): S3 streams its bodies to disk under limits of its own;
    - POST / for SageMaker or CloudWatch Logs (``json_api``), the busiest requests by far, is answered
      here from the ASGI scope (``server/sagemaker.serve_json``: the same body cap, request id, metrics
      and error shapes), without the middleware, router, Request and Response that cost a search more
      CPU than verifying its signature;
    - everything else (STS, the native API, the console, /healthz, the 404s and 405s) goes on to the
      routes, through the body cap."""

    def __init__(self, app: ASGIApp, context: ServiceContext, limits: ServerLimits) -> None:
        self.app = app
        self.context = context
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if is_s3(scope):
                await s3_endpoint.serve(scope, receive, send, self.context, self.limits)
                return
            api = json_api(scope)
            if api is not None:
                await serve_json(scope, receive, send, api, self.context, self.limits)
                return
        await self.app(scope, receive, send)


def json_api(scope: Scope) -> JsonApi | None:
    """The awsJson1.1 API a request that is not S3's is for, if it is one: POST / (as the router matches
    it) with the credential scope ``logs`` (CloudWatch Logs) or anything but ``sts`` (SageMaker, whose
    verifier answers an unsigned request or an unknown service as ``aws_endpoint`` would)."""
    if scope["method"] != "POST" or scope["path"] != "/" or scope.get("root_path"):
        return None
    authorizations = [value.decode("latin-1") for name, value in scope["headers"] if name == b"authorization"]
    # The query as request.url gives it (Starlette's URL), only when there is one.
    query = URL(scope=scope).query if scope.get("query_string") else ""
    service = credential_service_of(authorizations, query)
    if service == "sts":
        return None
    return LOGS if service == "logs" else SAGEMAKER
