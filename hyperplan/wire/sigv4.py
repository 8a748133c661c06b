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
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes

from hyperplan.core.keyed_hash import hmac_sha256
from hyperplan.errors import (
    InvalidSignature,
    MissingAuthenticationToken,
    SignatureExpired,
    UnrecognizedClient,
)

ALGORITHM = "AWS4-HMAC-SHA256"
TERMINATOR = "aws4_request"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
# Prefix of the chunked payload modes (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-...).
STREAMING_PAYLOAD_PREFIX = "STREAMING-"
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"
# AWS caps presigned URLs at one week.
MAX_PRESIGN_EXPIRES = 604800

SIGNATURE_MISMATCH = (
    "The request signature we calculated does not match the signature you provided. "
    "Check your AWS Secret Access Key and signing method."
)
MISSING_TOKEN = "Missing Authentication Token"
UNKNOWN_KEY = "The security token included in the request is invalid."

_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)
_TIMESTAMP_RE = re.compile(r"\d{8}T\d{6}Z")
_HEX64_RE = re.compile(r"[0-9a-fA-F]{64}")
# RFC 3986 unreserved characters: the only ones SigV4 leaves unencoded in the query string.
_QUERY_SAFE = "-_.~"
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


@dataclass(frozen=True, slots=True)
class _Claim:
    """What the client says about its signature, from the Authorization header or the query string."""

    access_key: str
    scope_date: str
    scope_region: str
    scope_service: str
    signed_headers: tuple[str, ...]
    signature: str
    timestamp: str
    expires: int | None  # seconds; only presigned URLs carry it
    presigned: bool


# --------------------------------------------------------------------------------------------------
# The entry point
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
        payload_hash=lambda _claim: _payload_hash(headers, request.body),
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

    def payload_hash(claim: _Claim) -> str:
        if claim.presigned:
            return UNSIGNED_PAYLOAD
        declared = headers.get("x-amz-content-sha256")
        if declared is None:
            raise InvalidSignature("Missing required header for this request: x-amz-content-sha256.")
        if "x-amz-content-sha256" not in claim.signed_headers:
            raise InvalidSignature(
                "'X-Amz-Content-Sha256' must be a 'SignedHeader' in the AWS Authorization."
            )
        declared = declared.strip()
        if not (declared == UNSIGNED_PAYLOAD or declared in STREAMING_MODES or _HEX64_RE.fullmatch(declared)):
            raise InvalidSignature(
                f"x-amz-content-sha256 '{declared}' is neither a hex SHA-256 nor a payload mode S3 knows."
            )
        return declared

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


STREAMING_MODES = frozenset(
    {
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
    }
)


def credential_service(headers: Mapping[str, str], raw_query: str) -> str | None:
    """The service a request's SigV4 credential scope names (``Credential=KEY/DATE/REGION/SERVICE/...``
    in the Authorization header, or the ``X-Amz-Credential`` query parameter), or None if unsigned or
    unreadable: what tells the APIs sharing one endpoint apart, before any signature is checked."""
    return credential_service_of(
        (value for name, value in headers.items() if name.lower() == "authorization"), raw_query
    )


def credential_service_of(authorizations: Iterable[str], raw_query: str) -> str | None:
    """:func:`credential_service` from the Authorization headers' values, in the order sent."""
    credential = None
    for value in authorizations:
        for part in value.partition(" ")[2].split(","):
            key, _, found = part.strip().partition("=")
            if key == "Credential":
                credential = found
    if credential is None and "X-Amz-Credential" in raw_query:
        for pair_key, raw in _query_pairs(raw_query):
            if pair_key == b"X-Amz-Credential":
                credential = raw.decode("utf-8", "replace")
    if credential is None:
        return None
    parts = credential.rsplit("/", 4)
    return parts[3] if len(parts) == 5 else None


@dataclass(frozen=True, slots=True)
class _Verified:
    claim: _Claim
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
    payload_hash: Callable[[_Claim], str],
) -> _Verified:
    pairs = _query_pairs(request.query)
    claim = _read_claim(headers, pairs, policy)

    _check_scope(claim, region=region, service=service)
    request_time = _parse_timestamp(claim.timestamp)
    if claim.scope_date != claim.timestamp[:8]:
        raise InvalidSignature(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{claim.scope_date}' != '{claim.timestamp[:8]}', from '{claim.timestamp}'."
        )
    _check_signed_headers(claim, headers, policy)
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
            _canonical_query(pairs, exclude=exclude),
            _canonical_headers(headers, claim.signed_headers),
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


# --------------------------------------------------------------------------------------------------
# Reading the claim
# --------------------------------------------------------------------------------------------------


def _read_claim(
    headers: Mapping[str, str], pairs: list[tuple[bytes, bytes]], policy: SigningPolicy
) -> _Claim:
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
        return _claim_from_header(authorization, headers)
    if not policy.presigned_urls:
        raise InvalidSignature(
            f"{policy.api} does not accept presigned URLs (X-Amz-Signature in the query string); "
            "sign the request with an Authorization header instead."
        )
    return _claim_from_query(pairs)


def _claim_from_header(authorization: str, headers: Mapping[str, str]) -> _Claim:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise InvalidSignature(
            f"Unsupported signature algorithm '{algorithm}'; only {ALGORITHM} is accepted."
        )
    fields = _authorization_fields(rest)
    missing = [name for name in ("Credential", "SignedHeaders", "Signature") if name not in fields]
    timestamp = _header_timestamp(headers)
    if missing or timestamp is None:
        # Name every missing piece at once, as AWS does, so one round trip fixes the client.
        problems = [f"Authorization header requires '{name}' parameter." for name in missing]
        if timestamp is None:
            problems.append(
                "Authorization header requires an 'X-Amz-Date' header; "
                "this server does not take the request time from 'Date'."
            )
        raise InvalidSignature(" ".join(problems))
    access_key, date, region, service = _parse_credential(fields["Credential"])
    return _Claim(
        access_key=access_key,
        scope_date=date,
        scope_region=region,
        scope_service=service,
        signed_headers=_parse_signed_headers(fields["SignedHeaders"]),
        signature=fields["Signature"],
        timestamp=timestamp,
        expires=None,
        presigned=False,
    )


def _authorization_fields(rest: str) -> dict[str, str]:
    """Split ``Credential=a, SignedHeaders=b, Signature=c`` (spaces after commas optional)."""
    fields: dict[str, str] = {}
    for part in rest.split(","):
        part = part.strip()
        if not part:
            continue
        name, eq, value = part.partition("=")
        if not eq:
            raise InvalidSignature(
                f"Invalid key=value pair (missing equal-sign) in Authorization header: '{part}'."
            )
        name = name.strip()
        if name in fields:
            raise InvalidSignature(f"Authorization header has parameter '{name}' more than once.")
        fields[name] = value.strip()
    return fields


def _header_timestamp(headers: Mapping[str, str]) -> str | None:
    """The request time as SigV4 puts it in the string to sign (see the module notes on ``Date``)."""
    amz_date = headers.get("x-amz-date")
    return None if amz_date is None else amz_date.strip()


def _claim_from_query(pairs: list[tuple[bytes, bytes]]) -> _Claim:
    params = _presign_params(pairs)
    missing = [name for name in _PRESIGN_PARAMS if name not in params]
    if missing:
        raise InvalidSignature(
            "AWS query-string parameters must include 'X-Amz-Algorithm', 'X-Amz-Credential', "
            "'X-Amz-Signature', 'X-Amz-Date', 'X-Amz-SignedHeaders', and 'X-Amz-Expires'. "
            "Re-examine the query-string parameters."
        )
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise InvalidSignature(
            f"Unsupported signature algorithm '{params['X-Amz-Algorithm']}'; only {ALGORITHM} is accepted."
        )
    access_key, date, region, service = _parse_credential(params["X-Amz-Credential"])
    return _Claim(
        access_key=access_key,
        scope_date=date,
        scope_region=region,
        scope_service=service,
        signed_headers=_parse_signed_headers(params["X-Amz-SignedHeaders"]),
        signature=params["X-Amz-Signature"],
        timestamp=params["X-Amz-Date"],
        expires=_parse_expires(params["X-Amz-Expires"]),
        presigned=True,
    )


def _presign_params(pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
    params: dict[str, str] = {}
    for raw_key, raw_value in pairs:
        key = raw_key.decode("utf-8", "replace")
        if key not in _PRESIGN_PARAMS:
            continue
        if key in params:
            raise InvalidSignature(f"Query parameter '{key}' appears more than once.")
        params[key] = raw_value.decode("utf-8", "replace")
    return params


def _parse_expires(value: str) -> int:
    if not value.isdigit():
        raise InvalidSignature(f"X-Amz-Expires must be a whole number of seconds, not '{value}'.")
    expires = int(value)
    if expires < 1 or expires > MAX_PRESIGN_EXPIRES:
        raise InvalidSignature(
            f"X-Amz-Expires must be between 1 and {MAX_PRESIGN_EXPIRES} seconds (one week), not {expires}."
        )
    return expires


def _parse_credential(credential: str) -> tuple[str, str, str, str]:
    # Split from the right: the four scope parts never contain '/', so the key id keeps whatever is left.
    parts = credential.rsplit("/", 4)
    if len(parts) != 5 or not all(parts):
        raise InvalidSignature(
            "Credential should have exactly 5 slash-delimited elements, "
            f"e.g. keyid/date/region/service/term, got '{credential}'."
        )
    access_key, date, region, service, terminator = parts
    if terminator != TERMINATOR:
        raise InvalidSignature(
            f"Credential should be scoped with a valid terminator: '{TERMINATOR}', not '{terminator}'."
        )
    return access_key, date, region, service


@lru_cache(maxsize=256)  # one client signs the same headers in every request
def _parse_signed_headers(value: str) -> tuple[str, ...]:
    names = [name.strip().lower() for name in value.split(";")]
    if not all(names):
        raise InvalidSignature(f"SignedHeaders has an empty header name: '{value}'.")
    # The canonical request lists them sorted and lower-cased, whatever order the client wrote.
    return tuple(sorted(set(names)))


# --------------------------------------------------------------------------------------------------
# What must be signed, scope and time
# --------------------------------------------------------------------------------------------------


def _check_signed_headers(claim: _Claim, headers: Mapping[str, str], policy: SigningPolicy) -> None:
    """Refuse a signature that leaves out a header the server relies on, naming every one left out.

    ``host`` binds the signature to this endpoint; ``x-amz-date`` to its time (a presigned URL signs
    its time in the query string instead); the policy's headers to what the API does, so that, say,
    a request signed for SageMaker.ListTrainingPlans cannot be replayed as SageMaker.DeleteCluster.
    """
    required = {"host"} if claim.presigned else {"host", "x-amz-date"}
    required |= {name for name in policy.headers_signed_when_sent if name in headers}
    unsigned = sorted(required - set(claim.signed_headers))
    if not unsigned:
        return
    names = ", ".join(f"'{_display_name(name)}'" for name in unsigned)
    noun = "a 'SignedHeader'" if len(unsigned) == 1 else "'SignedHeaders'"
    raise InvalidSignature(
        f"{names} must be {noun} in the AWS Authorization: "
        f"{policy.api} does not act on a request the signature does not fully cover."
    )


def _display_name(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


def _check_scope(claim: _Claim, *, region: str, service: str) -> None:
    if claim.scope_region != region:
        raise InvalidSignature(
            f"Credential should be scoped to a valid region, not '{claim.scope_region}'. "
            f"This endpoint serves '{region}'."
        )
    if claim.scope_service != service:
        raise InvalidSignature(
            f"Credential should be scoped to correct service: '{service}', not '{claim.scope_service}'."
        )


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
# Canonicalisation (public so the client signer and tests share exactly one definition)
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


@lru_cache(maxsize=1024)  # a server sees few paths (POST / above all); each costs a quote and a split
def canonical_uri(raw_path: str) -> str:
    """Canonical URI for a non-S3 service, as botocore computes it.

    Dot segments and empty segments are removed, then the already percent-encoded path is encoded
    *again* (``%20`` becomes ``%2520``): SigV4 double-encodes paths for every service but S3.
    """
    return quote(_remove_dot_segments(raw_path) or "/", safe="/~")


def _remove_dot_segments(path: str) -> str:
    if not path:
        return "/"
    kept: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if kept:
                kept.pop()
        else:
            kept.append(segment)
    leading = "/" if path.startswith("/") else ""
    trailing = "/" if path.endswith("/") and kept else ""
    return leading + "/".join(kept) + trailing


def canonical_query_string(raw_query: str) -> str:
    """Sorted, RFC 3986-encoded ``key=value`` pairs of a raw query string."""
    return _canonical_query(_query_pairs(raw_query), exclude=frozenset())


def _query_pairs(raw_query: str) -> list[tuple[bytes, bytes]]:
    """Decode a raw query string into (key, value) byte pairs.

    ``+`` means a space here, as in HTML forms: botocore's ``AWSRequest.prepare`` sends spaces in
    ``params`` as ``+`` while signing them as ``%20``, and web frameworks read ``+`` as a space too.
    Bytes, not text, so a stray invalid UTF-8 escape survives the decode/encode round trip unchanged.
    """
    pairs: list[tuple[bytes, bytes]] = []
    for part in raw_query.split("&"):
        if not part:
            continue
        key, _, value = part.partition("=")
        pairs.append((_unquote_plus_bytes(key), _unquote_plus_bytes(value)))
    return pairs


def _unquote_plus_bytes(text: str) -> bytes:
    return unquote_to_bytes(text.replace("+", " "))


def _canonical_query(pairs: Iterable[tuple[bytes, bytes]], *, exclude: frozenset[bytes]) -> str:
    encoded = sorted(
        (quote(key, safe=_QUERY_SAFE), quote(value, safe=_QUERY_SAFE))
        for key, value in pairs
        if key not in exclude
    )
    return "&".join(f"{key}={value}" for key, value in encoded)


def _canonical_header_value(value: str) -> str:
    # SigV4 "Trimall": strip, and collapse internal runs of whitespace to one space.
    return " ".join(value.split())


def _canonical_headers(headers: Mapping[str, str], signed_headers: tuple[str, ...]) -> str:
    lines = []
    for name in signed_headers:
        value = headers.get(name)
        if value is None:
            raise InvalidSignature(
                f"Header '{name}' is listed in SignedHeaders but is not present in the request."
            )
        lines.append(f"{name}:{_canonical_header_value(value)}\n")
    return "".join(lines)


def _payload_hash(headers: Mapping[str, str], body: bytes) -> str:
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


def canonical_request(
    *,
    method: str,
    path: str,
    canonical_query: str,
    headers: Mapping[str, str],
    signed_headers: tuple[str, ...],
    payload_hash: str,
) -> str:
    """The SigV4 canonical request. ``headers`` must already be folded to lower-case names."""
    return "\n".join(
        [
            method.upper(),
            canonical_uri(path),
            canonical_query,
            _canonical_headers(headers, signed_headers),
            ";".join(signed_headers),
            payload_hash,
        ]
    )


def credential_scope(date: str, region: str, service: str) -> str:
    return f"{date}/{region}/{service}/{TERMINATOR}"


def string_to_sign(timestamp: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"{ALGORITHM}\n{timestamp}\n{scope}\n{digest}"


@lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    """HMAC chain AWS documents for SigV4: secret -> date -> region -> service -> 'aws4_request'.

    Cached because one key signs every request a client makes that day; each derivation is four HMACs.
    """
    key = ("AWS4" + secret).encode("utf-8")
    for part in (date, region, service, TERMINATOR):
        key = hmac.new(key, part.encode("utf-8"), hashlib.sha256).digest()
    return key
