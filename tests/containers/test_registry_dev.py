"""`scripts/registry-dev`: Debian's docker-registry on loopback, up, idempotent, status and down.

Needs root where docker-registry is not installed (tests/containers/conftest.py skips otherwise). Each
test brings up registries of its own, in its own directories, and brings them down even when it fails.
"""

from __future__ import annotations

import contextlib
import json
import socket
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


def get(url: str) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as response:
        return response.status, response.read()


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
