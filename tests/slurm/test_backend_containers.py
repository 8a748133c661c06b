"""The Slurm back end with every node program and sandbox in a container (runtime podman on Slurm,
docs/SLURM.md "Containers on Slurm"), against the dev cluster: the back-end contract
(tests/backends/contract.py) kept with rootless runc in each Slurm step, and what containers add: the
runner's records out of the tenant's reach, an image that cannot be had failing its work, saying why.
The programs are the contract's sh scripts, run by the image's /bin/sh."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.base import (
    ContainerSpec,
    IdMap,
    Limits,
    Mount,
    NodeSpec,
    NodeState,
    RunAs,
    TaskRef,
    TaskSpec,
    TaskState,
)
from hyperplan.backends.containers import Podman
from hyperplan.backends.fake import Program
from hyperplan.backends.slurm import SlurmBackend
from hyperplan.backends.slurm_images import SlurmImages
from hyperplan.containers.podman import PodmanStore
from tests import processes
from tests.backends.contract import INSTANCE_TYPE, BackendContract, Harness, eventually, task_final
from tests.backends.test_local import render
from tests.image_fixtures import Built
from tests.slurm.cluster import Cluster, reachable_directory
from tests.slurm.test_backend import tenant

__all__ = ["tenant"]  # the fixture, shared

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: Slurm's daemons, Podman and the tenants' users"
    ),
]


class Containerized:
    """The Slurm back end, every node and sandbox a container of ``image`` run as ``tenant`` (what the
    services do with runtime podman on Slurm)."""

    def __init__(self, backend: SlurmBackend, container: ContainerSpec, tenant: RunAs) -> None:
        self.backend, self.container, self.tenant = backend, container, tenant

    def provision(self, spec: NodeSpec) -> None:
        self.backend.provision(dataclasses.replace(spec, container=self.container, run_as=self.tenant))

    def run(self, spec: TaskSpec) -> None:
        if spec.node_id is None:
            spec = dataclasses.replace(spec, container=self.container, run_as=self.tenant)
        self.backend.run(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)


class SlurmContainerHarness(Harness):
    """A back end over ``root`` (a module's: its images unpacked once), its test's files in ``files``."""

    def __init__(
        self, cluster: Cluster, root: Path, files: Path, store: PodmanStore, image: str, tenant: RunAs
    ) -> None:
        self.cluster, self.root, self.files, self.store, self.tenant = cluster, root, files, store, tenant
        self.container = ContainerSpec(
            image=image,
            ids=IdMap(tenant.uid, 1),
            limits=Limits(1.0, 256 * 2**20, 256),
            endpoint="127.0.0.1:9",  # the node's network (no endpoint: a network of its own)
            insecure_registry=True,
        )
        self.backend: Any = self._backend()
        self.count = 0

    def _backend(self) -> Containerized:
        slurm = SlurmBackend(self.root, self.cluster.client, podman_store=self.store.root)
        return Containerized(slurm, self.container, self.tenant)

    def command(self, program: Program) -> tuple[str, ...]:
        return ("/bin/sh", "-c", render(program))

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        self.count += 1
        source = self.files / f"lifecycle-{self.count}"
        source.mkdir()
        (source / "on_create.sh").write_text(render(program))
        return source, "on_create.sh"

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        task = self.root / "tasks" / task_id

        def ended() -> bool:
            if not (task / "out" / "exit.json").exists():
                return False
            jobs = SlurmBackend(self.root, self.cluster.client).live_jobs()
            return not [job for job in jobs if task_id in job.name]

        return bool(eventually(ended, bool, timeout))

    def restart(self) -> Any:
        self.backend.close()
        self.backend = self._backend()
        return self.backend


@dataclasses.dataclass(frozen=True)
class Warm:
    """A back-end root whose images are unpacked already, and the store they came from."""

    root: Path
    store: PodmanStore


@pytest.fixture(scope="module")
def warm(built: Built, podman_store_dir: Path) -> Iterator[Warm]:
    """The session's Python image pulled into the session's Slurm store (as the server's store pulls) and
    unpacked under one back-end root, which the module's tests share: each test's work is gone at its end
    (a back end that knows nothing cancels all of it), its images stay."""
    store = PodmanStore(podman_store_dir)
    store.prepare()
    base = reachable_directory("hp-slurm-containers-")
    try:
        images = SlurmImages(base / "backend" / "images", Podman(store.root, base / "backend"))
        images.prepare(built.python, None, insecure=True)
        images.wait(built.python, 600)
        yield Warm(base / "backend", store)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def contained_harness(
    cluster: Cluster, warm: Warm, image: str, tenant: RunAs, files: Path
) -> Iterator[SlurmContainerHarness]:
    harness = SlurmContainerHarness(cluster, warm.root, files, warm.store, image, tenant)
    try:
        yield harness
    finally:
        harness.backend.close()
        cleaner = SlurmBackend(warm.root, cluster.client)
        cleaner.adopt([])  # a back end that knows nothing cancels all its jobs
        assert eventually(cleaner.live_jobs, lambda jobs: not jobs, 30) == []
        left = eventually(lambda: _processes_of(tenant), lambda found: not found, 30)
        assert not left, f"processes of the tenant left (its containers' included): {left}"


def _processes_of(tenant: RunAs) -> list[str]:
    """The tenant's processes still running (its containers' included: root inside is its uid outside),
    with their command lines; not those that have exited and wait to be reaped."""
    found = []
    for pid in processes.owned_by(tenant.uid, zombies=False):
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            found.append(f"{pid} {command}")
    return found


class TestSlurmContainerContract(BackendContract):
    # Not run again with containers: what they check is the back end's bookkeeping, the same with and
    # without a container (ids, specs, deadlines, forgetting, exec's output caps), which the process
    # contract (tests/slurm/test_backend.py) runs on the same code; the Slurm part has a time budget.
    test_unknown_ids = None  # type: ignore[assignment]
    test_provision_is_idempotent_and_refuses_another_spec = None  # type: ignore[assignment]
    test_the_nearer_deadline_wins = None  # type: ignore[assignment]
    test_a_task_terminated_before_it_started_never_starts = None  # type: ignore[assignment]
    test_exec_returns_at_most_the_limit_of_each_stream_and_says_it_cut = None  # type: ignore[assignment]
    test_only_ended_work_can_be_forgotten = None  # type: ignore[assignment]

    @pytest.fixture
    def harness(
        self, cluster: Cluster, warm: Warm, built: Built, tenant: RunAs, tmp_path: Path
    ) -> Iterator[SlurmContainerHarness]:
        with contained_harness(cluster, warm, built.python, tenant, tmp_path) as harness:
            yield harness


# The forgeries of tests/slurm/test_backend.py, tried from inside a container: the task's out/ (given
# as OUT, a path on the node) is not there, and the runner is not among the container's processes.
FORGE = (
    'for f in exit.json started.json stdout.log; do rm -f "$OUT/$f"; ln -s /etc/shadow "$OUT/$f"; done\n'
    'echo \'{"exit_code": 0, "signal": null}\' > "$OUT/exit.json"\n'
    "ls /proc | grep -c '^[0-9]' > /root/pids\n"
    "exit 7\n"
)


def test_a_tenant_in_a_container_cannot_reach_its_runners_records(
    cluster: Cluster, warm: Warm, built: Built, tenant: RunAs, tmp_path: Path
) -> None:
    """With host processes the account's program can rewrite what its runner writes (tests/slurm/
    test_backend.py); in a container it cannot even find it: the records stay the runner's, and how the
    task ended is the program's true exit code, on a node and in a sandbox alike."""
    with contained_harness(cluster, warm, built.python, tenant, tmp_path) as harness:
        backend = harness.backend
        tasks = harness.root / "tasks"
        backend.provision(NodeSpec("n-forge", "forge", INSTANCE_TYPE))
        assert eventually(lambda: backend.node_status("n-forge").state, lambda s: s is NodeState.RUNNING, 90)
        backend.run(
            TaskSpec("on-node", ("/bin/sh", "-c", FORGE), "n-forge", {"OUT": str(tasks / "on-node/out")})
        )
        backend.run(TaskSpec("sandbox", ("/bin/sh", "-c", FORGE), env={"OUT": str(tasks / "sandbox/out")}))
        for name in ("on-node", "sandbox"):
            status = task_final(backend, name, 90)
            assert (status.state, status.exit_code) == (TaskState.EXITED, 7), (name, status)
            assert "refused" not in status.message, status
            out = tasks / name / "out"
            for record in ("exit.json", "started.json", "stdout.log"):
                assert not (out / record).is_symlink(), (name, record)
            assert b'"exit_code": 7' in (out / "exit.json").read_bytes()
            assert b"No such file or directory" in (out / "stderr.log").read_bytes()
        # Its own PID namespace: sh, ls and grep, and the init: nothing of the node's.
        pids = int((harness.root / "nodes" / "n-forge" / "home" / "pids").read_text())
        assert pids <= 5, pids


def test_work_whose_image_cannot_be_had_fails_saying_why(
    cluster: Cluster, warm: Warm, built: Built, tenant: RunAs, tmp_path: Path
) -> None:
    """A node of an image the registry does not have fails, naming it and what the pull said; nothing
    is submitted to Slurm for it."""
    missing = f"{built.registry}/hyperplan/no-such-image:1"
    with contained_harness(cluster, warm, missing, tenant, tmp_path) as harness:
        backend = harness.backend
        backend.provision(NodeSpec("n-missing", "missing", INSTANCE_TYPE))
        failed = eventually(
            lambda: backend.node_status("n-missing"), lambda s: s.state is NodeState.FAILURE, 90
        )
        assert failed.state is NodeState.FAILURE, failed
        assert "its image cannot be used" in failed.message and "no-such-image" in failed.message, failed
        assert "could not be pulled" in failed.message, failed
        assert not (harness.root / "nodes" / "n-missing" / "job.json").exists()


def test_an_instance_sees_its_tree_and_host_names_and_writes_nothing_else(
    cluster: Cluster, warm: Warm, built: Built, tenant: RunAs, tmp_path: Path
) -> None:
    """A job's instance: its tree bound at /opt/ml (written as root inside, the tenant's outside), its
    host name algo-1 in /etc/hosts and as its hostname, root inside; the image read-only."""
    tree = reachable_directory("hp-slurm-tree-")
    os.chown(tree, tenant.uid, tenant.gid)
    program = (
        "set -e\n"
        'echo "$(id -u) $(hostname) $(getent hosts algo-1 | cut -d" " -f1)" > /opt/ml/seen\n'
        "touch /usr/written 2>/dev/null && echo image-writable >> /opt/ml/seen || true\n"
        'echo "$HOME $PWD" >> /opt/ml/seen\n'
    )
    try:
        with contained_harness(cluster, warm, built.python, tenant, tmp_path) as harness:
            harness.container = dataclasses.replace(
                harness.container, hosts=("algo-1",), mounts=(Mount(tree, "/opt/ml"),)
            )
            backend = harness.restart()
            backend.run(TaskSpec("instance", ("/bin/sh", "-c", program)))
            status = task_final(backend, "instance", 90)
            assert (status.state, status.exit_code) == (TaskState.EXITED, 0), status
            assert (tree / "seen").read_text().splitlines() == ["0 algo-1 127.0.0.1", "/root /root"]
            assert (tree / "seen").stat().st_uid == tenant.uid
            backend.terminate(TaskRef("instance"), timedelta(seconds=1))  # ended: nothing happens
    finally:
        shutil.rmtree(tree, ignore_errors=True)
