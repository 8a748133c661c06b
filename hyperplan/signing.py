"""Client-side SigV4 signing for hyperplan's own CLI.

botocore does the signing, so our CLI signs byte-for-byte like boto3 and the aws CLI, which is what the
server's verifier (``hyperplan.wire.sigv4``) is tested against. botocore signs every header it is given
(Host, X-Amz-Date, X-Amz-Target, Content-Type, ...) and the body's real SHA-256, which is what the server
demands. This module only pins down what botocore leaves to the HTTP client and that must match on both
ends: the Host header and the canonical form of the query string; and it keeps the request time in
X-Amz-Date, the only place the server reads it from.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


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
) -> dict[str, str]:
    """Return ``headers`` (less any Date) plus Host, X-Amz-Date, Authorization (and X-Amz-Security-Token).

    ``url`` must be exactly what goes on the wire: path and query already percent-encoded. Send the
    returned headers as they are; the Host header among them is the one that was signed.
    """
    # botocore is imported here, not at the top: a CLI command that only prints help never signs.
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotocoreCredentials

    parts = urlsplit(url)
    # Given a Date header, botocore would put the request time there instead of in X-Amz-Date.
    to_sign = {name: value for name, value in headers.items() if name.lower() != "date"}
    if not any(name.lower() == "host" for name in to_sign):
        # Set it ourselves rather than trust the HTTP client to derive the same value botocore signed.
        to_sign["Host"] = _host_header(parts)
    request = AWSRequest(method=method.upper(), url=_signing_url(parts), headers=to_sign, data=body)
    credentials = BotocoreCredentials(access_key, secret_key, session_token)
    SigV4Auth(credentials, service, region).add_auth(request)
    return dict(request.headers.items())


def _signing_url(parts: SplitResult) -> str:
    """The URL with its query already in SigV4 canonical form.

    botocore signs a query taken from the URL verbatim (sorted, not re-encoded), while the server
    decodes and re-encodes it. Canonicalising here first makes both ends agree however the caller
    encoded the query (``+`` or ``%20`` for a space, ``~`` or ``%7E``, ...).
    """
    from hyperplan.wire.sigv4 import canonical_query_string

    return urlunsplit(parts._replace(query=canonical_query_string(parts.query)))


def _host_header(parts: SplitResult) -> str:
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal keeps its brackets in a Host header
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host
