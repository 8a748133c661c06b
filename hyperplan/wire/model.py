"""Loading the service models that define the wire contracts: SageMaker's, and CloudWatch Logs' and
STS's for the endpoint's other services.

botocore's own models are the single source of truth: the same shapes drive boto3's request serializer
and response parser, so validating and serializing against them keeps hyperplan and its clients in step
without a hand-copied schema that could drift.
"""

from __future__ import annotations

import threading
from functools import cache

import botocore.session
from botocore.model import OperationModel, ServiceModel

from hyperplan.errors import UnknownOperation
from hyperplan.waits import may_wait

SERVICE_NAME = "sagemaker"
LOGS = "logs"
STS = "sts"
SERVICES = frozenset({SERVICE_NAME, LOGS, STS})


_loaded: dict[str, ServiceModel] = {}
_loading = threading.Lock()


def service_model(service: str = SERVICE_NAME) -> ServiceModel:
    """A model bundled with the installed botocore, loaded once per process (SageMaker's takes a
    hundred ms of CPU or more; `load_every_model` loads them as a server starts). Only the services of
    :data:`SERVICES` are asked for, so what is kept stays bounded."""
    if service not in SERVICES:
        raise ValueError(f"hyperplan serves no model of {service!r}")
    found = _loaded.get(service)
    if found is not None:
        return found
    # Too long for the event loop, where a search is first tried (server/sagemaker.py): a first search
    # before the model is loaded is answered in the thread pool, which loads it (an error is not kept).
    may_wait(f"loading botocore's model of {service}")
    # One load, whoever asks: the first requests of a server arrive together, and each thread loading
    # its own copy cost a new server's first second several loads' CPU, every request waiting for it.
    with _loading:
        found = _loaded.get(service)
        if found is None:
            found = _loaded[service] = botocore.session.get_session().get_service_model(service)
    return found


def load_every_model() -> None:
    """Every model served, loaded now: a server calls this as it starts, before it takes a request, so
    that its first requests wait for no model."""
    for service in sorted(SERVICES):
        service_model(service)
        _operation_names(service)


@cache
def _operation_names(service: str) -> frozenset[str]:
    return frozenset(service_model(service).operation_names)


def operation_names(service: str = SERVICE_NAME) -> frozenset[str]:
    """Every operation botocore's model of ``service`` has."""
    return _operation_names(service)


def operation_model(name: str, service: str = SERVICE_NAME) -> OperationModel:
    """The model of one operation, e.g. ``"CreateTrainingPlan"``; unknown names are a client error."""
    if not isinstance(name, str) or name not in _operation_names(service):
        raise UnknownOperation(f"Unknown operation {name!r}")
    return _operation_model(service, name)


@cache
def _operation_model(service: str, name: str) -> OperationModel:
    # botocore builds a fresh OperationModel (and fresh shapes) on every call; caching here keeps the
    # shapes' own cached properties warm. Only known names get here, so the cache stays bounded.
    return service_model(service).operation_model(name)
