"""Raw S3 requests signed as S3 signs them, for bodies and headers the SDKs will not send on their own
(aws-chunked bodies with chunk signatures and trailers, wrong hashes, bad members).

The request's signature is botocore's own, by its S3 signer, with the payload hash the test chooses; a
streaming body's chunk and trailer signatures are computed here, from AWS's description of the format.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import zlib
from collections.abc import Mapping

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from hyperplan.signing import Credentials
from tests.harness import ADMIN, RAW_HTTP, REGION

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class _Signer(S3SigV4Auth):
    """botocore's S3 signer, signing whatever x-amz-content-sha256 the test put on the request."""

    def payload(self, request: AWSRequest) -> str:
        return str(request.headers["X-Amz-Content-SHA256"])

    def _modify_request_before_signing(self, request: AWSRequest) -> None:
        chosen = request.headers["X-Amz-Content-SHA256"]
        super()._modify_request_before_signing(request)
        del request.headers["X-Amz-Content-SHA256"]
        request.headers["X-Amz-Content-SHA256"] = chosen


def signed(
    url: str,
    method: str,
    path: str,
    *,
    body: bytes = b"",
    payload_hash: str | None = None,
    headers: Mapping[str, str] | None = None,
    credentials: Credentials = ADMIN,
) -> tuple[httpx.Response, _Signer, AWSRequest]:
    """Send one S3 request, signed; returns the answer, and the signer and request (for chunk signatures)."""
    request = AWSRequest(method=method, url=f"{url}{path}", data=body, headers=dict(headers or {}))
    request.headers["X-Amz-Content-SHA256"] = payload_hash or hashlib.sha256(body).hexdigest()
    signer = _Signer(BotoCredentials(credentials.access_key, credentials.secret_key), "s3", REGION)
    signer.add_auth(request)
    prepared = request.prepare()
    answer = RAW_HTTP.request(method, prepared.url, content=body, headers=dict(prepared.headers))
    return answer, signer, request


def streaming_put(
    url: str,
    path: str,
    data: bytes,
    *,
    mode: str,
    chunk: int = 64 * 1024,
    trailer: tuple[str, str] | None = None,
    corrupt_chunk: bool = False,
    credentials: Credentials = ADMIN,
) -> httpx.Response:
    """PUT `data` as an aws-chunked body in `mode` (STREAMING-...), with an optional checksum trailer
    (name, value); `corrupt_chunk` signs the first chunk wrongly."""
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data))}
    if trailer is not None:
        headers["x-amz-trailer"] = trailer[0]
    # Sign the headers first: the seed signature starts the chunks' chain.
    request = AWSRequest(method="PUT", url=f"{url}{path}", data=b"", headers=headers)
    request.headers["X-Amz-Content-SHA256"] = mode
    signer = _Signer(BotoCredentials(credentials.access_key, credentials.secret_key), "s3", REGION)
    signer.add_auth(request)
    timestamp = str(request.headers["X-Amz-Date"])
    scope = f"{timestamp[:8]}/{REGION}/s3/aws4_request"
    authorization = request.headers["Authorization"]
    seed = authorization.rsplit("Signature=", 1)[1]
    key = _key(credentials.secret_key, timestamp[:8])
    signed_chunks = mode.startswith("STREAMING-AWS4-HMAC-SHA256-PAYLOAD")

    body = bytearray()
    previous = seed
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)] + [b""]
    for index, piece in enumerate(pieces):
        if signed_chunks:
            to_sign = "\n".join(
                [
                    "AWS4-HMAC-SHA256-PAYLOAD",
                    timestamp,
                    scope,
                    previous,
                    EMPTY_SHA256,
                    hashlib.sha256(piece).hexdigest(),
                ]
            )
            signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
            previous = signature
            if corrupt_chunk and index == 0:
                signature = "0" * 64
            body += f"{len(piece):x};chunk-signature={signature}\r\n".encode()
        else:
            body += f"{len(piece):x}\r\n".encode()
        if piece:
            body += piece + b"\r\n"
    if trailer is not None:
        line = f"{trailer[0]}:{trailer[1]}"
        body += (line + "\r\n").encode()
        if mode == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER":
            to_sign = "\n".join(
                [
                    "AWS4-HMAC-SHA256-TRAILER",
                    timestamp,
                    scope,
                    previous,
                    hashlib.sha256((line + "\n").encode()).hexdigest(),
                ]
            )
            trailer_signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
            body += f"x-amz-trailer-signature:{trailer_signature}\r\n".encode()
    body += b"\r\n"
    prepared = request.prepare()
    sent = {name: value for name, value in prepared.headers.items() if name.lower() != "content-length"}
    return RAW_HTTP.put(prepared.url, content=bytes(body), headers=sent)


def _key(secret: str, date: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (date, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def crc32(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def sha256_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def upload_request(
    url: str, path: str, length: int, *, credentials: Credentials = ADMIN
) -> tuple[str, dict[str, str]]:
    """The URL and signed headers of a PUT whose body (`length` bytes, UNSIGNED-PAYLOAD) the caller
    streams itself."""
    request = AWSRequest(method="PUT", url=f"{url}{path}", data=b"", headers={"Content-Length": str(length)})
    request.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
    _Signer(BotoCredentials(credentials.access_key, credentials.secret_key), "s3", REGION).add_auth(request)
    prepared = request.prepare()
    headers = dict(prepared.headers)
    headers["Content-Length"] = str(length)
    return prepared.url, headers
