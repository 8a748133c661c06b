"""An instance group's plans: its primary plan (the wire's TrainingPlanArn, which CreateCluster and
UpdateCluster set) and its further plans, listed, added and removed here (the native API, the CLI and
the console). A group may run up to its target across all of them (docs/DECISIONS.md, "Consumers").

Adding or removing a plan is one transaction: the change, its audit record and the reconciliation of
the account's plan groups (nodes added, carried over to another plan, or taken back at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.clusters import GroupFacts
from hyperplan.core.group_plans import check_further_plan
from hyperplan.core.status import ClusterStatus, NodeStatus
from hyperplan.errors import Conflict, ResourceNotFound, ValidationError
from hyperplan.services.accounts import audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_groups, cluster_records, group_capacity
from hyperplan.services.clusters.cluster_nodes import NodeActions, run_actions
from hyperplan.services.clusters.cluster_reconcile import reconcile
from hyperplan.services.plans import plans
from hyperplan.services.runtime import drain_state
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.db import after_commit
from hyperplan.store.schema import (
    Cluster,
    ClusterNode,
    InstanceGroup,
    InstanceGroupPlan,
    TrainingPlan,
)


@dataclass(frozen=True)
class GroupPlanView:
    """One plan of a group: `active_now` when it may serve now (Active, a segment open, before that
    segment's reclaim time); `capacity_now` its instances the group holds now (its share); `serving`
    the group's Running nodes on it."""

    arn: str
    name: str
    primary: bool
    status: str
    active_now: bool
    capacity_now: int
    serving: int


@dataclass(frozen=True)
class GroupPlansView:
    cluster_name: str
    group_name: str
    instance_type: str
    target_count: int
    running_count: int
    plans: tuple[GroupPlanView, ...]  # the primary first, then the further plans in the order added


def list_plans(runtime: ServiceContext, caller: Caller, cluster: str, group: str) -> GroupPlansView:
    with runtime.db.read() as session:
        found = cluster_records.get(session, runtime, caller, cluster)
        return _view(session, runtime, found, cluster_records.group_named(session, found, group))


def add_plan(runtime: ServiceContext, caller: Caller, cluster: str, group: str, plan: str) -> GroupPlansView:
    """Add `plan` (a name or an ARN) to the group's further plans; adding one it has is no change."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        found, target = _group_in_service(session, runtime, caller, cluster, group)
        added = _plan_or_none(session, runtime, caller, plan)
        if not _check(session, runtime, found, target, added, plan):
            assert added is not None  # _check refuses a missing plan
            drain_state.refuse_if_drained(session, f"Adding a plan to group {target.name}")
            session.add(InstanceGroupPlan(group_id=target.id, plan_id=added.id, added_at=now))
            _changed(session, runtime, caller, "cluster-group.plan-add", found, target, added, now)
        return _view(session, runtime, found, target)


def remove_plan(
    runtime: ServiceContext, caller: Caller, cluster: str, group: str, plan: str
) -> GroupPlansView:
    """Remove one of the group's further plans (its nodes on it carry over to the others' room, or go);
    the primary plan is changed with UpdateCluster, never removed here."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        found, target = _group_in_service(session, runtime, caller, cluster, group)
        removed = plans.get(session, runtime, caller, plan)
        if removed.id == target.plan_id:
            raise _primary_refusal(runtime, target, removed)
        row = session.scalar(
            select(InstanceGroupPlan).where(
                InstanceGroupPlan.group_id == target.id, InstanceGroupPlan.plan_id == removed.id
            )
        )
        if row is None:
            raise ResourceNotFound(f"Group {target.name} of cluster {found.name} has no plan {plan}.")
        session.delete(row)
        _changed(session, runtime, caller, "cluster-group.plan-remove", found, target, removed, now)
        return _view(session, runtime, found, target)


def _group_in_service(
    session: Session, runtime: ServiceContext, caller: Caller, cluster: str, group: str
) -> tuple[Cluster, InstanceGroup]:
    found = cluster_records.get(session, runtime, caller, cluster)
    _check_in_service(found)
    return found, cluster_records.group_named(session, found, group)


def _changed(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    action: str,
    cluster: Cluster,
    group: InstanceGroup,
    plan: TrainingPlan,
    now: datetime,
) -> None:
    """A group's plans changed in this transaction: audited, and its nodes follow at once (added,
    carried over or taken back), the back end told after the commit."""
    session.flush()
    _audit(session, caller, action, cluster, group, plan, now)
    actions = NodeActions()
    reconcile(session, runtime, [group], now, actions)
    after_commit(session, lambda: run_actions(runtime, actions))


def plan_views(
    session: Session, runtime: ServiceContext, group: InstanceGroup, now: datetime
) -> tuple[GroupPlanView, ...]:
    """The group's plans, the primary first, then the further ones as added (none on demand)."""
    if group.plan_id is None:
        return ()
    plan_ids = group_capacity.plan_order(session, [group])[group.id]
    held = group_capacity.claims_of(session, [group]).get(group.id, {})
    serving = _serving(session, group)
    views = []
    for plan_id in plan_ids:
        plan = session.get(TrainingPlan, plan_id)
        assert plan is not None
        views.append(
            GroupPlanView(
                arn=plans.plan_arn(runtime, plan),
                name=plan.name,
                primary=plan_id == group.plan_id,
                status=plan.status,
                active_now=group_capacity.usable(session, runtime, plan, now) > 0,
                capacity_now=held.get(plan_id, 0),
                serving=serving.get(plan_id, 0),
            )
        )
    return tuple(views)


def _view(
    session: Session, runtime: ServiceContext, cluster: Cluster, group: InstanceGroup
) -> GroupPlansView:
    return GroupPlansView(
        cluster_name=cluster.name,
        group_name=group.name,
        instance_type=group.instance_type,
        target_count=group.target_count,
        running_count=cluster_records.running_count(session, group),
        plans=plan_views(session, runtime, group, runtime.clock.now()),
    )


def _serving(session: Session, group: InstanceGroup) -> dict[int, int]:
    """The group's Running nodes on each plan."""
    rows = session.execute(
        select(ClusterNode.plan_id, func.count(ClusterNode.id))
        .where(ClusterNode.group_id == group.id, ClusterNode.status == NodeStatus.RUNNING)
        .group_by(ClusterNode.plan_id)
    )
    return {plan_id: int(count) for plan_id, count in rows if plan_id is not None}


def _plan_or_none(session: Session, runtime: ServiceContext, caller: Caller, ref: str) -> TrainingPlan | None:
    try:
        return plans.get(session, runtime, caller, ref)
    except ResourceNotFound:
        return None  # absent, or another account's: refused as the binding rules refuse it


def _check(
    session: Session,
    runtime: ServiceContext,
    cluster: Cluster,
    group: InstanceGroup,
    plan: TrainingPlan | None,
    ref: str,
) -> bool:
    """Refuse a plan the group may not take as a further plan; True when it has it already."""
    primary = session.get(TrainingPlan, group.plan_id) if group.plan_id is not None else None
    further = cluster_records.further_plans(session, [group.id]).get(group.id, [])
    further_arns = []
    for row in further:
        other = session.get(TrainingPlan, row.plan_id)
        if other is not None:
            further_arns.append(plans.plan_arn(runtime, other))
    return check_further_plan(
        GroupFacts(f"group {group.name}", group.name, group.instance_type, frozenset()),
        group.availability_zone,
        plans.plan_arn(runtime, primary) if primary is not None else None,
        further_arns,
        cluster_groups._plan_facts(session, runtime, plan) if plan is not None else None,
        ref,
        field=f"Cluster {cluster.name}, group {group.name}",
    )


def _primary_refusal(runtime: ServiceContext, group: InstanceGroup, plan: TrainingPlan) -> ValidationError:
    return ValidationError(
        f"Plan {plans.plan_arn(runtime, plan)} is the primary plan of group {group.name} (its "
        "TrainingPlanArn): change it with UpdateCluster, or make the group on-demand there; it cannot be "
        "removed here."
    )


def _check_in_service(cluster: Cluster) -> None:
    if cluster.status != ClusterStatus.IN_SERVICE:
        raise Conflict(f"Cluster {cluster.name} is {cluster.status}; its groups' plans cannot change now.")


def _audit(
    session: Session,
    caller: Caller,
    action: str,
    cluster: Cluster,
    group: InstanceGroup,
    plan: TrainingPlan,
    now: datetime,
) -> None:
    # As a job's further plans are audited: the consumer is the target, the plan in the detail.
    detail = {"Group": group.name, "Plan": plan.name}
    audit.record(
        session, now, caller, action, account_id=cluster.account_id, target=cluster.name, detail=detail
    )
