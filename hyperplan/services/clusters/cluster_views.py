"""Clusters as the handlers show them: each function owns its read transaction and returns frozen views,
so that no handler touches the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.errors import ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_records, group_plans
from hyperplan.services.clusters.cluster_request import ClusterSettings, InstanceGroupSpec
from hyperplan.services.clusters.group_plans import GroupPlanView
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingPlan


@dataclass(frozen=True)
class GroupView:
    name: str
    instance_type: str
    target_count: int
    running_count: int
    spec: InstanceGroupSpec  # as it was given
    plan_arn: str | None  # the primary plan's (the wire's TrainingPlanArn as given)
    plan_status: str | None
    plans: tuple[GroupPlanView, ...] = ()  # the primary first, then the further plans as added

    def plan_shown(self) -> GroupPlanView | None:
        """The plan DescribeCluster shows: the primary, unless it cannot serve now and another of the
        group's plans can (the first such), so that a wire user sees the plan serving the group now."""
        if not self.plans:
            return None
        primary = self.plans[0]
        if primary.active_now:
            return primary
        return next((plan for plan in self.plans if plan.active_now), primary)


@dataclass(frozen=True)
class ClusterView:
    arn: str
    cluster_id: str
    name: str
    status: str
    created_at: datetime
    failure_message: str
    settings: ClusterSettings
    groups: tuple[GroupView, ...]


@dataclass(frozen=True)
class NodeView:
    group_name: str
    group_spec: InstanceGroupSpec
    instance_id: str
    instance_type: str
    launched_at: datetime
    status: str
    message: str
    hostname: str
    availability_zone: str


def describe(runtime: ServiceContext, caller: Caller, name: str) -> ClusterView:
    """The cluster with every group (and the plan that backs it)."""
    with runtime.db.read() as session:
        return _cluster_view(runtime, session, cluster_records.get(session, runtime, caller, name))


def _cluster_view(runtime: ServiceContext, session: Session, cluster: Cluster) -> ClusterView:
    return ClusterView(
        arn=cluster_records.cluster_arn(runtime, cluster),
        cluster_id=cluster.cluster_id,
        name=cluster.name,
        status=cluster.status,
        created_at=cluster.created_at,
        failure_message=cluster.failure_message,
        settings=ClusterSettings.from_json(cluster.settings),
        groups=tuple(_group_view(runtime, session, g) for g in cluster_records.groups_of(session, cluster)),
    )


def list_all(runtime: ServiceContext, caller: Caller) -> list[ClusterView]:
    """Every cluster of the caller's account, oldest first."""
    with runtime.db.read() as session:
        return [
            _cluster_view(runtime, session, cluster)
            for cluster in cluster_records.list_clusters(session, caller.account_id)
        ]


def _group_view(runtime: ServiceContext, session: Session, group: InstanceGroup) -> GroupView:
    plan = session.get(TrainingPlan, group.plan_id) if group.plan_id is not None else None
    return GroupView(
        plans=group_plans.plan_views(session, runtime, group, runtime.clock.now()),
        name=group.name,
        instance_type=group.instance_type,
        target_count=group.target_count,
        running_count=cluster_records.running_count(session, group),
        spec=InstanceGroupSpec.from_json(group.spec),
        plan_arn=runtime.arn(plan.account_id, f"training-plan/{plan.name}") if plan else None,
        plan_status=plan.status if plan else None,
    )


def nodes(runtime: ServiceContext, caller: Caller, name: str) -> tuple[str, list[NodeView]]:
    """The cluster's id (it scopes paging tokens) and its nodes that are not gone, oldest first."""
    with runtime.db.read() as session:
        cluster = cluster_records.get(session, runtime, caller, name)
        groups = {g.id: g for g in cluster_records.groups_of(session, cluster)}
        specs = {g.id: InstanceGroupSpec.from_json(g.spec) for g in groups.values()}
        return cluster.cluster_id, [
            _node_view(n, groups[n.group_id], specs[n.group_id])
            for n in cluster_records.nodes_of(session, cluster)
        ]


def node(runtime: ServiceContext, caller: Caller, name: str, node_id: str) -> NodeView:
    with runtime.db.read() as session:
        cluster = cluster_records.get(session, runtime, caller, name)
        found = next(
            (n for n in cluster_records.nodes_of(session, cluster) if n.instance_id == node_id), None
        )
        if found is None:
            raise ResourceNotFound(f"Cluster {cluster.name} has no node {node_id}.")
        group = session.get(InstanceGroup, found.group_id)
        assert group is not None
        return _node_view(found, group, InstanceGroupSpec.from_json(group.spec))


def _node_view(node: ClusterNode, group: InstanceGroup, spec: InstanceGroupSpec) -> NodeView:
    return NodeView(
        group_name=group.name,
        group_spec=spec,
        instance_id=node.instance_id,
        instance_type=group.instance_type,
        launched_at=node.launched_at,
        status=node.status,
        message=node.message,
        hostname=node.hostname,
        availability_zone=node.availability_zone,
    )
