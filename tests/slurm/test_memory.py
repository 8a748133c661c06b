"""Slurm enforces the allocation's memory (docs/SLURM.md, "Memory"): the dev cluster runs Slurm's cgroup
plugins and each job gets ``--mem``, its instance type's memory times its pool's ``limits_scale``. A
real `hyperplan serve` on the dev cluster, under the manual clock; the server, its accounts' users and
their Slurm jobs go with the test (tests/slurm/test_reservations.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hyperplan.slurm.devcluster import TYPES
from tests.harness import Server, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.test_reservations import WAIT, _user_of, slurm_server
from tests.slurm.test_work import FINAL, G5, JOB_PERIODS, _jobs_of, _on_demand_fleet, _on_demand_job

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

HOG = 'python3 -c "x = bytearray(2 * 2**30)"'  # 2 GiB, twice a g5 instance's limit on the dev cluster
LOOP = "while :; do sleep 0.2; done"
OOM = "OutOfMemoryError: instance {} ran out of memory"


def _g5_memory_mib() -> int:
    """What the dev cluster's fleet gives a g5 instance: 192 GiB times the pool's scale, in MiB up."""
    [g5] = [kind for kind in TYPES if kind.instance_type == G5]
    return -(-int(192 * 2**30 * g5.limits_scale) // 2**20)


def _memory_of_jobs(cluster: Cluster, user: str) -> set[str]:
    """MinMemoryNode of every job of `user` Slurm still lists (ended ones too, for MinJobAge)."""
    text = cluster.client.run("scontrol", "show", "job", "-o")
    lines = [line for line in text.splitlines() if f"UserId={user}(" in line]
    return {
        field.split("=", 1)[1]
        for line in lines
        for field in line.split()
        if field.startswith("MinMemoryNode=")
    }


def test_a_memory_hog_ends_its_job_failed_out_of_memory_and_its_nodes_run_the_next_job(
    cluster: Cluster, slurm_server: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-instance job that allocates twice its memory, and a two-instance job whose algo-2 does while
    algo-1 runs on: both Failed, OutOfMemoryError naming the instance (Slurm's OUT_OF_MEMORY job state;
    the slurmstepd of algo-2's node). Every job got --mem. Then a job on all four g5 nodes completes."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    server = slurm_server("manual", _on_demand_fleet(cluster, tmp_path / "fleet.toml"))
    team = server.new_account("team")
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    server.cli("buckets", "grant", "bucket", "team")
    client = server.sagemaker(team)
    client.create_training_job(**_on_demand_job("hog", f"echo hogging; exec {HOG}", G5))
    in_two = f'if [ "$SM_CURRENT_HOST" = algo-2 ]; then exec {HOG}; fi; {LOOP}'
    client.create_training_job(**_on_demand_job("hog-in-two", in_two, G5, 2))

    def ended(name: str) -> dict[str, Any]:
        describe = lambda: client.describe_training_job(TrainingJobName=name)  # noqa: E731
        found = wait_until(lambda: (d := describe())["TrainingJobStatus"] in FINAL and d, timeout=WAIT)
        assert found, describe()
        return dict(found)

    hog, in_two_job = ended("hog"), ended("hog-in-two")
    assert hog["TrainingJobStatus"] == "Failed" and hog["FailureReason"].startswith(OOM.format("algo-1")), hog
    assert in_two_job["TrainingJobStatus"] == "Failed", in_two_job
    assert in_two_job["FailureReason"].startswith(OOM.format("algo-2")), in_two_job
    _, user = _user_of(server, "team")
    assert _memory_of_jobs(cluster, user) == {f"{_g5_memory_mib()}M"}

    client.create_training_job(**_on_demand_job("after", "echo fine", G5, 4))  # every g5 node
    after = ended("after")
    assert after["TrainingJobStatus"] == "Completed", after
    assert wait_until(lambda: not _jobs_of(cluster, user), timeout=WAIT), _jobs_of(cluster, user)
