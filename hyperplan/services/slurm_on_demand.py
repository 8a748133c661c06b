"""On-demand cluster nodes on a Slurm fleet, looked after by each reservation pass (slurm_reservations).

An on-demand group's nodes run in the partition, outside reservations. Two things end one, and in both
its group gets a new instance at once (a new instance id, as HyperPod does), whose Slurm job Slurm places
on a free node of the pool when there is one (else it waits, Pending, until one frees):

- **Its Slurm node fails** (DOWN, DRAIN, FAIL...: the pass's health rule): automatic node recovery, as
  for nodes on plans, unless the cluster was created with ``NodeRecovery=None``.
- **A plan's reservation takes its Slurm node**: under the wall clock Slurm's ``--time`` would end the
  job before the reservation starts, but under a manual or accelerated clock a reservation is made only
  when its segment starts in service time, so nothing in Slurm protects the plan's capacity. The node is
  ended here (SIGTERM, SIGKILL after the grace, as at reclaim) once the segment has started, or is within
  :data:`LEAD` of starting in real time (wall clock: before ``--time`` fails it). The reservation is made
  once its nodes are free (Slurm refuses a reservation starting now on a busy node; the pass tries
  again each time), and reservations prefer nodes that run no on-demand work.

Each is recorded in the audit trail (``cluster-node.recovered``, by the service itself) and in the node's
status message.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.services import audit, cluster_reconcile
from hyperplan.services.cluster_nodes import SHUTDOWN_GRACE, NodeActions, run_actions, shut_down
from hyperplan.services.cluster_records import LIVE
from hyperplan.services.cluster_request import ClusterSettings
from hyperplan.services.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup

LEAD = timedelta(minutes=2) + SHUTDOWN_GRACE
"""How long before a reservation's real start its nodes' on-demand work is ended (wall clock)."""


def slurm_node_of(node: ClusterNode) -> str:
    """The Slurm node a cluster node runs on: its private DNS name's second label, once placed."""
    labels = node.hostname.split(".")
    return labels[1] if len(labels) > 1 else ""


def police(
    runtime: ServiceContext, unhealthy: Mapping[str, str], taken: Mapping[str, str], pool_nodes: set[str]
) -> None:
    """End and replace the on-demand nodes on a Slurm node that is ``unhealthy`` (name -> Slurm's
    state and reason) or ``taken`` by a reservation (name -> the reservation's name)."""
    if not unhealthy and not taken:
        return
    with runtime.db.read() as session:  # most passes find none: no write then
        if not _ended(session, unhealthy, taken, pool_nodes):
            return
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        groups: dict[int, InstanceGroup] = {}
        for node, group, cluster, why in _ended(session, unhealthy, taken, pool_nodes):
            shut_down(session, node, actions, now)
            node.message = f"{why}; this on-demand instance is replaced by a new one."
            audit.record(
                session,
                now,
                None,
                "cluster-node.recovered",
                account_id=cluster.account_id,
                target=node.instance_id,
                detail={"Cluster": cluster.name, "Group": group.name, "SlurmNode": slurm_node_of(node),
                        "Reason": why},
            )  # fmt: skip
            groups[group.id] = group
        cluster_reconcile.reconcile(session, runtime, groups.values(), now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))


def _ended(
    session: Session, unhealthy: Mapping[str, str], taken: Mapping[str, str], pool_nodes: set[str]
) -> list[tuple[ClusterNode, InstanceGroup, Cluster, str]]:
    """The live on-demand nodes to end, with why."""
    rows = session.execute(
        select(ClusterNode, InstanceGroup, Cluster)
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .join(Cluster, Cluster.id == ClusterNode.cluster_id)
        .where(InstanceGroup.plan_id.is_(None), ClusterNode.status.in_(LIVE))
        .order_by(ClusterNode.id)
    ).all()
    found = []
    for node, group, cluster in rows:
        host = slurm_node_of(node)
        if host not in pool_nodes:
            continue  # not placed yet (its name's second label is the region)
        if host in unhealthy:
            if ClusterSettings.from_json(cluster.settings).as_given.get("NodeRecovery") == "None":
                continue
            found.append((node, group, cluster, f"Slurm node {host} is {unhealthy[host]}"))
        elif host in taken:
            found.append(
                (node, group, cluster, f"Slurm node {host} is taken by the plan reservation {taken[host]}")
            )
    return found
