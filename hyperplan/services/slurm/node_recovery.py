"""HyperPod's automatic node recovery for the cluster nodes of plans (each pass of
slurm_reservations): a node on a Slurm node its plan's reservation replaced, or failed on one still
unhealthy, is replaced by a new instance (on-demand nodes: slurm_on_demand).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.status import NodeStatus
from hyperplan.services.clusters import cluster_nodes, cluster_reconcile
from hyperplan.services.clusters.cluster_nodes import NodeActions, retire
from hyperplan.services.clusters.cluster_records import LIVE
from hyperplan.services.clusters.cluster_request import ClusterSettings
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.slurm import slurm_on_demand
from hyperplan.services.slurm.reservation_notes import Note
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingPlan


def recover_cluster_nodes(
    runtime: ServiceContext, replaced: Sequence[Note], unhealthy: Mapping[str, str]
) -> None:
    """HyperPod's automatic node recovery, for nodes on plans:

    - a cluster node on a Slurm node that its plan's reservation replaced is shut down (its instance
      ends, Terminated), and its group, now a node short, gets a new instance at once, which Slurm starts
      on the reservation's replacement node;
    - a cluster node that has failed (its Slurm job ended: NODE_FAIL when its node stopped answering) on a
      Slurm node that is still unhealthy, which no free node could replace, is replaced too: the new
      instance is Pending in the reservation until a node of it is healthy again.

    A cluster created with ``NodeRecovery=None`` keeps its node as it is (failed, when Slurm ended its
    job)."""
    if not replaced and not unhealthy:
        return
    with runtime.db.read() as session:  # most passes find none: no write then
        if not replaced and not _failed_on(session, unhealthy):
            return
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        found = [
            (node, note.failed_node, note.why, "on the reservation's replacement node")
            for note in replaced
            for node in _live_plan_nodes(session, note.plan_id)
            if slurm_on_demand.slurm_node_of(node) == note.failed_node
        ]
        found += [
            (node, host, unhealthy[host], "in the reservation, Pending until a node of it is healthy")
            for node, host in _failed_on(session, unhealthy)
            if all(node.id != seen.id for seen, *_ in found)
        ]
        plans = set()
        for node, host, why, where_new in found:
            cluster = session.get(Cluster, node.cluster_id)
            group = session.get(InstanceGroup, node.group_id)
            plan_id = node.plan_id  # the plan it runs on: its group's primary or a further one
            if cluster is None or group is None or plan_id is None:
                continue
            if not ClusterSettings.from_json(cluster.settings).recovers_nodes:
                continue
            message = f"Automatic node recovery: Slurm node {host} is {why}; "
            retire(session, node, actions, now, message + "this instance is replaced by a new one.")
            plans.add(plan_id)
            plan = session.get(TrainingPlan, plan_id)
            if plan is not None:
                message = (
                    f"Cluster node {node.instance_id} (group {group.name}) was on Slurm node {host}, "
                    f"{why}: automatic node recovery terminates it and starts a new one {where_new}."
                )
                lifecycle.record(session, plan, "cluster-node-recovered", message, now)
        for plan_id in sorted(plans):
            cluster_reconcile.reconcile_plan(session, runtime, plan_id, now)
        after_commit(session, lambda: cluster_nodes.run_actions(runtime, actions))


def _live_plan_nodes(session: Session, plan_id: int | None) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .where(ClusterNode.plan_id == plan_id, ClusterNode.status.in_(LIVE))
            .order_by(ClusterNode.id)
        )
    )


def _failed_on(session: Session, unhealthy: Mapping[str, str]) -> list[tuple[ClusterNode, str]]:
    """Failed cluster nodes of plans on an unhealthy Slurm node, with that node's name."""
    if not unhealthy:
        return []
    failed = session.scalars(
        select(ClusterNode)
        .where(ClusterNode.plan_id.is_not(None), ClusterNode.status == NodeStatus.FAILURE)
        .order_by(ClusterNode.id)
    )
    return [(node, host) for node in failed if (host := slurm_on_demand.slurm_node_of(node)) in unhealthy]
