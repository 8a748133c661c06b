"""HyperPod's automatic node recovery for a node that died on its own (docs/DECISIONS.md, "Node failure").

The node watcher hands over each node the back end reports dead (``NodeStatus.died``: on the local back
end, its node agent died), once it has recorded the node's Failure, which ends its charge. Unless its
cluster's NodeRecovery is None, the node is retired (shut down, its instance given back) and its group,
a node short, reconciled at once: a new node, a new instance id, runs the lifecycle scripts again.
Retiring and reconciling are the Slurm reconcilers' steps too (services/slurm/node_recovery.py,
slurm_on_demand.py), and the record is theirs: the plan's history (``cluster-node-recovered``) for a
group on a plan, the audit trail (``cluster-node.recovered``) for an on-demand group, here naming the new
node as well. The new node's status message says which node it replaces and why, for as long as it
runs: the failed one is gone from the listings once Terminated.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.core.status import ClusterStatus
from hyperplan.services.clusters import cluster_reconcile
from hyperplan.services.clusters.cluster_nodes import NodeActions, record_on_demand, retire
from hyperplan.services.clusters.cluster_request import ClusterSettings
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingPlan

REPLACES = "It replaces "
"""How a replacement's status message names the node it replaces (kept once it runs: kept_note)."""


def node_died(
    session: Session, runtime: ServiceContext, node: ClusterNode, now: datetime, actions: NodeActions
) -> None:
    """``node`` has just moved to Failure because it died (its message says how): replace it, or keep
    it as it is when its cluster's NodeRecovery is None."""
    cluster = session.get(Cluster, node.cluster_id)
    group = session.get(InstanceGroup, node.group_id)
    if cluster is None or group is None or cluster.status != ClusterStatus.IN_SERVICE:
        return  # a cluster being deleted ends its nodes anyway
    why = node.message.rstrip(". \n")  # each message below ends its own sentence
    if not ClusterSettings.from_json(cluster.settings).recovers_nodes:
        node.message = f"{why}. The cluster's NodeRecovery is None: the node is kept as it is, not replaced."
        return
    retire(session, node, actions, now, f"Automatic node recovery: {why}; this instance is replaced.")
    cluster_reconcile.reconcile(session, runtime, [group], now, actions)
    fresh = [new.instance_id for new, _, _ in actions.provision if new.group_id == group.id]
    for new, _, _ in actions.provision:
        if new.group_id == group.id:
            new.message = f"Provisioning: running the lifecycle scripts. {REPLACES}{node.instance_id}: {why}."
    _record(session, node, group, cluster, why, fresh, now)


def kept_note(message: str) -> str:
    """The part of a node's status message that says which node it replaces, or "" (what a node that
    starts running keeps of its Pending message)."""
    _, found, rest = message.partition(REPLACES)
    return f"{REPLACES}{rest}" if found else ""


def _record(
    session: Session,
    node: ClusterNode,
    group: InstanceGroup,
    cluster: Cluster,
    why: str,
    fresh: list[str],
    now: datetime,
) -> None:
    """The plan's history, or for an on-demand group the audit trail, as the Slurm reconcilers record it."""
    started = (
        f"starts {', '.join(fresh)} in its place" if fresh else "starts no new one now (the fleet is drained)"
    )
    plan_id = node.plan_id if node.plan_id is not None else group.plan_id  # the plan it ran on
    plan = session.get(TrainingPlan, plan_id) if plan_id is not None else None
    if plan is not None:
        message = (
            f"Cluster node {node.instance_id} (cluster {cluster.name}, group {group.name}) failed: {why}. "
            f"Automatic node recovery terminates it and {started}."
        )
        lifecycle.record(session, plan, "cluster-node-recovered", message, now)
        return
    record_on_demand(session, now, node, group, cluster, why, ReplacedBy=", ".join(fresh))
