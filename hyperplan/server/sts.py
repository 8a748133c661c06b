"""The STS wire adapter: the query protocol on POST /, for requests signed with the scope ``sts``.

Protocol only, as the JSON adapters: authenticate, find the operation (``Action``) in botocore's STS
model, validate its members against the input shape, call the handler off the event loop, check the
result against the output shape and write it as the query protocol's XML.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from hyperplan.core.rate_limits import RequestClass
from hyperplan.server import auth
from hyperplan.server.errors import STS_NAMESPACE, sts_error_response
from hyperplan.server.request_ids import new_request_id
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire import model, query, registry, serialize, validate
from hyperplan.wire.registry import RequestContext


async def sts_endpoint(request: Request) -> Response:
    request_id = new_request_id()
    runtime: ServiceContext = request.app.state.runtime
    try:
        body = await request.body()
        caller = await run_in_threadpool(auth.authenticate, runtime, request, body, model.STS, auth.STS_API)
        runtime.rate_limiter.admit(caller, RequestClass.READ, runtime.fleet.rate_limits)
        version = model.service_model(model.STS).api_version
        action, fields = query.parse_body(body, version)
        operation = model.operation_model(action, model.STS)
        handler = registry.handler_for(operation.name, model.STS)
        params = validate.parse_request(operation, dict(fields))
        context = RequestContext(runtime=runtime, caller=caller, request_id=request_id)
        result = await run_in_threadpool(handler, context, params)
        payload = serialize.serialize_response(operation, result)
        xml = query.render_response(operation, payload, STS_NAMESPACE, request_id)
    except Exception as exc:  # every error becomes a wire response in one place
        return sts_error_response(exc, request_id)
    return Response(xml, media_type="text/xml", headers={"x-amzn-RequestId": request_id})
