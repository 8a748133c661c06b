"""The back-end contract (tests/backends/contract.py) with every node and sandbox a Podman container.

The same rules as for host processes, kept by the local back end when each spec carries a
ContainerSpec: OnCreate, tasks and exec run in the node's container, signals reach its programs, a
terminate ends them within their grace, a restarted back end adopts what runs and kills what it does
not know (its containers too). The programs are the contract's sh scripts, run by the image's /bin/sh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends import LocalBackend, NodeSpec, Program, TaskSpec
from hyperplan.backends.base import ContainerSpec, IdMap, Limits, Login, NodeState
from hyperplan.backends.containers import PULL_LOGIN
from hyperplan.containers.podman import PodmanStore
from tests.backends.contract import BackendContract, Harness, eventually
from tests.backends.test_local import render
from tests.containers.conftest import Built, podman

pytestmark = pytest.mark.containers

# A block of host ids no account is handed (the fleet's default range ends below 2**31): the tests' own.
TEST_IDS = IdMap(3_000_000_000)


class Containerized:
    """The local back end, every node and sandbox given ``container`` (what the services do)."""

    def __init__(self, backend: LocalBackend, container: ContainerSpec) -> None:
        self.backend, self.container = backend, container

    def provision(self, spec: NodeSpec) -> None:
        self.backend.provision(dataclasses.replace(spec, container=self.container))

    def run(self, spec: TaskSpec) -> None:
        if spec.node_id is None:
            spec = dataclasses.replace(spec, container=self.container)
        self.backend.run(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


class ContainerHarness(Harness):
    def __init__(self, tmp_path: Path, store: PodmanStore, image: str) -> None:
        self.tmp_path, self.store = tmp_path, store
        self.root = tmp_path / "backend"
        self.container = ContainerSpec(image=image, ids=TEST_IDS, limits=Limits(1.0, 256 * 2**20, 256))
        self.backend: Any = self._backend()
        self.count = 0

    def _backend(self) -> Containerized:
        return Containerized(LocalBackend(self.root, podman_store=self.store.root), self.container)

    def command(self, program: Program) -> tuple[str, ...]:
        return ("/bin/sh", "-c", render(program))

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        self.count += 1
        source = self.tmp_path / f"lifecycle-{self.count}"
        source.mkdir()
        (source / "on_create.sh").write_text(render(program))
        return source, "on_create.sh"

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        exit_record = self.backend.backend.layout.task(task_id).exit
        return bool(eventually(exit_record.exists, bool, timeout))

    def restart(self) -> Any:
        self.backend.close()
        self.backend = self._backend()
        return self.backend


@pytest.fixture(scope="module")
def contract_store(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodmanStore]:
    store = PodmanStore(tmp_path_factory.mktemp("contract-store"))
    store.prepare()
    pulled = podman(store, "pull", "--quiet", "--tls-verify=false", built.python)
    assert pulled.returncode == 0, pulled.stderr
    try:
        yield store
    finally:
        podman(store, "rm", "--all", "--force", "--time", "0")
        podman(store, "pod", "rm", "--all", "--force")
        store.remove()


class TestContainerContract(BackendContract):
    @pytest.fixture
    def harness(
        self, tmp_path: Path, contract_store: PodmanStore, built: Built
    ) -> Iterator[ContainerHarness]:
        harness = ContainerHarness(tmp_path, contract_store, built.python)
        yield harness
        harness.backend.close()
        # Whatever a test left running goes, its containers with it.
        LocalBackend(harness.root, podman_store=contract_store.root).adopt([])
        left = podman(contract_store, "ps", "--all", "--format", "{{.Names}} {{.PodName}} {{.Status}}").stdout
        pods = podman(contract_store, "pod", "ps", "--format", "{{.Name}} {{.Status}}").stdout
        assert not left.strip() and not pods.strip(), f"left behind: {left} pods: {pods}"


def test_a_nodes_registry_login_reaches_its_pull_alone_and_is_gone_after_it(
    tmp_path: Path, contract_store: PodmanStore, built: Built
) -> None:
    """The login is a file of root's in the node's directory until the agent's pull is done: never in
    the node's record, its log, or anything a tenant can read."""
    harness = ContainerHarness(tmp_path, contract_store, built.python)
    backend = harness.backend.backend
    secret = "registry-password-9d1c4e7a"
    spec = NodeSpec("login-node", "login-node", "ml.m5.large", container=harness.container)
    backend.provision(dataclasses.replace(spec, image_login=Login("puller", secret)))
    try:
        status = eventually(lambda: backend.node_status("login-node"), lambda s: s.state is NodeState.RUNNING)
        assert status.state is NodeState.RUNNING, status
        files = backend.layout.node("login-node")
        assert not (files.path / PULL_LOGIN).exists()
        for path in files.path.rglob("*"):
            if path.is_file() and not path.is_relative_to(files.path / "disk"):
                assert secret.encode() not in path.read_bytes(), path
        assert secret not in repr(dataclasses.replace(spec, image_login=Login("puller", secret)))
    finally:
        backend.close()
        LocalBackend(harness.root, podman_store=contract_store.root).adopt([])
