"""A node's on_reclaim.sh on the Slurm back end (issue 50, docs/DECISIONS.md "Reclaim hook"): at its plan's
reclaim time the node's batch script runs the hook from its lifecycle copy, as its OnCreate ran (the node's
user, the published expiry, its output in the node's lifecycle log), before the node's Slurm job ends; a
node let go at a scale-down runs none.

A real `hyperplan serve` on the Slurm back end in isolation mode users, under the manual clock
(tests/slurm/test_reservations.py's slurm_server, which takes the server, its accounts' users, their
Slurm jobs and the `hp-` reservations away after the test)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import boto3
import pytest

from hyperplan.signing import Credentials
from tests.harness import REGION, SERVER_START, Server, boundary_after, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.test_reservations import DAY, WAIT, _user_of, slurm_server
from tests.slurm.test_several_plans import LIVE, _buy, _node_jobs
from tests.slurm.test_work import ON_CREATE, P5, ROLE

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

EXPIRY = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
# It lingers after its marker: the node's Slurm job must still be live when the marker is seen.
ON_RECLAIM = (
    "#!/bin/sh\n"
    f'echo "${EXPIRY} $(id -un)" >> "$HOME/reclaimed.txt"\n'
    f'echo "on_reclaim: saving state before ${EXPIRY}"\n'
    "sleep 3\n"
)


def _group(count: int, arn: str) -> dict[str, object]:
    return {
        "InstanceGroupName": "workers", "InstanceType": P5, "InstanceCount": count,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
        "ExecutionRole": ROLE, "ThreadsPerCore": 1, "TrainingPlanArn": arn,
    }  # fmt: skip


def _markers(server: Server) -> dict[str, list[str]]:
    """Each node home's reclaimed.txt lines, by instance id (the homes are under the server's work dir)."""
    args = list(server.extra_args)
    work = Path(args[args.index("--work-dir") + 1])
    return {
        found.parent.parent.name.removeprefix("node-"): found.read_text().splitlines()
        for found in work.rglob("nodes/node-*/home/reclaimed.txt")
    }


def _lifecycle_log(server: Server, who: Credentials, instance_id: str) -> list[str]:
    client = server.sagemaker(who)
    cluster_id = client.describe_cluster(ClusterName="c")["ClusterArn"].rpartition("/")[2]
    logs = boto3.client(
        "logs", endpoint_url=server.url, region_name=REGION,
        aws_access_key_id=who.access_key, aws_secret_access_key=who.secret_key,
    )  # fmt: skip
    events = logs.get_log_events(
        logGroupName=f"/aws/sagemaker/Clusters/c/{cluster_id}",
        logStreamName=f"LifecycleConfig/workers/{instance_id}",
        startFromHead=True,
    )["events"]
    return [event["message"] for event in events]


def test_on_reclaim_runs_in_the_node_job_at_the_reclaim_and_not_at_a_scale_down(
    cluster: Cluster, slurm_server: Callable[..., Server]
) -> None:
    server = slurm_server("manual")
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team = server.new_account("team")
    _, team_user = _user_of(server, "team")
    plan = _buy(server, team, "landing", 2, first_day, 1)
    source = server.data_dir / "s3" / "lifecycle" / "src"
    source.mkdir(parents=True)
    (source / "on_create.sh").write_text(ON_CREATE)
    (source / "on_reclaim.sh").write_text(ON_RECLAIM)
    server.cli("buckets", "grant", "lifecycle", "team")
    client = server.sagemaker(team)
    client.create_cluster(ClusterName="c", InstanceGroups=[_group(2, plan)])

    def running() -> set[str]:
        nodes = client.list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
        return {n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}

    def live(job_id: int) -> bool:
        found = cluster.client.job(job_id)
        return found is not None and found.state in LIVE

    server.set_clock(first_day + timedelta(minutes=1))
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), client.list_cluster_nodes(ClusterName="c")
    jobs = _node_jobs(cluster, team_user)

    # A scale-down: the node goes, its plan's capacity not taken back, so no hook runs.
    client.update_cluster(ClusterName="c", InstanceGroups=[_group(1, plan)])
    assert wait_until(lambda: len(_node_jobs(cluster, team_user)) == 1, timeout=WAIT), _node_jobs(
        cluster, team_user
    )
    (kept,) = _node_jobs(cluster, team_user)
    (dropped,) = set(jobs) - {kept}
    assert wait_until(lambda: not live(jobs[dropped].id), timeout=WAIT)
    assert _markers(server) == {}

    # The reclaim: the hook runs in the kept node's job, once, with the segment's end, as the node's user,
    # while the job still runs; then the job ends.
    server.set_clock(first_day + DAY - timedelta(minutes=30))
    assert wait_until(lambda: _markers(server), timeout=WAIT), "on_reclaim.sh did not run"
    assert live(jobs[kept].id), cluster.client.job(jobs[kept].id)
    end = str(int((first_day + DAY).timestamp()))
    assert _markers(server) == {kept: [f"{end} {team_user}"]}
    assert wait_until(lambda: not live(jobs[kept].id), timeout=WAIT), cluster.client.job(jobs[kept].id)
    assert _markers(server) == {kept: [f"{end} {team_user}"]}
    assert f"on_reclaim: saving state before {end}" in _lifecycle_log(server, team, kept)
    assert not any("on_reclaim" in line for line in _lifecycle_log(server, team, dropped))
