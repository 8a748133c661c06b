"""The one place that turns errors into responses, for both APIs.

A HyperplanError keeps its code, status and message. Anything else is a bug: it is logged with its
traceback and answered as a 500 InternalFailure that says so, never with the exception's text.
"""

from __future__ import annotations

import logging

from starlette.responses import JSONResponse

from hyperplan.errors import HyperplanError, InternalFailure

log = logging.getLogger(__name__)

AMZ_JSON = "application/x-amz-json-1.1"


def as_hyperplan_error(exc: BaseException, request_id: str) -> HyperplanError:
    if isinstance(exc, HyperplanError):
        return exc
    log.exception("request %s failed with a bug", request_id, exc_info=exc)
    return InternalFailure(f"Internal error (request {request_id}); the server log has the details.")


def sagemaker_error_response(exc: BaseException, request_id: str) -> JSONResponse:
    """AWS JSON 1.1 error: botocore reads the error code from `__type` and the text from `message`."""
    error = as_hyperplan_error(exc, request_id)
    return JSONResponse(
        {"__type": error.code, "message": error.message},
        status_code=error.status,
        media_type=AMZ_JSON,
        headers={"x-amzn-RequestId": request_id, "x-amzn-ErrorType": error.code},
    )


def native_error_response(exc: BaseException, request_id: str) -> JSONResponse:
    error = as_hyperplan_error(exc, request_id)
    return JSONResponse(
        {"Error": {"Code": error.code, "Message": error.message}, "RequestId": request_id},
        status_code=error.status,
        headers={"x-amzn-RequestId": request_id},
    )


NATIVE_PATH_PREFIX = "/api/"


def error_response_for_path(path: str, exc: BaseException, request_id: str) -> JSONResponse:
    """For errors met before a route runs (the front door's limits): each API answers in its own shape."""
    if path.startswith(NATIVE_PATH_PREFIX):
        return native_error_response(exc, request_id)
    return sagemaker_error_response(exc, request_id)
