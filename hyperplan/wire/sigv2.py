"""S3's presigned URLs of Signature Version 2 (``?AWSAccessKeyId=...&Expires=...&Signature=...``).

botocore, and so the aws CLI v1 (``aws s3 presign``) and boto3's ``generate_presigned_url``, presigns S3
URLs with version 2 for an endpoint URL unless told ``signature_version = s3v4``; S3 still accepts them.
Only the query-string form is accepted here (a version-2 Authorization header is not), for S3 only.

The string to sign, as botocore's ``HmacV1QueryAuth`` writes it: the method, ``Content-MD5``,
``Content-Type``, the expiry (seconds since the epoch), the ``x-amz-*`` headers (lower-case, sorted,
``name:value``), then the resource: ``/BUCKET/KEY`` as sent, and the sub-resources of the query string
(sorted). The signature is the base64 HMAC-SHA1 of it under the secret key. Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl

from hyperplan.errors import InvalidSignature, SignatureExpired, UnrecognizedClient
from hyperplan.wire.sigv4 import SIGNATURE_MISMATCH, UNKNOWN_KEY

PARAMETERS = ("AWSAccessKeyId", "Expires", "Signature")
SUBRESOURCES = frozenset(
    {
        "acl",
        "cors",
        "delete",
        "lifecycle",
        "location",
        "logging",
        "notification",
        "partNumber",
        "policy",
        "requestPayment",
        "restore",
        "tagging",
        "torrent",
        "uploadId",
        "uploads",
        "versionId",
        "versioning",
        "versions",
        "website",
        "response-cache-control",
        "response-content-disposition",
        "response-content-encoding",
        "response-content-language",
        "response-content-type",
        "response-expires",
    }
)


@dataclass(frozen=True)
class PresignedV2:
    access_key: str
    expires: int
    signature: str


def presigned(raw_query: str) -> PresignedV2 | None:
    """The version-2 presigned parameters of a query string, or None if it carries none of them."""
    values: dict[str, str] = {}
    for key, value in parse_qsl(raw_query, keep_blank_values=True):
        if key in PARAMETERS:
            if key in values:
                raise InvalidSignature(f"Query parameter '{key}' appears more than once.")
            values[key] = value
    if not values:
        return None
    missing = [name for name in PARAMETERS if name not in values]
    if missing:
        raise InvalidSignature(
            "A presigned URL of Signature Version 2 carries AWSAccessKeyId, Expires and Signature; "
            f"missing: {', '.join(missing)}."
        )
    if not values["Expires"].isdigit():
        raise InvalidSignature(f"Expires must be seconds since the epoch, not '{values['Expires'][:40]}'.")
    return PresignedV2(values["AWSAccessKeyId"], int(values["Expires"]), values["Signature"])


def verify_presigned(
    claim: PresignedV2,
    *,
    method: str,
    resource_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    lookup_secret: Callable[[str], str | None],
    now: datetime,
) -> str:
    """Check a version-2 presigned URL; return the access key id. `resource_path` is ``/BUCKET/KEY`` as
    sent (for a virtual-hosted request, ``/BUCKET`` and the path)."""
    moment = now if now.tzinfo is not None else now.replace(tzinfo=UTC)
    if moment.timestamp() > claim.expires:
        expired = datetime.fromtimestamp(claim.expires, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        raise SignatureExpired(f"Request has expired: it was valid until {expired}.")
    secret = lookup_secret(claim.access_key)
    if secret is None:
        raise UnrecognizedClient(UNKNOWN_KEY)
    folded = {name.lower(): value for name, value in headers.items()}
    amz = "".join(f"{name}:{folded[name].strip()}\n" for name in sorted(folded) if name.startswith("x-amz-"))
    subresources = sorted(
        (key, value) for key, value in parse_qsl(raw_query, keep_blank_values=True) if key in SUBRESOURCES
    )
    resource = resource_path
    if subresources:
        resource += "?" + "&".join(f"{key}={value}" if value else key for key, value in subresources)
    to_sign = "\n".join(
        [
            method.upper(),
            folded.get("content-md5", "").strip(),
            folded.get("content-type", "").strip(),
            str(claim.expires),
        ]
    )
    to_sign += "\n" + amz + resource
    expected = base64.b64encode(hmac.new(secret.encode(), to_sign.encode(), hashlib.sha1).digest()).decode()
    if not hmac.compare_digest(expected.encode(), claim.signature.encode()):
        raise InvalidSignature(SIGNATURE_MISMATCH)
    return claim.access_key
