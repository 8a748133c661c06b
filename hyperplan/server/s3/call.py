"""One S3 request being served: what was asked (:class:`S3Request`) and what every handler asks of it
(:class:`Call`: a header, the bucket with a right, the body, an XML body read against the operation's
shape; :func:`query_count`: a count from the query string).

Apart from endpoint.py so that every handler module can take a Call while endpoint.py imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from io import BytesIO
from typing import IO, Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope

from hyperplan.core import s3_listing
from hyperplan.core.bucket_rights import Right
from hyperplan.errors import InvalidArgument
from hyperplan.server.limits import MIB, ServerLimits
from hyperplan.server.s3.body import Received, receive_body
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.services.storage.bucket_rights import ServedBucket
from hyperplan.wire import s3_model, s3_xml, sigv4

XML_BODY_CAP = 2 * MIB
"""The XML bodies S3 takes (DeleteObjects' thousand keys, CompleteMultipartUpload's ten thousand parts)."""


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


def query_count(call: Call, name: str, default: int, *, cap: int = s3_listing.MAX_KEYS) -> int:
    """A count from the query string (already a whole number by the model's check), at most `cap`."""
    text = call.request.query.get(name)
    number = default if not text else int(text)
    if number < 0:
        raise InvalidArgument(f"{name} must not be negative; got {number}.")
    return min(number, cap)
