"""A cluster's rows: the cluster found by name or ARN, its groups and each group's plans (the primary,
then the further ones in the order added), its nodes (live ones hold a place in their group), the running
count, and the consumer name a group claims a plan's instances under."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.status import NodeStatus
from hyperplan.errors import ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, InstanceGroupPlan

LIVE = (NodeStatus.PENDING, NodeStatus.RUNNING, NodeStatus.FAILURE)  # nodes that hold a place in their group


GONE = NodeStatus.TERMINATED


def get(session: Session, runtime: ServiceContext, caller: Caller, name_or_arn: str) -> Cluster:
    prefix = runtime.arn(caller.account_id, "cluster/")
    column = Cluster.cluster_id if name_or_arn.startswith(prefix) else Cluster.name
    cluster = session.scalar(
        select(Cluster).where(
            Cluster.account_id == caller.account_id, column == name_or_arn.removeprefix(prefix)
        )
    )
    if cluster is None:
        raise ResourceNotFound(f"Cluster {name_or_arn} does not exist.")
    return cluster


def groups_of(session: Session, cluster: Cluster) -> list[InstanceGroup]:
    return list(
        session.scalars(
            select(InstanceGroup).where(InstanceGroup.cluster_id == cluster.id).order_by(InstanceGroup.id)
        )
    )


def group_named(session: Session, cluster: Cluster, name: str) -> InstanceGroup:
    group = session.scalar(
        select(InstanceGroup).where(InstanceGroup.cluster_id == cluster.id, InstanceGroup.name == name)
    )
    if group is None:
        raise ResourceNotFound(f"Cluster {cluster.name} has no instance group {name}.")
    return group


def further_plans(session: Session, group_ids: Sequence[int]) -> dict[int, list[InstanceGroupPlan]]:
    """Each group's further plans, in the order they were added (groups without any are absent)."""
    found: dict[int, list[InstanceGroupPlan]] = {}
    if not group_ids:
        return found
    rows = session.scalars(
        select(InstanceGroupPlan)
        .where(InstanceGroupPlan.group_id.in_(list(group_ids)))
        .order_by(InstanceGroupPlan.id)
    )
    for row in rows:
        found.setdefault(row.group_id, []).append(row)
    return found


def forget_further_plans(session: Session, group_ids: Sequence[int]) -> None:
    """A group gone, or made on-demand, keeps no further plan."""
    if group_ids:
        session.query(InstanceGroupPlan).filter(InstanceGroupPlan.group_id.in_(list(group_ids))).delete()


def nodes_of(session: Session, cluster: Cluster) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .where(ClusterNode.cluster_id == cluster.id, ClusterNode.status != GONE)
            .order_by(ClusterNode.id)
        )
    )


def running_count(session: Session, group: InstanceGroup) -> int:
    return int(
        session.scalar(
            select(func.count(ClusterNode.id)).where(
                ClusterNode.group_id == group.id, ClusterNode.status == NodeStatus.RUNNING
            )
        )
        or 0
    )


def list_clusters(session: Session, account_id: str) -> list[Cluster]:
    return list(session.scalars(select(Cluster).where(Cluster.account_id == account_id).order_by(Cluster.id)))


def cluster_arn(runtime: ServiceContext, cluster: Cluster) -> str:
    return runtime.arn(cluster.account_id, f"cluster/{cluster.cluster_id}")


def live_nodes(session: Session, group: InstanceGroup) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .where(ClusterNode.group_id == group.id, ClusterNode.status.in_(LIVE))
            .order_by(ClusterNode.id)
        )
    )


def consumer(group: InstanceGroup) -> str:
    return f"cluster-group:{group.id}"
