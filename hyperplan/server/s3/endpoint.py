"""S3's REST-XML API over the directory buckets: the one entry point (:func:`serve`) and its dispatch.

Protocol only: who calls (S3's SigV4), which bucket and key (path-style ``/BUCKET/KEY``, or virtual-hosted
``Host: BUCKET.HOST`` when BUCKET is a bucket here, or HOST is ``localhost``), which operation (method,
subresource and headers, as botocore's S3 model routes them), its query and header members checked
against the model, then the handler the table names. Rights are services/storage/bucket_rights.py's;
files hyperplan/objects/served.py's; every refusal becomes S3's XML error in server/errors.py.

The handlers live beside it, a module per kind of operation (buckets.py, listings.py, objects.py,
multipart.py, tagging.py); what they share is call.py (the request being served), answers.py (S3's XML
and headers) and object_files.py (an object's key, metadata and file as the handlers reach them).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hyperplan.core.rate_limits import RequestClass
from hyperplan.errors import (
    InternalFailure,
    InvalidArgument,
    MissingAuthenticationToken,
    S3MethodNotAllowed,
    S3NotImplemented,
)
from hyperplan.server.auth import authenticate_s3, authenticate_s3_v2
from hyperplan.server.errors import s3_error_response
from hyperplan.server.limits import ServerLimits
from hyperplan.server.s3 import buckets, listings, multipart, objects, tagging
from hyperplan.server.s3.answers import FileAnswer
from hyperplan.server.s3.call import Call, S3Request
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.wire import s3_model, s3_responses, sigv2, sigv4

log = logging.getLogger(__name__)

# Subresources this endpoint does not serve: S3 answers 501 NotImplemented for what it does not do.
_BUCKET_EXTRAS = frozenset(
    {
        "accelerate",
        "acl",
        "analytics",
        "cors",
        "encryption",
        "intelligent-tiering",
        "inventory",
        "lifecycle",
        "logging",
        "metrics",
        "notification",
        "object-lock",
        "ownershipControls",
        "policy",
        "policyStatus",
        "publicAccessBlock",
        "replication",
        "requestPayment",
        "tagging",
        "versioning",
        "versions",
        "website",
    }
)
_OBJECT_EXTRAS = frozenset(
    {
        "acl",
        "attributes",
        "legal-hold",
        "restore",
        "retention",
        "select",
        "torrent",
    }
)
_TAGGING = {"GET": "GetObjectTagging", "PUT": "PutObjectTagging", "DELETE": "DeleteObjectTagging"}


# -- the entry point -------------------------------------------------------------------------------------


async def serve(
    scope: Scope, receive: Receive, send: Send, runtime: ServiceContext, limits: ServerLimits
) -> None:
    """Answer one S3 request (signed for the service ``s3``, or unsigned and refused)."""
    request_id = uuid.uuid4().hex[:16].upper()
    request = S3Request.of(scope)
    call: Call | None = None
    resource = unquote(request.raw_path)
    try:
        bucket, key, virtual = await run_in_threadpool(_target, runtime, request)
        legacy = sigv2.presigned(request.raw_query)
        if legacy is not None:
            resource = f"/{bucket}{request.raw_path}" if virtual else request.raw_path
            caller, signature = await run_in_threadpool(
                authenticate_s3_v2,
                runtime,
                legacy,
                request.method,
                resource,
                request.raw_query,
                request.headers,
            )
        elif sigv4.credential_service(request.headers, request.raw_query) is None:
            if request.headers.get("authorization", "").startswith("AWS "):
                raise MissingAuthenticationToken(
                    "Access Denied: an Authorization header of Signature Version 2 is not accepted here; "
                    "sign with SigV4 for the service 's3'."
                )
            raise MissingAuthenticationToken(
                "Access Denied: this request is not signed. S3 requests to this endpoint are signed with "
                "SigV4 for the service 's3' (AWS_ENDPOINT_URL or --endpoint-url, and an access key)."
            )
        else:
            signed = sigv4.SignedRequest(
                request.method, request.raw_path, request.raw_query, request.headers, b""
            )
            client = scope.get("client")
            remote = client[0] if client else ""
            caller, signature = await run_in_threadpool(authenticate_s3, runtime, signed, remote)
        call = Call(runtime, limits, request, receive, caller, signature, bucket, key)
        operation = call.operation = _operation(request, bucket, key)
        s3_model.check_request(operation, request.query, request.headers)
        runtime.rate_limiter.admit(caller, _request_class(operation), runtime.fleet.rate_limits)
        response = await _HANDLERS[operation](call)
    except Exception as exc:  # every refusal becomes S3's XML error in one place
        response = s3_error_response(exc, request_id, resource, head=request.method == "HEAD")
        if (call is None or not call.body_done) and _has_body(request.headers):
            # The body was not read to its end (a refusal before it, or in it: too large, a bad
            # checksum...): the connection is closed after the answer, not left with a client still
            # sending what nobody reads.
            response.headers["connection"] = "close"
            receive = _no_more
    response.headers["x-amz-request-id"] = request_id
    if os.environ.get(s3_responses.ENVIRONMENT) == "1":
        response = _checked(call.operation if call is not None else "", response, request_id, resource)
    await response(scope, receive, send)


def _checked(operation: str, response: Response, request_id: str, resource: str) -> Response:
    """The answer if the model allows it, else a 500 naming what is wrong (tests and development only:
    wire/s3_responses.py)."""
    answer: Any = response  # a Response, or a FileAnswer (an object's bytes, not read here)
    streamed = isinstance(answer, FileAnswer)
    status = answer.status if streamed else answer.status_code
    headers = dict(answer.headers.items())
    body = None if streamed else bytes(answer.body)
    found = s3_responses.problems(operation, status, headers, body) if operation or status >= 300 else []
    if not found:
        return response
    if streamed:
        answer.handle.close()
    log.error("S3 %s answer does not match botocore's model: %s", operation, "; ".join(found))
    failure = InternalFailure(
        f"The {operation} answer does not match botocore's S3 model: {'; '.join(found)}"
    )
    return s3_error_response(failure, request_id, resource)


async def _no_more() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def _has_body(headers: dict[str, str]) -> bool:
    return headers.get("content-length", "0") != "0" or "transfer-encoding" in headers


def _request_class(operation: str) -> RequestClass:
    return RequestClass.READ if operation.startswith(("Get", "Head", "List")) else RequestClass.WRITE


# -- which bucket, key and operation -------------------------------------------------------------------


def _target(runtime: ServiceContext, request: S3Request) -> tuple[str, str, bool]:
    """(bucket, key, virtual-hosted?): from ``Host: BUCKET.HOST`` when that names a bucket here (or HOST
    is localhost), else from the path ``/BUCKET/KEY``. The key is the path's rest, percent-decoded."""
    try:
        path = unquote(request.raw_path, errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument("The request's path is not percent-encoded UTF-8.") from None
    virtual = _virtual_bucket(runtime, request.headers.get("host", ""))
    if virtual is not None:
        return virtual, path[1:] if path.startswith("/") else path, True
    bucket, _, key = path.lstrip("/").partition("/")
    return bucket, key, False


def _virtual_bucket(runtime: ServiceContext, host: str) -> str | None:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    if "." not in name or name.startswith("["):
        return None
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        return None
    candidates = [name[:at] for at, char in enumerate(name) if char == "."]
    for candidate in reversed(candidates):  # the longest bucket name first
        if bucket_rights.known_bucket(runtime, candidate):
            return candidate
    if name.endswith(".localhost"):
        return name.removesuffix(".localhost")
    return None


def _operation(request: S3Request, bucket: str, key: str) -> str:
    method, query, headers = request.method, request.query, request.headers
    if not bucket:
        if method == "GET":
            return "ListBuckets"
        raise S3MethodNotAllowed(f"The specified method is not allowed against this resource: {method} /.")
    if not key:
        extra = sorted(_BUCKET_EXTRAS & query.keys())
        if extra:
            raise S3NotImplemented(f"Bucket subresource {extra[0]!r} is not served by this endpoint.")
        routes = {
            "PUT": "CreateBucket",
            "HEAD": "HeadBucket",
            "DELETE": "DeleteBucket",
        }
        if method == "GET":
            if "location" in query:
                return "GetBucketLocation"
            if "uploads" in query:
                return "ListMultipartUploads"
            return "ListObjectsV2" if query.get("list-type") == "2" else "ListObjects"
        if method == "POST" and "delete" in query:
            return "DeleteObjects"
        if method in routes:
            return routes[method]
    else:
        extra = sorted(_OBJECT_EXTRAS & query.keys())
        if extra:
            raise S3NotImplemented(f"Object subresource {extra[0]!r} is not served by this endpoint.")
        if "tagging" in query and method in _TAGGING:
            return _TAGGING[method]
        upload = "uploadId" in query
        if method == "PUT":
            if upload or "partNumber" in query:
                return "UploadPartCopy" if "x-amz-copy-source" in headers else "UploadPart"
            return "CopyObject" if "x-amz-copy-source" in headers else "PutObject"
        if method == "GET":
            return "ListParts" if upload else "GetObject"
        if method == "HEAD":
            return "HeadObject"
        if method == "DELETE":
            return "AbortMultipartUpload" if upload else "DeleteObject"
        if method == "POST":
            if "uploads" in query:
                return "CreateMultipartUpload"
            if upload:
                return "CompleteMultipartUpload"
    raise S3MethodNotAllowed(
        f"The specified method is not allowed against this resource: {method} {unquote(request.raw_path)}."
    )


# -- each operation's handler ------------------------------------------------------------------------

_HANDLERS: dict[str, Callable[[Call], Awaitable[Response]]] = {
    "ListBuckets": buckets.list_buckets,
    "CreateBucket": buckets.create_bucket,
    "HeadBucket": buckets.head_bucket,
    "DeleteBucket": buckets.delete_bucket,
    "GetBucketLocation": buckets.get_bucket_location,
    "ListObjectsV2": listings.list_objects_v2,
    "ListObjects": listings.list_objects,
    "PutObject": objects.put_object,
    "GetObject": objects.get_object,
    "HeadObject": objects.head_object,
    "DeleteObject": objects.delete_object,
    "DeleteObjects": objects.delete_objects,
    "CopyObject": objects.copy_object,
    "CreateMultipartUpload": multipart.create_multipart_upload,
    "UploadPart": multipart.upload_part,
    "CompleteMultipartUpload": multipart.complete_multipart_upload,
    "AbortMultipartUpload": multipart.abort_multipart_upload,
    "ListParts": multipart.list_parts,
    "ListMultipartUploads": multipart.list_multipart_uploads,
    "UploadPartCopy": multipart.upload_part_copy,
    "GetObjectTagging": tagging.get_object_tagging,
    "PutObjectTagging": tagging.put_object_tagging,
    "DeleteObjectTagging": tagging.delete_object_tagging,
}
