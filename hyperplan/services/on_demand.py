"""On-demand capacity: the instances of a pool that plans may not reserve, shared by every consumer.

Cluster nodes of on-demand groups and instances of training jobs without a plan both use them, so both
count here, in the caller's transaction: a node holds its place until it is Terminated, a job from the
moment it is given its instances until its processes have ended.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.fleet import Pool
from hyperplan.core.status import NodeStatus
from hyperplan.store.schema import ClusterNode, InstanceGroup, TrainingJob

NODE_GONE = NodeStatus.TERMINATED
JOB_HOLDING = ("launching", "running")  # attempt states in which a job's instances are in use


def used_by_nodes(session: Session, pool: Pool, exclude_group: int | None = None) -> int:
    query = (
        select(func.count(ClusterNode.id))
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .where(
            ClusterNode.on_plan.is_(False),
            ClusterNode.status != NODE_GONE,
            ClusterNode.availability_zone == pool.availability_zone,
            InstanceGroup.instance_type == pool.instance_type,
        )
    )
    if exclude_group is not None:
        query = query.where(ClusterNode.group_id != exclude_group)  # a group's own nodes count as its own
    return int(session.scalar(query) or 0)


def used_by_jobs(session: Session, pool: Pool) -> int:
    query = select(func.coalesce(func.sum(TrainingJob.instance_count), 0)).where(
        TrainingJob.plan_id.is_(None),
        TrainingJob.attempt_state.in_(JOB_HOLDING),
        TrainingJob.availability_zone == pool.availability_zone,
        TrainingJob.instance_type == pool.instance_type,
    )
    return int(session.scalar(query) or 0)


def free(session: Session, pool: Pool, exclude_group: int | None = None) -> int:
    """On-demand instances of `pool` nobody uses now (a group's own nodes excluded, when named)."""
    return pool.on_demand - used_by_nodes(session, pool, exclude_group) - used_by_jobs(session, pool)
