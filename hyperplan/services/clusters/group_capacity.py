"""What plan groups may hold now: each plan's usable capacity (its open segment's count while the plan is
Active and before the segment's reclaim time, else none) shared among an account's plan groups in one
allocation (core/group_plans.py), since groups of one account may share plans."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import func, select, union
from sqlalchemy.orm import Session

from hyperplan.core import group_plans
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.status import ClusterStatus, NodeStatus
from hyperplan.services.clusters.cluster_records import consumer, further_plans
from hyperplan.services.plans import capacity_claims, loans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import tx_facts
from hyperplan.store.schema import (
    CapacityClaim,
    Cluster,
    ClusterNode,
    InstanceGroup,
    InstanceGroupPlan,
    TrainingPlan,
)

TARGET = "hyperpod-cluster"


def usable(session: Session, runtime: ServiceContext, plan: TrainingPlan | None, now: datetime) -> int:
    """How many of the plan's instances may serve groups now: none outside an open segment, from its
    reclaim time on, or when the plan is not Active."""
    if plan is None or plan.status != PlanStatus.ACTIVE:
        return 0
    segment = capacity_claims.open_segment(session, plan, now)
    if segment is None or now >= segment.end - runtime.fleet.policy.reclaim_lead_for(TARGET):
        return 0
    return segment.count


def plan_groups(session: Session, account_ids: Collection[str]) -> list[InstanceGroup]:
    """The plan groups of the accounts' in-service clusters, in creation order."""
    if not account_ids:
        return []
    return list(
        session.scalars(
            select(InstanceGroup)
            .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
            .where(
                Cluster.account_id.in_(list(account_ids)),
                Cluster.status == ClusterStatus.IN_SERVICE,
                InstanceGroup.plan_id.is_not(None),
            )
            .order_by(InstanceGroup.id)
        )
    )


def accounts_of(session: Session, groups: Sequence[InstanceGroup]) -> set[str]:
    cluster_ids = {group.cluster_id for group in groups}
    if not cluster_ids:
        return set()
    return set(session.scalars(select(Cluster.account_id).where(Cluster.id.in_(cluster_ids))))


def accounts_using(session: Session, plan_id: int) -> set[str]:
    """The accounts with an in-service cluster whose groups have the plan, as primary or further plan."""
    if plan_id not in plans_in_service(session):
        return set()
    further = select(InstanceGroupPlan.group_id).where(InstanceGroupPlan.plan_id == plan_id)
    return set(
        session.scalars(
            select(Cluster.account_id)
            .join(InstanceGroup, InstanceGroup.cluster_id == Cluster.id)
            .where(
                Cluster.status == ClusterStatus.IN_SERVICE,
                InstanceGroup.plan_id.is_not(None),
                (InstanceGroup.plan_id == plan_id) | InstanceGroup.id.in_(further),
            )
        )
    )


_GROUP_TABLES = frozenset({"clusters", "instance_groups", "instance_group_plans"})


def plans_in_service(session: Session) -> frozenset[int]:
    """Every plan an in-service cluster's groups have, as primary or further plan. Read once a
    transaction while it writes no cluster or group (store/tx_facts.py): a lifecycle batch's plan events
    each ask, and nearly always of a plan no cluster uses."""
    return tx_facts.fact(session, "plans of in-service groups", _GROUP_TABLES, _read_plans_in_service)


def _read_plans_in_service(session: Session) -> frozenset[int]:
    groups = (
        select(InstanceGroup.id)
        .join(Cluster, InstanceGroup.cluster_id == Cluster.id)
        .where(Cluster.status == ClusterStatus.IN_SERVICE, InstanceGroup.plan_id.is_not(None))
    )
    primary = select(InstanceGroup.plan_id).where(InstanceGroup.id.in_(groups))
    further = select(InstanceGroupPlan.plan_id).where(InstanceGroupPlan.group_id.in_(groups))
    return frozenset(session.scalars(union(primary, further)))


def claims_of(session: Session, groups: Sequence[InstanceGroup]) -> dict[int, dict[int, int]]:
    """The instances each group's open claims hold of each plan: {group id: {plan id: count}}."""
    consumers = {consumer(group): group.id for group in groups}
    if not consumers:
        return {}
    rows = session.execute(
        select(CapacityClaim.consumer, CapacityClaim.plan_id, func.sum(CapacityClaim.count))
        .where(CapacityClaim.consumer.in_(list(consumers)), CapacityClaim.released_at.is_(None))
        .group_by(CapacityClaim.consumer, CapacityClaim.plan_id)
    )
    held: dict[int, dict[int, int]] = {}
    for name, plan_id, count in rows:
        held.setdefault(consumers[name], {})[plan_id] = int(count or 0)
    return held


def plan_order(session: Session, groups: Sequence[InstanceGroup]) -> dict[int, tuple[int, ...]]:
    """Each plan group's plans in order: its primary, then its further plans as added."""
    further = further_plans(session, [group.id for group in groups])
    order: dict[int, tuple[int, ...]] = {}
    for group in groups:
        assert group.plan_id is not None
        rest = (row.plan_id for row in further.get(group.id, []) if row.plan_id != group.plan_id)
        order[group.id] = (group.plan_id, *rest)
    return order


def shares(
    session: Session,
    runtime: ServiceContext,
    groups: Sequence[InstanceGroup],
    now: datetime,
    with_lent: bool = False,
) -> dict[int, dict[int, int]]:
    """Each group's share of each of its plans now ({group id: {plan id: count}}, in the group's plan
    order); `groups` are plan groups in creation order. Instances a plan lends to managed spot training
    are not the groups' until they are back (`with_lent`: as if they were: what the groups want)."""
    order = plan_order(session, groups)
    plan_ids = {plan_id for plans in order.values() for plan_id in plans}
    capacity = {
        plan_id: usable(session, runtime, session.get(TrainingPlan, plan_id), now)
        - (0 if with_lent else loans.lent(session, plan_id))
        for plan_id in plan_ids
    }
    demands = [group_plans.GroupDemand(g.id, g.target_count, order[g.id]) for g in groups]
    return group_plans.allocate(demands, {plan_id: max(count, 0) for plan_id, count in capacity.items()})


def wanted_of(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> int:
    """How many of the plan's instances its groups would hold now if none were lent."""
    groups = plan_groups(session, accounts_using(session, plan_id))
    allocation = shares(session, runtime, groups, now, with_lent=True)
    return sum(share.get(plan_id, 0) for share in allocation.values())


def nodes_on(session: Session, plan_id: int) -> int:
    """The plan's nodes not yet Terminated: a node shutting down still holds its instance."""
    return int(
        session.scalar(
            select(func.count(ClusterNode.id)).where(
                ClusterNode.plan_id == plan_id, ClusterNode.status != NodeStatus.TERMINATED
            )
        )
        or 0
    )


def take_back_lent(
    session: Session,
    runtime: ServiceContext,
    allocation: dict[int, dict[int, int]],
    groups: Sequence[InstanceGroup],
    now: datetime,
) -> None:
    """Where the groups want more of a plan than its lent instances leave them, those are taken back for
    them (services/jobs/spot.py through ``runtime.reclaim_lent``); the groups grow once they are."""
    lending = {
        plan_id: count
        for plan_id in {p for plans in plan_order(session, groups).values() for p in plans}
        if (count := loans.lent(session, plan_id))
    }
    if not lending:
        return
    wanted = shares(session, runtime, groups, now, with_lent=True)
    for plan_id in lending:
        held = sum(share.get(plan_id, 0) for share in allocation.values())
        needed = sum(share.get(plan_id, 0) for share in wanted.values()) - held
        if needed > 0:
            runtime.reclaim_lent(session, runtime, plan_id, needed, "owner-group", now)
