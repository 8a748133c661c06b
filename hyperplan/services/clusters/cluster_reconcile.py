"""Each group's live nodes brought to what it should have now: its target on on-demand capacity, or its
creation-order share of its plan's open segment (none from the reclaim time on), claimed through
``capacity_claims``; nodes to add or remove are recorded in the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.clusters import allocate
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.status import ClusterStatus, NodeStatus
from hyperplan.services.clusters import metering
from hyperplan.services.clusters.cluster_nodes import NodeActions, new_node, run_actions, shut_down
from hyperplan.services.clusters.cluster_records import consumer, live_nodes
from hyperplan.services.clusters.cluster_request import InstanceGroupSpec
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, ReservedCapacity, TrainingPlan


def reconcile(
    session: Session,
    runtime: ServiceContext,
    groups: Iterable[InstanceGroup],
    now: datetime,
    actions: NodeActions,
) -> None:
    """Bring each group's live nodes to what it should have now; plan groups claim their share."""
    shares: dict[int, int] = {}
    drained = drain_state.current(session)
    for group in groups:
        if group.plan_id is None:
            wanted, expiry = group.target_count, "0"
        else:
            if group.id not in shares:
                shares.update(_plan_shares(session, runtime, group.plan_id, now))
            wanted, expiry = shares.get(group.id, 0), _segment_expiry(session, group.plan_id, now)
        if drained.draining:  # no node added (scale-ups wait); none kept when running work was stopped
            held = 0 if drained.stop_running else min(wanted, len(live_nodes(session, group)))
            if group.plan_id is not None and held != wanted:  # the plan's counters follow what it holds
                plan = session.get(TrainingPlan, group.plan_id)
                capacity_claims.give_back(session, consumer(group), now, plan_id=group.plan_id)
                if plan is not None and held:
                    capacity_claims.take(session, plan, consumer(group), held, now)
            wanted = held
        _converge(session, runtime, group, wanted, expiry, now, actions)


def reconcile_plan(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (segment start, reclaim, end, failure): its groups follow, at once."""
    groups = list(
        session.scalars(
            select(InstanceGroup).where(InstanceGroup.plan_id == plan_id).order_by(InstanceGroup.id)
        )
    )
    if not groups:
        return
    actions = NodeActions()
    reconcile(session, runtime, groups, now, actions)
    after_commit(session, lambda: run_actions(runtime, actions))


def reconcile_all(runtime: ServiceContext) -> None:
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        groups = list(
            session.scalars(
                select(InstanceGroup)
                .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
                .where(Cluster.status == ClusterStatus.IN_SERVICE)
                .order_by(InstanceGroup.id)
            )
        )
        reconcile(session, runtime, groups, now, actions)
        after_commit(session, lambda: run_actions(runtime, actions))


def _plan_shares(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> dict[int, int]:
    """Each group's share of the plan's open segment, in creation order; none outside one or from reclaim."""
    plan = session.get(TrainingPlan, plan_id)
    groups = list(
        session.scalars(
            select(InstanceGroup)
            .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
            .where(InstanceGroup.plan_id == plan_id, Cluster.status == ClusterStatus.IN_SERVICE)
            .order_by(InstanceGroup.id)
        )
    )
    segment = capacity_claims.open_segment(session, plan, now) if plan else None
    lead = runtime.fleet.policy.reclaim_lead_for("hyperpod-cluster")
    usable = (
        plan is not None
        and plan.status == PlanStatus.ACTIVE
        and segment is not None
        and now < segment.end - lead
    )
    shares = allocate([(g.id, g.target_count) for g in groups], segment.count if usable and segment else 0)
    for group in groups:  # the plan's counters follow what the groups hold
        capacity_claims.give_back(session, consumer(group), now, plan_id=plan_id)
        if plan is not None and shares[group.id]:
            capacity_claims.take(session, plan, consumer(group), shares[group.id], now)
    return shares


def _segment_expiry(session: Session, plan_id: int, now: datetime) -> str:
    segment = session.scalar(
        select(ReservedCapacity).where(
            ReservedCapacity.plan_id == plan_id, ReservedCapacity.start <= now, ReservedCapacity.end > now
        )
    )
    return str(int(segment.end.timestamp())) if segment else "0"


def _converge(
    session: Session,
    runtime: ServiceContext,
    group: InstanceGroup,
    wanted: int,
    expiry: str,
    now: datetime,
    actions: NodeActions,
) -> None:
    nodes = live_nodes(session, group)
    # Failed and still-pending nodes go first, then the newest.
    nodes.sort(key=lambda n: (n.status == NodeStatus.RUNNING, -n.id))
    for node in nodes[: max(len(nodes) - wanted, 0)]:
        shut_down(session, node, actions, now, expiry)
    spec = InstanceGroupSpec.from_json(group.spec)
    for _ in range(wanted - len(nodes)):
        node = new_node(session, group, runtime.region, now)
        if group.plan_id is None:
            _meter(session, runtime, group, node, now)
        actions.provision.append((node, spec, expiry))


def _meter(
    session: Session, runtime: ServiceContext, group: InstanceGroup, node: ClusterNode, now: datetime
) -> None:
    """An on-demand node is metered from its launch until it is Terminated (services/clusters/metering.py)."""
    cluster = session.get(Cluster, group.cluster_id)
    assert cluster is not None
    pool = metering.pool_of(runtime, group.instance_type, node.availability_zone)
    name = f"node {node.instance_id} (cluster {cluster.name}, group {group.name})"
    metering.start(session, cluster.account_id, metering.node_holder(node), name, pool, 1, now)
