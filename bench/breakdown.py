"""Where a request's time goes: the stages the SageMaker endpoint runs, called in-process one by one on
the filled store (before the server starts), so that what HTTP adds can be read off by subtraction.

The stages are the project's own functions, in the endpoint's order: authentication as the server runs
it (`server/auth.authenticate`: the change-counter sync, the access key from the process's key cache,
read from the store only on a miss, and SigV4 verification), the rate limiter, body decoding and
validation against botocore's model, the operation handler, and serialisation to the JSON the response
carries. Uvicorn, h11, Starlette routing and the hop to the thread pool are what this leaves out.
"""

from __future__ import annotations

import cProfile
import json
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, TypeVar

from starlette.requests import Request

from bench import mix
from bench.loadgen import CREATE, SEARCH, Endpoint, signed_headers
from bench.report import line, percentile
from bench.server import HOST, Store
from hyperplan.core.rate_limits import sagemaker_class
from hyperplan.server import auth
from hyperplan.server.auth import SAGEMAKER_API
from hyperplan.services.orchestration import account_views
from hyperplan.wire import model, registry, serialize, validate
from hyperplan.wire.registry import RequestContext

T = TypeVar("T")
KEY_LOOKUP = "  alone: access key from the key cache"
COUNTER_SYNC = "  alone: change-counter sync"
CALENDAR_SEARCH = "  of which: calendar search, read afresh"
Stages = dict[str, list[float]]


def _timed(stages: Stages, name: str, work: Callable[[], T]) -> T:
    began = time.perf_counter()
    result = work()
    stages.setdefault(name, []).append(time.perf_counter() - began)
    return result


def _call(
    store: Store,
    endpoint: Endpoint,
    operation: str,
    payload: dict[str, Any],
    stages: Stages,
    profiler: cProfile.Profile | None = None,
) -> Any:
    """One request through every stage of the endpoint but HTTP; returns the handler's result.
    ``profiler``, if given, runs over the server-side stages."""
    if profiler is None:
        return _stages(store, endpoint, operation, payload, stages)
    profiler.enable()
    try:
        return _stages(store, endpoint, operation, payload, stages)
    finally:
        profiler.disable()


def _starlette_request(headers: dict[str, str]) -> Request:
    """The request as the endpoint receives it (its body is passed beside it, as there)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
        ],
        "client": ("127.0.0.1", 40000),
    }
    return Request(scope)


def _stages(store: Store, endpoint: Endpoint, operation: str, payload: dict[str, Any], stages: Stages) -> Any:
    runtime = store.runtime
    body = json.dumps(payload).encode()
    headers = _timed(
        stages,
        "sign (client side)",
        lambda: signed_headers(endpoint, f"SageMaker.{operation}", body, datetime.now(UTC)),
    )
    request = _starlette_request(headers)
    caller = _timed(
        stages,
        "authenticate (sync + key cache + SigV4)",
        lambda: auth.authenticate(runtime, request, body, "sagemaker", SAGEMAKER_API),
    )
    # Again, each alone: what they cost of the stage above (the key from the cache, as most requests).
    _timed(stages, COUNTER_SYNC, runtime.sync)
    _timed(
        stages,
        KEY_LOOKUP,
        lambda: runtime.keys.get(endpoint.access_key, partial(account_views.caller_for_key, runtime)),
    )
    op = model.operation_model(operation)
    _timed(
        stages,
        "rate limiter",
        lambda: runtime.rate_limiter.admit(caller, sagemaker_class(operation), runtime.fleet.rate_limits),
    )
    params = _timed(
        stages, "decode + validate body", lambda: validate.parse_request(op, validate.decode_body(body))
    )
    context = RequestContext(runtime=runtime, caller=caller, request_id="bench")
    handler = registry.handler_for(operation)
    result = _timed(stages, f"handler ({operation})", lambda: handler(context, params))
    _timed(
        stages,
        "serialize + JSON encode",
        lambda: json.dumps(serialize.serialize_response(op, result), separators=(",", ":")).encode(),
    )
    return result


def _endpoint(store: Store) -> Endpoint:
    key = store.keys[0]
    return Endpoint(HOST, 8080, store.runtime.region, key.access_key_id, key.secret_access_key)


def _searches(store: Store, samples: int, stages: Stages, profiler: cProfile.Profile | None = None) -> None:
    """``samples`` searches of the HTTP search mix; each one's calendar search is also timed alone."""
    endpoint, rng = _endpoint(store), random.Random(5)
    context = mix.MixContext.of(store.fleet, store.now)
    for _ in range(samples):
        request = mix.search_request(rng, context)
        _call(store, endpoint, SEARCH, mix.wire_search(request), stages, profiler)
        # Alone, with what the handler's search just kept dropped (the calendar keeps a search's reads
        # until its next change): the cost of a search that misses them, an upper bound.
        store.runtime.calendar.forget_derived()
        _timed(stages, CALENDAR_SEARCH, partial(store.runtime.calendar.search, request, store.now))


def _purchases(
    store: Store, samples: int, stages: Stages, profiler: cProfile.Profile | None = None, tag: str = ""
) -> None:
    """``samples`` purchases of the purchase mix, each after its own (untimed) search. They commit."""
    endpoint, rng = _endpoint(store), random.Random(6 + len(tag))
    context = mix.MixContext.of(store.fleet, store.now)
    for number in range(samples):
        found = _call(store, endpoint, SEARCH, mix.wire_search(mix.purchase_request(rng, context)), {})
        offerings = found["TrainingPlanOfferings"]
        if offerings:
            payload = {
                "TrainingPlanName": f"breakdown{tag}-{number}",
                "TrainingPlanOfferingId": offerings[0]["TrainingPlanOfferingId"],
            }
            _call(store, endpoint, CREATE, payload, stages, profiler)


def measure(store: Store, samples: int) -> tuple[Stages, Stages]:
    """Stage timings of ``samples`` searches and ``samples`` purchases."""
    searches: Stages = {}
    purchases: Stages = {}
    _searches(store, samples, searches)
    _purchases(store, samples, purchases)
    return searches, purchases


def profile(store: Store, samples: int) -> tuple[cProfile.Profile, cProfile.Profile]:
    """cProfiles of the server-side stages of ``samples`` searches and of ``samples`` purchases, in this
    thread's CPU time: a wall-clock profile of a purchase is mostly its commit waiting for the disk."""
    searching, buying = cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)
    _searches(store, samples, {}, searching)
    _purchases(store, samples, {}, buying, tag="-profiled")
    return searching, buying


def print_stages(title: str, stages: Stages) -> float:
    """Print p50 and mean per stage, each sub-stage under its stage; returns the sum of the server-side
    stages' means in seconds."""
    line(title)
    total = 0.0
    for name in _in_order(stages):
        seconds = stages[name]
        mean = sum(seconds) / len(seconds)
        line(f"  {name:<42} p50 {percentile(seconds, 50) * 1000:7.3f} ms   mean {mean * 1000:7.3f} ms")
        if not name.startswith(("sign", "  ")):
            total += mean
    line(f"  {'server-side stages, total of means':<42} {'':15} {total * 1000:7.3f} ms")
    return total


def _in_order(stages: Stages) -> list[str]:
    """Stages in the order they ran, with the sub-stages (indented names) after the stage they are part of."""
    parent_of = {KEY_LOOKUP: "authenticate", COUNTER_SYNC: "authenticate", CALENDAR_SEARCH: "handler"}
    names = [name for name in stages if name not in parent_of]
    for sub, parent in parent_of.items():
        if sub in stages:
            at = next((i for i, name in enumerate(names) if name.startswith(parent)), len(names) - 1)
            names.insert(at + 1, sub)
    return names
