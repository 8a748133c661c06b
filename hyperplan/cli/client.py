"""A small signed client for the native API, used by the `hyperplan` commands and by tests.

http.client and the INI reader are imported inside the functions that use them: importing this module
(as every command does, even for `--help`) stays cheap.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyperplan.signing import Credentials, sign_request

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
    """The flag, else $HYPERPLAN_ENDPOINT_URL, else $AWS_ENDPOINT_URL, else the local default; a value
    that is no server's URL is refused (ValidationError) naming where it came from."""
    given = (
        ("--endpoint-url", endpoint_url),
        (f"${ENDPOINT_ENV}", os.environ.get(ENDPOINT_ENV)),
        (f"${AWS_ENDPOINT_ENV}", os.environ.get(AWS_ENDPOINT_ENV)),
    )
    source, chosen = next(((source, value) for source, value in given if value), ("", DEFAULT_ENDPOINT))
    return _checked_endpoint(chosen.rstrip("/"), source)


def _checked_endpoint(url: str, source: str) -> str:
    from urllib.parse import urlsplit

    from hyperplan.errors import ValidationError

    try:
        parts = urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a bad port or IPv6 address: urlsplit and .port say so only by raising
        usable = False
    if not usable:
        raise ValidationError(
            f"{source} {url!r} is not a server's URL; give http://HOST:PORT or https://HOST:PORT, "
            "e.g. http://127.0.0.1:8080"
        )
    return url


def default_data_dir() -> Path:
    """The server's default data directory; the same rule as `hyperplan.app.default_data_dir`.

    Repeated here so that a client command never imports the runtime (SQLAlchemy, Alembic, numpy);
    tests/cli checks that the two agree.
    """
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "share" / "hyperplan"


def resolve_credentials(data_dir: Path | str, profile: str | None = None) -> Credentials | None:
    """The keys the AWS tools would use, then the data directory's credentials file.

    In the AWS tools' order: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (unless a profile is named on
    the command line), then the profile (the flag, AWS_PROFILE, or `default`) of the shared credentials
    file and of the config file (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, or their places under
    ~/.aws), read as botocore reads them (the standard library's raw INI parser). hyperplan issues its
    own keys, so AWS's other sources (SSO, credential processes, instance metadata) have none to give
    and are not asked: asking the instance metadata service would reach the network, and loading
    botocore's session costs a command half a second.
    """
    if profile is None and (from_environment := _environment_credentials()) is not None:
        return from_environment
    name = profile or os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE") or "default"
    shared = os.environ.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials")
    config = os.environ.get("AWS_CONFIG_FILE", "~/.aws/config")
    config_section = name if name == "default" else f"profile {name}"
    found = _ini_credentials(Path(shared).expanduser(), name) or _ini_credentials(
        Path(config).expanduser(), config_section
    )
    return found or credentials_from_file(Path(data_dir) / "credentials")


def credentials_from_file(path: Path) -> Credentials | None:
    """The `hyperplan` profile of a credentials file (the one the server writes at its first start)."""
    return _ini_credentials(path, PROFILE)


def _environment_credentials() -> Credentials | None:
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    return Credentials(key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)


def _ini_credentials(path: Path, section: str) -> Credentials | None:
    # botocore's reader is this parser plus nested-value handling, which credentials never use; importing
    # botocore's would cost every command its exceptions module (and a vendored requests).
    from configparser import Error, RawConfigParser

    if not path.is_file():
        return None
    parser = RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (Error, UnicodeDecodeError):
        return None
    values = dict(parser.items(section)) if parser.has_section(section) else {}
    key, secret = values.get("aws_access_key_id"), values.get("aws_secret_access_key")
    if not key or not secret:
        return None
    return Credentials(key, secret, values.get("aws_session_token") or None)


# RFC 3986's reserved and unreserved characters, and "%": left as they are in a request's path.
_URL_CHARACTERS = "/%?=&:@!$'()*+,;~[]"


class Unreachable(ConnectionError):
    """No answer from the server: the connection was refused, timed out, or broke off."""

    def __init__(self, origin: str, reason: str) -> None:
        super().__init__(f"{origin}: {reason}")
        self.origin = origin
        self.reason = reason


@dataclass
class NativeClient:
    """Signed JSON requests to the native API, over the standard library's http.client: a command
    makes one or two requests, and importing httpx would take longer than Typer and Rich together.
    Each request has a connection of its own, so one made after the server restarted never meets a
    stale connection."""

    endpoint: str
    credentials: Credentials
    region: str | None = None
    timeout: float = 600.0

    def server_region(self) -> str:
        if self.region is None:
            status, data = self.exchange("GET", f"{self.endpoint}/healthz", {}, b"", timeout=10)
            health = _result(status, data)
            if not isinstance(health, dict) or "region" not in health:  # another kind of server answered
                raise ApiError("InvalidResponse", f"{self.endpoint} is not a hyperplan server", status)
            self.region = str(health["region"])
        return self.region

    def get(self, path: str, **query: Any) -> Any:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.call("POST", path, body=body or {})

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)

    def call(self, method: str, path: str, *, body: Any = None, query: dict[str, Any] | None = None) -> Any:
        from urllib.parse import quote, urlencode

        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        # RFC 3986 encoding (a space is %20, a slash %2F): what SigV4 signs is exactly what is sent.
        # A name a command put in the path as given ("a b", "é") is encoded here; what is a URL's already
        # (a "/", a "%2F" a command encoded, a query) is left as it is.
        url = f"{self.endpoint}{quote(path, safe=_URL_CHARACTERS)}"
        url += f"?{urlencode(params, quote_via=quote)}" if params else ""
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
        return _result(*self.exchange(method, url, headers, data))

    def exchange(
        self, method: str, url: str, headers: dict[str, str], body: bytes, timeout: float | None = None
    ) -> tuple[int, bytes]:
        """One request on a connection of its own: the answer's status and body (signed by the caller)."""
        from http.client import HTTPConnection, HTTPException, HTTPSConnection
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        kind = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        connection = kind(
            parts.hostname or "", parts.port, timeout=self.timeout if timeout is None else timeout
        )
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request(method, target, body=body or None, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, HTTPException) as exc:
            raise Unreachable(origin, str(exc) or type(exc).__name__) from exc
        finally:
            connection.close()


def _result(status: int, data: bytes) -> Any:
    try:
        payload = json.loads(data)
    except ValueError:
        raise ApiError("InvalidResponse", data[:500].decode(errors="replace"), status) from None
    if status >= 400:
        error = payload.get("Error", {}) if isinstance(payload, dict) else {}
        raise ApiError(error.get("Code", "Unknown"), error.get("Message", ""), status)
    return payload
