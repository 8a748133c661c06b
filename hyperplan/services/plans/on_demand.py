"""On-demand capacity: the instances of a pool that plans may not reserve, shared by every consumer.

Cluster groups without a plan and training jobs without a plan both use them, so both count here, in
the caller's transaction: a group holds its target from the request on and each of its nodes until it
is Terminated, a job from the moment it is given its instances until its processes have ended.
``held_by_account`` counts one account's use of a type for its quota (services/plans/quotas.py).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, func, select, true
from sqlalchemy.orm import Session

from hyperplan.core.fleet import Pool
from hyperplan.core.jobs import HOLDING
from hyperplan.core.status import ClusterStatus, NodeStatus
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingJob

NODE_GONE = NodeStatus.TERMINATED


def used_by_groups(session: Session, pool: Pool, exclude_group: int | None = None) -> int:
    """On-demand instances of `pool` held by cluster groups: each counts the larger of its target and
    its nodes not yet Terminated, as for the quota (``held_by_account``). A group's target holds its
    place from the request on: its nodes are launched afterwards, and two requests (or two groups of
    one request) that each saw only nodes could together take more than the pool has."""
    return _held_by_groups(
        session,
        exclude_group,
        InstanceGroup.instance_type == pool.instance_type,
        node_filter=ClusterNode.availability_zone == pool.availability_zone,
        group_filter=InstanceGroup.availability_zone == pool.availability_zone,
    )


def _held_by_groups(
    session: Session,
    exclude_group: int | None,
    *where: ColumnElement[bool],
    node_filter: ColumnElement[bool],
    group_filter: ColumnElement[bool],
) -> int:
    """The sum over on-demand groups matching `where` of the larger of their target (clusters in
    service) and their nodes not yet Terminated; `node_filter` and `group_filter` narrow each side."""
    nodes: dict[int, int] = dict(
        session.execute(
            select(ClusterNode.group_id, func.count(ClusterNode.id))
            .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
            .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
            .where(ClusterNode.on_plan.is_(False), ClusterNode.status != NODE_GONE, node_filter, *where)
            .group_by(ClusterNode.group_id)
        ).all()
    )
    targets: dict[int, int] = dict(
        session.execute(
            select(InstanceGroup.id, InstanceGroup.target_count)
            .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
            .where(
                Cluster.status == ClusterStatus.IN_SERVICE,
                InstanceGroup.plan_id.is_(None),
                group_filter,
                *where,
            )
        ).all()
    )
    return sum(
        max(targets.get(group, 0), nodes.get(group, 0))
        for group in nodes.keys() | targets.keys()
        if group != exclude_group  # a group's own count is what it asks for anew
    )


def used_by_jobs(session: Session, pool: Pool) -> int:
    query = select(func.coalesce(func.sum(TrainingJob.instance_count), 0)).where(
        TrainingJob.plan_id.is_(None),
        TrainingJob.lent_plan_id.is_(None),  # a spot job on a plan's lent instances holds none of these
        TrainingJob.attempt_state.in_(HOLDING),
        TrainingJob.availability_zone == pool.availability_zone,
        TrainingJob.instance_type == pool.instance_type,
    )
    return int(session.scalar(query) or 0)


def free(session: Session, pool: Pool, exclude_group: int | None = None) -> int:
    """On-demand instances of `pool` nobody holds now (a group's own excluded, when named)."""
    return pool.on_demand - used_by_groups(session, pool, exclude_group) - used_by_jobs(session, pool)


def held_by_account(
    session: Session, account_id: str, instance_type: str, exclude_group: int | None = None
) -> int:
    """On-demand instances of a type the account holds now, in every zone: each on-demand group of its
    clusters counts the larger of its target and its nodes not yet Terminated (a group added in the same
    request has no node yet; a shrinking one still has nodes shutting down), and each job without a plan
    its instances while it holds them. A group named by ``exclude_group`` is left out."""
    groups = _held_by_groups(
        session,
        exclude_group,
        Cluster.account_id == account_id,
        InstanceGroup.instance_type == instance_type,
        node_filter=true(),
        group_filter=true(),
    )
    jobs = session.scalar(
        select(func.coalesce(func.sum(TrainingJob.instance_count), 0)).where(
            TrainingJob.account_id == account_id,
            TrainingJob.plan_id.is_(None),
            TrainingJob.lent_plan_id.is_(None),
            TrainingJob.attempt_state.in_(HOLDING),
            TrainingJob.instance_type == instance_type,
        )
    )
    return groups + int(jobs or 0)
