"""Where SageMaker operations plug in.

A handler takes the caller's context and the validated request (a dict shaped like the operation's
input shape, timestamps as aware datetimes) and returns a dict shaped like its output shape. Handlers
translate between wire names and service calls; the rules live in hyperplan.services and hyperplan.core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hyperplan.errors import UnknownOperation

if TYPE_CHECKING:
    from hyperplan.runtime import Runtime
    from hyperplan.services.accounts import Caller


@dataclass(frozen=True)
class RequestContext:
    runtime: Runtime
    caller: Caller
    request_id: str


Handler = Callable[[RequestContext, dict[str, Any]], Mapping[str, Any] | None]

_HANDLERS: dict[str, Handler] = {}


def operation(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        if name in _HANDLERS:
            raise RuntimeError(f"two handlers for {name}")
        _HANDLERS[name] = handler
        return handler

    return register


def handler_for(name: str) -> Handler:
    _load_operations()
    try:
        return _HANDLERS[name]
    except KeyError:
        raise UnknownOperation(f"hyperplan does not serve the operation {name!r}.") from None


def served_operations() -> list[str]:
    _load_operations()
    return sorted(_HANDLERS)


def _load_operations() -> None:
    import hyperplan.wire.ops  # noqa: F401  (registers every handler on import)
