"""S3's answers, shared by the handlers: an XML document in S3's namespace and its elements, S3's forms
of a time, an object's headers and checksum, a key as a listing writes it, and an object's bytes streamed
off the event loop (:class:`FileAnswer`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import formatdate
from typing import IO
from urllib.parse import quote
from xml.sax.saxutils import escape

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from hyperplan.objects import served as files
from hyperplan.server.errors import S3_XML
from hyperplan.server.limits import KIB
from hyperplan.server.s3.body import Received

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
SEND_CHUNK = 256 * KIB


def xml_answer(root: str, inner: str, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """An S3 XML document: ``root`` in S3's namespace around ``inner``, whose elements are escaped."""
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{root} xmlns="{NAMESPACE}">{inner}</{root}>'
    return Response(body.encode(), status_code=status, media_type=S3_XML, headers=headers)


def element(name: str, value: object) -> str:
    """``<name>value</name>``, the value escaped: every text an answer carries goes through here."""
    return f"<{name}>{escape(str(value))}</{name}>"


def iso_time(mtime_ns: int) -> str:
    """A file's modification time as S3's XML writes times (ISO 8601 in UTC, to the millisecond)."""
    return datetime.fromtimestamp(mtime_ns / 1e9, UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def iso_moment(moment: datetime) -> str:
    """A moment as S3's XML writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def http_date(mtime_ns: int) -> str:
    """A file's modification time as HTTP headers write dates (Last-Modified)."""
    return formatdate(mtime_ns / 1e9, usegmt=True)


def object_headers(info: files.ObjectInfo) -> dict[str, str]:
    """What every answer about an object carries: its ETag, date, type and user metadata."""
    headers = {
        "ETag": info.etag,
        "Last-Modified": http_date(info.mtime_ns),
        "Content-Type": info.content_type,
        "Accept-Ranges": "bytes",
    }
    for name, value in info.metadata.items():
        headers[f"x-amz-meta-{name}"] = value
    return headers


def checksum_headers(received: Received) -> dict[str, str]:
    """The flexible checksum a body came with, echoed back as S3 does (none when it came without)."""
    if received.checksum is None:
        return {}
    algorithm, value = received.checksum
    return {f"x-amz-checksum-{algorithm}": value}


def listed_form(encode: bool) -> Callable[[str], str]:
    """How a listing writes a key, prefix or delimiter: URL-encoded when the caller asked for
    ``encoding-type=url`` (for keys XML cannot carry), else as it is."""
    return (lambda text: quote(text, safe="/")) if encode else (lambda text: text)


def written_size(shown: Callable[[str], str]) -> Callable[[str], int]:
    """A key's bytes as the answer writes it (URL-encoded when asked, XML-escaped): what a listing's page
    weighs it by (core/s3_listing.py)."""
    return lambda key: len(escape(shown(key)).encode("utf-8", "surrogatepass"))


class FileAnswer:
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
