"""A small signed client for the native API, used by the `hyperplan` commands and by tests.

botocore and httpx are imported inside the functions that use them: importing this module (as every
command does, even for `--help`) stays cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyperplan.signing import Credentials, sign_request

if TYPE_CHECKING:
    import httpx

ENDPOINT_ENV = "HYPERPLAN_ENDPOINT_URL"
AWS_ENDPOINT_ENV = "AWS_ENDPOINT_URL"  # what every AWS tool honours; ours comes first when both are set
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
DATA_DIR_ENV = "HYPERPLAN_DATA_DIR"
PROFILE = "hyperplan"


class ApiError(Exception):
    """An error answer from the server, with its code and message."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


def resolve_endpoint(endpoint_url: str | None) -> str:
    """The flag, else $HYPERPLAN_ENDPOINT_URL, else $AWS_ENDPOINT_URL, else the local default."""
    chosen = endpoint_url or os.environ.get(ENDPOINT_ENV) or os.environ.get(AWS_ENDPOINT_ENV)
    return (chosen or DEFAULT_ENDPOINT).rstrip("/")


def default_data_dir() -> Path:
    """The server's default data directory; the same rule as `hyperplan.app.default_data_dir`.

    Repeated here so that a client command never imports the runtime (SQLAlchemy, Alembic, numpy);
    tests/cli checks that the two agree.
    """
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "share" / "hyperplan"


def resolve_credentials(data_dir: Path, profile: str | None = None) -> Credentials | None:
    """The usual AWS chain (environment, profile); failing that, the data directory's credentials file."""
    import botocore.session

    session = botocore.session.Session(profile=profile) if profile else botocore.session.Session()
    try:
        found = session.get_credentials()
    except Exception:  # a named profile that does not exist: fall through to the data directory
        found = None
    if found is not None:
        frozen = found.get_frozen_credentials()
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)
    return credentials_from_file(data_dir / "credentials")


def credentials_from_file(path: Path) -> Credentials | None:
    import botocore.session

    if not path.exists():
        return None
    session = botocore.session.Session(profile=PROFILE)
    session.set_config_variable("credentials_file", str(path))
    session.set_config_variable("config_file", os.devnull)
    found = session.get_credentials()
    if found is None:
        return None
    frozen = found.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


@dataclass
class NativeClient:
    endpoint: str
    credentials: Credentials
    region: str | None = None
    timeout: float = 600.0
    _client: httpx.Client | None = field(default=None, init=False, repr=False, compare=False)

    def _http(self) -> httpx.Client:
        """One client for this object's requests: httpx builds a TLS context per client, which costs far
        more than a request to a server on loopback. Plain http needs none. Connections are not kept, so
        a request after the server restarted never meets a stale one."""
        import httpx

        if self._client is None:
            self._client = httpx.Client(
                verify=self.endpoint.startswith("https://"),
                limits=httpx.Limits(max_keepalive_connections=0),
            )
        return self._client

    def server_region(self) -> str:
        if self.region is None:
            self.region = str(self._http().get(f"{self.endpoint}/healthz", timeout=10).json()["region"])
        return self.region

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call("POST", path, body=body or {})

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def call(self, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        import httpx

        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        url = str(httpx.Request(method, f"{self.endpoint}{path}", params=params).url)
        data = b"" if body is None else json.dumps(body).encode()
        headers = sign_request(
            method,
            url,
            headers={"Content-Type": "application/json"} if data else {},
            body=data,
            access_key=self.credentials.access_key,
            secret_key=self.credentials.secret_key,
            region=self.server_region(),
            session_token=self.credentials.session_token,
        )
        response = self._http().request(method, url, headers=headers, content=data, timeout=self.timeout)
        return _result(response)


def _result(response: httpx.Response) -> Any:
    try:
        payload = response.json()
    except ValueError:
        raise ApiError("InvalidResponse", response.text[:500], response.status_code) from None
    if response.status_code >= 400:
        error = payload.get("Error", {}) if isinstance(payload, dict) else {}
        raise ApiError(error.get("Code", "Unknown"), error.get("Message", ""), response.status_code)
    return payload
