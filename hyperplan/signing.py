"""Client-side SigV4 signing for hyperplan's own CLI.

The CLI signs with the same canonical forms the server verifies with (``hyperplan.wire.sigv4``), and
``tests/test_signing.py`` checks every signature against botocore's own signer (``SigV4Auth``), which is
what boto3 and the aws CLI use: the signature is the same byte for byte. Importing botocore's signer
costs a command about a tenth of a second, more than everything else a command does.

Like botocore, it signs every header it is given but ``expect``, ``user-agent`` and
``x-amzn-trace-id``, plus Host and X-Amz-Date (and X-Amz-Security-Token), and the body's real SHA-256,
which is what the server demands. It sets the Host header itself, so that the HTTP client cannot send a
different one, and keeps the request time in X-Amz-Date, the only place the server reads it from.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import SplitResult, urlsplit

from hyperplan.wire.sigv4 import TIMESTAMP_FORMAT, canonical_query_string, fold_headers
from hyperplan.wire.sigv4_canonical import canonical_request
from hyperplan.wire.sigv4_key import ALGORITHM, credential_scope, signing_key, string_to_sign

_DEFAULT_PORTS = {"http": 80, "https": 443}
UNSIGNED_HEADERS = frozenset({"expect", "user-agent", "x-amzn-trace-id"})  # botocore's list


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    session_token: str | None = None


def sign_request(
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    body: bytes,
    access_key: str,
    secret_key: str,
    region: str,
    service: str = "sagemaker",
    session_token: str | None = None,
    now: datetime | None = None,
) -> dict[str, str]:
    """Return ``headers`` (less any Date) plus Host, X-Amz-Date, Authorization (and X-Amz-Security-Token).

    ``url`` must be exactly what goes on the wire: path and query already percent-encoded. Send the
    returned headers as they are; the Host header among them is the one that was signed. ``now`` is the
    request time (the real clock by default: the server checks it against its own).
    """
    parts = urlsplit(url)
    signed_request = {name: value for name, value in headers.items() if name.lower() != "date"}
    if not any(name.lower() == "host" for name in signed_request):
        signed_request["Host"] = _host_header(parts)
    timestamp = (now or datetime.now(UTC)).astimezone(UTC).strftime(TIMESTAMP_FORMAT)
    signed_request["X-Amz-Date"] = timestamp
    if session_token:
        signed_request["X-Amz-Security-Token"] = session_token
    folded = fold_headers(signed_request)
    signed_names = tuple(sorted(name for name in folded if name not in UNSIGNED_HEADERS))
    canonical = canonical_request(
        method=method,
        path=parts.path or "/",
        canonical_query=canonical_query_string(parts.query),
        headers=folded,
        signed_headers=signed_names,
        payload_hash=hashlib.sha256(body).hexdigest(),
    )
    scope = credential_scope(timestamp[:8], region, service)
    key = signing_key(secret_key, timestamp[:8], region, service)
    signature = hmac.new(key, string_to_sign(timestamp, scope, canonical).encode(), hashlib.sha256)
    signed_request["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={';'.join(signed_names)}, "
        f"Signature={signature.hexdigest()}"
    )
    return signed_request


def _host_header(parts: SplitResult) -> str:
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets in a Host header
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host
