"""Automatic node recovery on the local back end (issue 47): a node whose agent is killed is terminated and
charged no more, and its group gets a new node that runs the lifecycle scripts again; with
NodeRecovery=None the node stays failed, uncharged from its failure on.

One real server, real node agents killed with SIGKILL; service time moves only by the manual clock."""

from __future__ import annotations

import json
import os
import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.harness import ADMIN, Server, service_now, wait_until
from tests.server.test_clusters import SMALL_FLEET, SUBNETS, _buy, _counts, _group, put_lifecycle_script

M5 = "ml.m5.12xlarge"  # the small fleet's on-demand pool: 4 instances at 2.50 an hour
SAID = "the node agent died (killed by SIGKILL, signal 9) and said nothing"


@pytest.fixture
def small(server_factory: type[Server], tmp_path: Path) -> Server:
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    put_lifecycle_script(server)
    return server.start()


def _nodes(server: Server, cluster: str) -> dict[str, dict[str, Any]]:
    """The cluster's listed nodes by instance id, each with its group and status."""
    summaries = server.sagemaker().list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    return {n["InstanceId"]: n for n in summaries}


def _by_group(nodes: dict[str, dict[str, Any]]) -> dict[str, tuple[str, str]]:
    return {n["InstanceGroupName"]: (i, n["InstanceStatus"]["Status"]) for i, n in nodes.items()}


def _kill_agent(server: Server, instance_id: str) -> None:
    record = server.work_dir / "backend" / "nodes" / f"node-{instance_id}" / "agent.json"
    os.kill(json.loads(record.read_text())["pid"], signal.SIGKILL)


def _node_lines(server: Server, instance_id: str) -> list[tuple[datetime, str]]:
    """The account's on-demand ledger lines for one node: when each hour started, and which hour."""
    entries = server.native().get("/api/v1/accounts/admin/ledger")["Entries"]
    return [
        (datetime.fromisoformat(e["At"]), e["Description"].split(", ")[-2])
        for e in entries
        if f"node {instance_id} " in e["Description"]
    ]


def test_a_killed_node_agent_is_replaced_and_charged_no_more_unless_node_recovery_is_none(
    small: Server,
) -> None:
    client = small.sagemaker()
    plan = _buy(small, ADMIN, "steady", 1, 1)
    client.create_cluster(
        ClusterName="recovering",
        InstanceGroups=[_group("controller", 1, instance_type=M5), _group("workers", 1, plan)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    )
    client.create_cluster(
        ClusterName="kept", InstanceGroups=[_group("controller", 1, instance_type=M5)], NodeRecovery="None"
    )
    small.set_clock(
        client.describe_training_plan(TrainingPlanName="steady")["StartTime"] + timedelta(minutes=1)
    )
    running = {"controller": "Running", "workers": "Running"}
    assert wait_until(
        lambda: {g: s for g, (_, s) in _by_group(_nodes(small, "recovering")).items()} == running
    ), _nodes(small, "recovering")
    assert wait_until(lambda: _by_group(_nodes(small, "kept"))["controller"][1] == "Running")
    old = {g: i for g, (i, _) in _by_group(_nodes(small, "recovering")).items()}
    [kept] = _nodes(small, "kept")

    failed_at = service_now(small)
    for instance_id in (*old.values(), kept):
        _kill_agent(small, instance_id)

    # Each group of the recovering cluster runs a new node in place of its failed one, which is gone.
    def replaced() -> dict[str, dict[str, Any]]:
        nodes = _nodes(small, "recovering")
        fresh = {n["InstanceGroupName"]: n for i, n in nodes.items() if i not in old.values()}
        done = len(nodes) == 2 and all(n["InstanceStatus"]["Status"] == "Running" for n in fresh.values())
        return fresh if done and set(fresh) == {"controller", "workers"} else {}

    fresh = wait_until(replaced)
    assert fresh, _nodes(small, "recovering")
    assert _counts(small, "recovering") == {"controller": (1, 1), "workers": (1, 1)}
    for group, node in fresh.items():
        assert node["InstanceStatus"]["Message"] == f"It replaces {old[group]}: {SAID}."
        with pytest.raises(ClientError) as gone:
            client.describe_cluster_node(ClusterName="recovering", NodeId=old[group])
        assert gone.value.response["Error"]["Code"] == "ResourceNotFound"
    # The new nodes ran the lifecycle scripts again.
    created = small.cli(
        "clusters",
        "exec",
        "recovering",
        fresh["controller"]["InstanceId"],
        "--",
        "cat",
        "lifecycle/created.txt",
    )
    assert created.stdout.startswith("created on") and created.stdout.strip().endswith("until 0")
    worker_home = small.work_dir / "backend" / "nodes" / f"node-{fresh['workers']['InstanceId']}" / "home"
    assert (worker_home / "lifecycle" / "created.txt").read_text().startswith("created on")

    # What happened is recorded: the plan's history for its group, the audit trail for the on-demand one.
    history = small.native().get("/api/v1/plans/steady/events")["Events"]
    [recovered] = [e["Message"] for e in history if e["Kind"] == "cluster-node-recovered"]
    assert recovered == (
        f"Cluster node {old['workers']} (cluster recovering, group workers) failed: {SAID}. "
        f"Automatic node recovery terminates it and starts {fresh['workers']['InstanceId']} in its place."
    )
    audit = small.native().get("/api/v1/audit")["Events"]
    [event] = [e for e in audit if e["Action"] == "cluster-node.recovered"]
    assert (event["Target"], event["Detail"]) == (
        old["controller"],
        {"Cluster": "recovering", "Group": "controller", "Reason": SAID,
         "ReplacedBy": fresh["controller"]["InstanceId"]},
    )  # fmt: skip

    # NodeRecovery=None: the node stays as it failed, saying why, and nothing replaces it.
    [(instance_id, node)] = _nodes(small, "kept").items()
    assert (instance_id, node["InstanceStatus"]["Status"]) == (kept, "Failure")
    assert node["InstanceStatus"]["Message"] == (
        f"{SAID}. The cluster's NodeRecovery is None: the node is kept as it is, not replaced."
    )
    assert _counts(small, "kept") == {"controller": (0, 1)}

    # Three service hours on: no failed node is charged an hour that starts after its failure, while
    # the new on-demand node is charged from its start.
    small.advance_clock("3h")
    for failed in (old["controller"], kept):
        lines = _node_lines(small, failed)
        assert lines and all(at <= failed_at for at, _ in lines), lines
        assert [hour for _, hour in lines] == [f"hour {n}" for n in range(1, len(lines) + 1)]
    assert [hour for _, hour in _node_lines(small, fresh["controller"]["InstanceId"])] == [
        "hour 1",
        "hour 2",
        "hour 3",
        "hour 4",
    ]
    # The failed controller's instance is back in the on-demand pool: two of its four are free.
    client.create_cluster(ClusterName="more", InstanceGroups=[_group("controller", 2, instance_type=M5)])
