"""An instance group fed by two plans on the local back end (issue 48): what tests/server/test_group_plans.py
shows over the fake back end, with real node agents and lifecycle scripts. Plan A's nodes are the same
nodes, with the same processes, before and after plan B joins the group, and at A's reclaim time B's nodes
stay up without a new lifecycle run while A's are taken back and their processes end.

One real server under the manual clock; DescribeCluster is checked against botocore's model at each step
(tests.harness)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends import procfs
from tests.harness import Server, boundary_after, service_now, wait_until
from tests.server.test_clusters import SMALL_FLEET, SUBNETS, _group

VPC = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS}
ZONE = "us-west-2a"  # the small fleet's zone of 8 p5 instances, where both plans are bought


def _on_create(runs: Path) -> str:
    """A lifecycle script that says each run in `runs` (one line per run, whichever node) and leaves a
    daemon running on the node, as a HyperPod lifecycle script starts its cluster's daemons; the
    daemon's pid goes to the node's home."""
    return (
        "#!/bin/sh\n"
        f'echo "$HYPERPLAN_INSTANCE_ID" >> {runs}\n'
        "sleep 3600 </dev/null >/dev/null 2>&1 &\n"
        'echo $! > "$HOME/daemon.pid"\n'
    )


@pytest.fixture
def server(server_factory: type[Server], tmp_path: Path) -> Server:
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"  # where _group looks
    script.parent.mkdir(parents=True)
    script.write_text(_on_create(tmp_path / "lifecycle-runs.txt"))
    return server.start()


@dataclass(frozen=True)
class Proc:
    """A process by pid and start time (a later process given the same pid is another one)."""

    pid: int
    starttime: int

    @property
    def alive(self) -> bool:
        stat = procfs.read_stat(self.pid)
        return stat is not None and stat.starttime == self.starttime and not stat.is_zombie


def _proc(pid: int) -> Proc:
    stat = procfs.read_stat(pid)
    assert stat is not None, f"process {pid} is not running"
    return Proc(pid, stat.starttime)


def _processes(server: Server, instance_id: str) -> tuple[Proc, Proc]:
    """A node's agent and the daemon its lifecycle script left running."""
    node = server.work_dir / "backend" / "nodes" / f"node-{instance_id}"
    agent = json.loads((node / "agent.json").read_text())
    return _proc(int(agent["pid"])), _proc(int((node / "home" / "daemon.pid").read_text()))


def _buy(server: Server, name: str, count: int, start: datetime, days: int) -> str:
    """A hyperpod-cluster plan of `count` p5 instances for `days` days from `start`, in ZONE: its ARN."""
    client = server.sagemaker()
    offerings = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge",
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=days),
    )["TrainingPlanOfferings"]
    [offering, *_] = [
        o for o in offerings if {r["AvailabilityZone"] for r in o["ReservedCapacityOfferings"]} == {ZONE}
    ]
    created = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return str(created["TrainingPlanArn"])


def _described(server: Server) -> tuple[int, int, str, str]:
    """DescribeCluster's only group (boto3, checked against the model): current and target count, and
    the plan it shows with its status."""
    [group] = server.sagemaker().describe_cluster(ClusterName="c")["InstanceGroups"]
    return group["CurrentCount"], group["TargetCount"], group["TrainingPlanArn"], group["TrainingPlanStatus"]


def _running(server: Server) -> set[str]:
    nodes = server.sagemaker().list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
    return {n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}


def _statuses(server: Server) -> dict[str, Any]:
    """Every listed node's status, for the messages of failed waits."""
    nodes = server.sagemaker().list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
    return {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in nodes}


def test_nodes_keep_their_processes_when_a_second_plan_joins_and_when_the_first_is_reclaimed(
    server: Server, tmp_path: Path
) -> None:
    runs = tmp_path / "lifecycle-runs.txt"
    lifecycle_runs = lambda: runs.read_text().split() if runs.exists() else []  # noqa: E731
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    plan_a = _buy(server, "plan-a", 2, start, 2)
    plan_b = _buy(server, "plan-b", 2, start, 4)  # overlaps A and outlives it
    client = server.sagemaker()
    client.create_cluster(ClusterName="c", InstanceGroups=[_group("workers", 2, plan_a)], VpcConfig=VPC)
    server.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: len(_running(server)) == 2), _statuses(server)
    on_a = _running(server)
    processes_a = {i: _processes(server, i) for i in on_a}
    assert sorted(lifecycle_runs()) == sorted(on_a)
    assert _described(server) == (2, 2, plan_a, "Active")

    client.update_cluster(ClusterName="c", InstanceGroups=[_group("workers", 4, plan_a)])
    assert _described(server) == (2, 4, plan_a, "Active")  # A alone gives 2
    added = json.loads(server.cli("clusters", "plans", "add", "c", "workers", "plan-b", "--json").stdout)
    assert [(p["TrainingPlanName"], p["Primary"]) for p in added["Plans"]] == [
        ("plan-a", True),
        ("plan-b", False),
    ]
    assert wait_until(lambda: len(_running(server)) == 4), _statuses(server)
    assert _running(server) >= on_a  # A's nodes are the same instances...
    assert {i: _processes(server, i) for i in on_a} == processes_a  # ...with the same processes
    assert all(p.alive for pair in processes_a.values() for p in pair)
    on_b = _running(server) - on_a
    assert len(lifecycle_runs()) == 4 and set(lifecycle_runs()) == on_a | on_b  # one run per node, 4 in all
    processes_b = {i: _processes(server, i) for i in on_b}
    assert _described(server) == (4, 4, plan_a, "Active")
    listed = server.native().get("/api/v1/clusters/c/instance-groups/workers/plans")
    assert [(p["TrainingPlanName"], p["CapacityNow"], p["Serving"]) for p in listed["Plans"]] == [
        ("plan-a", 2, 2),
        ("plan-b", 2, 2),
    ]

    server.set_clock(start + timedelta(days=2, minutes=-30))  # A's reclaim time: A serves no more
    assert wait_until(lambda: _running(server) == on_b), _statuses(server)
    gone = [p for pair in processes_a.values() for p in pair]
    assert wait_until(lambda: not [p for p in gone if p.alive]), [p for p in gone if p.alive]
    assert _running(server) == on_b  # B's nodes stayed up...
    assert {i: _processes(server, i) for i in on_b} == processes_b  # ...the same processes...
    assert all(p.alive for pair in processes_b.values() for p in pair)
    assert len(lifecycle_runs()) == 4  # ...and no new lifecycle run
    assert _described(server) == (2, 4, plan_b, "Active")  # B serves the group now
