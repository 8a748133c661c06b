from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Tests assert behaviour, never timings: Hypothesis' per-example deadline (200 ms by default) is a timing
# assertion, and on a loaded 2-core CI machine a plain example can take longer (a serializer property test
# failed at 283 ms while other work ran). Examples are still bounded by each test's own max_examples.
settings.register_profile("hyperplan", deadline=None)
settings.load_profile("hyperplan")

# The servers, commands and node agents the tests start run hyperplan as an installed package does, from
# bytecode compiled once (pip compiles at install) and reused: with PYTHONDONTWRITEBYTECODE set, each of
# the hundreds of them would compile hyperplan's modules afresh, about half a second of CPU per server
# start. Read at the start of every interpreter, so it covers the test workers xdist starts after this.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Every server the tests start, in this process or as a subprocess (they inherit os.environ), runs tenant
# work as host processes, as before containers: as root where Podman is usable the default would be
# containers, which only the tests that ask for them pay for ([backend] runtime or --runtime, which come
# before this variable: core/runtime_choice.py).
os.environ["HYPERPLAN_RUNTIME"] = "process"

pytest.register_assert_rewrite("tests.postgres")  # a plugin below, which tests.harness imports first

from tests.forkserver import stop_fork_server  # noqa: E402
from tests.harness import Server  # noqa: E402
from tests.inprocess import InProcessServer, Templates  # noqa: E402

# nothing outlives the run; each part's time; both stores (the `stores` fixture); the registry and the
# images the containers and Slurm tests share (one definition: one registry and one build per worker)
pytest_plugins = ["tests.leaks", "tests.parts", "tests.postgres", "tests.image_fixtures"]


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish() -> None:
    # Before tests/leaks.py looks for processes left running: the fork server ends with its session.
    stop_fork_server()


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


@pytest.fixture(scope="session")
def store_templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    """First-start data directories, made once a run and copied for each in-process server."""
    return Templates(tmp_path_factory.mktemp("templates"))


@pytest.fixture
def fast_server_factory(tmp_path: Path, store_templates: Templates) -> Iterator[type[InProcessServer]]:
    """Build in-process servers (tests/inprocess.py) in this test's directory; all stopped after."""
    started: list[InProcessServer] = []

    class TestServer(InProcessServer):
        def start(self, timeout: float = 60) -> InProcessServer:
            started.append(self)
            self.templates = self.templates or store_templates
            return super().start(timeout)

    yield TestServer
    for server in reversed(started):
        server.close()


@pytest.fixture
def fast_server(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    """A fresh in-process server on the demo fleet with the manual clock, over the fake back end."""
    return fast_server_factory(data_dir=tmp_path / "data").start()


@pytest.fixture(scope="module")
def fast_shared_server(
    tmp_path_factory: pytest.TempPathFactory, store_templates: Templates
) -> Iterator[InProcessServer]:
    """One in-process server for a whole module of rule tests; each test makes its own accounts."""
    data_dir = tmp_path_factory.mktemp("shared") / "data"
    server = InProcessServer(data_dir=data_dir, templates=store_templates).start()
    yield server
    server.close()
