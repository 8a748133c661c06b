"""S3's REST-XML API over the directory buckets: the one entry point (:func:`serve`) and its handlers.

Protocol only: who calls (S3's SigV4), which bucket and key (path-style ``/BUCKET/KEY``, or virtual-hosted
``Host: BUCKET.HOST`` when BUCKET is a bucket here, or HOST is ``localhost``), which operation (method,
subresource and headers, as botocore's S3 model routes them), its query and header members checked
against the model, then the handler. Rights are services/storage/bucket_rights.py's; files
hyperplan/objects/served.py's; every refusal becomes S3's XML error in server/errors.py.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import formatdate
from io import BytesIO
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, quote, unquote
from xml.sax.saxutils import escape

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hyperplan.core import s3_listing
from hyperplan.core.bucket_rights import Right
from hyperplan.core.buckets import key_problem
from hyperplan.core.rate_limits import RequestClass
from hyperplan.errors import (
    AccessDenied,
    EntityTooSmall,
    HyperplanError,
    IllegalLocationConstraint,
    InternalFailure,
    InvalidArgument,
    InvalidLocationConstraint,
    InvalidPart,
    InvalidPartOrder,
    InvalidRange,
    InvalidS3Request,
    InvalidTag,
    MalformedXML,
    MissingAuthenticationToken,
    NoSuchKey,
    NoSuchUpload,
    S3MethodNotAllowed,
    S3NotImplemented,
)
from hyperplan.objects import served as files
from hyperplan.server.auth import authenticate_s3, authenticate_s3_v2
from hyperplan.server.errors import S3_XML, s3_error_response
from hyperplan.server.limits import KIB, MIB, ServerLimits
from hyperplan.server.s3.body import Received, receive_body
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.services.storage.bucket_rights import ServedBucket
from hyperplan.wire import s3_model, s3_responses, s3_xml, sigv2, sigv4

log = logging.getLogger(__name__)

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_DELETES = 1000
XML_BODY_CAP = 2 * MIB
"""The XML bodies S3 takes (DeleteObjects' thousand keys, CompleteMultipartUpload's ten thousand parts)."""
MAX_KEY_BYTES = 1024
SEND_CHUNK = 256 * KIB

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


# -- the request ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Request:
    method: str
    raw_path: str
    raw_query: str
    query: dict[str, str]
    headers: dict[str, str]

    @classmethod
    def of(cls, scope: Scope) -> S3Request:
        raw_path = scope.get("raw_path") or scope["path"].encode()
        raw_query = scope.get("query_string", b"").decode("latin-1")
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]},{text}" if key in headers else text
        query: dict[str, str] = {}
        for key, value in parse_qsl(raw_query, keep_blank_values=True):
            query.setdefault(key, value)
        return cls(scope["method"], raw_path.decode("latin-1").split("?")[0], raw_query, query, headers)


@dataclass
class Call:
    """One S3 request being served."""

    runtime: ServiceContext
    limits: ServerLimits
    request: S3Request
    receive: Receive
    caller: Caller
    signature: sigv4.S3Signature
    bucket: str
    key: str
    operation: str = ""
    body_done: bool = False  # the body was read to its end

    def header(self, name: str) -> str | None:
        return self.request.headers.get(name)

    async def bucket_for(self, need: Right, bucket: str | None = None) -> ServedBucket:
        return await run_in_threadpool(
            bucket_rights.served_bucket, self.runtime, self.caller, bucket or self.bucket, need
        )

    async def body_into(self, sink: IO[bytes], *, cap: int | None = None) -> Received:
        received = await receive_body(
            self.receive, self.request.headers, self.signature, self.limits, sink, cap=cap
        )
        self.body_done = True
        return received

    async def xml_body(self) -> tuple[dict[str, Any] | None, list[s3_xml.Problem]]:
        """The operation's XML body read against its payload's shape (wire/s3_model.py): the value (None
        for no body) and what in it the shape does not allow, for the handler to answer."""
        buffer = BytesIO()
        await self.body_into(buffer, cap=XML_BODY_CAP)
        return s3_model.read_body(self.operation, buffer.getvalue())

    async def checked_xml_body(self) -> dict[str, Any] | None:
        """The body's value; MalformedXML if the shape does not allow it."""
        value, problems = await self.xml_body()
        s3_model.refuse(self.operation, problems)
        return value


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
            caller, signature = await run_in_threadpool(authenticate_s3, runtime, signed)
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
    answer: Any = response  # a Response, or a _FileAnswer (an object's bytes, not read here)
    streamed = isinstance(answer, _FileAnswer)
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


# -- answers ----------------------------------------------------------------------------------------------


def _xml(root: str, inner: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NAMESPACE}">{inner}</{root}>'
    return Response(body.encode(), status_code=status, media_type=S3_XML, headers=headers)


def _el(name: str, value: object) -> str:
    return f"<{name}>{escape(str(value))}</{name}>"


def _iso(mtime_ns: int) -> str:
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _iso_of(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _http_date(mtime_ns: int) -> str:
    return formatdate(mtime_ns / 1e9, usegmt=True)


def _object_headers(info: files.ObjectInfo) -> dict[str, str]:
    headers = {
        "ETag": info.etag,
        "Last-Modified": _http_date(info.mtime_ns),
        "Content-Type": info.content_type,
        "Accept-Ranges": "bytes",
    }
    for name, value in info.metadata.items():
        headers[f"x-amz-meta-{name}"] = value
    return headers


def _check_key(key: str) -> None:
    problem = key_problem(key)
    if problem is None and key.endswith("/"):
        problem = "a key ending in '/' (a folder marker) cannot be kept in a directory bucket"
    if problem is None and len(key.encode("utf-8", "surrogateescape")) > MAX_KEY_BYTES:
        problem = f"a key may be at most {MAX_KEY_BYTES} bytes long"
    if problem is not None:
        raise InvalidArgument(f"Object key {key[:200]!r}: {problem}.")


def _user_metadata(headers: dict[str, str]) -> dict[str, str]:
    return {
        name.removeprefix("x-amz-meta-"): value
        for name, value in headers.items()
        if name.startswith("x-amz-meta-")
    }


def _storage_failure(error: Exception) -> HyperplanError:
    if isinstance(error, files.ServedError):
        return InvalidS3Request(str(error))
    if isinstance(error, OSError):
        return InvalidS3Request(f"The object could not be stored: {files.reason(error)}.")
    raise error


# -- buckets ----------------------------------------------------------------------------------------------


async def list_buckets(call: Call) -> Response:
    listed = await run_in_threadpool(bucket_rights.served_buckets, call.runtime, call.caller)
    inner = "".join(
        f"<Bucket>{_el('Name', item.name)}{_el('CreationDate', _iso_of(item.created))}</Bucket>"
        for item in listed
    )
    owner = (
        f"<Owner>{_el('ID', call.caller.account_id)}{_el('DisplayName', call.caller.account_name)}</Owner>"
    )
    return _xml("ListAllMyBucketsResult", f"<Buckets>{inner}</Buckets>{owner}")


async def create_bucket(call: Call) -> Response:
    config, problems = await call.xml_body()
    constraint = (config or {}).get("LocationConstraint")
    where = "CreateBucketConfiguration.LocationConstraint"
    unlisted = [problem for problem in problems if problem.path == where and problem.kind == "enum"]
    if constraint is not None and constraint != call.runtime.region:
        if unlisted:
            raise InvalidLocationConstraint(
                f"The specified location-constraint is not valid: {constraint!r}."
            )
        raise IllegalLocationConstraint(
            f"CreateBucket: LocationConstraint {constraint!r} is not this endpoint's region "
            f"{call.runtime.region!r}; leave it out or name {call.runtime.region!r}."
        )
    # The endpoint's own region is accepted even where the model's list of regions lacks it.
    s3_model.refuse(call.operation, [problem for problem in problems if problem not in unlisted])
    await run_in_threadpool(bucket_rights.create_served_bucket, call.runtime, call.caller, call.bucket)
    return Response(b"", headers={"Location": f"/{call.bucket}"})


async def head_bucket(call: Call) -> Response:
    await call.bucket_for(Right.READ)
    return Response(b"", headers={"x-amz-bucket-region": call.runtime.region})


async def delete_bucket(call: Call) -> Response:
    await run_in_threadpool(bucket_rights.delete_served_bucket, call.runtime, call.caller, call.bucket)
    for upload in await run_in_threadpool(files.uploads_of, call.runtime.data_dir, call.bucket):
        await run_in_threadpool(files.remove_upload, upload)  # its unfinished uploads go with it
    return Response(b"", status_code=204)


async def get_bucket_location(call: Call) -> Response:
    await call.bucket_for(Right.READ)
    region = "" if call.runtime.region == "us-east-1" else call.runtime.region
    return Response(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<LocationConstraint xmlns="{NAMESPACE}">'
        f"{escape(region)}</LocationConstraint>".encode(),
        media_type=S3_XML,
    )


async def _listing(call: Call, prefix: str) -> list[tuple[str, files.ObjectInfo]]:
    served = await call.bucket_for(Right.READ)
    return await run_in_threadpool(lambda: list(files.keys_under(served.root, prefix)))


def _count(call: Call, name: str, default: int, *, cap: int = s3_listing.MAX_KEYS) -> int:
    """A count from the query string (already a whole number by the model's check), at most `cap`."""
    text = call.request.query.get(name)
    number = default if not text else int(text)
    if number < 0:
        raise InvalidArgument(f"{name} must not be negative; got {number}.")
    return min(number, cap)


def _max_keys(call: Call) -> int:
    return _count(call, "max-keys", s3_listing.MAX_KEYS)


def _listed(encode: bool) -> Callable[[str], str]:
    return (lambda text: quote(text, safe="/")) if encode else (lambda text: text)


def _written(shown: Callable[[str], str]) -> Callable[[str], int]:
    """A key's bytes as the answer writes it (URL-encoded when asked, XML-escaped): what a listing's page
    weighs it by (core/s3_listing.py)."""
    return lambda key: len(escape(shown(key)).encode("utf-8", "surrogatepass"))


def _contents(page: s3_listing.Page[files.ObjectInfo], shown: Callable[[str], str]) -> str:
    items = "".join(
        "<Contents>"
        + _el("Key", shown(key))
        + _el("LastModified", _iso(info.mtime_ns))
        + _el("ETag", info.etag)
        + _el("Size", info.size)
        + _el("StorageClass", "STANDARD")
        + "</Contents>"
        for key, info in page.contents
    )
    return items + "".join(
        f"<CommonPrefixes>{_el('Prefix', shown(p))}</CommonPrefixes>" for p in page.common_prefixes
    )


async def list_objects_v2(call: Call) -> Response:
    query = call.request.query
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    token = query.get("continuation-token")
    after = query.get("start-after", "")
    if token is not None:
        decoded = s3_listing.decode_token(token)
        if decoded is None:
            raise InvalidArgument("The continuation token provided is incorrect.")
        after = decoded
    max_keys = _max_keys(call)
    entries = await _listing(call, prefix)
    encode = query.get("encoding-type") == "url"
    shown = _listed(encode)
    page = s3_listing.page(
        entries, prefix=prefix, delimiter=delimiter, after=after, max_keys=max_keys, weigh=_written(shown)
    )
    inner = _el("Name", call.bucket) + _el("Prefix", shown(prefix))
    if delimiter:
        inner += _el("Delimiter", shown(delimiter))
    inner += _el("MaxKeys", max_keys) + _el("KeyCount", len(page.contents) + len(page.common_prefixes))
    inner += _el("IsTruncated", "true" if page.truncated else "false")
    if token is not None:
        inner += _el("ContinuationToken", token)
    if page.next_token is not None:
        inner += _el("NextContinuationToken", page.next_token)
    if "start-after" in query:
        inner += _el("StartAfter", shown(query["start-after"]))
    if encode:
        inner += _el("EncodingType", "url")
    return _xml("ListBucketResult", inner + _contents(page, shown))


async def list_objects(call: Call) -> Response:
    query = call.request.query
    prefix, delimiter, marker = query.get("prefix", ""), query.get("delimiter", ""), query.get("marker", "")
    max_keys = _max_keys(call)
    entries = await _listing(call, prefix)
    encode = query.get("encoding-type") == "url"
    shown = _listed(encode)
    page = s3_listing.page(
        entries, prefix=prefix, delimiter=delimiter, after=marker, max_keys=max_keys, weigh=_written(shown)
    )
    inner = _el("Name", call.bucket) + _el("Prefix", shown(prefix)) + _el("Marker", shown(marker))
    if delimiter:
        inner += _el("Delimiter", shown(delimiter))
    inner += _el("MaxKeys", max_keys) + _el("IsTruncated", "true" if page.truncated else "false")
    if page.truncated and delimiter and page.next_token is not None:
        inner += _el("NextMarker", shown(s3_listing.decode_token(page.next_token) or ""))
    if encode:
        inner += _el("EncodingType", "url")
    return _xml("ListBucketResult", inner + _contents(page, shown))


# -- objects ----------------------------------------------------------------------------------------------


async def _receive_object(call: Call, root: Path, staged: tuple[int, Path]) -> tuple[Path, Received]:
    handle, path = staged
    try:
        with os.fdopen(handle, "wb", buffering=MIB) as sink:
            received = await call.body_into(sink)
    except BaseException:
        files.discard(path)
        raise
    return path, received


def _checksum_headers(received: Received) -> dict[str, str]:
    if received.checksum is None:
        return {}
    algorithm, value = received.checksum
    return {f"x-amz-checksum-{algorithm}": value}


async def put_object(call: Call) -> Response:
    _check_key(call.key)
    served = await call.bucket_for(Right.WRITE)
    staged = await run_in_threadpool(files.staged_file, served.root)
    path, received = await _receive_object(call, served.root, staged)
    content_type = call.header("content-type")
    metadata = _user_metadata(call.request.headers)
    try:
        info = await run_in_threadpool(
            files.commit, path, served.root, call.key, f'"{received.md5_hex}"', content_type, metadata
        )
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    return Response(b"", headers={"ETag": info.etag, **_checksum_headers(received)})


def _parse_range(text: str | None, size: int) -> tuple[int, int] | None:
    """(start, end inclusive) of a single ``bytes=`` range, None for the whole object (also for a range
    header S3 would ignore); InvalidRange when it cannot be satisfied."""
    if text is None or not text.startswith("bytes=") or "," in text:
        return None
    first, dash, last = text.removeprefix("bytes=").strip().partition("-")
    if (
        not dash
        or not (first.isdigit() or last.isdigit())
        or (first and not first.isdigit())
        or (last and not last.isdigit())
    ):
        return None
    if not first:
        length = int(last)
        if length == 0 or size == 0:
            raise InvalidRange(f"The requested range is not satisfiable: {text} of {size} bytes.")
        return max(size - length, 0), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if last and int(last) < start:
        return None
    if start >= size:
        raise InvalidRange(f"The requested range is not satisfiable: {text} of {size} bytes.")
    return start, end


async def _object(call: Call) -> tuple[ServedBucket, files.ObjectInfo]:
    served = await call.bucket_for(Right.READ)
    problem = key_problem(call.key)
    info = None
    if problem is None:
        try:
            info = await run_in_threadpool(files.head, served.root, call.key)
        except files.ServedError:
            info = None
    if info is None:
        raise NoSuchKey(f"The specified key does not exist: {call.key[:200]!r}.")
    return served, info


async def head_object(call: Call) -> Response:
    _served, info = await _object(call)
    headers = _object_headers(info)
    span = _parse_range(call.header("range"), info.size)
    status, length = 200, info.size
    if span is not None:
        status, length = 206, span[1] - span[0] + 1
        headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{info.size}"
    headers["Content-Length"] = str(length)
    return Response(None, status_code=status, headers=headers)


class _FileAnswer:
    """A file's bytes, sent in pieces read off the event loop."""

    def __init__(
        self, handle: IO[bytes], start: int, length: int, status: int, headers: dict[str, str]
    ) -> None:
        self.handle, self.start, self.length = handle, start, length
        self.status = status
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in self.headers.items()
        ]
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": raw})
            remaining = self.length
            await run_in_threadpool(self.handle.seek, self.start)
            while remaining > 0:
                chunk = await run_in_threadpool(self.handle.read, min(SEND_CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": remaining > 0})
            if self.length == 0 or remaining > 0:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.handle.close()


async def get_object(call: Call) -> Response:
    served, info = await _object(call)
    try:
        handle = await run_in_threadpool(files.object_path(served.root, call.key).open, "rb")
    except (FileNotFoundError, NotADirectoryError):
        raise NoSuchKey(f"The specified key does not exist: {call.key[:200]!r}.") from None
    size = os.fstat(handle.fileno()).st_size
    headers = _object_headers(info)
    try:
        span = _parse_range(call.header("range"), size)
    except InvalidRange:
        handle.close()
        raise
    start, length, status = 0, size, 200
    if span is not None:
        start, length, status = span[0], span[1] - span[0] + 1, 206
        headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{size}"
    headers["Content-Length"] = str(length)
    for name in ("content-type", "content-disposition", "cache-control", "content-encoding"):
        override = call.request.query.get(f"response-{name}")
        if override is not None:
            headers[name.title()] = override
    answer = _FileAnswer(handle, start, length, status, headers)
    return answer  # type: ignore[return-value]  # an ASGI answer like a Response


async def delete_object(call: Call) -> Response:
    served = await call.bucket_for(Right.WRITE)
    if key_problem(call.key) is None:
        await run_in_threadpool(files.delete, served.root, call.key)
    return Response(b"", status_code=204)


async def delete_objects(call: Call) -> Response:
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(
            f"{s3_model.MALFORMED}: DeleteObjects takes a <Delete> document naming the objects."
        )
    objects = document.get("Objects", [])
    if not objects or len(objects) > MAX_DELETES:
        raise MalformedXML(f"{s3_model.MALFORMED}: DeleteObjects names 1 to {MAX_DELETES} objects.")
    quiet = bool(document.get("Quiet"))
    served = await call.bucket_for(Right.WRITE)
    deleted, failed = [], []
    for item in objects:
        key = item["Key"]
        problem = key_problem(key)
        if problem is not None:
            failed.append(
                f"<Error>{_el('Key', key)}{_el('Code', 'InvalidArgument')}{_el('Message', problem)}</Error>"
            )
            continue
        await run_in_threadpool(files.delete, served.root, key)
        if not quiet:
            deleted.append(f"<Deleted>{_el('Key', key)}</Deleted>")
    return _xml("DeleteResult", "".join(deleted) + "".join(failed))


def _copy_source(text: str) -> tuple[str, str]:
    source = unquote(text.split("?", 1)[0]).lstrip("/")
    bucket, _, key = source.partition("/")
    if not bucket or not key:
        raise InvalidArgument(f"x-amz-copy-source {text[:200]!r} must name BUCKET/KEY.")
    return bucket, key


async def _copy_source_object(call: Call) -> tuple[ServedBucket, str, files.ObjectInfo]:
    """The object ``x-amz-copy-source`` names, once the caller's read right on its bucket is checked:
    (its bucket, its key, its head), or NoSuchKey."""
    source_bucket, source_key = _copy_source(call.header("x-amz-copy-source") or "")
    source = await call.bucket_for(Right.READ, source_bucket)
    info = (
        await run_in_threadpool(files.head, source.root, source_key)
        if key_problem(source_key) is None
        else None
    )
    if info is None:
        raise NoSuchKey(f"The specified key does not exist: {source_key[:200]!r}.")
    return source, source_key, info


async def copy_object(call: Call) -> Response:
    _check_key(call.key)
    source, source_key, info = await _copy_source_object(call)
    served = await call.bucket_for(Right.WRITE)
    replace = (call.header("x-amz-metadata-directive") or "COPY").upper() == "REPLACE"
    content_type = call.header("content-type") if replace else info.content_type
    metadata = _user_metadata(call.request.headers) if replace else dict(info.metadata)
    try:
        staged, md5_hex = await run_in_threadpool(
            files.copy_into_staged, files.object_path(source.root, source_key), served.root
        )
        copied = await run_in_threadpool(
            files.commit, staged, served.root, call.key, f'"{md5_hex}"', content_type, metadata
        )
    except FileNotFoundError:
        raise NoSuchKey(f"The specified key does not exist: {source_key[:200]!r}.") from None
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    return _xml("CopyObjectResult", _el("LastModified", _iso(copied.mtime_ns)) + _el("ETag", copied.etag))


# -- multipart uploads --------------------------------------------------------------------------------------


async def create_multipart_upload(call: Call) -> Response:
    _check_key(call.key)
    await call.bucket_for(Right.WRITE)
    upload = await run_in_threadpool(
        files.start_upload,
        call.runtime.data_dir,
        call.bucket,
        call.key,
        call.caller.account_id,
        call.header("content-type"),
        _user_metadata(call.request.headers),
    )
    inner = _el("Bucket", call.bucket) + _el("Key", call.key) + _el("UploadId", upload.upload_id)
    return _xml("InitiateMultipartUploadResult", inner)


async def _upload(call: Call) -> files.Upload:
    upload_id = call.request.query.get("uploadId", "")
    upload = await run_in_threadpool(files.find_upload, call.runtime.data_dir, upload_id)
    if upload is None or upload.bucket != call.bucket or upload.key != call.key:
        raise NoSuchUpload(
            f"The specified upload does not exist: {upload_id[:100]!r} (completed or aborted, maybe)."
        )
    if upload.account_id != call.caller.account_id and not call.caller.is_admin:
        raise AccessDenied(f"Access Denied: upload {upload_id!r} was started by another account.")
    return upload


def _part_number(call: Call) -> int:
    text = call.request.query.get("partNumber", "")
    if not text.isdigit() or not 1 <= int(text) <= files.MAX_PARTS:
        raise InvalidArgument(
            f"Part number must be an integer between 1 and {files.MAX_PARTS}, inclusive; got {text!r}."
        )
    return int(text)


async def upload_part(call: Call) -> Response:
    number = _part_number(call)
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    staged = await run_in_threadpool(files.staged_part, upload)
    path, received = await _receive_object(call, upload.directory, staged)
    try:
        part = await run_in_threadpool(files.commit_part, upload, path, number, received.md5_hex)
    except FileNotFoundError:
        raise NoSuchUpload(
            "The specified upload does not exist: it was completed or aborted meanwhile."
        ) from None
    return Response(b"", headers={"ETag": part.etag, **_checksum_headers(received)})


async def complete_multipart_upload(call: Call) -> Response:
    served = await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(
            f"{s3_model.MALFORMED}: CompleteMultipartUpload takes a <CompleteMultipartUpload> document "
            "naming the parts."
        )
    chosen = []
    for item in document.get("Parts", []):
        number, part_etag = item.get("PartNumber"), item.get("ETag")
        if number is None or part_etag is None:
            raise MalformedXML(f"{s3_model.MALFORMED}: every <Part> names its <PartNumber> and <ETag>.")
        chosen.append((number, part_etag))
    try:
        staged, etag = await run_in_threadpool(files.assemble, upload, chosen, served.root)
    except files.PartProblem as problem:
        kinds: dict[str, type[HyperplanError]] = {
            "InvalidPart": InvalidPart,
            "InvalidPartOrder": InvalidPartOrder,
            "EntityTooSmall": EntityTooSmall,
            "MalformedXML": MalformedXML,
        }
        raise kinds[problem.kind](str(problem)) from None
    try:
        await run_in_threadpool(
            files.commit, staged, served.root, call.key, etag, upload.content_type, upload.metadata
        )
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    await run_in_threadpool(files.remove_upload, upload)
    inner = _el("Location", f"/{call.bucket}/{quote(call.key)}") + _el("Bucket", call.bucket)
    inner += _el("Key", call.key) + _el("ETag", etag)
    return _xml("CompleteMultipartUploadResult", inner)


async def abort_multipart_upload(call: Call) -> Response:
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    await run_in_threadpool(files.remove_upload, upload)
    return Response(b"", status_code=204)


async def list_parts(call: Call) -> Response:
    # Bounded in bytes by its count alone: at most 1,000 parts a page (max-parts is capped), each under
    # 200 bytes of XML (a number, a date, an ETag, a size), and the key once: under 200 KB, so no cut by
    # bytes is needed (core/page_bytes.py's 1 MiB).
    await call.bucket_for(Right.READ)
    upload = await _upload(call)
    marker = _count(call, "part-number-marker", 0, cap=files.MAX_PARTS)
    max_parts = _count(call, "max-parts", 1000)
    found = [part for part in await run_in_threadpool(files.parts, upload) if part.number > marker]
    shown, truncated = found[:max_parts], len(found) > max_parts
    inner = _el("Bucket", call.bucket) + _el("Key", call.key) + _el("UploadId", upload.upload_id)
    inner += _el("PartNumberMarker", marker)
    if shown:
        inner += _el("NextPartNumberMarker", shown[-1].number)
    inner += _el("MaxParts", max_parts) + _el("IsTruncated", "true" if truncated else "false")
    inner += "".join(
        f"<Part>{_el('PartNumber', p.number)}{_el('LastModified', _iso(p.mtime_ns))}{_el('ETag', p.etag)}"
        f"{_el('Size', p.size)}</Part>"
        for p in shown
    )
    return _xml("ListPartsResult", inner)


async def list_multipart_uploads(call: Call) -> Response:
    """The bucket's unfinished uploads the caller started (every account's, for an administrator): what
    ``aws s3api list-multipart-uploads`` lists to abort after an interrupted upload."""
    await call.bucket_for(Right.READ)
    query = call.request.query
    prefix, delimiter = query.get("prefix", ""), query.get("delimiter", "")
    key_marker, id_marker = query.get("key-marker", ""), query.get("upload-id-marker", "")
    max_uploads = _count(call, "max-uploads", s3_listing.MAX_KEYS)
    found = await run_in_threadpool(files.uploads_of, call.runtime.data_dir, call.bucket)
    mine = sorted(
        (u for u in found if u.account_id == call.caller.account_id or call.caller.is_admin),
        key=lambda u: (s3_listing.sort_key(u.key), u.initiated_ns, u.upload_id),
    )
    encode = query.get("encoding-type") == "url"
    shown = _listed(encode)
    page = s3_listing.uploads_page(
        ((u.key, u.upload_id, u) for u in mine),
        prefix=prefix,
        delimiter=delimiter,
        key_marker=key_marker,
        upload_id_marker=id_marker if key_marker else "",
        max_uploads=max_uploads,
        weigh=_written(shown),
    )
    inner = (
        _el("Bucket", call.bucket) + _el("KeyMarker", shown(key_marker)) + _el("UploadIdMarker", id_marker)
    )
    if page.truncated:
        inner += _el("NextKeyMarker", shown(page.next_key_marker))
        inner += _el("NextUploadIdMarker", page.next_upload_id_marker)
    inner += _el("Prefix", shown(prefix))
    if delimiter:
        inner += _el("Delimiter", shown(delimiter))
    inner += _el("MaxUploads", max_uploads) + _el("IsTruncated", "true" if page.truncated else "false")
    for key, upload_id, upload in page.uploads:
        who = _el("ID", upload.account_id) + _el("DisplayName", upload.account_id)
        inner += (
            "<Upload>"
            + _el("Key", shown(key))
            + _el("UploadId", upload_id)
            + f"<Initiator>{who}</Initiator><Owner>{who}</Owner>"
            + _el("StorageClass", "STANDARD")
            + _el("Initiated", _iso(upload.initiated_ns))
            + "</Upload>"
        )
    inner += "".join(
        f"<CommonPrefixes>{_el('Prefix', shown(p))}</CommonPrefixes>" for p in page.common_prefixes
    )
    if encode:
        inner += _el("EncodingType", "url")
    return _xml("ListMultipartUploadsResult", inner)


def _copy_range(text: str | None, size: int) -> tuple[int, int]:
    """(start, length) of ``x-amz-copy-source-range: bytes=FIRST-LAST`` (the whole object without one)."""
    if text is None:
        return 0, size
    first, dash, last = text.removeprefix("bytes=").partition("-")
    if not text.startswith("bytes=") or not dash or not first.isdigit() or not last.isdigit():
        raise InvalidArgument(
            f"The x-amz-copy-source-range value must be of the form bytes=first-last where first and last "
            f"are the zero-based offsets of the first and last bytes to copy; got {text[:100]!r}."
        )
    start, end = int(first), int(last)
    if start > end or end >= size:
        raise InvalidArgument(
            f"Range specified is not valid for source object of size: {size} ({text[:100]!r})."
        )
    return start, end - start + 1


async def upload_part_copy(call: Call) -> Response:
    """A part copied from an object, whole or a range: read rights on the source bucket, as CopyObject."""
    number = _part_number(call)
    source, source_key, info = await _copy_source_object(call)
    await call.bucket_for(Right.WRITE)
    upload = await _upload(call)
    start, length = _copy_range(call.header("x-amz-copy-source-range"), info.size)
    handle, staged = await run_in_threadpool(files.staged_part, upload)
    try:
        md5_hex = await run_in_threadpool(
            files.copy_range, files.object_path(source.root, source_key), start, length, handle
        )
        part = await run_in_threadpool(files.commit_part, upload, staged, number, md5_hex)
    except FileNotFoundError:
        raise NoSuchUpload(
            "The specified upload does not exist: it was completed or aborted meanwhile."
        ) from None
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    finally:
        files.discard(staged)
    return _xml("CopyPartResult", _el("ETag", part.etag) + _el("LastModified", _iso(part.mtime_ns)))


# -- object tagging ---------------------------------------------------------------------------------------

MAX_TAGS = 10
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256


async def get_object_tagging(call: Call) -> Response:
    served, _info = await _object(call)
    tag_set = await run_in_threadpool(files.tags, served.root, call.key)
    inner = "".join(f"<Tag>{_el('Key', k)}{_el('Value', v)}</Tag>" for k, v in tag_set.items())
    return _xml("Tagging", f"<TagSet>{inner}</TagSet>")


def _tag_set(document: dict[str, Any]) -> dict[str, str]:
    tag_set: dict[str, str] = {}
    for tag in document.get("TagSet", []):
        key, value = tag["Key"], tag["Value"]
        if key in tag_set:
            raise InvalidTag(f"Cannot provide multiple Tags with the same key: {key[:200]!r}.")
        if len(key) > MAX_TAG_KEY or len(value) > MAX_TAG_VALUE:
            raise InvalidTag(
                f"A tag's key is at most {MAX_TAG_KEY} characters, its value at most {MAX_TAG_VALUE}: "
                f"{key[:200]!r}."
            )
        tag_set[key] = value
    if len(tag_set) > MAX_TAGS:
        raise InvalidTag(f"Object tags cannot be greater than {MAX_TAGS}; got {len(tag_set)}.")
    return tag_set


async def put_object_tagging(call: Call) -> Response:
    served, _info = await _object(call)  # read rights first: a key of a bucket one cannot see is not named
    await call.bucket_for(Right.WRITE)
    document = await call.checked_xml_body()
    if document is None:
        raise MalformedXML(f"{s3_model.MALFORMED}: PutObjectTagging takes a <Tagging> document.")
    tag_set = _tag_set(document)
    try:
        await run_in_threadpool(files.set_tags, served.root, call.key, tag_set)
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    return Response(b"")


async def delete_object_tagging(call: Call) -> Response:
    served, _info = await _object(call)
    await call.bucket_for(Right.WRITE)
    try:
        await run_in_threadpool(files.set_tags, served.root, call.key, {})
    except (files.ServedError, OSError) as error:
        raise _storage_failure(error) from None
    return Response(b"", status_code=204)


_HANDLERS: dict[str, Callable[[Call], Awaitable[Response]]] = {
    "ListBuckets": list_buckets,
    "CreateBucket": create_bucket,
    "HeadBucket": head_bucket,
    "DeleteBucket": delete_bucket,
    "GetBucketLocation": get_bucket_location,
    "ListObjectsV2": list_objects_v2,
    "ListObjects": list_objects,
    "PutObject": put_object,
    "GetObject": get_object,
    "HeadObject": head_object,
    "DeleteObject": delete_object,
    "DeleteObjects": delete_objects,
    "CopyObject": copy_object,
    "CreateMultipartUpload": create_multipart_upload,
    "UploadPart": upload_part,
    "CompleteMultipartUpload": complete_multipart_upload,
    "AbortMultipartUpload": abort_multipart_upload,
    "ListParts": list_parts,
    "ListMultipartUploads": list_multipart_uploads,
    "UploadPartCopy": upload_part_copy,
    "GetObjectTagging": get_object_tagging,
    "PutObjectTagging": put_object_tagging,
    "DeleteObjectTagging": delete_object_tagging,
}
