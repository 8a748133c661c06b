"""The payload line of a SigV4 canonical request: what a signature says about the body.

Two rules. The JSON APIs sign the body's real SHA-256 and nothing else (:func:`body_payload_hash`). S3
signs what ``x-amz-content-sha256`` declares, which may also be ``UNSIGNED-PAYLOAD`` or a chunked
``STREAMING-*`` mode (:func:`s3_declared_payload`): the S3 endpoint streams the body and checks it
against the declaration itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from hyperplan.errors import InvalidSignature

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Prefix of the chunked payload modes (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-...).
STREAMING_PAYLOAD_PREFIX = "STREAMING-"
STREAMING_MODES = frozenset(
    {
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    }
)

_HEX64_RE = re.compile(r"[0-9a-fA-F]{64}")


def body_payload_hash(headers: Mapping[str, str], body: bytes) -> str:
    """The payload line of the canonical request: always the SHA-256 of the body actually received.

    JSON services do not send ``x-amz-content-sha256``, so the hash is computed from the body. When the
    header is present it is what the client signed, so it must be that same hash: else the body could be
    swapped under a valid signature. ``UNSIGNED-PAYLOAD`` (and the chunked ``STREAMING-*`` modes, which
    sign the body piece by piece) would leave the body out of the signature, so they are refused.
    """
    computed = hashlib.sha256(body).hexdigest()
    declared = headers.get("x-amz-content-sha256")
    if declared is None:
        return computed
    declared = declared.strip()
    if declared == UNSIGNED_PAYLOAD or declared.startswith(STREAMING_PAYLOAD_PREFIX):
        raise InvalidSignature(
            f"x-amz-content-sha256 '{declared}' is not accepted: the body must be signed. Send the hex "
            "SHA-256 of the body in x-amz-content-sha256, or leave the header out."
        )
    if not _HEX64_RE.fullmatch(declared):
        raise InvalidSignature(
            f"Unsupported x-amz-content-sha256 value '{declared}'; send the hex SHA-256 of the body."
        )
    if declared.lower() != computed:
        raise InvalidSignature("The provided 'x-amz-content-sha256' header does not match what was computed.")
    return declared


def s3_declared_payload(headers: Mapping[str, str], signed_headers: tuple[str, ...]) -> str:
    """The payload line of a header-signed S3 request: ``x-amz-content-sha256``, which it must send and
    sign, as a hex SHA-256, ``UNSIGNED-PAYLOAD`` or a ``STREAMING-*`` mode. The body is not read here."""
    declared = headers.get("x-amz-content-sha256")
    if declared is None:
        raise InvalidSignature("Missing required header for this request: x-amz-content-sha256.")
    if "x-amz-content-sha256" not in signed_headers:
        raise InvalidSignature("'X-Amz-Content-Sha256' must be a 'SignedHeader' in the AWS Authorization.")
    declared = declared.strip()
    if not (declared == UNSIGNED_PAYLOAD or declared in STREAMING_MODES or _HEX64_RE.fullmatch(declared)):
        raise InvalidSignature(
            f"x-amz-content-sha256 '{declared}' is neither a hex SHA-256 nor a payload mode S3 knows."
        )
    return declared
