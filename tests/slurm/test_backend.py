"""The Slurm back end against the dev cluster: the back-end contract (tests/backends/contract.py) with
nodes as whole-node Slurm jobs and tasks as job steps, and what only Slurm shows."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.backends import Backend
from hyperplan.backends.base import NodeSpec, Placement
from hyperplan.backends.fake import Program
from hyperplan.backends.slurm import SlurmBackend
from hyperplan.slurm.parse import key_values
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
        try:
            assert eventually(cleaner.live_jobs, lambda jobs: not jobs, 30) == []
        finally:
            shutil.rmtree(root, ignore_errors=True)  # the test's files go too, not only its jobs


class TestSlurmContract(BackendContract):
    @pytest.fixture
    def harness(self, cluster: Cluster) -> Iterator[SlurmHarness]:
        yield from slurm_harness(cluster)


def _time_limit_minutes(cluster: Cluster, job_id: int) -> int:
    """The job's TimeLimit ([days-]hours:minutes:seconds) in whole minutes."""
    text = cluster.client.run("scontrol", "show", "job", str(job_id), "-o").splitlines()[0]
    days, _, clock = key_values(text)["TimeLimit"].rpartition("-")
    hours, minutes, _ = (int(part) for part in clock.split(":"))
    return int(days or 0) * 1440 + hours * 60 + minutes


def test_on_demand_work_ends_before_the_next_reservation_on_its_nodes(cluster: Cluster) -> None:
    """Outside reservations a node's job gets a --time ending (with a margin) before the earliest
    reservation ahead on the nodes of its feature, so Slurm places it where it fits and ends it there."""
    nodes = [node for node in cluster.client.nodes() if node.features]
    feature = nodes[0].features[0]
    mine = [node.name for node in nodes if feature in node.features]
    now = datetime.now(UTC).replace(microsecond=0)
    cluster.client.create_reservation(
        "ahead-test",
        users=["root"],
        nodes=mine[-1:],
        start=now + timedelta(minutes=40),
        end=now + timedelta(minutes=60),
    )
    try:
        for harness in slurm_harness(cluster):
            backend = harness.backend
            spec = NodeSpec("n-ondemand", "od", feature, placement=Placement(constraint=feature))
            backend.provision(spec)
            job = json.loads((harness.root / "backend" / "nodes" / "n-ondemand" / "job.json").read_text())
            limit = _time_limit_minutes(cluster, int(job["job_id"]))
            assert 36 <= limit <= 38  # 40 minutes ahead, less the 2-minute margin, in whole minutes
    finally:
        cluster.client.delete_reservation("ahead-test")
