"""Where SageMaker operations are looked up: every handler of hyperplan.wire.ops, by operation name."""

from __future__ import annotations

import hyperplan.wire.ops  # noqa: F401  (registers every handler on import)
from hyperplan.errors import UnknownOperation
from hyperplan.wire.operations import HANDLERS, Handler, RequestContext

__all__ = ["Handler", "RequestContext", "handler_for", "served_operations"]


def handler_for(name: str) -> Handler:
    try:
        return HANDLERS[name]
    except KeyError:
        raise UnknownOperation(f"hyperplan does not serve the operation {name!r}.") from None


def served_operations() -> list[str]:
    return sorted(HANDLERS)
