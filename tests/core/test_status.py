"""Every status machine, as data: each listed move passes, every other pair of states is refused, final
states have no moves, and every state can be reached from where its entities start."""

from __future__ import annotations

from enum import StrEnum
from itertools import product
from typing import Any

import botocore.session
import pytest

from hyperplan.core.jobs import JOB_LIFECYCLE
from hyperplan.core.lifecycle import FINAL, PLAN_LIFECYCLE, RESERVED_CAPACITY_LIFECYCLE, PlanStatus
from hyperplan.core.status import (
    CLUSTER_LIFECYCLE,
    EXTENSION_LIFECYCLE,
    INSTANCE_GROUP_LIFECYCLE,
    INVOICE_LIFECYCLE,
    NODE_LIFECYCLE,
    IllegalTransition,
    Lifecycle,
    NodeStatus,
)

MACHINES: list[Lifecycle[Any]] = [
    PLAN_LIFECYCLE,
    RESERVED_CAPACITY_LIFECYCLE,
    JOB_LIFECYCLE,
    CLUSTER_LIFECYCLE,
    INSTANCE_GROUP_LIFECYCLE,
    NODE_LIFECYCLE,
    INVOICE_LIFECYCLE,
    EXTENSION_LIFECYCLE,
]


def _states(machine: Lifecycle[Any]) -> list[StrEnum]:
    return list(machine.moves)  # the table lists every state (Lifecycle checks it)


def _pairs(allowed: bool) -> list[Any]:
    return [
        pytest.param(machine, current, new, id=f"{machine.kind}:{current}->{new}")
        for machine in MACHINES
        for current, new in product(_states(machine), repeat=2)
        if machine.allows(current, new) == allowed
    ]


@pytest.mark.parametrize(("machine", "current", "new"), _pairs(allowed=True))
def test_every_listed_move_passes(machine: Lifecycle[Any], current: StrEnum, new: StrEnum) -> None:
    machine.check(current, new)


@pytest.mark.parametrize(("machine", "current", "new"), _pairs(allowed=False))
def test_every_other_pair_is_refused(machine: Lifecycle[Any], current: StrEnum, new: StrEnum) -> None:
    with pytest.raises(IllegalTransition, match=f"a {machine.noun} cannot go from {current} to {new}$"):
        machine.check(current, new)


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.kind)
def test_final_states_have_no_moves_and_staying_put_is_no_move(machine: Lifecycle[Any]) -> None:
    assert machine.final, "every entity can end"
    for state in machine.final:
        assert machine.moves[state] == frozenset()
    for state in _states(machine):
        assert not machine.allows(state, state)


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.kind)
def test_every_state_is_reachable_from_the_initial_one(machine: Lifecycle[Any]) -> None:
    assert machine.reachable() == frozenset(_states(machine))


def test_the_kinds_recorded_with_changes_are_distinct() -> None:
    assert len({machine.kind for machine in MACHINES}) == len(MACHINES)


def test_a_table_must_list_every_state_and_only_known_ones() -> None:
    with pytest.raises(ValueError, match="every state"):
        Lifecycle("x", "x", NodeStatus, NodeStatus.PENDING, {NodeStatus.PENDING: frozenset()})
    moves: dict[Any, frozenset[Any]] = {s: frozenset() for s in NodeStatus}
    moves[NodeStatus.PENDING] = frozenset({PlanStatus.ACTIVE})
    with pytest.raises(ValueError, match="unknown states"):
        Lifecycle("x", "x", NodeStatus, NodeStatus.PENDING, moves)


def test_plans_keep_their_final_statuses_and_segments_only_go_forward() -> None:
    assert {PlanStatus.EXPIRED, PlanStatus.FAILED} == FINAL
    assert PLAN_LIFECYCLE.allows(PlanStatus.ACTIVE, PlanStatus.SCHEDULED)  # between two segments
    assert not RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus.ACTIVE, PlanStatus.SCHEDULED)
    assert not RESERVED_CAPACITY_LIFECYCLE.allows(PlanStatus.EXPIRED, PlanStatus.FAILED)


def test_a_node_told_to_shut_down_only_ends() -> None:
    assert NODE_LIFECYCLE.moves[NodeStatus.SHUTTING_DOWN] == {NodeStatus.TERMINATED}


@pytest.mark.parametrize(
    ("machine", "shape", "ours_only"),
    [
        (PLAN_LIFECYCLE, "TrainingPlanStatus", set()),
        (RESERVED_CAPACITY_LIFECYCLE, "ReservedCapacityStatus", set()),
        (CLUSTER_LIFECYCLE, "ClusterStatus", set()),
        (INSTANCE_GROUP_LIFECYCLE, "InstanceGroupStatus", set()),
        (NODE_LIFECYCLE, "ClusterInstanceStatus", {"Terminated"}),  # gone: never on the wire
        (JOB_LIFECYCLE, "SecondaryStatus", set()),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_statuses_on_the_wire_are_sagemakers(
    machine: Lifecycle[Any], shape: str, ours_only: set[str]
) -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert {str(s) for s in _states(machine)} - ours_only <= set(model.shape_for(shape).enum)
