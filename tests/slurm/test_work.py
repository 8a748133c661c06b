"""HyperPod nodes as Slurm jobs, against the dev cluster: the seed's HyperPod walkthrough with the real
`aws` CLI on the Slurm fleet (docs/SLURM.md, "Nodes and jobs are Slurm jobs"). A real `hyperplan serve`
on the Slurm back end in isolation mode users, under the manual clock; the server, its accounts' users,
the `hp-` reservations and any Slurm job go with the test (tests/slurm/test_reservations.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.harness import SERVER_START, Server, boundary_after, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.test_reservations import DAY, WAIT, _held, _split_plan, _until, _user_of, slurm_server

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

ROLE = "arn:aws:iam::123456789012:role/hyperpod"
ON_CREATE = (
    "#!/bin/sh\n"
    'echo "created on $SLURMD_NODENAME as $(id -un) until '
    '$SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > created.txt\n'
)
TRAINER = (
    'trap \'cat "$HYPERPLAN_ENV_DIR/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > warned.txt; '
    "exit 0' TERM\n"
    "echo started > started.txt\n"
    "while :; do sleep 0.2; done\n"
)


def _jobs_of(cluster: Cluster, user: str) -> list[dict[str, str]]:
    text = cluster.client.run("squeue", "--noheader", f"--user={user}", "--format=%i|%j|%T|%N|%R|%v")
    keys = ("id", "name", "state", "nodes", "reason", "reservation")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in text.splitlines() if line.strip()]


def test_the_hyperpod_walkthrough_runs_its_nodes_as_slurm_jobs_in_the_plan_reservations(
    cluster: Cluster, slurm_server: Callable[[str], Server], tmp_path: Path
) -> None:
    server = slurm_server("manual")
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team, _other, plan = _split_plan(server, first_day)
    team_id, team_user = _user_of(server, "team")
    rc1, rc2 = f"hp-{team_id}-split-rc1", f"hp-{team_id}-split-rc2"
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    server.cli("buckets", "grant", "lifecycle", "team")
    config = {
        "ClusterName": "ml-cluster",
        "InstanceGroups": [
            {
                "InstanceGroupName": "worker-group-1",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceCount": 2,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "TrainingPlanArn": plan["TrainingPlanArn"],
            }
        ],
    }
    (tmp_path / "cluster-config.json").write_text(json.dumps(config))
    aws = lambda *args: server.aws(*args, credentials=team)  # noqa: E731
    aws("sagemaker", "create-cluster", "--cli-input-json", f"file://{tmp_path / 'cluster-config.json'}")

    def nodes() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = aws("sagemaker", "list-cluster-nodes", "--cluster-name", "ml-cluster")[
            "ClusterNodeSummaries"
        ]
        return found

    def running() -> list[dict[str, Any]]:
        return [n for n in nodes() if n["InstanceStatus"]["Status"] == "Running"]

    # The first segment: two nodes, each a whole-node Slurm job of the account's user in rc1.
    server.set_clock(first_day)
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), nodes()
    held = _held(cluster)
    jobs = _jobs_of(cluster, team_user)
    assert len(jobs) == 2 and {j["reservation"] for j in jobs} == {rc1}, jobs
    assert {j["nodes"] for j in jobs} == set(held[rc1].nodes)
    hosts = {n["PrivateDnsHostname"] for n in running()}
    assert hosts == set(held[rc1].nodes), hosts  # the Slurm node's name
    node_id = running()[0]["InstanceId"]
    described = aws(
        "sagemaker", "describe-cluster-node", "--cluster-name", "ml-cluster", "--node-id", node_id
    )
    host = described["NodeDetails"]["PrivateDnsHostname"]
    assert host in held[rc1].nodes

    # OnCreate ran on the node as the account's user; `clusters exec` is a step of the node's job.
    shown = server.cli(
        "clusters", "exec", "ml-cluster", node_id, "--", "sh", "-c",
        'echo "$SLURMD_NODENAME $SLURM_JOB_ID $(id -un)"; cat lifecycle/created.txt; pwd',
        credentials=team,
    ).stdout.split("\n")  # fmt: skip
    assert len(shown[0].split()) == 3, shown
    name, job_id, user = shown[0].split()
    assert (name, user) == (host, team_user)
    end = str(int((first_day + DAY).timestamp()))
    assert shown[1] == f"created on {host} as {team_user} until {end}"
    trainer_home = Path(shown[2])  # the node's home, on the shared work root

    # A training process of the user's own, started with srun in the node's job, is warned at reclaim.
    assert trainer_home.name == "home" and trainer_home.stat().st_uid != 0
    (trainer_home / "trainer.sh").write_text(TRAINER)
    trainer = subprocess.Popen(
        ["runuser", "-u", team_user, "--", "srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1",
         f"--chdir={trainer_home}", "sh", "trainer.sh"],
        env={**os.environ, "SLURM_CONF": str(cluster.conf),
             "HYPERPLAN_ENV_DIR": str(trainer_home.parent / "env")},
        cwd="/tmp",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(lambda: (trainer_home / "started.txt").exists(), timeout=WAIT)
        server.set_clock(first_day + DAY - timedelta(minutes=30))
        warned = trainer_home / "warned.txt"
        assert wait_until(lambda: warned.exists() and warned.read_text().strip(), timeout=WAIT), "no SIGTERM"
        assert warned.read_text().strip() == end
        assert wait_until(lambda: not running() and not _jobs_of(cluster, team_user), timeout=WAIT)
    finally:
        trainer.kill()
        trainer.wait(timeout=30)

    # Back at the next segment, in rc2; after it, nothing of the account runs on the cluster.
    server.set_clock(first_day + 2 * DAY)
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), nodes()
    held = _until(cluster, lambda h: rc2 in h)
    assert {j["reservation"] for j in _jobs_of(cluster, team_user)} == {rc2}
    assert {n["PrivateDnsHostname"] for n in running()} == set(held[rc2].nodes)
    server.set_clock(first_day + 3 * DAY)
    assert wait_until(lambda: not running() and not _jobs_of(cluster, team_user), timeout=WAIT)
