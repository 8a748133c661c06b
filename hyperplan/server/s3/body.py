"""An S3 request's body, received as it arrives: decoded, checked and handed to a sink piece by piece.

Never held whole: each piece the connection delivers goes on to the sink (a staged file) once decoded.
Bounded: at most ``ServerLimits.s3_max_body_bytes`` decoded bytes (refused before reading when the
length is declared), ``body_timeout`` seconds without a byte and ``s3_body_timeout`` in all.

What is checked, as S3 checks it:

- a plain body against the signed ``x-amz-content-sha256`` (XAmzContentSHA256Mismatch), unless that is
  ``UNSIGNED-PAYLOAD``; its length against ``Content-Length`` (IncompleteBody);
- an ``aws-chunked`` body (``STREAMING-*`` payload modes): its framing, its decoded length against
  ``x-amz-decoded-content-length``, and in the signed modes every chunk's signature, chained from the
  request's (SignatureDoesNotMatch), and the trailer's;
- ``Content-MD5`` when sent (BadDigest), and a flexible checksum (``x-amz-checksum-ALG``, as a header
  or, announced by ``x-amz-trailer``, in the chunked body's trailer; BadDigest when wrong).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from starlette.types import Receive

from hyperplan.errors import (
    BadDigest,
    ContentSha256Mismatch,
    EntityTooLarge,
    IncompleteBody,
    InvalidArgument,
    InvalidDigest,
    InvalidSignature,
    RequestTimeout,
)
from hyperplan.server.limits import ServerLimits, describe_bytes
from hyperplan.wire.sigv4 import S3Signature
from hyperplan.wire.sigv4_payload import UNSIGNED_PAYLOAD

SIGNED_CHUNKS = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
SIGNED_CHUNKS_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
UNSIGNED_CHUNKS_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_CHUNK_LINE = 4096


class Sink(Protocol):
    def write(self, data: bytes, /) -> object: ...


# -- checksums ------------------------------------------------------------------------------------------


class _Crc:
    """A reflected CRC from a table (CRC-32C and CRC-64/NVME: zlib has only CRC-32)."""

    def __init__(self, polynomial: int, width: int) -> None:
        self.width = width
        self.mask = (1 << width) - 1
        self.table = []
        for byte in range(256):
            value = byte
            for _ in range(8):
                value = (value >> 1) ^ polynomial if value & 1 else value >> 1
            self.table.append(value)

    def update(self, state: int, data: bytes) -> int:
        table = self.table
        for byte in data:
            state = table[(state ^ byte) & 0xFF] ^ (state >> 8)
        return state


_CRC32C = _Crc(0x82F63B78, 32)
_CRC64NVME = _Crc(0x9A6C9329AC4BC9B5, 64)


class Checksum:
    """One of S3's flexible checksums, computed as the body goes by; its value as S3 sends it (base64)."""

    ALGORITHMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._hash = hashlib.new(algorithm) if algorithm in ("sha1", "sha256") else None
        self._crc = _CRC32C if algorithm == "crc32c" else _CRC64NVME if algorithm == "crc64nvme" else None
        self._state = self._crc.mask if self._crc is not None else 0

    def update(self, data: bytes) -> None:
        if self._hash is not None:
            self._hash.update(data)
        elif self._crc is not None:
            self._state = self._crc.update(self._state, data)
        else:
            self._state = zlib.crc32(data, self._state)

    def value(self) -> str:
        if self._hash is not None:
            raw = self._hash.digest()
        elif self._crc is not None:
            raw = (self._state ^ self._crc.mask).to_bytes(self._crc.width // 8, "big")
        else:
            raw = self._state.to_bytes(4, "big")
        return base64.b64encode(raw).decode("ascii")


def _checksum_header(name: str) -> str | None:
    """``x-amz-checksum-crc32`` -> ``crc32``; None for anything else."""
    if not name.startswith("x-amz-checksum-"):
        return None
    algorithm = name.removeprefix("x-amz-checksum-")
    if algorithm == "type":
        return None
    if algorithm not in Checksum.ALGORITHMS:
        raise InvalidArgument(
            f"Checksum algorithm {algorithm!r} ({name}) is not one this endpoint checks: "
            f"{', '.join(Checksum.ALGORITHMS)}."
        )
    return algorithm


# -- the body -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    size: int
    md5_hex: str
    checksum: tuple[str, str] | None  # (algorithm, base64 value), when one was sent and matched


class _Chunks:
    """The aws-chunked framing: ``HEX[;chunk-signature=SIG]\\r\\nDATA\\r\\n`` ... ``0...\\r\\n``, trailer
    lines, an empty line. Signed modes check each chunk's signature, chained from the seed's."""

    def __init__(self, signature: S3Signature, emit: Callable[[bytes], None]) -> None:
        self.signed = signature.payload_hash in (SIGNED_CHUNKS, SIGNED_CHUNKS_TRAILER)
        self.signature = signature
        self.previous = signature.seed_signature
        self.emit = emit
        self.buffer = bytearray()
        self.remaining = -1  # bytes of the current chunk's data still to come; -1: a header line is next
        self.need_crlf = False
        self.chunk_signature = ""
        self.chunk_hash = hashlib.sha256()
        self.in_trailer = False
        self.trailer: list[tuple[str, str]] = []
        self.trailer_signature: str | None = None
        self.done = False

    def feed(self, data: bytes) -> None:
        if self.done:
            if data.strip(b"\r\n"):
                raise IncompleteBody("The aws-chunked body goes on after its last chunk and trailer.")
            return
        self.buffer += data
        while self.buffer and not self.done:
            if self.remaining > 0:
                piece = bytes(self.buffer[: self.remaining])
                del self.buffer[: len(piece)]
                self.remaining -= len(piece)
                if self.signed:
                    self.chunk_hash.update(piece)
                self.emit(piece)
                if self.remaining == 0:
                    self.need_crlf = True
                continue
            if self.need_crlf:
                if len(self.buffer) < 2:
                    return
                if self.buffer[:2] != b"\r\n":
                    raise IncompleteBody(
                        "An aws-chunked chunk's data is not followed by CRLF: its size is wrong."
                    )
                del self.buffer[:2]
                self.need_crlf = False
                self._chunk_done()
                self.remaining = -1
                continue
            line = self._line()
            if line is None:
                return
            if self.in_trailer:
                self._trailer_line(line)
            else:
                self._header_line(line)

    def _line(self) -> str | None:
        end = self.buffer.find(b"\r\n")
        if end < 0:
            if len(self.buffer) > MAX_CHUNK_LINE:
                raise IncompleteBody("An aws-chunked header or trailer line is too long.")
            return None
        line = bytes(self.buffer[:end]).decode("latin-1")
        del self.buffer[: end + 2]
        return line

    def _header_line(self, line: str) -> None:
        size_text, _, extension = line.partition(";")
        try:
            size = int(size_text.strip(), 16)
        except ValueError:
            raise IncompleteBody(
                f"Bad aws-chunked chunk header {line[:80]!r}: its size is not hex."
            ) from None
        if self.signed:
            name, _, value = extension.partition("=")
            if name.strip() != "chunk-signature" or not value:
                raise InvalidSignature(f"aws-chunked chunk header {line[:120]!r} carries no chunk-signature.")
            self.chunk_signature = value.strip()
        self.chunk_hash = hashlib.sha256()
        if size == 0:
            self._chunk_done()
            self.in_trailer = True
        else:
            self.remaining = size

    def _chunk_done(self) -> None:
        if not self.signed:
            return
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-PAYLOAD",
                self.signature.timestamp,
                self.signature.scope,
                self.previous,
                EMPTY_SHA256,
                self.chunk_hash.hexdigest(),
            ]
        )
        expected = hmac.new(self.signature.signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self.chunk_signature.lower()):
            raise InvalidSignature(
                "The request signature we calculated does not match the signature you provided: "
                "an aws-chunked chunk's signature is wrong."
            )
        self.previous = expected

    def _trailer_line(self, line: str) -> None:
        if not line:
            self._trailer_done()
            return
        name, colon, value = line.partition(":")
        if not colon:
            raise IncompleteBody(f"Bad aws-chunked trailer line {line[:80]!r}: no ':'.")
        name = name.strip().lower()
        if name == "x-amz-trailer-signature":
            self.trailer_signature = value.strip()
        else:
            self.trailer.append((name, value.strip()))

    def _trailer_done(self) -> None:
        self.done = True
        if self.signature.payload_hash != SIGNED_CHUNKS_TRAILER:
            return
        if self.trailer_signature is None:
            raise InvalidSignature("The aws-chunked trailer carries no x-amz-trailer-signature.")
        canonical = "".join(f"{name}:{value}\n" for name, value in self.trailer)
        to_sign = "\n".join(
            [
                "AWS4-HMAC-SHA256-TRAILER",
                self.signature.timestamp,
                self.signature.scope,
                self.previous,
                hashlib.sha256(canonical.encode()).hexdigest(),
            ]
        )
        expected = hmac.new(self.signature.signing_key, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, self.trailer_signature.lower()):
            raise InvalidSignature(
                "The request signature we calculated does not match the signature you provided: "
                "the aws-chunked trailer's signature is wrong."
            )


def declared_size(headers: Mapping[str, str], signature: S3Signature) -> int | None:
    """The body's decoded length as the request declares it (None: not declared)."""
    chunked = signature.payload_hash.startswith("STREAMING-")
    name = "x-amz-decoded-content-length" if chunked else "content-length"
    value = headers.get(name)
    if value is None:
        if chunked:
            raise InvalidArgument(
                f"An aws-chunked body ({signature.payload_hash}) needs the "
                "x-amz-decoded-content-length header."
            )
        return None
    if not value.strip().isdigit():
        raise InvalidArgument(f"{name} must be a whole number of bytes, not {value!r}.")
    return int(value)


async def receive_body(
    receive: Receive,
    headers: Mapping[str, str],
    signature: S3Signature,
    limits: ServerLimits,
    sink: Sink,
    *,
    cap: int | None = None,
) -> Received:
    """Read the whole body into `sink`, checking everything the request declares of it. `cap`: a lower
    cap than the server's (an XML body)."""
    cap = limits.s3_max_body_bytes if cap is None else cap
    declared = declared_size(headers, signature)
    if declared is not None and declared > cap:
        raise EntityTooLarge(
            f"Your proposed upload ({declared} bytes) exceeds the maximum allowed size, "
            f"{describe_bytes(cap)} for one request here."
        )
    md5 = hashlib.md5(usedforsecurity=False)
    sha256 = hashlib.sha256() if _is_hex_hash(signature.payload_hash) else None
    expected_md5 = _content_md5(headers.get("content-md5"))
    checksum = _flexible_checksum(headers)
    size = 0

    def emit(data: bytes) -> None:
        nonlocal size
        size += len(data)
        if size > cap:
            raise EntityTooLarge(f"The request body is over this endpoint's limit of {describe_bytes(cap)}.")
        md5.update(data)
        if checksum is not None:
            checksum[0].update(data)
        sink.write(data)

    chunks = _Chunks(signature, emit) if signature.payload_hash.startswith("STREAMING-") else None
    raw = 0
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limits.s3_body_timeout
    while True:
        wait = min(limits.body_timeout, deadline - loop.time())
        try:
            async with asyncio.timeout(max(wait, 0.001)):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(
                "Your socket connection to the server was not read from or written to within the timeout "
                f"period ({limits.body_timeout:g} s without a byte, or {limits.s3_body_timeout:g} s in all)."
            ) from None
        if message["type"] != "http.request":
            raise IncompleteBody("The connection closed before the request body was complete.")
        data = message.get("body", b"")
        if data:
            if sha256 is not None:
                sha256.update(data)
            if chunks is not None:
                raw += len(data)
                chunks.feed(data)
            else:
                emit(data)
        if not message.get("more_body", False):
            break
    if chunks is not None and not chunks.done:
        raise IncompleteBody("The aws-chunked body ended before its last chunk.")
    if declared is not None and size != declared:
        raise IncompleteBody(
            f"You did not provide the number of bytes specified: {size} of {declared} arrived."
        )
    if sha256 is not None and sha256.hexdigest() != signature.payload_hash.lower():
        raise ContentSha256Mismatch(
            "The provided 'x-amz-content-sha256' header does not match what was computed."
        )
    if expected_md5 is not None and md5.digest() != expected_md5:
        raise BadDigest("The Content-MD5 you specified did not match what we received.")
    matched = None
    if checksum is None and chunks is not None and _trailer_checksum(chunks.trailer):
        raise InvalidArgument("A checksum trailer arrived that x-amz-trailer did not announce.")
    if checksum is not None:
        computed, sent = checksum[0], checksum[1]
        if sent is None and chunks is not None:
            sent = dict(chunks.trailer).get(f"x-amz-checksum-{computed.algorithm}")
        if sent is None:
            raise InvalidArgument(
                f"x-amz-trailer announced x-amz-checksum-{computed.algorithm}, but no trailer carried it."
            )
        if computed.value() != sent:
            raise BadDigest(
                f"The {computed.algorithm.upper()} you specified did not match the calculated checksum "
                f"(sent {sent}, computed {computed.value()})."
            )
        matched = (computed.algorithm, sent)
    return Received(size, md5.hexdigest(), matched)


def _is_hex_hash(payload_hash: str) -> bool:
    return payload_hash != UNSIGNED_PAYLOAD and not payload_hash.startswith("STREAMING-")


def _content_md5(value: str | None) -> bytes | None:
    if value is None:
        return None
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise InvalidDigest("The Content-MD5 you specified is not valid: the base64 of 16 bytes.")
    return digest


def _flexible_checksum(headers: Mapping[str, str]) -> tuple[Checksum, str | None] | None:
    """The checksum to compute: one sent as a header (with its value), or one announced by
    ``x-amz-trailer`` (its value comes in the trailer)."""
    for name, value in headers.items():
        algorithm = _checksum_header(name)
        if algorithm is not None:
            return Checksum(algorithm), value.strip()
    announced = headers.get("x-amz-trailer")
    if announced is not None:
        names = [part.strip().lower() for part in announced.split(",") if part.strip()]
        for name in names:
            algorithm = _checksum_header(name)
            if algorithm is not None:
                return Checksum(algorithm), None
        raise InvalidArgument(f"x-amz-trailer {announced!r} names no checksum this endpoint checks.")
    return None


def _trailer_checksum(trailer: list[tuple[str, str]]) -> bool:
    return any(_checksum_header(name) is not None for name, _value in trailer)
