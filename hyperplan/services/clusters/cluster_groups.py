"""Instance groups added, changed and removed, each placed once every rule allows it: on its training
plan (the binding rules of ``core/clusters.py``) or on the on-demand pool of its type with the most free
instances among its zones."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core import served_types
from hyperplan.core.clusters import GroupFacts, PlanFacts, check_binding, check_subnets
from hyperplan.core.fleet import Pool
from hyperplan.errors import ResourceLimitExceeded, ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import metering
from hyperplan.services.clusters.cluster_nodes import NodeActions, shut_down
from hyperplan.services.clusters.cluster_records import (
    consumer,
    forget_further_plans,
    further_plans,
    live_nodes,
)
from hyperplan.services.clusters.cluster_request import ClusterSettings, InstanceGroupSpec
from hyperplan.services.plans import capacity_claims, lifecycle, on_demand, quotas
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Cluster, InstanceGroup, TrainingPlan


def add_group(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    spec: InstanceGroupSpec,
    where: str,
    now: datetime,
) -> InstanceGroup:
    plan, zone = _placement(session, runtime, caller, cluster, spec, where, group=None)
    group = InstanceGroup(
        cluster_id=cluster.id,
        name=spec.name,
        instance_type=spec.instance_type,
        target_count=spec.instance_count,
        plan_id=plan.id if plan else None,
        availability_zone=zone,
        spec=spec.to_json(),
        created_at=now,
    )
    session.add(group)
    session.flush()
    return group


def change_group(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    group: InstanceGroup,
    spec: InstanceGroupSpec,
    where: str,
) -> None:
    if spec.instance_type and spec.instance_type != group.instance_type:
        raise ValidationError(
            f"{where}.InstanceType: group {group.name} is {group.instance_type}; a group's instance type "
            "cannot change (delete the group and add a new one)."
        )
    plan, zone = _placement(session, runtime, caller, cluster, spec, where, group=group)
    _keep_further_plans(session, runtime, group, plan, zone, where)
    if (plan.id if plan else None) != group.plan_id:
        capacity_claims.give_back(session, consumer(group), runtime.clock.now())
    group.plan_id = plan.id if plan else None
    group.availability_zone = zone
    group.target_count = spec.instance_count
    group.spec = spec.to_json()


def _keep_further_plans(
    session: Session,
    runtime: ServiceContext,
    group: InstanceGroup,
    primary: TrainingPlan | None,
    zone: str,
    where: str,
) -> None:
    """A group's further plans under its new primary plan: none on demand; the new primary no longer a
    further plan too; refused, naming them, when they are in another zone than the new primary's."""
    further = further_plans(session, [group.id]).get(group.id, [])
    if primary is None:
        forget_further_plans(session, [group.id])
        return
    elsewhere = []
    for row in further:
        plan = session.get(TrainingPlan, row.plan_id)
        if row.plan_id == primary.id:
            session.delete(row)
        elif plan is not None and _plan_zone(session, plan) != zone:
            elsewhere.append(runtime.arn(plan.account_id, f"training-plan/{plan.name}"))
    if elsewhere:
        raise ValidationError(
            f"{where}.TrainingPlanArn: plan {primary.name} is in {zone}, but group {group.name}'s "
            f"further plan(s) {', '.join(elsewhere)} are in {group.availability_zone}; a group's plans "
            "must all be in its zone (remove them first: hyperplan clusters plans remove)."
        )


def remove_group(session: Session, group: InstanceGroup, actions: NodeActions, now: datetime) -> None:
    capacity_claims.give_back(session, consumer(group), now)
    forget_further_plans(session, [group.id])
    group.target_count = 0
    for node in live_nodes(session, group):
        shut_down(session, node, actions, now)


def _placement(
    session: Session,
    runtime: ServiceContext,
    caller: Caller,
    cluster: Cluster,
    spec: InstanceGroupSpec,
    where: str,
    group: InstanceGroup | None,
) -> tuple[TrainingPlan | None, str]:
    """The plan (or none) and the zone of a group, once every rule allows it."""
    if spec.instance_type is None:
        raise ValidationError(
            f"{where}.InstanceType is required: this deployment does not serve InstanceRequirements."
        )
    facts = _group_facts(runtime, cluster, spec, where)
    check_subnets(facts)
    arn = spec.plan_arn
    if arn:
        plan = _plan_by_arn(session, runtime, caller, arn)
        check_binding(facts, _plan_facts(session, runtime, plan) if plan else None, arn)
        assert plan is not None
        return plan, _plan_zone(session, plan)
    return None, _on_demand_zone(session, runtime, cluster, facts, spec.instance_count, group)


def _group_facts(
    runtime: ServiceContext, cluster: Cluster, spec: InstanceGroupSpec, where: str
) -> GroupFacts:
    subnets = spec.override_subnets
    if subnets is None:
        subnets = ClusterSettings.from_json(cluster.settings).subnets
    zones = {s: runtime.fleet.zone_of_subnet(s) for s in subnets}
    return GroupFacts(
        where=where,
        name=spec.name,
        instance_type=spec.instance_type or "",  # checked by the caller
        subnet_zones=frozenset(z.name for z in zones.values() if z is not None),
        unknown_subnets=tuple(s for s, z in zones.items() if z is None),
        capacity_requirements=spec.capacity_requirements,
    )


def _plan_by_arn(session: Session, runtime: ServiceContext, caller: Caller, arn: str) -> TrainingPlan | None:
    prefix = runtime.arn(caller.account_id, "training-plan/")
    if not arn.startswith(prefix):
        return None
    return session.scalar(
        select(TrainingPlan).where(
            TrainingPlan.account_id == caller.account_id, TrainingPlan.name == arn.removeprefix(prefix)
        )
    )


def _plan_facts(session: Session, runtime: ServiceContext, plan: TrainingPlan) -> PlanFacts:
    zones = frozenset(rc.availability_zone for rc in lifecycle.segments_of(session, plan.id))
    return PlanFacts(
        runtime.arn(plan.account_id, f"training-plan/{plan.name}"),
        plan.target,
        plan.status,
        plan.instance_type,
        zones,
    )


def _plan_zone(session: Session, plan: TrainingPlan) -> str:
    return lifecycle.segments_of(session, plan.id)[0].availability_zone


def _on_demand_zone(
    session: Session,
    runtime: ServiceContext,
    cluster: Cluster,
    facts: GroupFacts,
    count: int,
    group: InstanceGroup | None,
) -> str:
    """The pool with the most free on-demand instances among the group's zones; refused when short, and
    when the account's on-demand quota, or its budget for the nodes it adds, does not allow it (a group
    that does not grow is never refused for either)."""
    pools = [
        p
        for p in runtime.fleet.pools_of_type(facts.instance_type)
        if not facts.subnet_zones or p.availability_zone in facts.subnet_zones
    ]
    if not pools:
        raise served_types.refuse_absent_for_group(
            runtime.fleet, facts.instance_type, facts.subnet_zones, f"{facts.where}.InstanceType"
        )
    on_demand_group = group if group is not None and group.plan_id is None else None
    kept = len(live_nodes(session, on_demand_group)) if on_demand_group is not None else 0
    holds = max(on_demand_group.target_count, kept) if on_demand_group is not None else 0
    if count > holds:  # a group that does not grow passes, even if its quota was lowered since
        group_id = group.id if group is not None else None
        quotas.check_on_demand(session, runtime, cluster.account_id, facts.instance_type, count, group_id)
    free = {p.availability_zone: _on_demand_free(session, p, group) for p in pools}
    best = max(pools, key=lambda p: (free[p.availability_zone], p.availability_zone))
    if count > free[best.availability_zone]:
        described = ", ".join(f"{z}: {n} free" for z, n in sorted(free.items()))
        raise ResourceLimitExceeded(
            f"{facts.where}: group {facts.name} asks for {count} on-demand {facts.instance_type}, but the "
            f"pools it may use have {described} (on-demand: the instances the fleet keeps out of plans). "
            "Buy a training plan, or ask for fewer."
        )
    metering.check_budget(session, cluster.account_id, best, count - kept, facts.where)
    return best.availability_zone


def _on_demand_free(session: Session, pool: Pool, group: InstanceGroup | None) -> int:
    # Shared with training jobs without a plan: both use the pool's on-demand instances.
    return on_demand.free(session, pool, exclude_group=group.id if group is not None else None)
