"""SigV4 verification against what real AWS clients send.

Requests are signed by botocore itself (``SigV4Auth``, ``SigV4QueryAuth``), by a real boto3 client and by
the real aws CLI, never by a reimplementation: the verifier must accept exactly what they produce.
The only network used is a throwaway HTTP server on 127.0.0.1 that records requests.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from unittest import mock
from urllib.parse import urlencode, urlsplit

import boto3
import httpx
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotocoreCredentials
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.errors import InvalidSignature, MissingAuthenticationToken, UnrecognizedClient
from hyperplan.signing import Credentials, sign_request
from hyperplan.wire import sigv4
from hyperplan.wire.sigv4 import SIGNATURE_MISMATCH, SignedRequest, SigningPolicy, verify
from hyperplan.wire.sigv4_canonical import canonical_uri
from hyperplan.wire.sigv4_key import signing_key
from tests.harness import SignerLeavingOut

KEY = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
OTHER_KEY = "AKIDOTHER"
REGION = "us-east-1"
SERVICE = "sagemaker"
# Never contacted: these requests are signed and verified in memory.
ENDPOINT = "https://sagemaker.us-east-1.example"
SIGNED_AT = datetime(2026, 11, 30, 1, 2, 3, tzinfo=UTC)
SECRETS = {KEY: SECRET, OTHER_KEY: "another-secret"}
# Policies shaped like the server's two APIs, plus one that takes presigned URLs (none of the server's does).
TARGETED = SigningPolicy(api="The SageMaker API", headers_signed_when_sent=frozenset({"x-amz-target"}))
PLAIN = SigningPolicy(api="The native API")
PRESIGNABLE = SigningPolicy(api="A presignable API", presigned_urls=True)


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def _botocore_clock(moment: datetime) -> mock._patch[mock.MagicMock]:
    # botocore reads the clock through this one function (naive UTC).
    return mock.patch("botocore.auth.get_current_datetime", return_value=moment.replace(tzinfo=None))


def _received(request: AWSRequest) -> SignedRequest:
    """What the server sees for a botocore request: the prepared URL, headers and body, plus Host."""
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    headers = dict(prepared.headers.items())
    headers["Host"] = parts.netloc  # the HTTP client adds it; no default ports in these tests
    body = prepared.body or b""
    assert isinstance(body, bytes)
    return SignedRequest(
        method=prepared.method, path=parts.path, query=parts.query, headers=headers, body=body
    )


def botocore_signed(
    method: str,
    path: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    region: str = REGION,
    service: str = SERVICE,
    secret: str = SECRET,
    token: str | None = None,
    signed_at: datetime = SIGNED_AT,
    context: dict[str, object] | None = None,
    unsigned: tuple[str, ...] = (),
) -> SignedRequest:
    request = AWSRequest(
        method=method, url=ENDPOINT + path, data=body, headers=headers or {}, params=params or {}
    )
    request.context.update(context or {})
    credentials = BotocoreCredentials(KEY, secret, token)
    signer = SignerLeavingOut(credentials, service, region, leave_out=frozenset(unsigned))
    with _botocore_clock(signed_at):
        signer.add_auth(request)
    return _received(request)


def botocore_presigned(
    path: str, *, params: dict[str, str], expires: int, method: str = "GET", body: bytes = b""
) -> SignedRequest:
    request = AWSRequest(method=method, url=ENDPOINT + path, params=params, data=body)
    with _botocore_clock(SIGNED_AT):
        SigV4QueryAuth(BotocoreCredentials(KEY, SECRET), SERVICE, REGION, expires=expires).add_auth(request)
    return _received(request)


def check(
    request: SignedRequest,
    *,
    policy: SigningPolicy = TARGETED,
    now: datetime = SIGNED_AT,
    lookup_secret: Callable[[str], str | None] = SECRETS.get,
    max_skew: timedelta = timedelta(minutes=15),
) -> str:
    return verify(
        request,
        policy=policy,
        lookup_secret=lookup_secret,
        region=REGION,
        service=SERVICE,
        now=now,
        max_skew=max_skew,
    )


def signed_header_names(request: SignedRequest) -> set[str]:
    authorization = sigv4.fold_headers(request.headers)["authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0]
    return set(signed.split(";"))


def with_headers(request: SignedRequest, **changes: str) -> SignedRequest:
    headers = dict(request.headers)
    for name, value in changes.items():
        headers[name.replace("_", "-")] = value
    return dataclasses.replace(request, headers=headers)


def json_call(
    target: str | None = "SageMaker.ListTrainingPlans", unsigned: tuple[str, ...] = ()
) -> SignedRequest:
    headers = {"Content-Type": "application/x-amz-json-1.1"}
    if target is not None:
        headers["X-Amz-Target"] = target
    return botocore_signed("POST", "/", body=b'{"MaxResults": 10}', headers=headers, unsigned=unsigned)


# --------------------------------------------------------------------------------------------------
# What botocore signs, verifies
# --------------------------------------------------------------------------------------------------


def test_json_post_with_target_header_verifies() -> None:
    assert check(json_call()) == KEY


def test_get_with_query_needing_encoding_verifies() -> None:
    request = botocore_signed(
        "GET",
        "/api/v1/training-plans/my%20plan",
        params={"name prefix": "a b+c/é~", "filter": "x=y&z", "empty": "", "Z": "1"},
    )
    # botocore sends spaces in params as '+' but signs them as '%20'; both must be understood.
    assert "+" in request.query
    assert check(request) == KEY


def test_delete_with_empty_body_verifies() -> None:
    request = botocore_signed("DELETE", "/api/v1/training-plans/tp-0123")
    assert request.body == b""
    assert check(request) == KEY


def test_session_token_is_a_signed_header() -> None:
    request = botocore_signed("POST", "/", body=b"{}", token="session-token/+=")
    assert request.headers["X-Amz-Security-Token"] == "session-token/+="
    assert check(request) == KEY
    with pytest.raises(InvalidSignature, match="does not match"):
        check(with_headers(request, X_Amz_Security_Token="another-token"))


def test_declared_payload_hash_of_the_body_verifies_in_either_case() -> None:
    digest = hashlib.sha256(b"{}").hexdigest()
    for declared in (digest, digest.upper()):
        request = botocore_signed("POST", "/", body=b"{}", headers={"X-Amz-Content-SHA256": declared})
        assert check(request) == KEY


def test_unsigned_headers_may_be_added_in_transit() -> None:
    # Proxies add headers; only the ones listed in SignedHeaders are covered by the signature.
    assert check(with_headers(json_call(), X_Forwarded_For="10.0.0.1", User_Agent="something")) == KEY


def test_header_names_are_case_insensitive() -> None:
    request = json_call()
    lowered = {name.lower(): value for name, value in request.headers.items()}
    assert check(dataclasses.replace(request, headers=lowered)) == KEY


def test_now_may_be_naive_utc() -> None:
    assert check(json_call(), now=SIGNED_AT.replace(tzinfo=None)) == KEY


def test_max_skew_is_inclusive() -> None:
    assert check(json_call(), now=SIGNED_AT + timedelta(minutes=15)) == KEY
    assert check(json_call(), now=SIGNED_AT - timedelta(minutes=15)) == KEY


# --------------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------------


def test_unsigned_request_is_missing_authentication_token() -> None:
    request = SignedRequest("POST", "/", "", {"Host": "sagemaker.us-east-1.example"}, b"{}")
    with pytest.raises(MissingAuthenticationToken, match=r"^Missing Authentication Token$"):
        check(request)


def test_unknown_access_key_is_unrecognized_client() -> None:
    with pytest.raises(
        UnrecognizedClient, match=r"^The security token included in the request is invalid\.$"
    ):
        check(json_call(), lookup_secret=lambda key: None)


def test_wrong_secret_is_a_signature_mismatch() -> None:
    request = botocore_signed("POST", "/", body=b"{}", secret="not-the-secret")
    with pytest.raises(InvalidSignature) as caught:
        check(request)
    assert caught.value.message == SIGNATURE_MISMATCH
    assert caught.value.status == 403
    assert caught.value.code == "InvalidSignatureException"


def test_old_signature_has_expired() -> None:
    with pytest.raises(InvalidSignature) as caught:
        check(json_call(), now=SIGNED_AT + timedelta(minutes=45))
    assert caught.value.message == (
        "Signature expired: 20261130T010203Z is now earlier than 20261130T013203Z "
        "(20261130T014703Z - 15 min.)"
    )


def test_twenty_minute_old_signature_has_expired() -> None:
    with pytest.raises(InvalidSignature, match=r"^Signature expired: 20261130T010203Z is now earlier than"):
        check(json_call(), now=SIGNED_AT + timedelta(minutes=20))


def test_twenty_minute_future_signature_is_not_yet_current() -> None:
    with pytest.raises(InvalidSignature) as caught:
        check(json_call(), now=SIGNED_AT - timedelta(minutes=20))
    assert caught.value.message == (
        "Signature not yet current: 20261130T010203Z is still later than 20261130T005703Z "
        "(20261130T004203Z + 15 min.)"
    )


def test_max_skew_is_configurable() -> None:
    with pytest.raises(InvalidSignature, match=r"\(20261130T010803Z - 5 min\.\)$"):
        check(json_call(), now=SIGNED_AT + timedelta(minutes=6), max_skew=timedelta(minutes=5))


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda r: dataclasses.replace(r, body=b'{"MaxResults": 11}'), id="body"),
        pytest.param(lambda r: with_headers(r, X_Amz_Target="SageMaker.DeleteTrainingPlan"), id="header"),
        pytest.param(lambda r: with_headers(r, Host="evil.example"), id="host"),
        pytest.param(lambda r: dataclasses.replace(r, path="/api/v1/other"), id="path"),
        pytest.param(lambda r: dataclasses.replace(r, query="MaxResults=11"), id="query-added"),
        pytest.param(lambda r: dataclasses.replace(r, method="PUT"), id="method"),
    ],
)
def test_tampered_json_call_is_refused(tamper: Callable[[SignedRequest], SignedRequest]) -> None:
    with pytest.raises(InvalidSignature) as caught:
        check(tamper(json_call()))
    assert caught.value.message == SIGNATURE_MISMATCH


def test_tampered_query_value_is_refused() -> None:
    request = botocore_signed("GET", "/api/v1/training-plans", params={"status": "Active", "limit": "5"})
    tampered = dataclasses.replace(request, query=request.query.replace("Active", "Expired"))
    with pytest.raises(InvalidSignature, match="does not match the signature you provided"):
        check(tampered)


def test_wrong_region_scope_is_named() -> None:
    request = botocore_signed("POST", "/", body=b"{}", region="eu-west-1")
    with pytest.raises(InvalidSignature) as caught:
        check(request)
    assert caught.value.message == (
        "Credential should be scoped to a valid region, not 'eu-west-1'. This endpoint serves 'us-east-1'."
    )


def test_wrong_service_scope_is_named() -> None:
    request = botocore_signed("POST", "/", body=b"{}", service="sts")
    with pytest.raises(InvalidSignature) as caught:
        check(request)
    assert caught.value.message == "Credential should be scoped to correct service: 'sagemaker', not 'sts'."


@pytest.mark.parametrize(
    ("authorization", "expected"),
    [
        ("AWS AKIDEXAMPLE:c2lnbmF0dXJl", "Unsupported signature algorithm 'AWS'"),
        ("AWS4-HMAC-SHA512 Credential=a/b/c/d/e", "Unsupported signature algorithm 'AWS4-HMAC-SHA512'"),
        ("AWS4-HMAC-SHA256", "requires 'Credential' parameter"),
        ("AWS4-HMAC-SHA256 Credential=x, Signature=00", "requires 'SignedHeaders' parameter"),
        ("AWS4-HMAC-SHA256 Credential, SignedHeaders=host, Signature=00", "missing equal-sign"),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/sagemaker, "
            "SignedHeaders=host, Signature=0",
            "exactly 5 slash-delimited elements",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261130/us-east-1/sagemaker/aws5_request, "
            "SignedHeaders=host, Signature=0",
            "valid terminator: 'aws4_request', not 'aws5_request'",
        ),
        (
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261129/us-east-1/sagemaker/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=0",
            "Date in Credential scope does not match",
        ),
    ],
)
def test_malformed_authorization_header(authorization: str, expected: str) -> None:
    request = with_headers(json_call(), Authorization=authorization)
    with pytest.raises(InvalidSignature, match=expected):
        check(request)


def test_missing_x_amz_date() -> None:
    headers = {name: value for name, value in json_call().headers.items() if name != "X-Amz-Date"}
    with pytest.raises(InvalidSignature) as caught:
        check(dataclasses.replace(json_call(), headers=headers))
    assert caught.value.message == (
        "Authorization header requires an 'X-Amz-Date' header; "
        "this server does not take the request time from 'Date'."
    )


def test_http_date_header_does_not_stand_in_for_x_amz_date() -> None:
    # AWS would take the time from Date; botocore signs that way when the caller sets a Date header.
    request = botocore_signed("POST", "/", body=b"{}", headers={"Date": "placeholder, botocore rewrites it"})
    assert "X-Amz-Date" not in request.headers
    assert "date" in signed_header_names(request)
    with pytest.raises(InvalidSignature, match=r"requires an 'X-Amz-Date' header"):
        check(request)


@pytest.mark.parametrize("value", ["2026-11-30T01:02:03Z", "20261330T010203Z", "yesterday"])
def test_invalid_x_amz_date(value: str) -> None:
    with pytest.raises(InvalidSignature, match=f"Invalid X-Amz-Date '{value}'"):
        check(with_headers(json_call(), X_Amz_Date=value))


# --------------------------------------------------------------------------------------------------
# Signed means signed: the headers the server acts on, and the body
# --------------------------------------------------------------------------------------------------


def _target_added_after_signing() -> SignedRequest:
    # Signed with no X-Amz-Target at all, then given one in transit.
    return with_headers(json_call(target=None), X_Amz_Target="SageMaker.DeleteCluster")


@pytest.mark.parametrize(
    ("make", "policy", "refusal"),
    [
        pytest.param(
            lambda: json_call(unsigned=("host",)),
            TARGETED,
            "'Host' must be a 'SignedHeader' in the AWS Authorization: "
            "The SageMaker API does not act on a request the signature does not fully cover.",
            id="host",
        ),
        pytest.param(
            lambda: json_call(unsigned=("x-amz-date",)),
            PLAIN,
            "'X-Amz-Date' must be a 'SignedHeader' in the AWS Authorization: "
            "The native API does not act on a request the signature does not fully cover.",
            id="x-amz-date",
        ),
        pytest.param(
            lambda: json_call(unsigned=("x-amz-target",)),
            TARGETED,
            "'X-Amz-Target' must be a 'SignedHeader' in the AWS Authorization: "
            "The SageMaker API does not act on a request the signature does not fully cover.",
            id="x-amz-target",
        ),
        pytest.param(
            _target_added_after_signing,
            TARGETED,
            "'X-Amz-Target' must be a 'SignedHeader' in the AWS Authorization: "
            "The SageMaker API does not act on a request the signature does not fully cover.",
            id="x-amz-target-added-in-transit",
        ),
        pytest.param(
            lambda: json_call(unsigned=("host", "x-amz-date", "x-amz-target")),
            TARGETED,
            "'Host', 'X-Amz-Date', 'X-Amz-Target' must be 'SignedHeaders' in the AWS Authorization: "
            "The SageMaker API does not act on a request the signature does not fully cover.",
            id="all-three-named-at-once",
        ),
        pytest.param(
            lambda: botocore_presigned("/", params={}, expires=300, method="POST", body=b"{}"),
            TARGETED,
            "The SageMaker API does not accept presigned URLs (X-Amz-Signature in the query string); "
            "sign the request with an Authorization header instead.",
            id="presigned-sagemaker",
        ),
        pytest.param(
            lambda: botocore_presigned("/api/v1/whoami", params={}, expires=300),
            PLAIN,
            "The native API does not accept presigned URLs (X-Amz-Signature in the query string); "
            "sign the request with an Authorization header instead.",
            id="presigned-native",
        ),
    ],
)
def test_signature_must_cover_what_the_server_acts_on(
    make: Callable[[], SignedRequest], policy: SigningPolicy, refusal: str
) -> None:
    with pytest.raises(InvalidSignature) as caught:
        check(make(), policy=policy)
    assert caught.value.message == refusal
    assert caught.value.status == 403


@pytest.mark.parametrize(
    ("make", "policy"),
    [
        pytest.param(json_call, TARGETED, id="botocore-signs-everything"),
        # No X-Amz-Target, no operation: the SageMaker API refuses it itself, with a clearer message.
        pytest.param(lambda: json_call(target=None), TARGETED, id="no-target-at-all"),
        # Only the policy's headers are demanded: the native API does not read X-Amz-Target.
        pytest.param(lambda: json_call(unsigned=("x-amz-target",)), PLAIN, id="target-unread-by-api"),
        pytest.param(
            lambda: botocore_presigned("/api/v1/whoami", params={}, expires=300), PRESIGNABLE, id="presign-ok"
        ),
    ],
)
def test_signature_covering_what_the_policy_demands_verifies(
    make: Callable[[], SignedRequest], policy: SigningPolicy
) -> None:
    assert check(make(), policy=policy) == KEY


@pytest.mark.parametrize(
    ("declared", "refusal"),
    [
        pytest.param(
            "UNSIGNED-PAYLOAD",
            "x-amz-content-sha256 'UNSIGNED-PAYLOAD' is not accepted: the body must be signed.",
            id="unsigned",
        ),
        pytest.param(
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            "x-amz-content-sha256 'STREAMING-AWS4-HMAC-SHA256-PAYLOAD' is not accepted",
            id="streaming-signed",
        ),
        pytest.param(
            "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "x-amz-content-sha256 'STREAMING-UNSIGNED-PAYLOAD-TRAILER' is not accepted",
            id="streaming-unsigned",
        ),
        pytest.param(
            hashlib.sha256(b'{"MaxResults": 99}').hexdigest(),
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            id="another-body",
        ),
        pytest.param("0" * 64, "The provided 'x-amz-content-sha256' header does not match", id="zeros"),
        pytest.param("sha256-of-the-body", "Unsupported x-amz-content-sha256 value", id="not-hex"),
    ],
)
def test_payload_hash_must_be_the_bodys(declared: str, refusal: str) -> None:
    request = botocore_signed(
        "POST", "/", body=b'{"MaxResults": 10}', headers={"X-Amz-Content-SHA256": declared}
    )
    with pytest.raises(InvalidSignature) as caught:
        check(request)
    assert caught.value.message.startswith(refusal)


def test_botocore_unsigned_payload_mode_is_refused() -> None:
    # What botocore sends when payload signing is switched off for an HTTPS operation.
    request = botocore_signed("POST", "/", body=b"{}", context={"payload_signing_enabled": False})
    assert request.headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD"
    with pytest.raises(InvalidSignature, match=r"^x-amz-content-sha256 'UNSIGNED-PAYLOAD' is not accepted"):
        check(request)


def test_signed_header_absent_from_request() -> None:
    request = json_call()
    headers = {name: value for name, value in request.headers.items() if name != "X-Amz-Target"}
    with pytest.raises(
        InvalidSignature, match="'x-amz-target' is listed in SignedHeaders but is not present"
    ):
        check(dataclasses.replace(request, headers=headers))


# --------------------------------------------------------------------------------------------------
# Presigned URLs, where a policy accepts them (neither of the server's APIs does)
# --------------------------------------------------------------------------------------------------


def test_botocore_presigned_url_verifies_until_it_expires() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={"name": "a b"}, expires=300)
    assert "X-Amz-Signature=" in request.query
    assert "Authorization" not in request.headers
    assert check(request, policy=PRESIGNABLE, now=SIGNED_AT + timedelta(seconds=300)) == KEY
    with pytest.raises(InvalidSignature) as caught:
        check(request, policy=PRESIGNABLE, now=SIGNED_AT + timedelta(seconds=301))
    assert caught.value.message == (
        "Request has expired: signed at 20261130T010203Z to be valid for 300 seconds, "
        "until 20261130T010703Z; it is now 20261130T010704Z."
    )


def test_presigned_url_from_the_future_is_refused() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={}, expires=3600)
    with pytest.raises(InvalidSignature, match="Signature not yet current"):
        check(request, policy=PRESIGNABLE, now=SIGNED_AT - timedelta(minutes=20))


def test_presigned_url_tampered_query_is_refused() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={"name": "mine"}, expires=300)
    tampered = dataclasses.replace(request, query=request.query.replace("name=mine", "name=yours"))
    with pytest.raises(InvalidSignature, match="does not match the signature you provided"):
        check(tampered, policy=PRESIGNABLE)


def test_presigned_url_with_extended_expiry_is_refused() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={}, expires=300)
    tampered = dataclasses.replace(
        request, query=request.query.replace("X-Amz-Expires=300", "X-Amz-Expires=3000")
    )
    with pytest.raises(InvalidSignature, match="does not match the signature you provided"):
        check(tampered, policy=PRESIGNABLE, now=SIGNED_AT + timedelta(seconds=400))


def test_presigned_url_missing_parameters() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={}, expires=300)
    query = "&".join(p for p in request.query.split("&") if not p.startswith("X-Amz-Expires="))
    with pytest.raises(InvalidSignature, match="AWS query-string parameters must include"):
        check(dataclasses.replace(request, query=query), policy=PRESIGNABLE)


@pytest.mark.parametrize("expires", ["0", "604801", "-5", "soon"])
def test_presigned_url_expiry_bounds(expires: str) -> None:
    request = botocore_presigned("/api/v1/training-plans", params={}, expires=300)
    query = request.query.replace("X-Amz-Expires=300", f"X-Amz-Expires={expires}")
    with pytest.raises(InvalidSignature, match="X-Amz-Expires must be"):
        check(dataclasses.replace(request, query=query), policy=PRESIGNABLE)


def test_header_and_query_signatures_together_are_refused() -> None:
    request = botocore_presigned("/api/v1/training-plans", params={}, expires=300)
    with pytest.raises(InvalidSignature, match="Only one auth mechanism allowed"):
        check(with_headers(request, Authorization=json_call().headers["Authorization"]))


# --------------------------------------------------------------------------------------------------
# Canonicalisation agrees with botocore's, for any input
# --------------------------------------------------------------------------------------------------

_BOTOCORE = SigV4Auth(BotocoreCredentials(KEY, SECRET), SERVICE, REGION)
_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("", "/"),
        ("/", "/"),
        ("/api/v1/training-plans/my%20plan", "/api/v1/training-plans/my%2520plan"),
        ("/a/./b/../c//d/", "/a/c/d/"),
        ("/..", "/"),
    ],
)
def test_canonical_uri_examples(raw: str, canonical: str) -> None:
    assert canonical_uri(raw) == canonical


@given(st.lists(st.sampled_from(["", ".", "..", "a", "b%20c", "é", "~x", "%2F"]), max_size=6), st.booleans())
def test_canonical_uri_matches_botocore(segments: list[str], trailing_slash: bool) -> None:
    path = "/" + "/".join(segments) + ("/" if trailing_slash else "")
    assert canonical_uri(path) == _BOTOCORE._normalize_url_path(path)


@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=5))
def test_canonical_query_matches_botocore_params(params: list[tuple[str, str]]) -> None:
    # What botocore sends (urlencode, '+' for spaces) canonicalises to what it signed.
    expected = _BOTOCORE._canonical_query_string_params(params)
    assert sigv4.canonical_query_string(urlencode(params)) == expected


@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=5))
def test_canonical_query_is_idempotent(params: list[tuple[str, str]]) -> None:
    once = sigv4.canonical_query_string(urlencode(params))
    assert sigv4.canonical_query_string(once) == once


def test_repeated_header_names_fold_into_one() -> None:
    assert sigv4.fold_headers({"X-Custom": "a", "x-custom": "b", "Host": "h"}) == {
        "x-custom": "a,b",
        "host": "h",
    }


def test_signing_key_matches_aws_documented_example() -> None:
    # From the AWS General Reference "Examples of how to derive a signing key for Signature Version 4".
    key = signing_key("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")
    assert key.hex() == "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d"


# --------------------------------------------------------------------------------------------------
# Our own client signer
# --------------------------------------------------------------------------------------------------


def _client_signed(
    url: str, *, method: str = "GET", body: bytes = b"", token: str | None = None
) -> SignedRequest:
    credentials = Credentials(KEY, SECRET, token)
    headers = sign_request(
        method,
        url,
        headers={"Content-Type": "application/json", "X-Hyperplan-Trace": "  spaced   out  "},
        body=body,
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        region=REGION,
        session_token=credentials.session_token,
        now=SIGNED_AT,
    )
    parts = urlsplit(url)
    return SignedRequest(method=method, path=parts.path, query=parts.query, headers=headers, body=body)


def test_client_signer_output_verifies() -> None:
    request = _client_signed(ENDPOINT + "/api/v1/training-plans", method="POST", body=b'{"name": "x"}')
    assert request.headers["Host"] == "sagemaker.us-east-1.example"
    assert {"host", "x-amz-date"} <= signed_header_names(request)
    assert check(request, policy=PLAIN) == KEY


def test_client_signer_signs_every_header_it_is_given_and_keeps_the_time_in_x_amz_date() -> None:
    headers = sign_request(
        "POST",
        ENDPOINT + "/",
        headers={
            "X-Amz-Target": "SageMaker.ListTrainingPlans",
            "Date": "Mon, 30 Nov 2026 01:02:03 GMT",  # botocore would have moved its time out of X-Amz-Date
        },
        body=b"{}",
        access_key=KEY,
        secret_key=SECRET,
        region=REGION,
        now=SIGNED_AT,
    )
    request = SignedRequest("POST", "/", "", headers, b"{}")
    assert "Date" not in headers
    assert {"host", "x-amz-date", "x-amz-target"} <= signed_header_names(request)
    assert check(request, policy=TARGETED) == KEY


def test_client_signer_with_loosely_encoded_query_and_token_verifies() -> None:
    url = ENDPOINT + ":8443/api/v1/training-plans/my%20plan?z=1&name=a+b&tilde=%7E&slash=a/b&flag"
    request = _client_signed(url, token="tok")
    assert request.headers["Host"] == "sagemaker.us-east-1.example:8443"
    assert request.headers["X-Amz-Security-Token"] == "tok"
    assert check(request) == KEY


# --------------------------------------------------------------------------------------------------
# End to end: real clients over loopback HTTP
# --------------------------------------------------------------------------------------------------


def _capture_handler(captured: list[SignedRequest]) -> type[BaseHTTPRequestHandler]:
    class Capture(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _capture(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path, _, query = self.path.partition("?")
            headers: dict[str, str] = {}
            for name, value in self.headers.items():
                key = name.lower()
                headers[key] = f"{headers[key]},{value}" if key in headers else value
            captured.append(SignedRequest(self.command, path, query, headers, body))
            reply = b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/x-amz-json-1.1")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        do_GET = do_POST = do_DELETE = _capture

        def log_message(self, format: str, *args: object) -> None:
            pass  # keep pytest output clean

    return Capture


@pytest.fixture
def capture_server() -> Iterator[tuple[str, list[SignedRequest]]]:
    captured: list[SignedRequest] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _capture_handler(captured))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", captured
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def isolated_aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment that keeps AWS clients away from the user's config and from instance metadata."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    env = {
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_boto3_client_request_verifies(
    capture_server: tuple[str, list[SignedRequest]], isolated_aws_env: dict[str, str]
) -> None:
    url, captured = capture_server
    session = boto3.session.Session(aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION)
    config = Config(retries={"max_attempts": 1}, connect_timeout=5, read_timeout=10)
    client = session.client("sagemaker", endpoint_url=url, config=config)
    client.list_training_plans()
    [request] = captured
    assert request.headers["x-amz-target"] == "SageMaker.ListTrainingPlans"
    assert {"host", "x-amz-date", "x-amz-target"} <= signed_header_names(request)
    assert "x-amz-content-sha256" not in request.headers  # the payload hash is the body's, computed
    assert check(request, now=datetime.now(UTC)) == KEY


def test_aws_cli_request_verifies(
    capture_server: tuple[str, list[SignedRequest]], isolated_aws_env: dict[str, str], tmp_path: Path
) -> None:
    url, captured = capture_server
    aws = Path(sys.executable).parent / "aws"
    if not aws.exists():
        pytest.skip("the aws CLI is not installed next to this Python")
    env = {
        **isolated_aws_env,
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_MAX_ATTEMPTS": "1",
        "AWS_PAGER": "",
    }
    result = subprocess.run(
        [str(aws), "sagemaker", "list-training-plans", "--endpoint-url", url, "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [request] = captured
    assert request.headers["x-amz-target"] == "SageMaker.ListTrainingPlans"
    assert {"host", "x-amz-date", "x-amz-target"} <= signed_header_names(request)
    assert "x-amz-content-sha256" not in request.headers
    assert check(request, now=datetime.now(UTC)) == KEY


def test_client_signer_over_the_wire_verifies(capture_server: tuple[str, list[SignedRequest]]) -> None:
    url, captured = capture_server
    target = url + "/api/v1/training-plans/my%20plan?name=a+b&tilde=%7E"
    body = b'{"DurationHours": 24}'
    headers = sign_request(
        "POST",
        target,
        headers={"Content-Type": "application/json"},
        body=body,
        access_key=KEY,
        secret_key=SECRET,
        region=REGION,
        session_token="tok",
    )
    with httpx.Client(timeout=10) as http:
        assert http.post(target, headers=headers, content=body).status_code == 200
    [request] = captured
    assert request.path == "/api/v1/training-plans/my%20plan"
    assert check(request, now=datetime.now(UTC)) == KEY
