"""Loading the SageMaker service model that defines the wire contract.

botocore's own model is the single source of truth: the same shapes drive boto3's request serializer
and response parser, so validating and serializing against them keeps hyperplan and its clients in step
without a hand-copied schema that could drift.
"""

from __future__ import annotations

from functools import cache, lru_cache

import botocore.session
from botocore.model import OperationModel, ServiceModel

from hyperplan.errors import UnknownOperation

SERVICE_NAME = "sagemaker"


@lru_cache(maxsize=1)
def service_model() -> ServiceModel:
    """The SageMaker model bundled with the installed botocore (loaded once: it takes a few hundred ms)."""
    return botocore.session.get_session().get_service_model(SERVICE_NAME)


@lru_cache(maxsize=1)
def _operation_names() -> frozenset[str]:
    return frozenset(service_model().operation_names)


def operation_names() -> frozenset[str]:
    """Every operation botocore's model has."""
    return _operation_names()


def operation_model(name: str) -> OperationModel:
    """The model of one operation, e.g. ``"CreateTrainingPlan"``; unknown names are a client error."""
    if not isinstance(name, str) or name not in _operation_names():
        raise UnknownOperation(f"Unknown operation {name!r}")
    return _operation_model(name)


@cache
def _operation_model(name: str) -> OperationModel:
    # botocore builds a fresh OperationModel (and fresh shapes) on every call; caching here keeps the
    # shapes' own cached properties warm. Only known names get here, so the cache stays bounded.
    return service_model().operation_model(name)
