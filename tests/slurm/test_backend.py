"""The Slurm back end against the dev cluster: the back-end contract (tests/backends/contract.py) with
nodes as whole-node Slurm jobs and tasks as job steps, and what only Slurm shows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import Backend
from hyperplan.backends.fake import Program
from hyperplan.backends.slurm import SlurmBackend
from tests.backends.contract import BackendContract, Harness, eventually
from tests.backends.test_local import render
from tests.slurm.cluster import Cluster, reachable_directory

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons"),
]


class SlurmHarness(Harness):
    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.backend: Backend = SlurmBackend(root / "backend", cluster.client)
        self.count = 0

    def command(self, program: Program) -> tuple[str, ...]:
        return ("/bin/sh", "-c", render(program))

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        self.count += 1
        source = self.root / f"lifecycle-{self.count}"
        source.mkdir()
        (source / "on_create.sh").write_text(render(program))
        return source, "on_create.sh"

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        record = self.root / "backend" / "tasks" / task_id / "out" / "exit.json"
        return bool(eventually(record.exists, bool, timeout))

    def restart(self) -> Backend:
        self.backend.close()
        self.backend = SlurmBackend(self.root / "backend", self.cluster.client)
        return self.backend


def slurm_harness(cluster: Cluster) -> Iterator[SlurmHarness]:
    root = reachable_directory("hp-slurm-backend-")
    harness = SlurmHarness(cluster, root)
    try:
        yield harness
    finally:
        harness.backend.close()
        # Whatever a test left behind goes: a back end that knows nothing cancels all its jobs.
        cleaner = SlurmBackend(root / "backend", cluster.client)
        cleaner.adopt([])
        assert eventually(cleaner.live_jobs, lambda jobs: not jobs, 30) == []


class TestSlurmContract(BackendContract):
    @pytest.fixture
    def harness(self, cluster: Cluster) -> Iterator[SlurmHarness]:
        yield from slurm_harness(cluster)
