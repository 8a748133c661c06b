"""Server-side verification of AWS Signature Version 4.

Both wire protocols (SageMaker's awsJson1.1 at ``/`` and the native API under ``/api/v1/``) are signed
the way botocore signs a non-S3 service, so one verifier serves both. Two forms exist:

* the ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`` header that
  boto3 and the aws CLI send on every call, with the request time in ``X-Amz-Date``;
* a presigned URL, where the same fields travel as ``X-Amz-*`` query parameters plus ``X-Amz-Expires``,
  accepted only where the caller's :class:`SigningPolicy` allows it.

"Signed" means everything the server acts on is covered by the signature: the method, path, query, the
real SHA-256 of the body (``UNSIGNED-PAYLOAD`` and streaming payloads are refused), ``host``,
``x-amz-date`` and whatever headers the policy names. SigV4 lets the client choose which headers it
signs; an unsigned header could be changed by anyone who captured the request.

The request time comes from ``X-Amz-Date`` only. AWS also takes it from the HTTP ``Date`` header, but
no client of this server needs that (botocore, hence boto3, the aws CLI and ``hyperplan``, always sends
``X-Amz-Date``), and one source in one format is one thing less to get wrong.

The module is pure: no I/O and no clock. The caller passes the request as received, the policy, a
function that maps an access key id to its secret, and the current time. The canonicalisation mirrors
what botocore does on the client side (see ``botocore.auth.SigV4Auth``), because a verifier that is
"more correct" than the signers it must accept would reject real clients.

This module holds the entry points and the order of the checks. ``sigv4_claim`` reads what the client
claims (Authorization header or presigned query) and checks its scope and signed headers;
``sigv4_payload`` has the payload line (the body's hash, or S3's declared modes); ``sigv4_canonical``
and ``sigv4_key`` the canonical request, string to sign and signing key, shared with ``signing.py``.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from hyperplan.core.keyed_hash import hmac_sha256
from hyperplan.errors import (
    InvalidSignature,
    MissingAuthenticationToken,
    SignatureExpired,
    UnrecognizedClient,
)
from hyperplan.wire.sigv4_canonical import canonical_headers, canonical_query, canonical_uri, query_pairs
from hyperplan.wire.sigv4_claim import (
    Claim,
    check_scope,
    check_signed_headers,
    claim_from_header,
    claim_from_query,
    credential_service_of,
    presign_params,
)
from hyperplan.wire.sigv4_key import ALGORITHM, credential_scope, signing_key, string_to_sign
from hyperplan.wire.sigv4_payload import UNSIGNED_PAYLOAD, body_payload_hash, s3_declared_payload

TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"

SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method."
)
MISSING_TOKEN = "Missing Authentication Token"
UNKNOWN_KEY = "The security token included in the request is invalid."

_TIMESTAMP_RE = re.compile(r"\d{8}T\d{6}Z")
_PRESIGNED_EXCLUDE = frozenset({b"X-Amz-Signature"})
_NOTHING: frozenset[bytes] = frozenset()


@dataclass(frozen=True)
class SigningPolicy:
    """What one API demands of a signature beyond what this module always demands.

    Always demanded: ``host`` and (for the Authorization header form) ``x-amz-date`` among the
    SignedHeaders, and the real payload hash. ``headers_signed_when_sent`` names, in lower case, the
    headers that steer the API: when the request carries one, it must be signed. A request without it
    is left to the API to refuse (no ``X-Amz-Target``: no operation). ``presigned_urls`` says whether
    query-string authentication is accepted at all; ``api`` names the API in error messages.
    """

    api: str
    headers_signed_when_sent: frozenset[str] = frozenset()
    presigned_urls: bool = False


@dataclass(frozen=True)
class SignedRequest:
    """A request exactly as it arrived, before any decoding by the web framework.

    ``path`` is the raw, still percent-encoded path; ``query`` the raw query string without ``?``.
    ``headers`` may use any case; a header sent more than once must be joined with ``,``.
    """

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


# --------------------------------------------------------------------------------------------------
# The entry points
# --------------------------------------------------------------------------------------------------


def verify(
    request: SignedRequest,
    *,
    policy: SigningPolicy,
    lookup_secret: Callable[[str], str | None],
    region: str,
    service: str,
    now: datetime,
    max_skew: timedelta = timedelta(minutes=15),
) -> str:
    """Check the request's SigV4 signature, and that it covers what ``policy`` demands; return the
    access key id that signed it.

    Raises ``MissingAuthenticationToken`` when the request is not signed at all, ``UnrecognizedClient``
    when ``lookup_secret`` does not know the key, and ``InvalidSignature`` for everything else.
    ``now`` should be timezone-aware; a naive value is taken to be UTC.
    """
    headers = fold_headers(request.headers)
    return _verify(
        request,
        headers,
        policy=policy,
        lookup_secret=lookup_secret,
        region=region,
        service=service,
        now=now,
        max_skew=max_skew,
        path=canonical_uri(request.path),
        payload_hash=lambda _claim: body_payload_hash(headers, request.body),
    ).claim.access_key


@dataclass(frozen=True)
class S3Signature:
    """What an S3 request's verified signature says: who signed, and what a streaming body's chunk
    signatures chain from (the seed signature, its signing key, time and scope)."""

    access_key: str
    payload_hash: str  # as signed: a hex SHA-256, UNSIGNED-PAYLOAD or a STREAMING-* mode
    presigned: bool
    seed_signature: str
    signing_key: bytes
    timestamp: str
    scope: str


S3_POLICY = SigningPolicy(api="S3", presigned_urls=True)


def verify_s3(
    request: SignedRequest,
    *,
    lookup_secret: Callable[[str], str | None],
    region: str,
    now: datetime,
    max_skew: timedelta = timedelta(minutes=15),
) -> S3Signature:
    """S3's rules (botocore's ``S3SigV4Auth`` and ``S3SigV4QueryAuth``): the path is signed as sent,
    neither normalised nor encoded again; the payload line is the ``x-amz-content-sha256`` header, which a
    header-signed request must send and sign (a hex SHA-256 the caller checks against the body it
    streams, ``UNSIGNED-PAYLOAD`` or a ``STREAMING-*`` mode); a presigned URL signs ``UNSIGNED-PAYLOAD``.
    The body is not read here: ``request.body`` is ignored."""
    headers = fold_headers(request.headers)

    def payload_hash(claim: Claim) -> str:
        if claim.presigned:
            return UNSIGNED_PAYLOAD
        return s3_declared_payload(headers, claim.signed_headers)

    verified = _verify(
        request,
        headers,
        policy=S3_POLICY,
        lookup_secret=lookup_secret,
        region=region,
        service="s3",
        now=now,
        max_skew=max_skew,
        path=request.path or "/",
        payload_hash=payload_hash,
    )
    claim = verified.claim
    return S3Signature(
        access_key=claim.access_key,
        payload_hash=verified.payload_hash,
        presigned=claim.presigned,
        seed_signature=claim.signature.lower(),
        signing_key=verified.key,
        timestamp=claim.timestamp,
        scope=credential_scope(claim.scope_date, claim.scope_region, claim.scope_service),
    )


def credential_service(headers: Mapping[str, str], raw_query: str) -> str | None:
    """The service a request's SigV4 credential scope names (``Credential=KEY/DATE/REGION/SERVICE/...``
    in the Authorization header, or the ``X-Amz-Credential`` query parameter), or None if unsigned or
    unreadable: what tells the APIs sharing one endpoint apart, before any signature is checked."""
    return credential_service_of(
        (value for name, value in headers.items() if name.lower() == "authorization"), raw_query
    )


# --------------------------------------------------------------------------------------------------
# The checks, in order
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Verified:
    claim: Claim
    key: bytes
    payload_hash: str


def _verify(
    request: SignedRequest,
    headers: Mapping[str, str],
    *,
    policy: SigningPolicy,
    lookup_secret: Callable[[str], str | None],
    region: str,
    service: str,
    now: datetime,
    max_skew: timedelta,
    path: str,
    payload_hash: Callable[[Claim], str],
) -> _Verified:
    pairs = query_pairs(request.query)
    claim = _read_claim(headers, pairs, policy)

    check_scope(claim, region=region, service=service)
    request_time = _parse_timestamp(claim.timestamp)
    if claim.scope_date != claim.timestamp[:8]:
        raise InvalidSignature(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{claim.scope_date}' != '{claim.timestamp[:8]}', from '{claim.timestamp}'."
        )
    check_signed_headers(
        claim, headers, api=policy.api, headers_signed_when_sent=policy.headers_signed_when_sent
    )
    _check_time(request_time, _as_utc(now), max_skew, claim.expires)

    secret = lookup_secret(claim.access_key)
    if secret is None:
        raise UnrecognizedClient(UNKNOWN_KEY)

    # A presigned URL's own signature is not part of what it signs.
    exclude = _PRESIGNED_EXCLUDE if claim.presigned else _NOTHING
    payload = payload_hash(claim)
    canonical = "\n".join(
        [
            request.method.upper(),
            path,
            canonical_query(pairs, exclude=exclude),
            canonical_headers(headers, claim.signed_headers),
            ";".join(claim.signed_headers),
            payload,
        ]
    )
    scope = credential_scope(claim.scope_date, claim.scope_region, claim.scope_service)
    key = signing_key(secret, claim.scope_date, claim.scope_region, claim.scope_service)
    # The signing key's HMAC, its key blocks hashed once for every request signed with it that day.
    expected = hmac_sha256(key)(string_to_sign(claim.timestamp, scope, canonical).encode("utf-8")).hex()
    if not hmac.compare_digest(expected.encode("ascii"), claim.signature.encode("utf-8")):
        raise InvalidSignature(SIGNATURE_MISMATCH)
    return _Verified(claim, key, payload)


def _read_claim(headers: Mapping[str, str], pairs: list[tuple[bytes, bytes]], policy: SigningPolicy) -> Claim:
    """The claim of whichever form the request is signed in: exactly one of them, and one the policy
    accepts."""
    authorization = headers.get("authorization")
    presigned = any(key == b"X-Amz-Signature" for key, _ in pairs)
    if authorization is None and not presigned:
        raise MissingAuthenticationToken(MISSING_TOKEN)
    if authorization is not None and presigned:
        # Two signatures could disagree about who is calling; AWS refuses to pick one.
        raise InvalidSignature(
            "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter "
            "or the Authorization header should be specified."
        )
    if authorization is not None:
        algorithm, _, fields = authorization.strip().partition(" ")
        _check_algorithm(algorithm)
        return claim_from_header(fields, headers)
    if not policy.presigned_urls:
        raise InvalidSignature(
            f"{policy.api} does not accept presigned URLs (X-Amz-Signature in the query string); "
            "sign the request with an Authorization header instead."
        )
    params = presign_params(pairs)
    _check_algorithm(params["X-Amz-Algorithm"])
    return claim_from_query(params)


def _check_algorithm(algorithm: str) -> None:
    """Both forms name their algorithm; SigV4's is the only one this verifier computes."""
    if algorithm != ALGORITHM:
        raise InvalidSignature(
            f"Unsupported signature algorithm '{algorithm}'; only {ALGORITHM} is accepted."
        )


# --------------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=256)  # requests signed in the same second share it
def _parse_timestamp(value: str) -> datetime:
    if _TIMESTAMP_RE.fullmatch(value):
        try:  # YYYYMMDDTHHMMSSZ by position: what strptime(TIMESTAMP_FORMAT) reads, at a tenth the cost
            return datetime(
                int(value[0:4]),
                int(value[4:6]),
                int(value[6:8]),
                int(value[9:11]),
                int(value[11:13]),
                int(value[13:15]),
                tzinfo=UTC,
            )
        except ValueError:
            pass  # right shape, impossible date (month 13): same answer as a wrong shape
    raise InvalidSignature(
        f"Invalid X-Amz-Date '{value}': expected ISO 8601 basic format YYYYMMDD'T'HHMMSS'Z'."
    )


def _check_time(request_time: datetime, now: datetime, max_skew: timedelta, expires: int | None) -> None:
    """Bound replay: a signature is good within ``max_skew`` of now, or until a presigned URL expires."""
    minutes = int(max_skew.total_seconds() // 60)
    if request_time > now + max_skew:
        raise SignatureExpired(
            f"Signature not yet current: {_fmt(request_time)} is still later than {_fmt(now + max_skew)} "
            f"({_fmt(now)} + {minutes} min.)"
        )
    if expires is not None:
        valid_until = request_time + timedelta(seconds=expires)
        if now > valid_until:
            raise SignatureExpired(
                f"Request has expired: signed at {_fmt(request_time)} to be valid for {expires} seconds, "
                f"until {_fmt(valid_until)}; it is now {_fmt(now)}."
            )
        return
    if request_time < now - max_skew:
        raise SignatureExpired(
            f"Signature expired: {_fmt(request_time)} is now earlier than {_fmt(now - max_skew)} "
            f"({_fmt(now)} - {minutes} min.)"
        )


def _as_utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def _fmt(moment: datetime) -> str:
    return moment.strftime(TIMESTAMP_FORMAT)


# --------------------------------------------------------------------------------------------------
# Headers and query as received (the canonical forms they feed are sigv4_canonical's)
# --------------------------------------------------------------------------------------------------


class FoldedHeaders(dict[str, str]):
    """Headers already folded as `fold_headers` folds them (lower-case names, each once): what a server
    that reads them off the wire builds in the same pass (server/auth.py), so they are not folded again."""


def fold_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Lower-case header names; the same name in different cases is one header sent twice."""
    if isinstance(headers, FoldedHeaders):
        return headers
    folded: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        folded[key] = f"{folded[key]},{value}" if key in folded else value
    return folded


def canonical_query_string(raw_query: str) -> str:
    """Sorted, RFC 3986-encoded ``key=value`` pairs of a raw query string."""
    return canonical_query(query_pairs(raw_query), exclude=frozenset())
