"""What a training job or an instance group is told when it asks for an instance type this fleet does
not have where it would run: the type it asked for, and this fleet's types it could use instead (never
AWS's whole list)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from hyperplan.core.fleet import Fleet, Pool
from hyperplan.core.served_types import (
    check_reservable,
    on_demand_types,
    refuse_absent_for_group,
    refuse_unknown_for_job,
)
from hyperplan.errors import ValidationError

from .support import fleet as make_fleet

P5, P5E, M5, T3 = "ml.p5.48xlarge", "ml.p5e.48xlarge", "ml.m5.12xlarge", "ml.t3.xlarge"


def pool(kind: str, zone: str, count: int, reservable: int) -> Pool:
    return Pool(kind, f"us-west-2{zone}", count, reservable, Decimal("10.00"), "USD")


# p5: 8 on demand in b only; p5e: plans only, in b; m5: on demand only, in a and b; t3: on demand, in c.
FLEET: Fleet = make_fleet(
    pool(P5, "a", 16, 16),
    pool(P5, "b", 16, 8),
    pool(P5E, "b", 8, 8),
    pool(M5, "a", 4, 0),
    pool(M5, "b", 4, 0),
    pool(T3, "c", 2, 0),
)
PLANS = "training plans here reserve ml.p5.48xlarge or ml.p5e.48xlarge."


def test_on_demand_types_are_those_with_instances_plans_never_hold() -> None:
    assert on_demand_types(FLEET) == (M5, P5, T3)
    assert on_demand_types(FLEET, {"us-west-2a"}) == (M5,)
    assert on_demand_types(FLEET, {"us-west-2b", "us-west-2c"}) == (M5, P5, T3)


def test_a_type_plans_can_reserve_passes_and_the_others_say_why_not() -> None:
    check_reservable(FLEET, P5E)
    with pytest.raises(ValidationError) as absent:
        check_reservable(FLEET, "ml.g5.48xlarge")
    assert absent.value.message == (
        "InstanceType: this fleet has no ml.g5.48xlarge. Training plans here reserve ml.p5.48xlarge or "
        "ml.p5e.48xlarge."
    )
    with pytest.raises(ValidationError) as on_demand_only:
        check_reservable(FLEET, M5)
    assert on_demand_only.value.message.startswith("InstanceType: ml.m5.12xlarge is on-demand only here")


def test_a_job_asking_for_a_type_the_fleet_lacks_hears_what_it_has_on_demand_and_for_plans() -> None:
    refusal = refuse_unknown_for_job(FLEET, "ml.g5.xlarge", "ResourceConfig.InstanceType")
    assert refusal.message == (
        "ResourceConfig.InstanceType: this fleet has no ml.g5.xlarge. A training job without a "
        "TrainingPlanArn runs on on-demand instances of ml.m5.12xlarge, ml.p5.48xlarge or ml.t3.xlarge; "
        + PLANS
    )


def test_a_group_hears_what_runs_on_demand_in_the_zone_of_its_subnets() -> None:
    refusal = refuse_absent_for_group(FLEET, "ml.g5.xlarge", {"us-west-2a"}, "InstanceGroups[0].InstanceType")
    assert refusal.message == (
        "InstanceGroups[0].InstanceType: this fleet has no ml.g5.xlarge. In us-west-2a, the zone of the "
        "group's subnets, an instance group without a TrainingPlanArn runs on on-demand instances of "
        "ml.m5.12xlarge; " + PLANS
    )
    anywhere = refuse_absent_for_group(FLEET, "ml.g5.xlarge", set(), "InstanceGroups[0].InstanceType")
    assert (
        "runs on on-demand instances of ml.m5.12xlarge, ml.p5.48xlarge or ml.t3.xlarge;" in anywhere.message
    )


def test_a_group_hears_where_the_fleet_has_its_type_and_how_it_could_use_it_there() -> None:
    on_demand_elsewhere = refuse_absent_for_group(FLEET, T3, {"us-west-2a"}, "InstanceGroups[1].InstanceType")
    assert on_demand_elsewhere.message == (
        "InstanceGroups[1].InstanceType: this fleet has no ml.t3.xlarge in us-west-2a, the zone of the "
        "group's subnets; it has ml.t3.xlarge on demand in us-west-2c (give the group a subnet there in "
        "OverrideVpcConfig). In us-west-2a an instance group without a TrainingPlanArn runs on on-demand "
        "instances of ml.m5.12xlarge."
    )
    plans_only = refuse_absent_for_group(FLEET, P5E, {"us-west-2a", "us-west-2c"}, "InstanceGroups[0].X")
    assert plans_only.message == (
        "InstanceGroups[0].X: this fleet has no ml.p5e.48xlarge in us-west-2a, us-west-2c, the zones of the "
        "group's subnets; it has ml.p5e.48xlarge in us-west-2b for training plans only (a group on such a "
        "plan names its TrainingPlanArn and a subnet of the plan's zone). In us-west-2a, us-west-2c an "
        "instance group without a TrainingPlanArn runs on on-demand instances of ml.m5.12xlarge or "
        "ml.t3.xlarge."
    )


def test_a_fleet_without_on_demand_or_plans_says_there_are_none() -> None:
    bare = make_fleet(pool(P5, "a", 8, 8))
    refusal = refuse_unknown_for_job(bare, "ml.g5.xlarge", "ResourceConfig.InstanceType")
    assert "runs on on-demand instances, of which there are none; training plans here reserve ml.p5" in (
        refusal.message
    )
    with pytest.raises(ValidationError) as none_reservable:
        check_reservable(make_fleet(pool(M5, "a", 4, 0)), P5)
    assert none_reservable.value.message == (
        "InstanceType: this fleet has no ml.p5.48xlarge. No plan can reserve any type here."
    )
