"""The awsJson1.1 wire adapters on POST /: SageMaker (X-Amz-Target: SageMaker.<Operation>) and CloudWatch
Logs (X-Amz-Target: Logs_20140328.<Operation>), told apart by the signature's credential scope
(``server/routing.py``).

Protocol only: authenticate for the API's service, find the operation, validate the body against
botocore's model of that service, call the handler off the event loop, and serialise its result from
the model's output shape. One adapter, one description per API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hyperplan.core.rate_limits import RequestClass, sagemaker_class
from hyperplan.errors import UnknownOperation
from hyperplan.server import auth
from hyperplan.server.errors import AMZ_JSON, logs_error_response, sagemaker_error_response
from hyperplan.server.request_ids import new_request_id
from hyperplan.server.request_metrics import counted_request
from hyperplan.services.context import ServiceContext
from hyperplan.wire import model, registry, serialize, validate
from hyperplan.wire.registry import RequestContext
from hyperplan.wire.sigv4 import SigningPolicy

TARGET_PREFIX = "SageMaker."


@dataclass(frozen=True)
class JsonApi:
    service: str
    """The credential scope's service, the botocore model's name and the handlers' table."""
    target_prefix: str
    policy: SigningPolicy
    error_response: Callable[[BaseException, str], Response]
    request_class: Callable[[str], RequestClass]


SAGEMAKER = JsonApi(
    model.SERVICE_NAME, TARGET_PREFIX, auth.SAGEMAKER_API, sagemaker_error_response, sagemaker_class
)
LOGS = JsonApi(
    model.LOGS, "Logs_20140328.", auth.LOGS_API, logs_error_response, lambda _name: RequestClass.READ
)
"""CloudWatch Logs: hyperplan serves only reads of it."""


async def sagemaker_endpoint(request: Request) -> Response:
    return await json_endpoint(request, SAGEMAKER)


async def logs_endpoint(request: Request) -> Response:
    return await json_endpoint(request, LOGS)


async def json_endpoint(request: Request, api: JsonApi) -> Response:
    with counted_request(api.service, _known_operation(request, api)) as count:
        return count(await _answer(request, api))


def _known_operation(request: Request, api: JsonApi) -> str:
    """The operation a request names, when the model has it (a label never takes a caller's text)."""
    name = request.headers.get("x-amz-target", "").removeprefix(api.target_prefix)
    return name if name in model.operation_names(api.service) else "unknown"


async def _answer(request: Request, api: JsonApi) -> Response:
    request_id = new_request_id()
    runtime: ServiceContext = request.app.state.runtime
    try:
        body = await request.body()
    except Exception as exc:
        return api.error_response(exc, request_id)
    # One hop to the thread pool per request: each hop costs the event loop a task, a queue and a wake
    # (a good share of a search's CPU), and everything after the body reads nothing from the loop.
    return await run_in_threadpool(_answer_sync, runtime, request, body, api, request_id)


def _answer_sync(
    runtime: ServiceContext, request: Request, body: bytes, api: JsonApi, request_id: str
) -> Response:
    try:
        caller = auth.authenticate(runtime, request, body, api.service, api.policy)
        operation = model.operation_model(_operation_name(request, api.target_prefix), api.service)
        runtime.rate_limiter.admit(caller, api.request_class(operation.name), runtime.fleet.rate_limits)
        handler = registry.handler_for(operation.name, api.service)
        params = validate.parse_request(operation, validate.decode_body(body))
        context = RequestContext(runtime=runtime, caller=caller, request_id=request_id)
        result = handler(context, params)
        payload = serialize.serialize_response(operation, result)
        # As JSONResponse renders, but here, off the event loop.
        content = json.dumps(
            payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        ).encode()
    except Exception as exc:  # every error becomes a wire response in one place
        return api.error_response(exc, request_id)
    return Response(content, media_type=AMZ_JSON, headers={"x-amzn-RequestId": request_id})


def _operation_name(request: Request, prefix: str) -> str:
    target = request.headers.get("x-amz-target", "")
    if not target.startswith(prefix):
        raise UnknownOperation(
            f"X-Amz-Target must be '{prefix}<Operation>'; got {target!r}."
            if target
            else f"The X-Amz-Target header is missing; it names the operation, as '{prefix}<Operation>'."
        )
    return target.removeprefix(prefix)
