"""The HTTP application: the SageMaker endpoint, the native API, S3, the console and the health check."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from hyperplan.console.app import routes as console_routes
from hyperplan.errors import HyperplanError, MethodNotAllowed, UnknownRoute
from hyperplan.server import native, native_buckets, native_users, native_webhooks
from hyperplan.server.body_limit import BodyLimit
from hyperplan.server.errors import error_response_for_path
from hyperplan.server.limits import ServerLimits
from hyperplan.server.s3 import endpoint as s3_endpoint
from hyperplan.server.sagemaker import sagemaker_endpoint
from hyperplan.services.context import ServiceContext
from hyperplan.wire import sigv4


class Lifespan(Protocol):
    """What the server starts before its first request and stops after its last (the composition root)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


async def no_route(request: Request, exc: Exception) -> Response:
    """An unknown path or method is answered in its API's error shape, like every other refusal."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    error: HyperplanError = (
        MethodNotAllowed(f"{request.url.path} does not take {request.method}; docs/API.md lists the routes.")
        if status == 405
        else UnknownRoute(f"There is no route {request.method} {request.url.path}; docs/API.md lists them.")
    )
    return error_response_for_path(request.url.path, error, str(uuid.uuid4()))


async def healthz(request: Request) -> Response:
    runtime: ServiceContext = request.app.state.runtime
    return JSONResponse(
        {
            "status": "ok",
            "clock": runtime.clock.kind,
            "region": runtime.region,
            "isolation": runtime.settings.isolation,
        }
    )


_NOT_S3_PREFIXES = ("/console", "/api/")


def is_s3(scope: Scope) -> bool:
    """Whether S3 answers the request: its SigV4 credential scope names the service ``s3`` (in the
    Authorization header or the ``X-Amz-Credential`` query parameter); or it is unsigned and looks like
    S3's (not the health check, the console or the native API, and a POST only with S3's ``?delete``,
    ``?uploads`` or ``?uploadId``; other POSTs are SageMaker's), so that S3 refuses it with its own
    AccessDenied."""
    headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
    service = sigv4.credential_service(headers, scope.get("query_string", b"").decode("latin-1"))
    if service is not None:
        return service == "s3"
    path = scope["path"]
    if path == "/healthz" or path.startswith(_NOT_S3_PREFIXES):
        return False
    if scope["method"] == "POST":  # SageMaker's, unless it is one of S3's POSTs
        return any(name in _S3_POSTS for name in _query_names(scope.get("query_string", b"")))
    return True


_S3_POSTS = frozenset({"delete", "uploads", "uploadId"})


def _query_names(raw: bytes) -> list[str]:
    return [part.split(b"=", 1)[0].decode("latin-1") for part in raw.split(b"&") if part]


class S3Dispatch:
    """S3's requests go to server/s3 before the JSON APIs' body cap (server/body_limit.py): S3 streams
    its bodies to disk under limits of its own."""

    def __init__(self, app: ASGIApp, context: ServiceContext, limits: ServerLimits) -> None:
        self.app = app
        self.context = context
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_s3(scope):
            await s3_endpoint.serve(scope, receive, send, self.context, self.limits)
            return
        await self.app(scope, receive, send)


def create_app(
    context: ServiceContext, life: Lifespan | None = None, limits: ServerLimits | None = None
) -> Starlette:
    """The app over an opened context; `life` (the composition root) is started and stopped with the
    server. Without it nothing is started: an app only to read its routes."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if life is not None:
            life.start()  # missed events run here, before the first request is served
        try:
            yield
        finally:
            if life is not None:
                life.stop()

    routes = [
        Route("/", sagemaker_endpoint, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        *native.routes(),
        *native_webhooks.routes(),
        *native_buckets.routes(),
        *native_users.routes(),
        *console_routes(),  # the web console under /console (hyperplan/console)
    ]
    limits = limits or ServerLimits()
    # Every route's body is capped and read here, once, before any handler or authentication runs; but
    # S3's, which goes to its own endpoint first.
    middleware = [
        Middleware(S3Dispatch, context=context, limits=limits),
        Middleware(BodyLimit, limits=limits),
    ]
    handlers = {404: no_route, 405: no_route}
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers)
    app.state.runtime = context  # what every handler and service works with
    return app
