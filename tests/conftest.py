from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Server

pytest_plugins = ["tests.leaks", "tests.parts"]  # nothing outlives the run; each part's time


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[type[Server]]:
    """Build servers in this test's temporary directory; every one still running is stopped after."""
    started: list[Server] = []

    class TestServer(Server):
        def start(self, timeout: float = 60) -> Server:
            started.append(self)
            return super().start(timeout)

    yield TestServer
    for server in started:
        server.close()


@pytest.fixture
def server(server_factory: type[Server], tmp_path: Path) -> Server:
    """A fresh server on the demo fleet with the manual clock."""
    return server_factory(data_dir=tmp_path / "data").start()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a whole module of read-mostly tests; each test makes its own accounts."""
    server = Server(data_dir=tmp_path_factory.mktemp("shared") / "data").start()
    yield server
    server.close()
