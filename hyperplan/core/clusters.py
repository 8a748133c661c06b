"""The rules of HyperPod instance groups on training plans, as pure functions.

A group runs on plans or on on-demand capacity, never both. A plan may back a group only when it is
the caller's, its target is hyperpod-cluster, it is Scheduled or Active, its instance type is the
group's, and the group's subnets (when it has any) include the plan's zone. While a segment is open the
plan's capacity goes to its groups in the order they were created, each up to its target; from the
reclaim time to the next segment, none. A group with further plans beside its primary one takes from
each in turn (core/group_plans.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from hyperplan.core.lifecycle import PlanStatus
from hyperplan.errors import ValidationError

TARGET = "hyperpod-cluster"


@dataclass(frozen=True)
class PlanFacts:
    """What the binding rules need to know of a plan."""

    arn: str
    target: str
    status: str
    instance_type: str
    zones: frozenset[str]


@dataclass(frozen=True)
class GroupFacts:
    where: str  # the group's path on the wire, e.g. "InstanceGroups[1]"
    name: str
    instance_type: str
    subnet_zones: frozenset[str]  # zones of the group's subnets (override, else the cluster's); empty: any
    unknown_subnets: tuple[str, ...] = ()
    capacity_requirements: bool = False


def check_subnets(group: GroupFacts) -> None:
    if group.unknown_subnets:
        raise ValidationError(
            f"{group.where}: subnet(s) {', '.join(group.unknown_subnets)} are in no zone of this fleet."
        )


def check_lifecycle_script(where: str, on_create: str | None) -> None:
    """OnCreate names a script inside the group's lifecycle source (copied to the node); a path that
    leaves it (absolute, or through '..') would run a file of the server's instead."""
    if on_create is None:
        return
    path = PurePosixPath(on_create)
    if not on_create.strip() or path.is_absolute() or ".." in path.parts or "\0" in on_create:
        raise ValidationError(
            f"{where}.LifeCycleConfig.OnCreate: {on_create!r} must be a path inside the lifecycle "
            "source (SourceS3Uri), such as on_create.sh or scripts/on_create.sh."
        )


def check_binding(group: GroupFacts, plan: PlanFacts | None, plan_arn: str, field: str | None = None) -> None:
    """Refuse, naming the rule, a plan that may not back this group. `plan` is None when the caller has
    no plan by that ARN (absent, or another account's: the same answer either way). `field` names what
    gave the plan (default: the group's TrainingPlanArn)."""
    field = field or f"{group.where}.TrainingPlanArn"
    if group.capacity_requirements:
        raise ValidationError(
            f"{field}: a group runs on a training plan or on on-demand capacity, never both; "
            "remove CapacityRequirements or the TrainingPlanArn."
        )
    if plan is None:
        raise ValidationError(f"{field}: this account has no training plan {plan_arn}.")
    if plan.target != TARGET:
        raise ValidationError(
            f"{field}: plan {plan.arn} serves {plan.target}; instance groups need a plan for {TARGET}."
        )
    if PlanStatus(plan.status) not in (PlanStatus.SCHEDULED, PlanStatus.ACTIVE):
        raise ValidationError(f"{field}: plan {plan.arn} is {plan.status}; it must be Scheduled or Active.")
    if plan.instance_type != group.instance_type:
        raise ValidationError(
            f"{field}: plan {plan.arn} reserves {plan.instance_type}, but group {group.name} is "
            f"{group.instance_type}."
        )
    if group.subnet_zones and not plan.zones & group.subnet_zones:
        raise ValidationError(
            f"{field}: plan {plan.arn} is in {', '.join(sorted(plan.zones))}, but the group's subnets are in "
            f"{', '.join(sorted(group.subnet_zones))}; add a subnet of the plan's zone to VpcConfig or the "
            "group's OverrideVpcConfig."
        )


def allocate(targets: Sequence[tuple[int, int]], capacity: int) -> dict[int, int]:
    """Share `capacity` among groups given as (group id, target) in creation order: each takes up to its
    target from what the earlier ones left."""
    shares: dict[int, int] = {}
    left = capacity
    for group_id, target in targets:
        shares[group_id] = min(max(target, 0), left)
        left -= shares[group_id]
    return shares
