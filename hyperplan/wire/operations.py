"""How a SageMaker operation's handler is declared: the `operation` decorator and its table.

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

from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext


@dataclass(frozen=True)
class RequestContext:
    runtime: ServiceContext
    caller: Caller
    request_id: str


Handler = Callable[[RequestContext, dict[str, Any]], Mapping[str, Any] | None]

HANDLERS: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        if name in HANDLERS:
            raise RuntimeError(f"two handlers for {name}")
        HANDLERS[name] = handler
        return handler

    return register
