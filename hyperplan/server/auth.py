"""Who is calling: SigV4 against the store's access keys, freshness against the real wall clock.

Also which API demands what of a signature (``wire/sigv4.py`` always demands ``host``, ``x-amz-date``
and the real body hash). The SageMaker and CloudWatch Logs APIs pick their operation from
``X-Amz-Target``, so that header must be signed; STS takes its from the signed body. None of these
APIs has a use for presigned URLs: no route is meant to be opened from a link. S3 (server/s3) follows
S3's own rules: :func:`authenticate_s3`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from starlette.datastructures import URL
from starlette.requests import Request
from starlette.types import Scope

from hyperplan.clock import utcnow
from hyperplan.errors import AccessDenied, HyperplanError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire import sigv2, sigv4
from hyperplan.wire.sigv4_payload import UNSIGNED_PAYLOAD

SIGNING_SERVICE = "sagemaker"
NATIVE_PREFIX = "/api/"

SAGEMAKER_API = sigv4.SigningPolicy(
    api="The SageMaker API", headers_signed_when_sent=frozenset({"x-amz-target"})
)
NATIVE_API = sigv4.SigningPolicy(api="The native API")
LOGS_API = sigv4.SigningPolicy(
    api="The CloudWatch Logs API", headers_signed_when_sent=frozenset({"x-amz-target"})
)
STS_API = sigv4.SigningPolicy(api="The STS API")


def policy_for(path: str) -> sigv4.SigningPolicy:
    """The native API lives under /api/; anything else gets the SageMaker API's stricter policy."""
    return NATIVE_API if path.startswith(NATIVE_PREFIX) else SAGEMAKER_API


def authenticate(
    runtime: ServiceContext,
    request: Request,
    body: bytes,
    service: str = SIGNING_SERVICE,
    policy: sigv4.SigningPolicy | None = None,
) -> Caller:
    """The caller of a request signed for ``service`` (the credential scope's), under ``policy`` (by
    default the one its path calls for: the native API's or SageMaker's)."""
    return authenticate_scope(runtime, request.scope, body, service, policy)


def authenticate_scope(
    runtime: ServiceContext,
    scope: Scope,
    body: bytes,
    service: str = SIGNING_SERVICE,
    policy: sigv4.SigningPolicy | None = None,
) -> Caller:
    """:func:`authenticate` for a request known by its ASGI scope alone (the awsJson front door)."""
    runtime.sync()  # keys revoked, capacity booked, the clock moved by another process: seen now
    found: dict[str, Caller] = {}

    def load(access_key_id: str) -> tuple[str, Caller] | None:
        return account_views.caller_for_key(runtime, access_key_id)

    def lookup_secret(access_key_id: str) -> str | None:
        entry = runtime.keys.get(access_key_id, load)
        if entry is None:
            return None
        secret, caller = entry
        found[access_key_id] = caller
        return secret

    # Read from the ASGI scope as the server received it: Starlette's request.url, request.headers and
    # request.client build objects (a URL parsed back out of a string) that cost more than the rest.
    # Starlette's URL only where the scope lacks what is needed (no raw_path; a query string, rare here):
    # the path and query then read exactly as request.url gives them.
    raw_path = scope.get("raw_path")
    signed = sigv4.SignedRequest(
        method=scope["method"],
        path=(raw_path.decode("latin-1") if raw_path is not None else URL(scope=scope).path).split("?")[0],
        query=URL(scope=scope).query if scope.get("query_string") else "",
        headers=_joined_headers(scope["headers"]),
        body=body,
    )
    client = scope.get("client")
    remote = client[0] if client else ""
    try:
        access_key_id = sigv4.verify(
            signed,
            # The decoded path the router matches, so the policy follows the API that will serve it.
            policy=policy or policy_for(scope["path"]),
            lookup_secret=lookup_secret,
            region=runtime.region,
            service=service,
            now=utcnow(),
        )
    except HyperplanError as refused:  # the audit trail counts refused signatures per address
        claimed = _CLAIMED_KEY.search(signed.headers.get("authorization", ""))
        key_id = claimed.group(1)[:128] if claimed else ""
        runtime.refusals.note(runtime.db, runtime.clock.now(), remote, key_id, refused.code)
        raise
    return _with_remote(found[access_key_id], remote)


def _with_remote(caller: Caller, remote: str) -> Caller:
    """The key's caller with the request's peer address. The same caller from the key cache and the
    same address give the same value, made once (dataclasses.replace is a tenth of what verifying
    costs): kept while the cache's caller is the one it was made from."""
    cached = _REMOTE_CALLERS.get((caller.access_key_id, remote))
    if cached is not None and cached[0] is caller:
        return cached[1]
    made = dataclasses.replace(caller, remote_address=remote)
    if len(_REMOTE_CALLERS) >= _REMOTE_CALLERS_MAX:
        _REMOTE_CALLERS.clear()
    _REMOTE_CALLERS[(caller.access_key_id, remote)] = (caller, made)
    return made


# (access key, peer address) -> (the key cache's caller, that caller with the address); bounded
_REMOTE_CALLERS: dict[tuple[str, str], tuple[Caller, Caller]] = {}
_REMOTE_CALLERS_MAX = 4096


_CLAIMED_KEY = re.compile(r"Credential=([A-Za-z0-9]+)/")


def _joined_headers(raw: Iterable[tuple[bytes, bytes]]) -> sigv4.FoldedHeaders:
    """The headers by lower-case name (ASGI's raw list: names already lower case); a header sent twice
    is signed as its values joined by ',' (SigV4's canonical form). One pass, and SigV4 folds them no
    more (sigv4.FoldedHeaders)."""
    joined = sigv4.FoldedHeaders()
    for raw_name, raw_value in raw:
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        joined[name] = f"{joined[name]},{value}" if name in joined else value
    return joined


def require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise AccessDenied(f"Account {caller.account_name!r} is not an administrator.")


def authenticate_s3(
    runtime: ServiceContext, request: sigv4.SignedRequest, remote: str = ""
) -> tuple[Caller, sigv4.S3Signature]:
    """S3's SigV4 (``wire/sigv4.verify_s3``): the same keys, S3's rules for the path and the payload; the
    body is checked as it streams (server/s3/body.py), with what the signature returned. A refusal is
    counted for ``remote`` in the audit trail, as the other APIs' are."""
    runtime.sync()  # a key revoked by another process: seen now
    found: dict[str, Caller] = {}

    def lookup_secret(access_key_id: str) -> str | None:
        entry = runtime.keys.get(access_key_id, lambda key: account_views.caller_for_key(runtime, key))
        if entry is None:
            return None
        secret, caller = entry
        found[access_key_id] = caller
        return secret

    try:
        signature = sigv4.verify_s3(request, lookup_secret=lookup_secret, region=runtime.region, now=utcnow())
    except HyperplanError as refused:
        claimed = _CLAIMED_KEY.search(request.headers.get("authorization", ""))
        key_id = claimed.group(1)[:128] if claimed else ""
        runtime.refusals.note(runtime.db, runtime.clock.now(), remote, key_id, refused.code)
        raise
    return _with_remote(found[signature.access_key], remote), signature


def authenticate_s3_v2(
    runtime: ServiceContext,
    claim: sigv2.PresignedV2,
    method: str,
    resource_path: str,
    raw_query: str,
    headers: Mapping[str, str],
) -> tuple[Caller, sigv4.S3Signature]:
    """A presigned URL of Signature Version 2 (``wire/sigv2.py``): what botocore presigns S3 URLs with
    for an endpoint URL unless told s3v4. Its body, if any, is unsigned, as with any presigned URL."""
    runtime.sync()  # a key revoked by another process: seen now
    found: dict[str, Caller] = {}

    def lookup_secret(access_key_id: str) -> str | None:
        entry = runtime.keys.get(access_key_id, lambda key: account_views.caller_for_key(runtime, key))
        if entry is None:
            return None
        secret, caller = entry
        found[access_key_id] = caller
        return secret

    access_key = sigv2.verify_presigned(
        claim,
        method=method,
        resource_path=resource_path,
        raw_query=raw_query,
        headers=headers,
        lookup_secret=lookup_secret,
        now=utcnow(),
    )
    signature = sigv4.S3Signature(access_key, UNSIGNED_PAYLOAD, True, "", b"", "", "")
    return found[access_key], signature
