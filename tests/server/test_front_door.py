"""The front door: what a client can make the server hold before it is authenticated.

A body over the cap is refused (413, in the API's own error shape) before it is read, or as soon as a
chunked one passes the cap; a client that stalls on its headers or its body is cut off; beyond the
connection cap a request is refused at once. Attacks here are sent unsigned, as an attacker would.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from tests.harness import Server, wait_until

MIB = 1024 * 1024
DEFAULT_CAP = MIB  # the server's default --max-body-bytes
GIB = 1024 * MIB
STALL_BOUND = 8.0  # seconds a test waits on a stalled socket: well over the 1 s it sets, under the defaults


class CountingBody:
    """A request body made on the fly and never held: `sent` says how much the client was asked for."""

    def __init__(self, total: int, chunk: int = 64 * 1024) -> None:
        self.total = total
        self.chunk = b"x" * chunk
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        while self.sent < self.total:
            self.sent += len(self.chunk)
            yield self.chunk


def peak_rss_mib(server: Server) -> int:
    """The server's peak resident memory (VmHWM) so far, which a short spike cannot hide from."""
    assert server.process is not None
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM in /proc status")


def raw_connection(server: Server, sockets: ExitStack, source: str = "127.0.0.1") -> socket.socket:
    """A plain TCP connection to the server from `source` (any loopback address), closed when `sockets`
    closes (at the end of the test)."""
    connection = sockets.enter_context(
        socket.create_connection(("127.0.0.1", server.port), timeout=10, source_address=(source, 0))
    )
    connection.settimeout(STALL_BOUND)
    return connection


def read_until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes; a socket.timeout if it leaves the connection open."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


@pytest.fixture
def sockets() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


# -- body size ---------------------------------------------------------------------------------------


def test_a_1_gib_body_is_refused_by_its_length_without_being_read(shared_server: Server) -> None:
    body = CountingBody(GIB)
    response = httpx.post(
        f"{shared_server.url}/",
        content=body,
        headers={"Content-Length": str(GIB), "X-Amz-Target": "SageMaker.ListTrainingPlans"},
        timeout=60,
    )
    assert response.status_code == 413
    assert response.headers["connection"] == "close"
    assert response.json() == {
        "__type": "RequestTooLargeException",
        "message": f"The request body ({GIB} bytes) is over this server's limit of 1048576 bytes (1 MiB).",
    }
    assert body.sent < 64 * MIB, "the server read on after refusing"
    assert peak_rss_mib(shared_server) < 300
    assert httpx.get(f"{shared_server.url}/healthz").status_code == 200


def test_a_chunked_body_is_cut_off_once_it_passes_the_cap(shared_server: Server) -> None:
    body = CountingBody(GIB)
    response = httpx.post(
        f"{shared_server.url}/api/v1/accounts", content=body, timeout=60
    )  # no length: chunked
    assert response.status_code == 413
    assert response.headers["connection"] == "close"
    error = response.json()["Error"]  # the native API's own shape under /api/v1/
    assert error["Code"] == "RequestTooLargeException"
    assert "limit of 1048576 bytes (1 MiB)" in error["Message"]
    assert body.sent < 64 * MIB, "the server read on after refusing"
    assert peak_rss_mib(shared_server) < 300


def _padded_to(size: int) -> Any:
    """A botocore hook that pads the JSON body with trailing spaces to `size` bytes before it is signed."""

    def pad(request: Any, **_: Any) -> None:
        request.data = request.body + b" " * (size - len(request.body))

    return pad


def test_a_signed_body_over_the_cap_is_refused_and_one_at_the_cap_is_served(shared_server: Server) -> None:
    client = shared_server.sagemaker()
    event = "before-sign.sagemaker.ListTrainingPlans"

    client.meta.events.register_first(event, _padded_to(DEFAULT_CAP), unique_id="pad")
    assert client.list_training_plans()["TrainingPlanSummaries"] == []
    client.meta.events.unregister(event, unique_id="pad")

    client.meta.events.register_first(event, _padded_to(DEFAULT_CAP + 1), unique_id="pad")
    with pytest.raises(ClientError) as refused:
        client.list_training_plans()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 413
    assert refused.value.response["Error"]["Code"] == "RequestTooLargeException"
    assert "limit of 1048576 bytes (1 MiB)" in refused.value.response["Error"]["Message"]


@pytest.fixture(scope="module")
def impatient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that gives a client 1 s for its headers and 1 s for its body, and 4 KiB of body."""
    args = ["--header-timeout", "1", "--body-timeout", "1", "--max-body-bytes", "4096"]
    server = Server(data_dir=tmp_path_factory.mktemp("impatient") / "data", extra_args=args)
    try:
        yield server.start()
    finally:
        if server.process is not None:
            server.kill()


def test_the_cap_is_a_setting(impatient_server: Server) -> None:
    response = httpx.post(f"{impatient_server.url}/", content=b" " * 4097, timeout=30)
    assert response.status_code == 413
    assert response.json()["message"].endswith("limit of 4096 bytes (4 KiB).")


# -- stalled clients ---------------------------------------------------------------------------------


def test_a_client_stalling_in_its_headers_is_disconnected(
    impatient_server: Server, sockets: ExitStack
) -> None:
    connection = raw_connection(impatient_server, sockets)
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyperplan\r\n")  # and never the blank line
    assert read_until_closed(connection) == b""


def test_a_kept_alive_client_stalling_in_its_next_headers_is_disconnected(
    impatient_server: Server, sockets: ExitStack
) -> None:
    connection = raw_connection(impatient_server, sockets)
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyperplan\r\n\r\n")
    answered = b""
    while b'"status":"ok"' not in answered:
        answered += connection.recv(65536)
    assert answered.startswith(b"HTTP/1.1 200 ")
    # Bytes of the next request stop uvicorn's keep-alive timer: only the header deadline is left.
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyp")
    assert read_until_closed(connection) == b""


def test_request_headers_growing_beyond_16_kib_are_refused_and_disconnected(
    shared_server: Server, sockets: ExitStack
) -> None:
    """A client cannot grow the server's memory by sending ever more of its headers (without ending them)
    for as long as the header deadline gives it: past 16 KiB it is answered 400, well before that."""
    connection = raw_connection(shared_server, sockets)
    connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: hyperplan\r\nX-Padding: " + b"a" * 20_000)
    assert read_until_closed(connection).startswith(b"HTTP/1.1 400 ")
    assert httpx.get(f"{shared_server.url}/healthz").status_code == 200


def test_a_client_that_sends_nothing_is_disconnected(impatient_server: Server, sockets: ExitStack) -> None:
    connection = raw_connection(impatient_server, sockets)
    assert read_until_closed(connection) == b""


def test_a_client_stalling_in_its_body_is_answered_408_and_disconnected(
    impatient_server: Server, sockets: ExitStack
) -> None:
    connection = raw_connection(impatient_server, sockets)
    connection.sendall(
        b"POST / HTTP/1.1\r\nHost: hyperplan\r\nX-Amz-Target: SageMaker.ListTrainingPlans\r\n"
        b"Content-Length: 100\r\n\r\n" + b"{" * 50
    )
    head, _, body = read_until_closed(connection).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(body)["__type"] == "RequestTimeoutException"


def test_a_client_leaving_mid_body_is_no_error_of_the_server(
    shared_server: Server, sockets: ExitStack
) -> None:
    connection = raw_connection(shared_server, sockets)
    connection.sendall(b"POST /api/v1/accounts HTTP/1.1\r\nHost: hyperplan\r\nContent-Length: 100\r\n\r\n{")
    connection.close()
    assert httpx.get(f"{shared_server.url}/healthz").status_code == 200
    assert "Traceback" not in shared_server.log()


def test_kept_alive_connections_serve_several_requests(impatient_server: Server) -> None:
    with httpx.Client(base_url=impatient_server.url) as client:
        for _ in range(3):
            assert client.post("/", content=b"{}").status_code == 403  # unsigned, read and judged
            assert client.get("/healthz").status_code == 200


# -- connection cap ----------------------------------------------------------------------------------


def test_beyond_the_connection_cap_requests_are_refused_until_idle_connections_are_dropped(
    server_factory: type[Server], tmp_path: Path, sockets: ExitStack
) -> None:
    cap = 4
    args = ["--max-connections", str(cap), "--header-timeout", "4"]
    server = server_factory(data_dir=tmp_path / "data", extra_args=args).start()
    # One connection an address: the cap per address (a quarter of 4) refuses a second as it opens.
    idle = [raw_connection(server, sockets, source=f"127.0.0.{n}") for n in range(2, cap + 5)]

    refused = httpx.get(f"{server.url}/healthz", timeout=10)  # a hang would raise here
    assert refused.status_code == 503 and refused.json()["__type"] == "ServiceUnavailable"

    for connection in idle:  # the server drops them itself: nobody can hold a place for ever
        assert read_until_closed(connection) == b""
    assert wait_until(lambda: httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200, timeout=30)


@pytest.mark.parametrize(
    ("method", "path", "status", "shape"),
    [
        ("GET", "/api/v1/no-such-route", 404, "native"),
        ("DELETE", "/api/v1/accounts", 405, "native"),
        ("POST", "/no-such-route", 404, "sagemaker"),
        ("GET", "/", 403, "s3"),  # unsigned, and S3's ListBuckets by its looks (issue 22): S3 refuses it
    ],
)
def test_an_unknown_route_or_method_is_answered_in_its_apis_shape(
    shared_server: Server, method: str, path: str, status: int, shape: str
) -> None:
    response = httpx.request(method, f"{shared_server.url}{path}", timeout=30)
    assert response.status_code == status
    if shape == "s3":
        assert b"<Code>AccessDenied</Code>" in response.content and b"not signed" in response.content
        return
    body = response.json()
    if shape == "native":
        assert body["Error"]["Code"] == "UnknownOperationException" and path in body["Error"]["Message"]
    else:
        assert body["__type"] == "UnknownOperationException" and path in body["message"]
