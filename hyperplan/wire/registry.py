"""Where operations are looked up: every handler of hyperplan.wire.ops, by service and operation name."""

from __future__ import annotations

import hyperplan.wire.ops  # noqa: F401  (registers every handler on import)
from hyperplan.errors import UnknownOperation
from hyperplan.wire.operations import HANDLERS, SERVICE_HANDLERS, Handler, RequestContext

__all__ = ["Handler", "RequestContext", "handler_for", "served_operations"]


def handler_for(name: str, service: str = "sagemaker") -> Handler:
    try:
        return SERVICE_HANDLERS[service][name]
    except KeyError:
        raise UnknownOperation(f"hyperplan does not serve the operation {name!r}.") from None


def served_operations(service: str = "sagemaker") -> list[str]:
    return sorted(SERVICE_HANDLERS[service] if service != "sagemaker" else HANDLERS)
