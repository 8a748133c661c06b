"""`scripts/registry-dev`: Debian's docker-registry on loopback, up, idempotent, status and down, open or
asking for a login.

Needs root where docker-registry is not installed (tests/containers/conftest.py skips otherwise). Each
test brings up registries of its own, in its own directories, and brings them down even when it fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.containers.registry_dev import MARK_VARIABLE
from tests.containers.conftest import script

pytestmark = pytest.mark.containers


def processes_marked_with(directory: Path) -> list[int]:
    mark = f"{MARK_VARIABLE}={directory}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def program_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


def get(url: str, login: tuple[str, str] | None = None) -> tuple[int, bytes]:
    """The status and body of a GET (401 and others too), with HTTP basic authentication for ``login``."""
    headers = {}
    if login is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(login).encode()).decode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as answer:
        with answer:
            return answer.code, answer.read()


def refuses_connections(address: str) -> bool:
    host, port = address.split(":")
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) != 0


@contextlib.contextmanager
def registries(*directories: Path) -> Iterator[None]:
    try:
        yield
    finally:
        for directory in directories:
            script("registry-dev", "down", directory)


def test_up_answers_on_loopback_again_and_again_and_down_leaves_nothing(
    container_tools: None, tmp_path: Path
) -> None:
    directory = tmp_path / "registry"
    with registries(directory):
        assert script("registry-dev", "status", directory).returncode == 3
        up = script("registry-dev", "up", directory, "--port", "0")
        assert up.returncode == 0, up.stderr
        address = up.stdout.strip()
        assert up.stdout == f"{address}\n" and address.startswith("127.0.0.1:")
        assert (directory / "address").read_text() == f"{address}\n"
        assert get(f"http://{address}/v2/") == (200, b"{}")
        assert json.loads(get(f"http://{address}/v2/_catalog")[1]) == {"repositories": []}
        assert script("registry-dev", "status", directory).returncode == 0
        running = processes_marked_with(directory)
        assert [program_of(pid) for pid in running] == ["docker-registry"]

        again = script("registry-dev", "up", directory)
        assert (again.returncode, again.stdout) == (0, up.stdout)
        assert processes_marked_with(directory) == running  # nothing changed

        down = script("registry-dev", "down", directory)
        assert down.returncode == 0, down.stderr
        assert processes_marked_with(directory) == []
        assert script("registry-dev", "status", directory).returncode == 3
        assert refuses_connections(address)
        assert script("registry-dev", "down", directory).returncode == 0  # nothing runs: still fine


def test_a_taken_port_5000_gives_a_free_port_and_says_which(container_tools: None, tmp_path: Path) -> None:
    taken = socket.socket()
    with taken, registries(tmp_path / "a", tmp_path / "b"):
        with contextlib.suppress(OSError):  # if something else holds 5000, it is taken all the same
            taken.bind(("127.0.0.1", 5000))
            taken.listen()
        up = script("registry-dev", "up", tmp_path / "a")
        assert up.returncode == 0, up.stderr
        address = up.stdout.strip()
        assert address != "127.0.0.1:5000"
        assert up.stderr == f"registry-dev up: port 5000 is taken; listening on {address}\n"
        assert get(f"http://{address}/v2/")[0] == 200

        port = address.split(":")[1]
        refused = script("registry-dev", "up", tmp_path / "b", "--port", port)
        assert refused.returncode == 1
        assert f"port {port} is taken on 127.0.0.1" in refused.stderr
        assert script("registry-dev", "status", tmp_path / "b").returncode == 3


def test_up_with_a_login_lets_that_user_alone_in_over_plain_http_and_up_again_keeps_to_it(
    container_tools: None, tmp_path: Path
) -> None:
    directory, password = tmp_path / "private", "pull-secret-4e1d"
    with registries(directory):
        up = script(
            "registry-dev", "up", directory, "--port", "0", "--login", "puller", stdin=f"{password}\n"
        )
        assert up.returncode == 0, up.stderr
        address = up.stdout.strip()
        assert get(f"http://{address}/v2/")[0] == 401
        assert get(f"http://{address}/v2/", ("puller", "wrong"))[0] == 401
        assert get(f"http://{address}/v2/", ("puller", password)) == (200, b"{}")
        assert script("registry-dev", "status", directory).returncode == 0
        # The password is nowhere but in the hash of a file of the registry's user alone.
        assert (directory / "htpasswd").stat().st_mode & 0o777 == 0o600
        for name in ("htpasswd", "config.yml", "registry.log"):
            assert password not in (directory / name).read_text(), name
        (pid,) = processes_marked_with(directory)
        assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()

        again = script("registry-dev", "up", directory, "--login", "puller", stdin=password)
        assert (again.returncode, again.stdout) == (0, up.stdout)
        for arguments, stdin in ((("--login", "puller"), "another"), ((), "")):
            refused = script("registry-dev", "up", directory, *arguments, stdin=stdin)
            assert refused.returncode == 1 and "is up asking for puller's login" in refused.stderr
        assert processes_marked_with(directory) == [pid]  # nothing changed

        assert script("registry-dev", "down", directory).returncode == 0
        reopened = script("registry-dev", "up", directory, "--port", "0")  # without a login this time
        assert reopened.returncode == 0, reopened.stderr
        assert get(f"http://{reopened.stdout.strip()}/v2/") == (200, b"{}")
        assert not (directory / "htpasswd").exists()
