"""The HTTP application: the SageMaker endpoint, the native API and the health check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hyperplan.runtime import Runtime
from hyperplan.server import native, native_webhooks
from hyperplan.server.body_limit import BodyLimit
from hyperplan.server.limits import ServerLimits
from hyperplan.server.sagemaker import sagemaker_endpoint


async def healthz(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    return JSONResponse({"status": "ok", "clock": runtime.clock.kind, "region": runtime.region})


def create_app(runtime: Runtime, limits: ServerLimits | None = None) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        runtime.start()  # missed events run here, before the first request is served
        try:
            yield
        finally:
            runtime.stop()

    routes = [
        Route("/", sagemaker_endpoint, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        *native.routes(),
        *native_webhooks.routes(),
    ]
    # Every route's body is capped and read here, once, before any handler or authentication runs.
    middleware = [Middleware(BodyLimit, limits=limits or ServerLimits())]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.runtime = runtime
    return app
