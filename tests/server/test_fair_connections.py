"""No client address holds the server (issue 42): connections are capped per client address, the caps
follow the client a trusted proxy names, and the server's own cap answers in the API's error shape.

Every connection here comes from a loopback address of its own choosing (all of 127.0.0.0/8 is this
machine's), so that one test plays several clients. A connection a test holds is one the server has
shown it admitted (it answered a request on it, or asked for a request's body) before the test goes on:
nothing depends on how soon the server gets to a connection.
"""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import uvicorn
from botocore.exceptions import ClientError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from hyperplan.cli.client import ApiError
from hyperplan.server.fair_connections import TrustedProxies
from hyperplan.server.header_deadline import front_door_protocol
from hyperplan.server.limits import ServerLimits
from tests.harness import BIN, Server, wait_until

FLOODER = "127.0.0.1"
OTHER = "127.0.0.2"
PROXY = "127.0.0.9"
WAITS = ["--header-timeout", "300", "--body-timeout", "300"]  # nothing a test holds meets a deadline


class Listening(Protocol):
    """A server the helpers talk to: the harness's, or a bare uvicorn's."""

    @property
    def port(self) -> int: ...

    @property
    def url(self) -> str: ...


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    """Every socket a test opens, closed when it ends."""
    with ExitStack() as stack:
        yield stack


def connect(server: Listening, source: str, sockets: ExitStack) -> socket.socket:
    return sockets.enter_context(
        socket.create_connection(("127.0.0.1", server.port), timeout=30, source_address=(source, 0))
    )


def read_head(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """A response's status and headers, and whatever of its body came with them."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65536)
        if not chunk:
            raise AssertionError(f"closed after {received!r}")
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = (line.split(": ", 1) for line in lines[1:])
    headers = {name.lower(): value for name, value in fields}
    return int(lines[0].split()[1]), headers, rest


def read_response(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = read_head(connection)
    while len(body) < int(headers.get("content-length", "0")):
        body += connection.recv(65536)
    return status, headers, body


def stall_in_headers(server: Listening, source: str, sockets: ExitStack) -> socket.socket:
    """A connection from `source`, admitted (a request answered on it), now stalled half-way through its
    next request's headers: the state the issue's 130 connections held."""
    connection = connect(server, source, sockets)
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyperplan\r\n\r\n")
    assert read_response(connection)[0] == 200
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyp")
    return connection


def request_in_progress(server: Listening, source: str, sockets: ExitStack, forwarded_for: str = "") -> bytes:
    """A connection from `source` whose request the server has begun (it asks for the body: 100
    Continue) and whose body never ends; or, refused, the refusal as it was sent."""
    connection = connect(server, source, sockets)
    forwarded = f"X-Forwarded-For: {forwarded_for}\r\n" if forwarded_for else ""
    connection.sendall(
        b"POST /api/v1/accounts HTTP/1.1\r\nHost: hyperplan\r\nContent-Length: 100\r\n"
        b"Expect: 100-continue\r\n" + forwarded.encode() + b"\r\n"
    )
    status, headers, body = read_head(connection)
    if status != 100:
        while len(body) < int(headers["content-length"]):
            body += connection.recv(65536)
        return body
    connection.sendall(b"{")
    return b""


def refused_as_it_opens(server: Listening, source: str, sockets: ExitStack) -> str:
    """The message of a connection refused before it sent anything (the server answers without reading)."""
    connection = connect(server, source, sockets)
    status, headers, body = read_response(connection)
    assert status == 503 and headers["x-amzn-errortype"] == "ServiceUnavailable"
    assert headers["connection"] == "close" and connection.recv(1) == b""  # and closed
    error = json.loads(body)
    assert error["__type"] == "ServiceUnavailable"
    return str(error["message"])


def client_from(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)


def answered(server: Listening, source: str, headers: dict[str, str] | None = None) -> bool:
    with client_from(source) as client:
        return client.get(f"{server.url}/healthz", headers=headers).status_code == 200


# -- one address ---------------------------------------------------------------------------------------


def test_half_open_connections_from_one_address_shut_out_nobody_else(
    server_factory: type[Server], tmp_path: Path, sockets: ExitStack
) -> None:
    """The issue's attack against the defaults (128 connections; 32 an address, 16 of them waiting for
    headers): the flooding address fills its own share, never the server's."""
    server = server_factory(data_dir=tmp_path / "data", extra_args=WAITS).start()
    flood = [stall_in_headers(server, FLOODER, sockets) for _ in range(16)]

    assert answered(server, OTHER)  # the health check
    with client_from(OTHER) as client:  # and the API, which judges the request (unsigned)
        refused = client.post(f"{server.url}/", content=b"{}")
    assert refused.status_code == 403 and refused.json()["__type"] == "MissingAuthenticationTokenException"

    message = refused_as_it_opens(server, FLOODER, sockets)
    assert message.startswith(f"{FLOODER} already holds 16 connections that have sent no request's headers")
    # The clients read the refusal: boto3 and ours (one body in both JSON shapes).
    with pytest.raises(ClientError) as by_boto3:
        server.sagemaker().list_training_plans()
    assert by_boto3.value.response["Error"]["Code"] == "ServiceUnavailable"
    with pytest.raises(ApiError) as by_ours:
        server.native().get("/api/v1/whoami")
    assert (by_ours.value.code, by_ours.value.status) == ("ServiceUnavailable", 503)

    flood[0].close()  # a place of its own again, once the server has seen it go
    assert wait_until(lambda: answered(server, FLOODER), timeout=30)


def test_requests_in_progress_count_against_the_address_too(
    server_factory: type[Server], tmp_path: Path, sockets: ExitStack
) -> None:
    args = [*WAITS, "--max-connections-per-address", "6", "--max-pending-per-address", "4"]
    server = server_factory(data_dir=tmp_path / "data", extra_args=args).start()
    for _ in range(2):
        stall_in_headers(server, FLOODER, sockets)
    for _ in range(4):
        assert request_in_progress(server, FLOODER, sockets) == b""

    message = refused_as_it_opens(server, FLOODER, sockets)
    assert message.startswith(f"{FLOODER} already holds 6 open connections")
    assert answered(server, OTHER)


# -- behind a trusted proxy ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxied_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server behind a reverse proxy at 127.0.0.9; 3 connections an address, 2 waiting for headers."""
    args = [*WAITS, "--trusted-proxy", f"192.0.2.0/24,{PROXY}"]
    args += ["--max-connections-per-address", "3", "--max-pending-per-address", "2"]
    server = Server(data_dir=tmp_path_factory.mktemp("proxied") / "data", extra_args=args).start()
    yield server
    server.close()


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_share(
    proxied_server: Server, sockets: ExitStack
) -> None:
    server, alice, bob = proxied_server, "198.51.100.1", "198.51.100.2"
    for _ in range(3):  # more than the proxy's address may hold waiting for headers: it is not counted
        stall_in_headers(server, PROXY, sockets)
    for _ in range(3):  # alice's share, one connection of the proxy's each
        assert request_in_progress(server, PROXY, sockets, forwarded_for=alice) == b""

    # Her next request is refused once its headers name her, in the native API's shape.
    refusal = json.loads(request_in_progress(server, PROXY, sockets, forwarded_for=alice))
    assert refusal["Error"]["Code"] == "ServiceUnavailable"
    assert refusal["Error"]["Message"].startswith(f"{alice} already holds 3 open connections")
    # A client who wrote her address in front of his own is still himself (the right-most untrusted).
    assert answered(server, PROXY, {"X-Forwarded-For": f"{alice}, {bob}"})
    assert request_in_progress(server, PROXY, sockets, forwarded_for=f"{alice}, {bob}") == b""


def test_an_untrusted_peer_naming_other_clients_is_counted_as_itself(
    proxied_server: Server, sockets: ExitStack
) -> None:
    peer = "127.0.0.3"
    for n in range(3):
        assert request_in_progress(proxied_server, peer, sockets, forwarded_for=f"198.51.100.{10 + n}") == b""
    assert refused_as_it_opens(proxied_server, peer, sockets).startswith(f"{peer} already holds 3 open")


def test_the_audit_trail_counts_refused_signatures_by_the_forwarded_client_from_a_trusted_proxy_only(
    proxied_server: Server,
) -> None:
    forged_key = "AKHPFORGED0000000042"
    forged = {
        "Authorization": f"AWS4-HMAC-SHA256 Credential={forged_key}/20261231/us-west-2/sagemaker/"
        "aws4_request, SignedHeaders=host;x-amz-date, Signature=" + "0" * 64,
        "X-Amz-Date": "20261231T235000Z",  # refused whatever the time: no such key
    }
    for source, forwarded_for in ((PROXY, "198.51.100.7"), ("127.0.0.4", "198.51.100.8")):
        with client_from(source) as client:
            refused = client.get(
                f"{proxied_server.url}/api/v1/whoami", headers={**forged, "X-Forwarded-For": forwarded_for}
            )
        assert refused.status_code == 403

    events = proxied_server.native().get("/api/v1/audit")["Events"]
    addresses = {
        event["RemoteAddress"]
        for event in events
        if event["Action"] == "signature.refused" and forged_key in event["Detail"]["AccessKeyIds"]
    }
    assert addresses == {"198.51.100.7", "127.0.0.4"}


# -- the server's cap ----------------------------------------------------------------------------------


def test_the_servers_cap_refuses_in_the_apis_error_shape(
    server_factory: type[Server], tmp_path: Path, sockets: ExitStack
) -> None:
    """Four connections from four addresses fill a server capped at 4 (one an address): the next request
    is refused as its API refuses, which boto3 reads as a ClientError rather than a response it cannot
    parse (uvicorn's plain text)."""
    args = [*WAITS, "--max-connections", "4"]
    server = server_factory(data_dir=tmp_path / "data", extra_args=args).start()
    for n in range(2, 6):
        stall_in_headers(server, f"127.0.0.{n}", sockets)

    with pytest.raises(ClientError) as refused:
        server.sagemaker().list_training_plans()
    error: Any = refused.value.response
    assert error["Error"]["Code"] == "ServiceUnavailable"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "its most connections or requests (4)" in error["Error"]["Message"]
    with client_from("127.0.0.6") as client:
        native = client.get(f"{server.url}/api/v1/accounts")
        s3 = client.get(f"{server.url}/bucket/key")
    assert native.status_code == 503 and native.json()["Error"]["Code"] == "ServiceUnavailable"
    assert s3.status_code == 503 and b"<Code>ServiceUnavailable</Code>" in s3.content


# -- both of uvicorn's protocols ------------------------------------------------------------------------


class BareServer:
    """uvicorn with the front door's protocol and a two-route app, in a thread of the test's: the
    protocol alone, on either parser."""

    def __init__(self, limits: ServerLimits, proxies: TrustedProxies, parser: str) -> None:
        async def healthz(request: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        async def whoami(request: Request) -> JSONResponse:  # what the audit trail and the console read
            return JSONResponse({"client": request.scope["client"][0], "scheme": request.scope["scheme"]})

        app = Starlette(routes=[Route("/healthz", healthz), Route("/whoami", whoami)])
        protocol = front_door_protocol(limits, proxies, parser=parser)
        config = uvicorn.Config(app, http=protocol, proxy_headers=False, lifespan="off", log_level="warning")
        self.server = uvicorn.Server(config)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.listener]})

    def __enter__(self) -> BareServer:
        self.thread.start()
        assert wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=30)
        assert self.server.started
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.listener.close()
        assert not self.thread.is_alive()


@pytest.mark.parametrize("parser", ["auto", "h11"])  # auto: httptools, the one hyperplan installs
def test_both_of_uvicorns_protocols_keep_the_shares_and_name_the_forwarded_client(
    parser: str, sockets: ExitStack
) -> None:
    limits = ServerLimits(
        max_connections=4, max_connections_per_address=2, max_pending_per_address=1, header_timeout=300
    )
    with BareServer(limits, TrustedProxies.parse([PROXY]), parser) as server:
        stall_in_headers(server, FLOODER, sockets)
        assert refused_as_it_opens(server, FLOODER, sockets).startswith(f"{FLOODER} already holds 1 ")

        forwarded = {"X-Forwarded-For": "198.51.100.1", "X-Forwarded-Proto": "https"}
        for source, seen in ((PROXY, {"client": "198.51.100.1", "scheme": "https"}), (OTHER, None)):
            with client_from(source) as client:
                said = client.get(f"{server.url}/whoami", headers=forwarded).json()
            assert said == (seen or {"client": source, "scheme": "http"})

        for n in range(2, 5):  # four open: the server's cap
            stall_in_headers(server, f"127.0.0.{n}", sockets)
        with client_from("127.0.0.5") as client:
            refused = client.get(f"{server.url}/healthz")
        assert refused.status_code == 503 and refused.json()["__type"] == "ServiceUnavailable"
        assert refused.headers["x-amzn-errortype"] == "ServiceUnavailable"


# -- the settings --------------------------------------------------------------------------------------


def test_a_share_one_address_could_fill_the_server_with_is_refused_at_start(tmp_path: Path) -> None:
    process = subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--data-dir", str(tmp_path / "data"), "--isolation", "none",
         "--max-connections", "8", "--max-connections-per-address", "8"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert process.returncode == 2
    said = " ".join(process.stderr.split())  # as Rich wrapped it
    assert "--max-connections-per-address (8) must be below --max-connections (8)" in said
    assert not (tmp_path / "data").exists()  # refused before anything was made
