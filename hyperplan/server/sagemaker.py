"""The awsJson1.1 wire adapters on POST /: SageMaker (X-Amz-Target: SageMaker.<Operation>) and CloudWatch
Logs (X-Amz-Target: Logs_20140328.<Operation>), told apart by the signature's credential scope
(``server/routing.py``).

Protocol only: authenticate for the API's service, find the operation, validate the body against
botocore's model of that service, call the handler (in the thread pool, or on the event loop for a
search that needs nothing from the store: server/loop_or_pool.py), and serialise its result from the
model's output shape.
One adapter, one description per API. The front door (``server/routing.py``, ``AwsFront``) hands these
requests to `serve_json` straight from ASGI; `json_endpoint` answers the same way for a request routed
by Starlette (always in the thread pool).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.model import OperationModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hyperplan.core.rate_limits import RequestClass, sagemaker_class
from hyperplan.errors import UnknownOperation
from hyperplan.server import auth, loop_or_pool
from hyperplan.server.body_limit import capped_body
from hyperplan.server.errors import AMZ_JSON, logs_error_response, sagemaker_error_response
from hyperplan.server.limits import ServerLimits
from hyperplan.server.request_ids import new_request_id
from hyperplan.server.request_metrics import count_answer
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire import model, registry, serialize, validate
from hyperplan.wire.registry import Handler, RequestContext
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
    on_the_loop: frozenset[str] = frozenset()
    """The X-Amz-Target values first tried on the event loop (`serve_json`): operations that, with warm
    caches, need nothing from the store, and whose work is bounded CPU."""
    on_the_loop_with_sqlite: frozenset[str] = frozenset()
    """Those tried there too when the store is SQLite: their answer is most often a refusal read on a
    WAL snapshot, which waits for nothing (store/checked_write.py)."""

    def tried_on_the_loop(self, target: str, runtime: ServiceContext) -> bool:
        return target in self.on_the_loop or (target in self.on_the_loop_with_sqlite and runtime.db.is_sqlite)


SAGEMAKER = JsonApi(
    model.SERVICE_NAME,
    TARGET_PREFIX,
    auth.SAGEMAKER_API,
    sagemaker_error_response,
    sagemaker_class,
    # A search: the signer from the key cache, the quota check remembered under the change counters, the
    # live calendar in memory. Nothing else qualifies: every other operation reads the store.
    on_the_loop=frozenset({TARGET_PREFIX + "SearchTrainingPlanOfferings"}),
    # A purchase: under contention most are refused (capacity taken since the search), and a refusal is
    # found on a snapshot; one that passes waits for the writers' turn, in the pool.
    on_the_loop_with_sqlite=frozenset({TARGET_PREFIX + "CreateTrainingPlan"}),
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
    """The API's answer to a request that came through Starlette's router (what the front door leaves
    to it: see `serve_json`), always in the thread pool."""
    target = request.headers.get("x-amz-target", "")
    started = time.perf_counter()
    request_id = new_request_id()
    try:
        body = await request.body()
    except Exception as exc:
        answer = _Answer.of(api.error_response(exc, request_id))
    else:
        runtime: ServiceContext = request.app.state.runtime
        answer = await _answered(runtime, request.scope, body, target, api, request_id, on_the_loop=False)
    count_answer(api.service, _known_operation(target, api), answer.status, started)
    return answer.response()


async def serve_json(
    scope: Scope, receive: Receive, send: Send, api: JsonApi, runtime: ServiceContext, limits: ServerLimits
) -> None:
    """POST / for an awsJson1.1 API, straight from ASGI (``server/routing.AwsFront``): the body read under
    the front door's cap (``server/body_limit.capped_body``, its refusals as for any route), then the
    same answer, request id and metrics as through Starlette's router, without its middleware, router,
    Request and Response objects, which cost a search more CPU than authenticating it."""
    body = await capped_body(scope, receive, send, limits)
    if body is None:
        return  # refused, and answered, before any request id or metric, as for every route
    target = _first_header(scope, b"x-amz-target")
    started = time.perf_counter()
    request_id = new_request_id()
    on_the_loop = api.tried_on_the_loop(target, runtime)  # server/loop_or_pool.py
    answer = await _answered(runtime, scope, body, target, api, request_id, on_the_loop=on_the_loop)
    count_answer(api.service, _known_operation(target, api), answer.status, started)
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.content})


async def _answered(
    runtime: ServiceContext,
    scope: Scope,
    body: bytes,
    target: str,
    api: JsonApi,
    request_id: str,
    *,
    on_the_loop: bool,
) -> _Answer:
    try:
        content = await loop_or_pool.answer(
            lambda: _admit(runtime, scope, body, target, api, request_id),
            _respond,
            on_the_loop=on_the_loop,
            read_ahead=runtime.db.counters_read_ahead,
        )
    except Exception as exc:  # every error becomes a wire response in one place
        return _Answer.of(api.error_response(exc, request_id))
    return _Answer.ok(content, request_id)


@dataclass(frozen=True)
class _Answer:
    """A response as ASGI sends it: status, raw headers, body (as Starlette's Response would have)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    content: bytes

    @staticmethod
    def of(response: Response) -> _Answer:
        return _Answer(response.status_code, response.raw_headers, bytes(response.body))

    @staticmethod
    def ok(content: bytes, request_id: str) -> _Answer:
        # Response(content, media_type=AMZ_JSON, headers={"x-amzn-RequestId": ...})'s headers, in order.
        headers = [
            (b"x-amzn-requestid", request_id.encode("latin-1")),
            (b"content-length", str(len(content)).encode("latin-1")),
            _AMZ_JSON_HEADER,
        ]
        return _Answer(200, headers, content)

    def response(self) -> Response:
        response = Response(self.content, self.status)
        response.raw_headers = self.headers
        return response


_AMZ_JSON_HEADER = (b"content-type", AMZ_JSON.encode("latin-1"))


def _first_header(scope: Scope, name: bytes) -> str:
    """A header's first value, as Starlette's request.headers.get gives it ("" when absent)."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return ""


def _known_operation(target: str, api: JsonApi) -> str:
    """The operation a request names, when the model has it (a label never takes a caller's text)."""
    name = target.removeprefix(api.target_prefix)
    return name if name in model.operation_names(api.service) else "unknown"


@dataclass(frozen=True)
class _Call:
    """A request authenticated, admitted and parsed: what its handler needs."""

    operation: OperationModel
    handler: Handler
    params: dict[str, Any]
    context: RequestContext


def _admit(
    runtime: ServiceContext, scope: Scope, body: bytes, target: str, api: JsonApi, request_id: str
) -> _Call:
    """The first step of an answer (server/loop_or_pool.py): who calls, for what, admitted (the rate
    token, its last wait and its one side effect), the body checked against the model."""
    caller = auth.authenticate_scope(runtime, scope, body, api.service, api.policy)
    operation = model.operation_model(_operation_name(target, api.target_prefix), api.service)
    runtime.rate_limiter.admit(caller, api.request_class(operation.name), runtime.fleet.rate_limits)
    handler = registry.handler_for(operation.name, api.service)
    params = validate.parse_request(operation, validate.decode_body(body))
    return _Call(
        operation, handler, params, RequestContext(runtime=runtime, caller=caller, request_id=request_id)
    )


def _respond(call: _Call) -> bytes:
    """The second step: the handler's result, serialised from the output shape (as JSONResponse renders,
    but here, off the event loop when in the pool)."""
    payload = serialize.serialize_response(call.operation, call.handler(call.context, call.params))
    return json.dumps(
        payload, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


def _operation_name(target: str, prefix: str) -> str:
    if not target.startswith(prefix):
        raise UnknownOperation(
            f"X-Amz-Target must be '{prefix}<Operation>'; got {target!r}."
            if target
            else f"The X-Amz-Target header is missing; it names the operation, as '{prefix}<Operation>'."
        )
    return target.removeprefix(prefix)
