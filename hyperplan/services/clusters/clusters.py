"""HyperPod-style clusters: instance groups on training plans or on on-demand capacity, and their nodes.

This module holds CreateCluster, UpdateCluster, DeleteCluster and BatchDeleteClusterNodes. The rest is in
``cluster_records`` (finding and listing the rows), ``cluster_groups`` (a group placed on a plan or on
on-demand capacity), ``group_plans`` (a group's further plans, added and removed), ``group_capacity``
(what plan groups may hold now), ``cluster_reconcile`` (nodes brought to what each group should have),
``cluster_nodes`` (a node's moves and the back end's part, after the commit) and ``cluster_exec``.

Every change to a cluster (create, update, delete, node deletion, a group's plans) and every event of a
plan that backs groups (segment start, reclaim, end, failure) ends in `cluster_reconcile`: it computes
how many nodes each affected group should have now (its target for on-demand groups; for plan groups,
their creation-order shares of their plans' open segments, none from a segment's reclaim time on) and
records the nodes to add, carry over to another plan or remove, in the caller's transaction. What the
execution back end must do about them runs after the commit (`cluster_nodes.NodeActions`), so the store
always knows a node before the back end acts on it. The node watcher (``services/clusters/
node_watcher.py``) brings back-end states (OnCreate done or failed, shutdown finished) into the store.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.bucket_rights import Right
from hyperplan.core.clusters import check_lifecycle_script
from hyperplan.core.status import CLUSTER_LIFECYCLE, ClusterStatus, NodeStatus
from hyperplan.errors import Conflict, ResourceInUse, ValidationError
from hyperplan.objects.uris import StorageError, parse_s3_uri
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters.cluster_groups import add_group, change_group, remove_group
from hyperplan.services.clusters.cluster_nodes import NodeActions, run_actions, shut_down
from hyperplan.services.clusters.cluster_reconcile import reconcile
from hyperplan.services.clusters.cluster_records import GONE, cluster_arn, get, groups_of
from hyperplan.services.clusters.cluster_request import ClusterSpec, ClusterUpdate, InstanceGroupSpec
from hyperplan.services.runtime import drain_state, status
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup


def create(runtime: ServiceContext, caller: Caller, request: ClusterSpec) -> str:
    """CreateCluster; returns the new cluster's ARN."""
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        drain_state.refuse_if_drained(session, "CreateCluster")
        name = request.name
        if session.scalar(
            select(Cluster.id).where(Cluster.account_id == caller.account_id, Cluster.name == name)
        ):
            raise ResourceInUse(f"A cluster named {name!r} already exists in this account.")
        cluster = Cluster(
            account_id=caller.account_id,
            name=name,
            cluster_id=_new_cluster_id(session),
            status=ClusterStatus.IN_SERVICE,
            settings=request.settings.to_json(),
            created_at=now,
        )
        session.add(cluster)
        session.flush()
        groups = request.groups
        if not groups:
            raise ValidationError("InstanceGroups: a cluster needs at least one instance group.")
        _check_unique_names(groups, "InstanceGroups")
        _check_lifecycle_scripts(groups, "InstanceGroups")
        for index, spec in enumerate(groups):
            add_group(session, runtime, caller, cluster, spec, f"InstanceGroups[{index}]", now)
        bucket_rights.require(session, runtime, caller, cluster_uses(groups))
        session.flush()
        reconcile(session, runtime, groups_of(session, cluster), now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))
    return cluster_arn(runtime, cluster)


def update(runtime: ServiceContext, caller: Caller, request: ClusterUpdate) -> str:
    """Change the groups it lists, delete InstanceGroupsToDelete, leave the others as they are; returns the
    cluster's ARN."""
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, request.name)
        _check_in_service(cluster)
        specs = request.groups
        _check_unique_names(specs, "InstanceGroups")
        _check_lifecycle_scripts(specs, "InstanceGroups")
        doomed = set(request.groups_to_delete)
        existing = {g.name: g for g in groups_of(session, cluster)}
        for name in doomed:
            if name not in existing:
                raise ValidationError(
                    f"InstanceGroupsToDelete: cluster {cluster.name} has no group {name!r}."
                )
            if any(spec.name == name for spec in specs):
                raise ValidationError(f"InstanceGroups: group {name!r} is also in InstanceGroupsToDelete.")
        touched = []
        for index, spec in enumerate(specs):
            where = f"InstanceGroups[{index}]"
            group = existing.get(spec.name)
            if group is None or spec.instance_count > group.target_count:
                drain_state.refuse_if_drained(session, f"UpdateCluster growing or adding group {spec.name}")
            if group is None:
                touched.append(add_group(session, runtime, caller, cluster, spec, where, now))
            else:
                change_group(session, runtime, caller, cluster, group, spec, where)
                touched.append(group)
        bucket_rights.require(session, runtime, caller, cluster_uses(specs))
        for name in doomed:
            remove_group(session, existing[name], actions, now)
        session.flush()
        reconcile(session, runtime, groups_of(session, cluster), now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))
    return cluster_arn(runtime, cluster)


def delete(runtime: ServiceContext, caller: Caller, name: str) -> str:
    """DeleteCluster: every node shuts down, the cluster goes once the last is gone; returns its ARN."""
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, name)
        if cluster.status == ClusterStatus.DELETING:
            raise Conflict(f"Cluster {cluster.name} is already being deleted.")
        status.change(session, CLUSTER_LIFECYCLE, cluster, ClusterStatus.DELETING, now, "DeleteCluster.")
        for group in groups_of(session, cluster):
            remove_group(session, group, actions, now)
        after_commit(session, lambda: run_actions(runtime, actions))
    runtime.wakes.nodes.notify()
    return cluster_arn(runtime, cluster)


def delete_nodes(
    runtime: ServiceContext, caller: Caller, name: str, instance_ids: Iterable[str]
) -> tuple[list[str], list[tuple[str, str, str]]]:
    """BatchDeleteClusterNodes: each node goes, and its group's target drops by one (so it stays gone)."""
    now = runtime.clock.now()
    actions = NodeActions()
    done: list[str] = []
    failed: list[tuple[str, str, str]] = []
    with runtime.db.write() as session:
        cluster = get(session, runtime, caller, name)
        _check_in_service(cluster)
        for instance_id in instance_ids:
            node = session.scalar(
                select(ClusterNode).where(
                    ClusterNode.cluster_id == cluster.id, ClusterNode.instance_id == instance_id
                )
            )
            if node is None or node.status == GONE:
                failed.append(
                    (instance_id, "NodeIdNotFound", f"Cluster {cluster.name} has no node {instance_id}.")
                )
                continue
            if node.status == NodeStatus.SHUTTING_DOWN:
                failed.append(
                    (instance_id, "InvalidNodeStatus", f"Node {instance_id} is already shutting down.")
                )
                continue
            group = session.get(InstanceGroup, node.group_id)
            assert group is not None
            group.target_count = max(group.target_count - 1, 0)
            shut_down(session, node, actions, now)
            done.append(instance_id)
        session.flush()
        reconcile(session, runtime, groups_of(session, cluster), now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))
    return done, failed


def cluster_uses(
    groups: Sequence[InstanceGroupSpec], where: str = "InstanceGroups"
) -> list[bucket_rights.Use]:
    """The lifecycle-script sources of a CreateCluster or UpdateCluster request's groups: read."""
    uses: list[bucket_rights.Use] = []
    for index, group in enumerate(groups):
        source = group.lifecycle.source_uri
        if source:
            uses.append((f"{where}[{index}].LifeCycleConfig.SourceS3Uri", source, Right.READ))
    return uses


def _check_in_service(cluster: Cluster) -> None:
    if cluster.status != ClusterStatus.IN_SERVICE:
        raise Conflict(f"Cluster {cluster.name} is {cluster.status}; it cannot be changed now.")


def _check_lifecycle_scripts(specs: Sequence[InstanceGroupSpec], where: str) -> None:
    for index, spec in enumerate(specs):
        check_lifecycle_script(f"{where}[{index}]", spec.lifecycle.on_create)
        if spec.lifecycle.source_uri:
            _check_source_uri(spec.lifecycle.source_uri, f"{where}[{index}].LifeCycleConfig.SourceS3Uri")


def _check_source_uri(uri: str, where: str) -> None:
    """Refused now, naming the URI, rather than when the first node would copy it."""
    try:
        parse_s3_uri(uri)
    except StorageError as exc:
        raise ValidationError(f"{where}: {exc.reason} ({uri}).") from None


def _check_unique_names(specs: Sequence[InstanceGroupSpec], where: str) -> None:
    names = [spec.name for spec in specs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValidationError(f"{where}: group name(s) {', '.join(repeated)} appear more than once.")


def _new_cluster_id(session: Session) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    while True:
        candidate = "".join(secrets.choice(alphabet) for _ in range(12))
        if session.scalar(select(Cluster.id).where(Cluster.cluster_id == candidate)) is None:
            return candidate
