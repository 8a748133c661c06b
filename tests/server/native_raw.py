"""Native API requests with any bytes for a body and any path: what NativeClient (which sends only what
json.dumps writes) never sends, signed exactly as it signs."""

from __future__ import annotations

from typing import Any

import httpx

from hyperplan.signing import Credentials, sign_request
from tests.harness import ADMIN, REGION, Server

# One client for every request: a new one per request builds a TLS context each time (~0.1 s of CPU).
_CLIENT = httpx.Client(timeout=60)


def signed_native(
    server: Server, method: str, path: str, body: bytes = b"", credentials: Credentials = ADMIN
) -> httpx.Response:
    """`path` is sent as it is: percent-encode it (and its query) beforehand."""
    url = f"{server.url}{path}"
    headers = sign_request(
        method,
        url,
        headers={"Content-Type": "application/json"} if body else {},
        body=body,
        access_key=credentials.access_key,
        secret_key=credentials.secret_key,
        region=REGION,
    )
    return _CLIENT.request(method, url, headers=headers, content=body)


def native_error(response: httpx.Response) -> dict[str, Any]:
    """The error of a refused request, checked to be in the native shape."""
    payload = response.json()
    assert set(payload) == {"Error", "RequestId"}, payload
    assert set(payload["Error"]) == {"Code", "Message"}, payload
    assert payload["RequestId"] == response.headers["x-amzn-RequestId"]
    return dict(payload["Error"])
