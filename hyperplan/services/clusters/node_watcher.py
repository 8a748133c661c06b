"""The node watcher: brings the back end's node states into the store, off the request and lifecycle paths.

A node's state changes by itself (an OnCreate script ends, a shutdown finishes, a process dies), and the
back end tells no one: the watcher looks, stores each change that the node's lifecycle allows
(hyperplan/core/status.py), hands a node that died to automatic node recovery (node_recovery.py), and
removes a deleted cluster once its last node is gone.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.backends.base import BackendError, NodeState
from hyperplan.backends.base import NodeStatus as BackendNodeStatus
from hyperplan.core.status import NODE_LIFECYCLE, ClusterStatus, NodeStatus
from hyperplan.services.clusters import cluster_nodes, node_recovery
from hyperplan.services.clusters.cluster_records import GONE, forget_further_plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, EndedNodeUsage, InstanceGroup
from hyperplan.worker import Worker

# Nodes whose back-end state changes by itself soon (an OnCreate running, a shutdown under way).
_SETTLING = (NodeStatus.PENDING, NodeStatus.SHUTTING_DOWN)
SETTLING_POLL = 0.5  # seconds between looks while some node is settling
SAFETY_POLL = 5.0  # seconds between looks otherwise: a running node fails without telling anyone


class NodeWatcher:
    """Brings back-end node states into the store, in real time, off the request and lifecycle paths.

    Woken after a commit that provisions or shuts down nodes. The back end announces nothing, so the
    watcher also looks on its own: every SETTLING_POLL while a node is settling, every SAFETY_POLL
    otherwise (a node's process can die at any time)."""

    def __init__(self, runtime: ServiceContext, poll: float = SAFETY_POLL) -> None:
        self.runtime = runtime
        self.worker = Worker("node-watcher", self._step, poll=poll, wake=runtime.wakes.nodes)

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()

    def wake(self) -> None:
        self.worker.wake()

    def _step(self) -> float | None:
        watch_nodes(self.runtime)
        with self.runtime.db.read() as session:
            settling = session.scalar(
                select(ClusterNode.id).where(ClusterNode.status.in_(_SETTLING)).limit(1)
            )
        return SETTLING_POLL if settling is not None else None


def watch_nodes(runtime: ServiceContext) -> int:
    """One pass: read the back end's state of every node not yet gone; returns how many changed."""
    with runtime.db.read() as session:
        watched = [
            (n.id, n.backend_id, n.status, n.hostname)
            for n in session.scalars(select(ClusterNode).where(ClusterNode.status != GONE))
        ]
    changes = []
    hosts = {}
    for node_id, backend_id, current, hostname in watched:
        try:
            seen = runtime.backend.node_status(backend_id)
        except BackendError:
            continue  # not handed to the back end yet (a provision in flight)
        if seen.host and with_host(hostname, seen.host) != hostname:
            hosts[node_id] = with_host(hostname, seen.host)
        if _store_status(seen.state, NodeStatus(current)) is not None:
            changes.append((node_id, seen))
    if hosts:
        with runtime.db.write() as session:
            for node_id, host in hosts.items():
                node = session.get(ClusterNode, node_id)
                if node is not None:
                    node.hostname = host
    if changes:
        return _apply(runtime, changes)
    _finish_quiet_deletions(runtime)
    return 0


def _finish_quiet_deletions(runtime: ServiceContext) -> None:
    """A cluster deleted with no node (its plans not started yet, say) sees no node change: it is
    removed here, or it would stay Deleting for ever."""
    left = select(ClusterNode.id).where(ClusterNode.cluster_id == Cluster.id, ClusterNode.status != GONE)
    with runtime.db.read() as session:
        done = session.scalar(
            select(Cluster.id).where(Cluster.status == ClusterStatus.DELETING, ~left.exists()).limit(1)
        )
    if done is not None:
        with runtime.db.write() as session:
            _finish_deletions(session)


def with_host(hostname: str, host: str) -> str:
    """The node's private DNS name with the machine it runs on (a Slurm node's name) as its second
    label: ``ip-10-1-2-3.hp-n01.us-west-2.compute.internal``. The model wants PrivateDnsHostname to
    start with an ``ip-A-B-C-D.`` label, which a Slurm node's name rarely is; so it follows that one."""
    label, _, rest = hostname.partition(".")
    if rest.split(".", 1)[0] == host:
        return hostname
    return f"{label}.{host}.{rest}" if rest else f"{label}.{host}"


def _store_status(state: NodeState, current: NodeStatus) -> NodeStatus | None:
    """The status a node moves to when the back end says `state`, or None: no news, or a move its
    lifecycle does not make (once we asked it to stop, only its ending is news)."""
    new = NodeStatus(state.value)
    return new if NODE_LIFECYCLE.allows(current, new) else None


def _apply(runtime: ServiceContext, changes: list[tuple[int, BackendNodeStatus]]) -> int:
    """Store what the back end said, against each node's status now: it may have moved since the look
    (shut down by a request, say), and then the news may be stale. A node that died is handed to
    automatic node recovery in the same transaction (its replacement provisioned after the commit)."""
    now = runtime.clock.now()
    applied = 0
    actions = cluster_nodes.NodeActions()
    with runtime.db.write() as session:
        for node_id, seen in changes:
            node = session.get(ClusterNode, node_id)
            new = _store_status(seen.state, NodeStatus(node.status)) if node is not None else None
            if node is None or new is None:
                continue
            # A replacement keeps saying which node it replaces once it runs.
            default = {NodeStatus.RUNNING: node_recovery.kept_note(node.message), GONE: "Terminated."}
            cluster_nodes.move_node(session, node, new, seen.message or default.get(new, node.message), now)
            if new == GONE:
                node.ended_at = now
            elif new == NodeStatus.FAILURE and seen.died:
                node_recovery.node_died(session, runtime, node, now, actions)
            applied += 1
        _finish_deletions(session)
        after_commit(session, lambda: cluster_nodes.run_actions(runtime, actions))
    return applied


def _finish_deletions(session: Session) -> None:
    """A Deleting cluster whose nodes are all gone is removed."""
    for cluster in session.scalars(select(Cluster).where(Cluster.status == ClusterStatus.DELETING)):
        remaining = session.scalar(
            select(func.count(ClusterNode.id)).where(
                ClusterNode.cluster_id == cluster.id, ClusterNode.status != GONE
            )
        )
        if not remaining:
            _keep_usage(session, cluster)
            session.query(ClusterNode).filter(ClusterNode.cluster_id == cluster.id).delete()
            group_ids = session.scalars(
                select(InstanceGroup.id).where(InstanceGroup.cluster_id == cluster.id)
            )
            forget_further_plans(session, list(group_ids))  # before their groups: they name them
            session.query(InstanceGroup).filter(InstanceGroup.cluster_id == cluster.id).delete()
            session.delete(cluster)


def _keep_usage(session: Session, cluster: Cluster) -> None:
    """What the cluster's nodes held, for the usage report (services/plans/usage.py), before their rows go."""
    rows = session.execute(
        select(ClusterNode, InstanceGroup)
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .where(ClusterNode.cluster_id == cluster.id)
    )
    for node, group in rows:
        session.add(
            EndedNodeUsage(
                account_id=cluster.account_id,
                cluster_id=cluster.cluster_id,
                instance_type=group.instance_type,
                availability_zone=node.availability_zone,
                launched_at=node.launched_at,
                ended_at=node.ended_at or node.launched_at,
                backend_id=node.backend_id,
                on_plan=node.on_plan,
            )
        )
