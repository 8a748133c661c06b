"""The endpoint relay (hyperplan/backends/endpoint_relay.py) between a private network namespace and a
server on the host's loopback, as a pod made with ``--network none`` would use it: real namespaces
(``unshare --net``), real relay processes started as the node agent starts them, and clients run inside
the namespace with ``nsenter``.

Each test makes its own namespace (a ``sleep`` holds it) and a small HTTP server on the host's
loopback; both, and every relay and client, are ended after the test, whatever its outcome.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hyperplan.backends import endpoint_relay
from hyperplan.backends.layout import MARK_VARIABLE, inherited_mark
from tests.processes import marked

pytestmark = [
    pytest.mark.isolation,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates and enters network namespaces"),
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("unshare", "nsenter", "ip")),
        reason="needs unshare, nsenter (util-linux) and ip (iproute2)",
    ),
]

POD_PORT = 8080  # where the pod's programs find the endpoint: any port, the namespace is the test's own
BIG = 8 * 1024 * 1024  # much more than the relay's buffers hold

# A client's helpers, run inside the namespace with the project's interpreter (-I: nothing of the
# test's environment, no proxy variables either: http.client uses none).
CLIENT = textwrap.dedent("""\
    import hashlib, http.client, json, random, socket, sys, time

    def get(port, path, connection=None):
        connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        connection.request("GET", path)
        return connection.getresponse().read()

    def refused(port):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        except ConnectionRefusedError:
            return True
        return False

    def until_closed(sock, timeout=20):
        sock.settimeout(timeout)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass

    port = int(sys.argv[1])
""")


@dataclass(frozen=True)
class Namespace:
    """A network namespace of its own, loopback up, nothing listening: what a pod's containers share."""

    path: str

    def run(self, script: str, *args: object) -> str:
        """Run CLIENT and ``script`` inside (``args`` after the pod's port); what it printed."""
        done = subprocess.run(
            self.argv(script, *args), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def argv(self, script: str, *args: object) -> list[str]:
        code = CLIENT + textwrap.dedent(script)
        command = [sys.executable, "-I", "-c", code, str(POD_PORT), *map(str, args)]
        return ["nsenter", f"--net={self.path}", "--", *command]


class HostServer(http.server.ThreadingHTTPServer):
    """The endpoint's stand-in on the host's loopback: remembers the address of every client."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Answers)
        self.clients: list[str] = []

    @property
    def port(self) -> int:
        return self.server_address[1]


class _Answers(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client can hold a connection open between requests
    server: HostServer

    def setup(self) -> None:
        super().setup()
        self.server.clients.append(self.client_address[0])

    def do_GET(self) -> None:
        if self.path.startswith("/big/"):
            self._answer(random.Random(45).randbytes(int(self.path.removeprefix("/big/"))))
        elif self.path.startswith("/drip/"):  # a byte every 0.2 s: slow, never idle
            count = int(self.path.removeprefix("/drip/"))
            self._head(count)
            for _ in range(count):
                time.sleep(0.2)
                self.wfile.write(b".")
                self.wfile.flush()
        else:
            self._answer(b"hello from the host")

    def do_POST(self) -> None:  # the body's digest
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(hashlib.sha256(body).hexdigest().encode())

    def _answer(self, body: bytes) -> None:
        self._head(len(body))
        self.wfile.write(body)

    def _head(self, length: int) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    holder = subprocess.Popen(
        ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
        stdout=subprocess.PIPE,
    )
    try:
        assert _line(holder, timeout=30) == b"up\n"
        # unshare execs its command in the same process: that pid's namespace is the new one
        yield Namespace(f"/proc/{holder.pid}/ns/net")
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


@pytest.fixture
def host() -> Iterator[HostServer]:
    server = HostServer()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="host-server")
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@dataclass
class Relay:
    process: subprocess.Popen[bytes]
    stderr: Path

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)

    def said(self) -> str:
        return self.stderr.read_text()


StartRelay = Callable[..., Relay]


@pytest.fixture
def start_relay(tmp_path: Path) -> Iterator[StartRelay]:
    """Start relays as the node agent does (relay_argv, a clean environment but for the run mark),
    each waited for until it says it is ready; every one still running is killed after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: list[str], ready: bool = True) -> Relay:
        stderr = tmp_path / f"relay-{len(started)}.err"
        with stderr.open("wb") as sink:
            process = subprocess.Popen(argv, env=inherited_mark(), stdout=subprocess.PIPE, stderr=sink)
        started.append(process)
        if ready:
            line = _line(process, timeout=30)
            assert line == endpoint_relay.READY, stderr.read_text()
        return Relay(process, stderr)

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()


def _argv(
    namespace: Namespace,
    target_port: int,
    *,
    source: str | None = None,
    max_connections: int = endpoint_relay.MAX_CONNECTIONS,
    idle_timeout: float = endpoint_relay.IDLE_TIMEOUT,
) -> list[str]:
    """The pod's port to the host's ``target_port``, as the node agent would start it."""
    listen, target = ("127.0.0.1", POD_PORT), ("127.0.0.1", target_port)
    return endpoint_relay.relay_argv(
        sys.executable,
        namespace.path,
        listen,
        target,
        source=source,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
    )


def _line(process: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The first line ``process`` writes to its standard output (what came before it ended, if it did)."""
    assert process.stdout is not None
    fd, got = process.stdout.fileno(), b""
    deadline = time.monotonic() + timeout
    while not got.endswith(b"\n") and (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1)  # one byte at a time: nothing after the line is taken from the pipe
            if not chunk:
                break
            got += chunk
    return got


def _free_port() -> int:
    """A host loopback port nobody listens on (bound for a moment, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- the tests ----------------------------------------------------------------------------------------


def test_the_pod_reaches_the_endpoint_through_the_relay_and_nothing_else_of_the_host(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    check = """
        print(json.dumps({"endpoint": refused(port), "host port": refused(int(sys.argv[2]))}))
    """
    # Without a relay the namespace's loopback has nothing: neither the pod's port nor the server's.
    assert json.loads(namespace.run(check, host.port)) == {"endpoint": True, "host port": True}

    start_relay(_argv(namespace, host.port))

    fetch = """print(get(port, "/hello").decode())"""
    assert namespace.run(fetch) == "hello from the host\n"
    # The relay opens its own port and nothing more: the server's port is still not there.
    assert json.loads(namespace.run(check, host.port)) == {"endpoint": False, "host port": True}


def test_large_bodies_cross_both_ways_unchanged_and_a_half_closed_request_is_answered(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    start_relay(_argv(namespace, host.port))
    transfers = """
        size = int(sys.argv[2])
        body = random.Random(45).randbytes(size)
        up = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        up.request("POST", "/digest", body=body)
        down = get(port, f"/big/{size}")
        # A client that says it has sent everything (half-close) still reads the whole answer.
        raw = socket.create_connection(("127.0.0.1", port), timeout=20)
        raw.sendall(b"POST /digest HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 5\\r\\n\\r\\nhello")
        raw.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
        print(json.dumps({
            "uploaded": up.getresponse().read().decode(),
            "downloaded": [len(down), hashlib.sha256(down).hexdigest()],
            "half-closed": answer.split(b"\\r\\n\\r\\n", 1)[1].decode(),
        }))
    """
    sent = random.Random(45).randbytes(BIG)
    assert json.loads(namespace.run(transfers, BIG)) == {
        "uploaded": hashlib.sha256(sent).hexdigest(),
        "downloaded": [BIG, hashlib.sha256(sent).hexdigest()],
        "half-closed": hashlib.sha256(b"hello").hexdigest(),
    }


def test_two_relays_share_the_pods_port_and_the_pod_keeps_its_endpoint_when_one_ends(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    """Two containers of one pod, a relay each, on one port (SO_REUSEPORT); one started by path as
    relay_argv says, the other as ``python -m``."""
    by_path = start_relay(_argv(namespace, host.port))
    as_module = [sys.executable, "-I", "-m", "hyperplan.backends.endpoint_relay"]
    as_module += _argv(namespace, host.port)[4:]  # the options, after the interpreter and the file
    start_relay(as_module)
    fetch_ten = """print(sum(get(port, "/hello") == b"hello from the host" for _ in range(10)))"""
    assert namespace.run(fetch_ten) == "10\n"

    assert by_path.stop() == 0

    assert namespace.run(fetch_ten) == "10\n"


def test_sigterm_closes_every_connection_and_the_port_and_leaves_no_process(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    relay = start_relay(_argv(namespace, host.port))
    holder = """
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        get(port, "/hello", connection)
        print("open", flush=True)
        until_closed(connection.sock)
        print("closed by the relay")
    """
    client = subprocess.Popen(namespace.argv(holder), stdout=subprocess.PIPE)
    try:
        assert _line(client, timeout=30) == b"open\n"

        assert relay.stop() == 0

        assert client.wait(timeout=30) == 0
        assert client.stdout is not None
        assert client.stdout.read() == b"closed by the relay\n"
    finally:
        client.kill()
        client.wait()
        if client.stdout is not None:
            client.stdout.close()
    assert relay.process.stdout is not None
    assert relay.process.stdout.read() == b""  # "ready" was all it ever wrote
    assert relay.said() == ""
    assert namespace.run("""print(refused(port))""") == "True\n"
    left = [p for p in marked(os.environ[MARK_VARIABLE]) if "endpoint_relay" in p.command]
    assert left == []


def test_a_connection_beyond_the_bound_waits_until_one_ends(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    start_relay(_argv(namespace, host.port, max_connections=1))
    scenario = """
        first = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        get(port, "/hello", first)  # served, and held open (keep-alive): the one connection allowed
        second = socket.create_connection(("127.0.0.1", port), timeout=20)  # into the accept queue
        second.sendall(b"GET /hello HTTP/1.1\\r\\nHost: x\\r\\nConnection: close\\r\\n\\r\\n")
        second.settimeout(1.0)
        try:
            print("second answered early:", second.recv(65536))
        except TimeoutError:
            print("second waits")
        first.close()
        second.settimeout(20)
        answer = b""
        while chunk := second.recv(65536):
            answer += chunk
        print("second answered:", answer.split(b"\\r\\n\\r\\n", 1)[1].decode())
    """
    assert namespace.run(scenario).splitlines() == ["second waits", "second answered: hello from the host"]


def test_an_idle_connection_is_closed_and_a_slow_one_is_not(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    start_relay(_argv(namespace, host.port, idle_timeout=0.5))
    scenario = """
        slow = get(port, "/drip/6")  # 1.2 s in all, a byte every 0.2 s: never idle for 0.5 s
        idle = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        get(port, "/hello", idle)
        began = time.monotonic()
        until_closed(idle.sock)
        print(json.dumps({"slow": slow.decode(), "idle for": time.monotonic() - began}))
    """
    seen = json.loads(namespace.run(scenario))
    assert seen["slow"] == "......"
    assert 0.4 <= seen["idle for"] < 15  # closed by the relay, not by the client's own 20 s timeout


def test_a_target_that_refuses_closes_that_connection_and_the_relay_carries_on(
    namespace: Namespace, start_relay: StartRelay
) -> None:
    nobody = _free_port()
    relay = start_relay(_argv(namespace, nobody))
    twice = """
        for _ in range(2):
            connection = socket.create_connection(("127.0.0.1", port), timeout=20)
            until_closed(connection)
        print("both closed")
    """
    assert namespace.run(twice) == "both closed\n"
    assert relay.process.poll() is None
    # One line, not one per connection: a tenant cannot fill the host's disk with them.
    assert relay.said() == f"endpoint relay: cannot connect to 127.0.0.1:{nobody}: Connection refused\n"


def test_connections_come_from_the_source_address_given(
    namespace: Namespace, host: HostServer, start_relay: StartRelay
) -> None:
    start_relay(_argv(namespace, host.port, source="127.0.0.45"))
    assert namespace.run("""print(get(port, "/hello").decode())""") == "hello from the host\n"
    assert host.clients == ["127.0.0.45"]


def test_startup_refusals_say_why_and_exit_non_zero(
    namespace: Namespace, start_relay: StartRelay, tmp_path: Path
) -> None:
    target = _free_port()

    def refused(netns: str, *more: str) -> tuple[int, str]:
        argv = endpoint_relay.relay_argv(
            sys.executable, netns, ("127.0.0.1", POD_PORT), ("127.0.0.1", target)
        )
        relay = start_relay([*argv, *more], ready=False)
        code = relay.process.wait(timeout=30)
        assert relay.process.stdout is not None and relay.process.stdout.read() == b""  # never ready
        return code, relay.said()

    gone = str(tmp_path / "no-namespace")
    assert refused(gone) == (1, f"endpoint relay: network namespace {gone}: No such file or directory\n")
    plain = tmp_path / "plain-file"
    plain.write_text("not a namespace")
    assert refused(str(plain)) == (
        1,
        f"endpoint relay: cannot enter the network namespace {plain}: Invalid argument\n",
    )
    code, said = refused(namespace.path, "--listen", "localhost:8080")
    assert (code, "'localhost' is not a numeric IP address" in said) == (2, True)

    # A program of the pod that took the port first, without SO_REUSEPORT: the relay will not share it.
    squatter = """
        taken = socket.socket()
        taken.bind(("127.0.0.1", port))
        taken.listen()
        print("taken", flush=True)
        sys.stdin.read()
    """
    holder = subprocess.Popen(namespace.argv(squatter), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert _line(holder, timeout=30) == b"taken\n"
        assert refused(namespace.path) == (
            1,
            f"endpoint relay: cannot listen on 127.0.0.1:{POD_PORT} in {namespace.path}: Address already"
            " in use (a socket without SO_REUSEPORT, or another user's, holds it)\n",
        )
    finally:
        holder.kill()
        holder.wait()
        for pipe in (holder.stdin, holder.stdout):
            if pipe is not None:
                pipe.close()
