"""How an operation's handler is declared (SageMaker's, CloudWatch Logs', STS's): the `operation`
decorator and its tables.

A handler takes the caller's context and the validated request (a dict shaped like the operation's
input shape, timestamps as aware datetimes) and returns a dict shaped like its output shape. Handlers
translate between wire names and service calls; the rules live in hyperplan.services and hyperplan.core.
The handlers (hyperplan.wire.ops) import this module; hyperplan.wire.registry imports them, so the table
is full wherever it is read, with no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext


@dataclass(frozen=True)
class RequestContext:
    runtime: ServiceContext
    caller: Caller
    request_id: str


Handler = Callable[[RequestContext, dict[str, Any]], Mapping[str, Any] | None]

SERVICE_HANDLERS: dict[str, dict[str, Handler]] = {"sagemaker": {}, "logs": {}, "sts": {}}
"""Each service's handlers by operation name (the service as botocore names its model)."""

HANDLERS = SERVICE_HANDLERS["sagemaker"]


def operation(name: str, service: str = "sagemaker") -> Callable[[Handler], Handler]:
    table = SERVICE_HANDLERS[service]

    def register(handler: Handler) -> Handler:
        if name in table:
            raise RuntimeError(f"two handlers for {service} {name}")
        table[name] = handler
        return handler

    return register
