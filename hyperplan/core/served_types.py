"""Which instance types this fleet serves, and the refusals that say so.

AWS's lists of instance types (hundreds for training jobs and HyperPod clusters, eleven for training
plans) say nothing about a fleet: it has a handful of types, some only on demand (pools with
``reservable = 0``). A refusal of a type therefore names the type asked for and lists this fleet's own
types that would do instead: those plans can reserve, or those with on-demand instances (where a
cluster's subnets put it, for an instance group).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from hyperplan.core.fleet import Fleet, Pool
from hyperplan.errors import ValidationError


def on_demand_types(fleet: Fleet, zones: Collection[str] | None = None) -> tuple[str, ...]:
    """Types with instances plans never hold, in ``zones`` (None: in any zone), sorted."""
    return tuple(
        sorted(
            {
                pool.instance_type
                for pool in fleet.pools
                if pool.on_demand > 0 and (zones is None or pool.availability_zone in zones)
            }
        )
    )


def check_reservable(fleet: Fleet, instance_type: str, where: str = "InstanceType") -> None:
    """Refuse a type no plan can reserve: one this fleet lacks, or one it has on demand only."""
    pools = fleet.pools_of_type(instance_type)
    if any(pool.reservable > 0 for pool in pools):
        return
    if pools:
        raise ValidationError(
            f"{where}: {instance_type} is on-demand only here (for clusters' on-demand instance groups "
            f"and training jobs without a plan), so no plan can reserve it. {_plans_reserve(fleet)}."
        )
    raise ValidationError(f"{where}: this fleet has no {instance_type}. {_plans_reserve(fleet)}.")


def refuse_unknown_for_job(fleet: Fleet, instance_type: str, where: str) -> ValidationError:
    """The refusal of a training job without a plan asking for a type this fleet lacks."""
    return ValidationError(
        f"{where}: this fleet has no {instance_type}. A training job without a TrainingPlanArn runs on "
        f"{_on_demand(on_demand_types(fleet))}; {_plans_reserve(fleet, lower=True)}."
    )


def refuse_absent_for_group(
    fleet: Fleet, instance_type: str, zones: Collection[str], where: str
) -> ValidationError:
    """The refusal of an instance group without a plan asking for a type this fleet lacks where the
    group's subnets are: in ``zones`` (empty: anywhere)."""
    usable = _on_demand(on_demand_types(fleet, zones or None))
    if not zones:
        return ValidationError(
            f"{where}: this fleet has no {instance_type}. An instance group without a TrainingPlanArn "
            f"runs on {usable}; {_plans_reserve(fleet, lower=True)}."
        )
    named = ", ".join(sorted(zones))
    subnets = f"{named}, the {'zone' if len(zones) == 1 else 'zones'} of the group's subnets"
    elsewhere = fleet.pools_of_type(instance_type)
    if elsewhere:
        return ValidationError(
            f"{where}: this fleet has no {instance_type} in {subnets}; {_where_it_is(elsewhere)}. In "
            f"{named} an instance group without a TrainingPlanArn runs on {usable}."
        )
    return ValidationError(
        f"{where}: this fleet has no {instance_type}. In {subnets}, an instance group without a "
        f"TrainingPlanArn runs on {usable}; {_plans_reserve(fleet, lower=True)}."
    )


def _where_it_is(pools: Sequence[Pool]) -> str:
    """Where the fleet has a type a group's subnets do not reach, and how a group would use it there."""
    kind = pools[0].instance_type
    on_demand = sorted(pool.availability_zone for pool in pools if pool.on_demand > 0)
    if on_demand:
        return (
            f"it has {kind} on demand in {', '.join(on_demand)} (give the group a subnet there in "
            "OverrideVpcConfig)"
        )
    zones = ", ".join(sorted(pool.availability_zone for pool in pools))
    return (
        f"it has {kind} in {zones} for training plans only (a group on such a plan names its "
        "TrainingPlanArn and a subnet of the plan's zone)"
    )


def _on_demand(types: Sequence[str]) -> str:
    if not types:
        return "on-demand instances, of which there are none"
    return f"on-demand instances of {_one_of(types)}"


def _plans_reserve(fleet: Fleet, lower: bool = False) -> str:
    types = fleet.reservable_types()
    said = f"Training plans here reserve {_one_of(types)}" if types else "No plan can reserve any type here"
    return said[0].lower() + said[1:] if lower else said


def _one_of(types: Sequence[str]) -> str:
    if len(types) == 1:
        return types[0]
    return f"{', '.join(types[:-1])} or {types[-1]}"
