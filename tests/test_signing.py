"""The CLI's SigV4 signer gives botocore's signature, byte for byte, and the server accepts it."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotocoreCredentials

from hyperplan.signing import sign_request
from hyperplan.wire import sigv4
from hyperplan.wire.sigv4_key import ALGORITHM

WHEN = datetime(2027, 3, 4, 5, 6, 7, tzinfo=UTC)
KEY, SECRET, TOKEN = "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token/+="


def _botocore(method: str, url: str, headers: dict[str, str], body: bytes, token: str | None) -> str:
    """botocore's Authorization for the same request at the same instant."""
    request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
    request.context["timestamp"] = WHEN.strftime(sigv4.TIMESTAMP_FORMAT)
    auth = SigV4Auth(BotocoreCredentials(KEY, SECRET, token), "sagemaker", "us-west-2")
    auth._modify_request_before_signing(request)  # X-Amz-Date and the token, as add_auth does
    canonical = auth.canonical_request(request)
    signature = auth.signature(auth.string_to_sign(request, canonical), request)
    names = auth.signed_headers(auth.headers_to_sign(request))
    return f"{ALGORITHM} Credential={auth.scope(request)}, SignedHeaders={names}, Signature={signature}"


CASES = [
    (
        "POST",
        "http://127.0.0.1:8080/",
        {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": "SageMaker.ListTrainingPlans"},
        b"{}",
        None,
    ),
    ("GET", "http://127.0.0.1:8080/api/v1/accounts", {}, b"", None),
    (
        "GET",
        "http://localhost:9/api/v1/training-jobs/a%20b/logs?host=algo-1&cursor=1%3A0&stream=stdout",
        {},
        b"",
        TOKEN,
    ),
    (
        "PATCH",
        "https://hyperplan.example.com/api/v1/accounts/team",
        {"Content-Type": "application/json", "User-Agent": "x"},
        b'{"Budget": "1.00"}',
        None,
    ),
    ("DELETE", "http://[::1]:8080/api/v1/keys/AKID%2F1", {"Expect": "100-continue"}, b"", TOKEN),
]


@pytest.mark.parametrize(
    ("method", "url", "headers", "body", "token"),
    CASES,
    ids=[c[0] + " " + urlsplit(c[1]).path for c in CASES],
)
def test_our_signature_is_botocore_s(
    method: str, url: str, headers: dict[str, str], body: bytes, token: str | None
) -> None:
    ours = sign_request(
        method,
        url,
        headers=headers,
        body=body,
        access_key=KEY,
        secret_key=SECRET,
        region="us-west-2",
        session_token=token,
        now=WHEN,
    )
    with_host = {**headers, "Host": ours["Host"]}
    assert ours["Authorization"] == _botocore(method, url, with_host, body, token)
    assert ours["X-Amz-Date"] == "20270304T050607Z"


def test_the_server_s_verifier_accepts_what_we_sign_and_refuses_a_changed_body() -> None:
    url = "http://127.0.0.1:8080/api/v1/accounts/team?x=1"
    signed = sign_request(
        "PATCH",
        url,
        headers={"Content-Type": "application/json"},
        body=b"{}",
        access_key=KEY,
        secret_key=SECRET,
        region="us-west-2",
        now=WHEN,
    )
    request = sigv4.SignedRequest(
        method="PATCH", path="/api/v1/accounts/team", query="x=1", headers=signed, body=b"{}"
    )
    policy = sigv4.SigningPolicy(api="the native API", headers_signed_when_sent=frozenset({"content-type"}))
    assert (
        sigv4.verify(
            request,
            policy=policy,
            lookup_secret={KEY: SECRET}.get,
            region="us-west-2",
            service="sagemaker",
            now=WHEN,
        )
        == KEY
    )
    changed = sigv4.SignedRequest(
        method="PATCH", path="/api/v1/accounts/team", query="x=1", headers=signed, body=b'{"a":1}'
    )
    with pytest.raises(Exception, match="signature"):
        sigv4.verify(
            changed,
            policy=policy,
            lookup_secret={KEY: SECRET}.get,
            region="us-west-2",
            service="sagemaker",
            now=WHEN,
        )
