"""Each group's live nodes brought to what it should have now: its target on on-demand capacity, or its
shares of its plans' open segments (none from a segment's reclaim time on), claimed through
``capacity_claims``; nodes to add, carry over to another plan or remove are recorded in the caller's
transaction.

Plan groups of one account may share plans, so they are reconciled together: one allocation over all
the plan groups of the account's in-service clusters (group_capacity.py, core/group_plans.py), whichever
group or plan changed. Each node runs on one of its group's plans (``ClusterNode.plan_id``); when its
plan's share shrinks and another plan has room, it moves there, the same node with no new lifecycle run
(on Slurm, where a node is a job inside its plan's reservation, it is replaced instead)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.group_plans import LiveNode, attribute
from hyperplan.core.status import ClusterStatus, NodeStatus
from hyperplan.services.clusters import group_capacity, metering
from hyperplan.services.clusters.cluster_nodes import NodeActions, new_node, run_actions, shut_down
from hyperplan.services.clusters.cluster_records import consumer, live_nodes
from hyperplan.services.clusters.cluster_request import InstanceGroupSpec
from hyperplan.services.plans import capacity_claims
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.drain_state import DrainState
from hyperplan.store.db import after_commit
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, ReservedCapacity, TrainingPlan


def reconcile(
    session: Session,
    runtime: ServiceContext,
    groups: Iterable[InstanceGroup],
    now: datetime,
    actions: NodeActions,
) -> None:
    """Bring each on-demand group to its target, and every plan group of the accounts of the plan groups
    given (each account's in one allocation) to its shares, which it claims."""
    given = list(groups)
    drained = drain_state.current(session)
    for group in given:
        if group.plan_id is None:
            _converge_on_demand(session, runtime, group, drained, now, actions)
    on_plans = [group for group in given if group.plan_id is not None]
    accounts = group_capacity.accounts_of(session, on_plans)
    _reconcile_plan_groups(session, runtime, accounts, on_plans, drained, now, actions)


def reconcile_plan(session: Session, runtime: ServiceContext, plan_id: int, now: datetime) -> None:
    """A plan changed (segment start, reclaim, end, failure): every group that has it, as primary or
    further plan, follows at once, with the other plan groups of its account."""
    accounts = group_capacity.accounts_using(session, plan_id)
    if not accounts:
        return
    actions = NodeActions()
    _reconcile_plan_groups(session, runtime, accounts, [], drain_state.current(session), now, actions)
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


def _reconcile_plan_groups(
    session: Session,
    runtime: ServiceContext,
    accounts: Collection[str],
    also: Sequence[InstanceGroup],
    drained: DrainState,
    now: datetime,
    actions: NodeActions,
) -> None:
    """The accounts' plan groups of in-service clusters brought to their shares, and `also` (plan groups
    of clusters no longer in service) to none; then each group's claims follow what it holds of each
    plan."""
    groups = group_capacity.plan_groups(session, accounts)
    known = {group.id for group in groups}
    groups += [group for group in also if group.id not in known]
    in_service = [g for g in groups if g.id in known]
    allocation = group_capacity.shares(session, runtime, in_service, now)
    if not drained.draining:
        group_capacity.take_back_lent(session, runtime, allocation, in_service, now)
    holds: dict[int, dict[int, int]] = {}
    for group in groups:
        shares = allocation.get(group.id, {})
        if drained.stop_running:  # running work was stopped: no node is kept
            shares = dict.fromkeys(shares, 0)
        holds[group.id] = _converge_plan_group(
            session, runtime, group, shares, not drained.draining, now, actions
        )
    _follow_claims(session, groups, holds, now)


def _follow_claims(
    session: Session, groups: Sequence[InstanceGroup], holds: Mapping[int, Mapping[int, int]], now: datetime
) -> None:
    """The plans' counters follow what each group holds: a claim that changed is given back and taken
    anew (every one given back before any is taken, so that a group's growth never waits on another's
    shrinking); one that did not is left as it is."""
    claimed = group_capacity.claims_of(session, groups)
    changed = [
        (group, plan_id, count)
        for group in groups
        for plan_id, count in {**dict.fromkeys(claimed.get(group.id, {}), 0), **holds[group.id]}.items()
        if claimed.get(group.id, {}).get(plan_id, 0) != count
    ]
    for group, plan_id, _ in changed:
        capacity_claims.give_back(session, consumer(group), now, plan_id=plan_id)
    for group, plan_id, count in changed:
        plan = session.get(TrainingPlan, plan_id)
        if plan is not None and count:
            capacity_claims.take(session, plan, consumer(group), count, now)


def _converge_plan_group(
    session: Session,
    runtime: ServiceContext,
    group: InstanceGroup,
    shares: Mapping[int, int],
    starts_new: bool,
    now: datetime,
    actions: NodeActions,
) -> dict[int, int]:
    """The group's live nodes attributed to its plans' shares (core/group_plans.attribute): kept, carried
    over, shut down, and new ones started unless `starts_new` is False (a drained fleet starts nothing).
    Returns how many nodes each plan holds then."""
    nodes = {node.id: node for node in live_nodes(session, group)}
    facts = [LiveNode(n.id, n.plan_id, n.status == NodeStatus.RUNNING) for n in nodes.values()]
    # On Slurm a node is a batch job inside its plan's reservation: it cannot change reservation.
    plan = attribute(facts, shares, can_move=runtime.slurm is None)
    expiry = _Expiries(session, now)
    for node_id in plan.shut_down:
        node = nodes[node_id]
        # A reclaim when its plan can hold nothing now (reclaim time, end, plan no longer Active);
        # a node let go while its plan still has capacity (a scale-down, a drain) is not one.
        plan_now = session.get(TrainingPlan, node.plan_id) if node.plan_id is not None else None
        reclaim = plan_now is not None and group_capacity.usable(session, runtime, plan_now, now) == 0
        shut_down(session, node, actions, now, expiry.of(node.plan_id), reclaim=reclaim)
    for node_id, plan_id in plan.move:
        _carry_over(session, nodes[node_id], plan_id, now)
    held = plan.held(facts)
    if not starts_new:
        return held
    spec = InstanceGroupSpec.from_json(group.spec)
    for plan_id in plan.add:
        node = new_node(session, group, runtime.region, now, plan_id=plan_id)
        actions.provision.append((node, spec, expiry.of(plan_id)))
        held[plan_id] = held.get(plan_id, 0) + 1
    return held


def _carry_over(session: Session, node: ClusterNode, plan_id: int, now: datetime) -> None:
    """The node runs on another plan of its group from now on: the same node, process and home."""
    node.plan_id = plan_id
    if not node.on_plan:  # an on-demand node of a group since given a plan: no hour charged from now on
        node.on_plan = True
        metering.stop(session, metering.node_holder(node), now)


def _converge_on_demand(
    session: Session,
    runtime: ServiceContext,
    group: InstanceGroup,
    drained: DrainState,
    now: datetime,
    actions: NodeActions,
) -> None:
    nodes = live_nodes(session, group)
    for node in nodes:  # a plan group made on-demand: its nodes hold none of its former plans
        node.plan_id = None
    wanted = group.target_count
    if drained.draining:  # no node added (scale-ups wait); none kept when running work was stopped
        wanted = 0 if drained.stop_running else min(wanted, len(nodes))
    # Failed and still-pending nodes go first, then the newest.
    nodes.sort(key=lambda n: (n.status == NodeStatus.RUNNING, -n.id))
    surplus = max(len(nodes) - wanted, 0)
    for node in nodes[:surplus]:
        shut_down(session, node, actions, now)
    for node in nodes[surplus:]:
        if node.on_plan:  # kept from the plans it ran on: on-demand capacity, charged from now on
            node.on_plan = False
            _meter(session, runtime, group, node, now)
    spec = InstanceGroupSpec.from_json(group.spec)
    for _ in range(wanted - len(nodes)):
        node = new_node(session, group, runtime.region, now)
        _meter(session, runtime, group, node, now)
        actions.provision.append((node, spec, "0"))


class _Expiries:
    """Each plan's open segment's end (epoch seconds, as SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_
    TIMESTAMP says it), "0" for none; each looked up once."""

    def __init__(self, session: Session, now: datetime) -> None:
        self.session = session
        self.now = now
        self.known: dict[int | None, str] = {None: "0"}

    def of(self, plan_id: int | None) -> str:
        if plan_id not in self.known:
            segment = self.session.scalar(
                select(ReservedCapacity).where(
                    ReservedCapacity.plan_id == plan_id,
                    ReservedCapacity.start <= self.now,
                    ReservedCapacity.end > self.now,
                )
            )
            self.known[plan_id] = str(int(segment.end.timestamp())) if segment else "0"
        return self.known[plan_id]


def _meter(
    session: Session, runtime: ServiceContext, group: InstanceGroup, node: ClusterNode, now: datetime
) -> None:
    """An on-demand node is metered from its launch until it is Terminated (services/clusters/metering.py)."""
    cluster = session.get(Cluster, group.cluster_id)
    assert cluster is not None
    pool = metering.pool_of(runtime, group.instance_type, node.availability_zone)
    name = f"node {node.instance_id} (cluster {cluster.name}, group {group.name})"
    metering.start(session, cluster.account_id, metering.node_holder(node), name, pool, 1, now)
