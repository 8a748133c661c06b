"""The one place that turns errors into responses, for every API: SageMaker's and CloudWatch Logs'
(awsJson1.1), STS's (the query protocol's XML), S3's (its XML) and the native API's.

A HyperplanError keeps its code, status and message. Anything else is a bug: it is logged with its
traceback and answered as a 500 InternalFailure that says so, never with the exception's text.
"""

from __future__ import annotations

import logging
from xml.sax.saxutils import escape

from starlette.responses import JSONResponse, Response

from hyperplan.errors import (
    AccessDenied,
    BucketAlreadyYours,
    HyperplanError,
    InternalFailure,
    InvalidSignature,
    MissingAuthenticationToken,
    RequestTimeout,
    RequestTooLarge,
    S3Error,
    SignatureExpired,
    Throttling,
    UnrecognizedClient,
    ValidationError,
)

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


LOGS_CODES = {
    "ValidationException": "InvalidParameterException",
    "SerializationException": "InvalidParameterException",
    "ResourceNotFound": "ResourceNotFoundException",
}
"""The tree's codes as CloudWatch Logs names them (its model's errors); the rest are the same in both."""

STS_CODES = {
    "ValidationException": "ValidationError",
    "SerializationException": "MalformedInput",
    "UnknownOperationException": "InvalidAction",
    "MissingAuthenticationTokenException": "MissingAuthenticationToken",
    "UnrecognizedClientException": "InvalidClientTokenId",
    "InvalidSignatureException": "SignatureDoesNotMatch",
    "AccessDeniedException": "AccessDenied",
    "ThrottlingException": "Throttling",
}
"""The tree's codes as STS's query API names them."""

STS_NAMESPACE = "https://sts.amazonaws.com/doc/2011-06-15/"


def logs_error_response(exc: BaseException, request_id: str) -> JSONResponse:
    """AWS JSON 1.1, as SageMaker's, with the codes CloudWatch Logs uses."""
    error = as_hyperplan_error(exc, request_id)
    code = LOGS_CODES.get(error.code, error.code)
    return JSONResponse(
        {"__type": code, "message": error.message},
        status_code=error.status,
        media_type=AMZ_JSON,
        headers={"x-amzn-RequestId": request_id, "x-amzn-ErrorType": code},
    )


def sts_error_response(exc: BaseException, request_id: str) -> Response:
    """The query protocol's error: ``ErrorResponse/Error/{Type,Code,Message}`` and the request id."""
    error = as_hyperplan_error(exc, request_id)
    code = STS_CODES.get(error.code, error.code)
    kind = "Receiver" if error.status >= 500 else "Sender"
    body = (
        f'<ErrorResponse xmlns="{STS_NAMESPACE}"><Error><Type>{kind}</Type><Code>{escape(code)}</Code>'
        f"<Message>{escape(error.message)}</Message></Error><RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return Response(
        body, status_code=error.status, media_type="text/xml", headers={"x-amzn-RequestId": request_id}
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


def before_any_request_error_response(exc: BaseException, request_id: str) -> JSONResponse:
    """For a refusal before a request is read (a connection over its address's share, answered as it
    opens): which API it is for is unknown, so one JSON body carries both JSON shapes, awsJson1.1's
    (``__type``, ``message``, ``x-amzn-ErrorType``: botocore's JSON parser) and the native API's
    (``Error``, ``RequestId``). botocore's S3 parser reads its status alone; its query parser (STS) fails."""
    error = as_hyperplan_error(exc, request_id)
    return JSONResponse(
        {
            "__type": error.code,
            "message": error.message,
            "Error": {"Code": error.code, "Message": error.message},
            "RequestId": request_id,
        },
        status_code=error.status,
        media_type=AMZ_JSON,
        headers={"x-amzn-RequestId": request_id, "x-amzn-ErrorType": error.code},
    )


S3_XML = "application/xml"


def _s3_code(error: HyperplanError) -> tuple[str, int]:
    """S3's code and status for an error: its own, or the nearest S3 says for the shared ones."""
    if isinstance(error, S3Error):
        return error.code, error.status
    if isinstance(error, BucketAlreadyYours):
        return "BucketAlreadyOwnedByYou", 409
    if isinstance(error, (MissingAuthenticationToken, AccessDenied, SignatureExpired)):
        return "AccessDenied", 403
    if isinstance(error, UnrecognizedClient):
        return "InvalidAccessKeyId", 403
    if isinstance(error, InvalidSignature):
        return "SignatureDoesNotMatch", 403
    if isinstance(error, RequestTooLarge):
        return "EntityTooLarge", 400
    if isinstance(error, RequestTimeout):
        return "RequestTimeout", 400
    if isinstance(error, Throttling):
        return "SlowDown", 503
    if isinstance(error, ValidationError):
        return "InvalidArgument", 400
    if error.status >= 500:
        return ("InternalError", 500) if isinstance(error, InternalFailure) else (error.code, error.status)
    return error.code, error.status


def s3_error_response(
    exc: BaseException, request_id: str, resource: str = "", *, head: bool = False
) -> Response:
    """S3's REST-XML error: ``<Error><Code/><Message/><Resource/><RequestId/></Error>``; a HEAD's answer
    has no body (botocore then reads the code from the status)."""
    error = as_hyperplan_error(exc, request_id)
    code, status = _s3_code(error)
    headers = {"x-amz-request-id": request_id}
    if head:
        return Response(b"", status_code=status, headers=headers)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(code)}</Code><Message>{escape(error.message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{request_id}</RequestId></Error>"
    )
    return Response(body.encode(), status_code=status, media_type=S3_XML, headers=headers)
