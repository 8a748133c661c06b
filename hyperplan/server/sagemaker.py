"""The SageMaker wire adapter: awsJson1.1 on POST / with X-Amz-Target: SageMaker.<Operation>.

Protocol only: authenticate, find the operation, validate the body against botocore's model, call the
handler off the event loop, and serialise its result from the model's output shape.
"""

from __future__ import annotations

import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hyperplan.core.rate_limits import sagemaker_class
from hyperplan.errors import UnknownOperation
from hyperplan.server.auth import authenticate
from hyperplan.server.errors import AMZ_JSON, sagemaker_error_response
from hyperplan.server.request_metrics import counted_request
from hyperplan.services.context import ServiceContext
from hyperplan.wire import model, registry, serialize, validate
from hyperplan.wire.registry import RequestContext

TARGET_PREFIX = "SageMaker."


async def sagemaker_endpoint(request: Request) -> Response:
    with counted_request("sagemaker", _known_operation(request)) as count:
        return count(await _answer(request))


def _known_operation(request: Request) -> str:
    """The operation a request names, when the model has it (a label never takes a caller's text)."""
    name = request.headers.get("x-amz-target", "").removeprefix(TARGET_PREFIX)
    return name if name in model.operation_names() else "unknown"


async def _answer(request: Request) -> Response:
    request_id = str(uuid.uuid4())
    runtime: ServiceContext = request.app.state.runtime
    try:
        body = await request.body()
        caller = await run_in_threadpool(authenticate, runtime, request, body)
        operation = model.operation_model(_operation_name(request))
        runtime.rate_limiter.admit(caller, sagemaker_class(operation.name), runtime.fleet.rate_limits)
        handler = registry.handler_for(operation.name)
        params = validate.parse_request(operation, validate.decode_body(body))
        context = RequestContext(runtime=runtime, caller=caller, request_id=request_id)
        result = await run_in_threadpool(handler, context, params)
        payload = serialize.serialize_response(operation, result)
    except Exception as exc:  # every error becomes a wire response in one place
        return sagemaker_error_response(exc, request_id)
    return JSONResponse(payload, media_type=AMZ_JSON, headers={"x-amzn-RequestId": request_id})


def _operation_name(request: Request) -> str:
    target = request.headers.get("x-amz-target", "")
    if not target.startswith(TARGET_PREFIX):
        raise UnknownOperation(
            f"X-Amz-Target must be 'SageMaker.<Operation>'; got {target!r}."
            if target
            else "The X-Amz-Target header is missing; it names the operation, as 'SageMaker.<Operation>'."
        )
    return target.removeprefix(TARGET_PREFIX)
