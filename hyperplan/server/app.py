"""The HTTP application: the AWS endpoint (SageMaker, CloudWatch Logs, STS, S3), the native API, the
console and the health check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hyperplan.console.app import routes as console_routes
from hyperplan.errors import HyperplanError, MethodNotAllowed, UnknownRoute
from hyperplan.server import (
    native,
    native_auto_book,
    native_buckets,
    native_cancellation,
    native_clusters,
    native_exec,
    native_extension_policy,
    native_job_plans,
    native_lending,
    native_offerings,
    native_ops,
    native_registries,
    native_returns,
    native_users,
    native_webhooks,
)
from hyperplan.server.body_limit import BodyLimit
from hyperplan.server.errors import error_response_for_path
from hyperplan.server.limits import ServerLimits
from hyperplan.server.request_ids import new_request_id
from hyperplan.server.routing import AwsFront, aws_endpoint
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire import model


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
    return error_response_for_path(request.url.path, error, new_request_id())


async def healthz(request: Request) -> Response:
    runtime: ServiceContext = request.app.state.runtime
    return JSONResponse(
        {
            "status": "ok",
            "clock": runtime.clock.kind,
            "region": runtime.region,
            "isolation": runtime.settings.isolation,
            "runtime": runtime.settings.runtime,  # core/runtime_choice.py
            "contained": runtime.settings.contained,
            "disks_bounded": runtime.settings.bounded_disks,  # backends/disks.py
        }
    )


def create_app(
    context: ServiceContext, life: Lifespan | None = None, limits: ServerLimits | None = None
) -> Starlette:
    """The app over an opened context; `life` (the composition root) is started and stopped with the
    server. Without it nothing is started: an app only to read its routes."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Before the first request, not by it: the first requests of a new server arrive together.
        model.load_every_model()
        if life is not None:
            life.start()  # missed events run here, before the first request is served
        try:
            yield
        finally:
            if life is not None:
                life.stop()

    routes = [
        Route("/", aws_endpoint, methods=["POST"]),  # SageMaker, CloudWatch Logs, STS: server/routing.py
        Route("/healthz", healthz, methods=["GET"]),
        *native.routes(),
        *native_exec.routes(),  # exec: waits on threads of its own, not the shared pool
        *native_webhooks.routes(),
        *native_buckets.routes(),
        *native_users.routes(),
        *native_registries.routes(),  # registries and their credentials (administrators)
        *native_offerings.routes(),  # one search across instance types
        *native_clusters.routes(),  # an instance group's plans
        *native_job_plans.routes(),  # a training job's further plans
        *native_auto_book.routes(),  # a training job that books its own capacity
        *native_extension_policy.routes(),  # a plan's automatic extensions
        *native_lending.routes(),  # a plan's lending of its idle instances to spot jobs
        *native_returns.routes(),  # a plan's capacity returned: quote, then return
        *native_ops.routes(),  # audit trail, drain (docs/OPERATIONS.md)
        # cancellation policies, the fleet's and a plan's: after every other route, as its plan path
        # (/api/v1/training-plans/{plan:path}) would also match theirs
        *native_cancellation.routes(),
        *console_routes(),  # the web console under /console (hyperplan/console)
    ]
    limits = limits or ServerLimits()
    # Every route's body is capped and read here, once, before any handler or authentication runs; but
    # S3's, which goes to its own endpoint first (server/routing.py) and streams its bodies to disk, and
    # SageMaker's and CloudWatch Logs' POST /, which the front door answers itself under the same cap.
    middleware = [
        Middleware(AwsFront, context=context, limits=limits),
        Middleware(BodyLimit, limits=limits),
    ]
    handlers = {404: no_route, 405: no_route}
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers=handlers)
    app.state.runtime = context  # what every handler and service works with
    return app
