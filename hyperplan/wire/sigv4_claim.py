"""What a SigV4 client claims about its signature, read from the Authorization header or a presigned
URL, and the checks on the claim alone: its scope, and the headers it must sign.

Which form a request uses, and the algorithm it names, are the verifier's to decide (``sigv4.py``);
this module reads the fields of each form. The wording of the complaints follows AWS's, so that what a
client's user searches for finds AWS's documentation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from hyperplan.errors import InvalidSignature
from hyperplan.wire.sigv4_canonical import query_pairs
from hyperplan.wire.sigv4_key import TERMINATOR

# AWS caps presigned URLs at one week.
MAX_PRESIGN_EXPIRES = 604800

_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)


@dataclass(frozen=True, slots=True)
class Claim:
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
# The Authorization header
# --------------------------------------------------------------------------------------------------


def claim_from_header(fields_text: str, headers: Mapping[str, str]) -> Claim:
    """The claim of an ``Authorization`` header, from what follows its algorithm's name."""
    fields = _authorization_fields(fields_text)
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
    return Claim(
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
    """The request time as SigV4 puts it in the string to sign (see ``sigv4.py``'s notes on ``Date``)."""
    amz_date = headers.get("x-amz-date")
    return None if amz_date is None else amz_date.strip()


# --------------------------------------------------------------------------------------------------
# A presigned URL
# --------------------------------------------------------------------------------------------------


def presign_params(pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The ``X-Amz-*`` query parameters of a presigned URL: each of them, each once."""
    params: dict[str, str] = {}
    for raw_key, raw_value in pairs:
        key = raw_key.decode("utf-8", "replace")
        if key not in _PRESIGN_PARAMS:
            continue
        if key in params:
            raise InvalidSignature(f"Query parameter '{key}' appears more than once.")
        params[key] = raw_value.decode("utf-8", "replace")
    missing = [name for name in _PRESIGN_PARAMS if name not in params]
    if missing:
        raise InvalidSignature(
            "AWS query-string parameters must include 'X-Amz-Algorithm', 'X-Amz-Credential', "
            "'X-Amz-Signature', 'X-Amz-Date', 'X-Amz-SignedHeaders', and 'X-Amz-Expires'. "
            "Re-examine the query-string parameters."
        )
    return params


def claim_from_query(params: Mapping[str, str]) -> Claim:
    """The claim of a presigned URL, from its parameters as :func:`presign_params` returns them."""
    access_key, date, region, service = _parse_credential(params["X-Amz-Credential"])
    return Claim(
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


def _parse_expires(value: str) -> int:
    if not value.isdigit():
        raise InvalidSignature(f"X-Amz-Expires must be a whole number of seconds, not '{value}'.")
    expires = int(value)
    if expires < 1 or expires > MAX_PRESIGN_EXPIRES:
        raise InvalidSignature(
            f"X-Amz-Expires must be between 1 and {MAX_PRESIGN_EXPIRES} seconds (one week), not {expires}."
        )
    return expires


# --------------------------------------------------------------------------------------------------
# The fields both forms share; the checks on the claim alone
# --------------------------------------------------------------------------------------------------


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


def check_scope(claim: Claim, *, region: str, service: str) -> None:
    """Refuse a credential scoped to another region or service than this endpoint's."""
    if claim.scope_region != region:
        raise InvalidSignature(
            f"Credential should be scoped to a valid region, not '{claim.scope_region}'. "
            f"This endpoint serves '{region}'."
        )
    if claim.scope_service != service:
        raise InvalidSignature(
            f"Credential should be scoped to correct service: '{service}', not '{claim.scope_service}'."
        )


def check_signed_headers(
    claim: Claim, headers: Mapping[str, str], *, api: str, headers_signed_when_sent: frozenset[str]
) -> None:
    """Refuse a signature that leaves out a header the server relies on, naming every one left out.

    ``host`` binds the signature to this endpoint; ``x-amz-date`` to its time (a presigned URL signs
    its time in the query string instead); the API's headers (``headers_signed_when_sent``, from its
    ``SigningPolicy``) to what the API does, so that, say, a request signed for
    SageMaker.ListTrainingPlans cannot be replayed as SageMaker.DeleteCluster.
    """
    required = {"host"} if claim.presigned else {"host", "x-amz-date"}
    required |= {name for name in headers_signed_when_sent if name in headers}
    unsigned = sorted(required - set(claim.signed_headers))
    if not unsigned:
        return
    names = ", ".join(f"'{_display_name(name)}'" for name in unsigned)
    noun = "a 'SignedHeader'" if len(unsigned) == 1 else "'SignedHeaders'"
    raise InvalidSignature(
        f"{names} must be {noun} in the AWS Authorization: "
        f"{api} does not act on a request the signature does not fully cover."
    )


def _display_name(header: str) -> str:
    return "-".join(part.capitalize() for part in header.split("-"))


def credential_service_of(authorizations: Iterable[str], raw_query: str) -> str | None:
    """The service a request's credential scope names, from the Authorization headers' values (in the
    order sent) or the ``X-Amz-Credential`` query parameter; None if unsigned or unreadable. Lenient on
    purpose: it only tells the APIs sharing one endpoint apart, before any signature is checked."""
    credential = None
    for value in authorizations:
        for part in value.partition(" ")[2].split(","):
            key, _, found = part.strip().partition("=")
            if key == "Credential":
                credential = found
    if credential is None and "X-Amz-Credential" in raw_query:
        for pair_key, raw in query_pairs(raw_query):
            if pair_key == b"X-Amz-Credential":
                credential = raw.decode("utf-8", "replace")
    if credential is None:
        return None
    parts = credential.rsplit("/", 4)
    return parts[3] if len(parts) == 5 else None
