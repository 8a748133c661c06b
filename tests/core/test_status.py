"""Every status machine, as data: each move the documents name passes, every other pair of states is
refused, final states have no moves, and every state can be reached from where its entities start.

The moves expected are written out here, from the documents, not read back from the tables under test:
a table that gains or loses a move fails until this list, and the document it cites, say the same.
"""

from __future__ import annotations

from enum import StrEnum
from itertools import product
from typing import Any

import botocore.session
import pytest

from hyperplan.core.jobs import ATTEMPT_LIFECYCLE, INSTANCE_LIFECYCLE, JOB_LIFECYCLE, Secondary, shown
from hyperplan.core.lifecycle import FINAL, PLAN_LIFECYCLE, RESERVED_CAPACITY_LIFECYCLE, PlanStatus
from hyperplan.core.status import (
    CLUSTER_LIFECYCLE,
    EXTENSION_LIFECYCLE,
    INVOICE_LIFECYCLE,
    KEY_LIFECYCLE,
    NODE_LIFECYCLE,
    IllegalTransition,
    InstanceGroupStatus,
    KeyStatus,
    Lifecycle,
    NodeStatus,
)

MACHINES: list[Lifecycle[Any]] = [
    PLAN_LIFECYCLE,
    RESERVED_CAPACITY_LIFECYCLE,
    JOB_LIFECYCLE,
    ATTEMPT_LIFECYCLE,
    INSTANCE_LIFECYCLE,
    CLUSTER_LIFECYCLE,
    NODE_LIFECYCLE,
    INVOICE_LIFECYCLE,
    EXTENSION_LIFECYCLE,
    KEY_LIFECYCLE,
]

_ENDS = ("Expired", "Failed")
EXPECTED: dict[str, dict[str, set[str]]] = {
    # shared/spec/sagemaker-training-plans.md 2.5: Pending -> Scheduled once paid, or -> Failed; Scheduled
    # <-> Active between discontinuous segments; Expired at the end. core/lifecycle.py: once paid, a plan's
    # status follows from its segments and the time, so one paid while a segment is open goes Active and
    # one paid after its end Expired; an administrator may fail a Scheduled or Active plan.
    "training-plan": {
        "Pending": {"Scheduled", "Active", *_ENDS},
        "Scheduled": {"Active", *_ENDS},
        "Active": {"Scheduled", *_ENDS},
        "Expired": set(),
        "Failed": set(),
    },
    # the same section, "RC: Scheduled -> Active -> Expired": a segment never goes back.
    "reserved-capacity": {
        "Pending": {"Scheduled", "Active", *_ENDS},
        "Scheduled": {"Active", *_ENDS},
        "Active": set(_ENDS),
        "Expired": set(),
        "Failed": set(),
    },
    # SageMaker's SecondaryStatus as docs/DECISIONS.md, "Consumers", has hyperplan move it: queued jobs
    # wait Pending; a reclaim sends a running one back to Pending (resumed in the next segment) or ends it
    # Interrupted; StopTrainingJob goes through Stopping.
    "training-job": {
        "Starting": {"Pending", "Downloading", "Failed", "Interrupted", "Stopped", "MaxWaitTimeExceeded"},
        "Pending": {"Downloading", "Failed", "Interrupted", "Stopped", "MaxWaitTimeExceeded"},
        "Downloading": {"Training", "Pending", "Stopping", "Failed", "SpotInterrupted"},
        "Training": {"Uploading", "Pending", "Stopping", "Failed", "SpotInterrupted"},
        "Uploading": {"Completed", "Failed"},
        "Stopping": {"Stopped", "Interrupted", "MaxRuntimeExceeded", "MaxWaitTimeExceeded", "Failed"},
        # A spot job whose lent instances are taken back waits again once its processes are gone.
        "SpotInterrupted": {"Pending", "Stopping", "Failed", "Interrupted", "Stopped", "MaxWaitTimeExceeded"},
        "Completed": set(),
        "Failed": set(),
        "Stopped": set(),
        "Interrupted": set(),
        "MaxRuntimeExceeded": set(),
        "MaxWaitTimeExceeded": set(),
    },
    # services/jobs/jobs.py: an attempt is launched (its tasks handed to the back end), runs while the watcher
    # follows them, ends (checkpoints and model stored) and is over; one none of whose tasks could start is
    # over at once. The next attempt is a new one.
    "training-job-attempt": {
        "launching": {"running", "ended"},
        "running": {"ending"},
        "ending": {"ended"},
        "ended": set(),
    },
    # An instance is recorded, then as its back-end task goes (backends/base.py TaskState: Running, then
    # Exited, Killed or Lost), or NotStarted when its attempt ended before the back end had it.
    "training-job-instance": {
        "Recorded": {"Running", "Exited", "Killed", "Lost", "NotStarted"},
        "Running": {"Exited", "Killed", "Lost"},
        "Exited": set(),
        "Killed": set(),
        "Lost": set(),
        "NotStarted": set(),
    },
    "cluster": {"InService": {"Deleting"}, "Deleting": set()},  # Deleting until its last node is gone
    # A node follows its back end (docs/ARCHITECTURE.md): a live one may fail or end; ShuttingDown only ends.
    "cluster-node": {
        "Pending": {"Running", "Failure", "ShuttingDown", "Terminated"},
        "Running": {"Failure", "ShuttingDown", "Terminated"},
        "Failure": {"ShuttingDown", "Terminated"},
        "ShuttingDown": {"Terminated"},
        "Terminated": set(),
    },
    # docs/API.md, "Invoice statuses": Pending until Paid, Rejected by an administrator, or Failed.
    "invoice": {"Pending": {"Paid", "Rejected", "Failed"}, "Paid": set(), "Rejected": set(), "Failed": set()},
    "plan-extension": {"Pending": {"Paid", "Failed"}, "Paid": set(), "Failed": set()},
    # IAM's access keys (docs/API.md, "Users and access keys"): activated and deactivated at will; a key
    # ends by its deletion.
    "access-key": {"Active": {"Inactive"}, "Inactive": {"Active"}},
}

# Entities that end outside their status: a deleted access key keeps its row, and its status, with
# revoked_at set (services/accounts/users.py), so none of its statuses is final.
ENDED_OUTSIDE_THEIR_STATUS = {"access-key"}


def _states(machine: Lifecycle[Any]) -> list[StrEnum]:
    return list(machine.moves)  # the table lists every state (Lifecycle checks it)


def _pairs(expected: bool) -> list[Any]:
    """Every (machine, current, new) whose move EXPECTED lists (True) or does not (False)."""
    return [
        pytest.param(machine, current, new, id=f"{machine.kind}:{current}->{new}")
        for machine in MACHINES
        for current, new in product(_states(machine), repeat=2)
        if (str(new) in EXPECTED[machine.kind][str(current)]) == expected
    ]


def test_each_machine_has_the_states_the_documents_name() -> None:
    assert {machine.kind: {str(s) for s in _states(machine)} for machine in MACHINES} == {
        kind: set(table) for kind, table in EXPECTED.items()
    }


@pytest.mark.parametrize(("machine", "current", "new"), _pairs(expected=True))
def test_every_documented_move_passes(machine: Lifecycle[Any], current: StrEnum, new: StrEnum) -> None:
    machine.check(current, new)


@pytest.mark.parametrize(("machine", "current", "new"), _pairs(expected=False))
def test_every_other_pair_is_refused(machine: Lifecycle[Any], current: StrEnum, new: StrEnum) -> None:
    with pytest.raises(IllegalTransition, match=f"a {machine.noun} cannot go from {current} to {new}$"):
        machine.check(current, new)


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.kind)
def test_final_states_have_no_moves_and_staying_put_is_no_move(machine: Lifecycle[Any]) -> None:
    assert bool(machine.final) != (machine.kind in ENDED_OUTSIDE_THEIR_STATUS), "every entity can end"
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
        (NODE_LIFECYCLE, "ClusterInstanceStatus", {"Terminated"}),  # gone: never on the wire
        (JOB_LIFECYCLE, "SecondaryStatus", {"SpotInterrupted"}),  # stored only: see the next test
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_statuses_on_the_wire_are_sagemakers(
    machine: Lifecycle[Any], shape: str, ours_only: set[str]
) -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert {str(s) for s in _states(machine)} - ours_only <= set(model.shape_for(shape).enum)


def test_every_secondary_status_a_job_answers_is_sagemakers() -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    answered = {shown(status) for status in Secondary}
    assert answered <= set(model.shape_for("SecondaryStatus").enum)
    assert shown(Secondary.SPOT_INTERRUPTED) == "Interrupted"  # InProgress, as SageMaker shows a spot job


def test_the_instance_group_status_hyperplan_answers_is_sagemakers() -> None:
    model = botocore.session.get_session().get_service_model("sagemaker")
    assert {str(s) for s in InstanceGroupStatus} <= set(model.shape_for("InstanceGroupStatus").enum)


def test_access_key_statuses_are_iams() -> None:
    model = botocore.session.get_session().get_service_model("iam")
    assert {str(s) for s in KeyStatus} <= set(model.shape_for("statusType").enum)
