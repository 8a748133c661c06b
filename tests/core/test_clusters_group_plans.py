"""An instance group fed by several plans (core/group_plans.py): the allocation of an account's plans
among its groups, which plan each live node runs on, and which plans a group may take."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core import clusters
from hyperplan.core.clusters import GroupFacts, PlanFacts
from hyperplan.core.group_plans import GroupDemand, LiveNode, allocate, attribute, check_further_plan
from hyperplan.errors import ValidationError

A, B, C = 1, 2, 3


# -- allocation ----------------------------------------------------------------------------------------


def test_a_group_runs_up_to_its_target_across_its_plans_primary_first() -> None:
    assert allocate([GroupDemand(10, 4, (A, B))], {A: 2, B: 2}) == {10: {A: 2, B: 2}}
    assert allocate([GroupDemand(10, 3, (A, B))], {A: 2, B: 2}) == {10: {A: 2, B: 1}}
    # plan A ended (or is past its reclaim time): B alone serves
    assert allocate([GroupDemand(10, 4, (A, B))], {B: 2}) == {10: {A: 0, B: 2}}


def test_earlier_groups_take_first_and_later_ones_get_what_is_left_of_each_plan() -> None:
    groups = [GroupDemand(1, 3, (A,)), GroupDemand(2, 4, (B, A)), GroupDemand(3, 2, (A, C))]
    assert allocate(groups, {A: 4, B: 2, C: 1}) == {1: {A: 3}, 2: {B: 2, A: 1}, 3: {A: 0, C: 1}}


def test_a_plan_named_twice_by_one_group_serves_once() -> None:
    assert allocate([GroupDemand(1, 5, (A, A))], {A: 2}) == {1: {A: 2}}


groups_and_plans = st.integers(1, 4).flatmap(
    lambda plan_count: st.tuples(
        st.lists(
            st.tuples(st.integers(-1, 12), st.lists(st.integers(1, plan_count), min_size=1, max_size=4)),
            max_size=6,
        ),
        st.dictionaries(st.integers(1, plan_count), st.integers(0, 10)),
    )
)


@given(groups_and_plans)
def test_never_more_than_a_target_nor_more_of_a_plan_than_its_capacity(
    given_: tuple[list[tuple[int, list[int]]], dict[int, int]],
) -> None:
    spec, usable = given_
    groups = [GroupDemand(i, target, tuple(plans)) for i, (target, plans) in enumerate(spec)]
    shares = allocate(groups, usable)
    for group in groups:
        assert set(shares[group.group_id]) == set(group.plan_ids)
        assert all(count >= 0 for count in shares[group.group_id].values())
        assert sum(shares[group.group_id].values()) <= max(group.target, 0)
    for plan_id in {p for g in groups for p in g.plan_ids}:
        claimed = sum(shares[g.group_id].get(plan_id, 0) for g in groups)
        assert claimed <= usable.get(plan_id, 0)
    # Nothing is left idle that a group still wants: a group short of its target has used up its plans.
    for group in groups:
        if sum(shares[group.group_id].values()) < max(group.target, 0):
            for plan_id in group.plan_ids:
                claimed = sum(shares[g.group_id].get(plan_id, 0) for g in groups)
                assert claimed == usable.get(plan_id, 0)


@given(
    st.lists(st.tuples(st.integers(0, 20), st.integers(1, 3)), max_size=8),
    st.dictionaries(st.integers(1, 3), st.integers(0, 30)),
)
def test_groups_on_one_plan_each_get_exactly_what_the_single_plan_allocation_gave(
    spec: list[tuple[int, int]], usable: dict[int, int]
) -> None:
    groups = [GroupDemand(i, target, (plan_id,)) for i, (target, plan_id) in enumerate(spec)]
    shares = allocate(groups, usable)
    for plan_id in {plan_id for _, plan_id in spec}:
        on_it = [(g.group_id, g.target) for g in groups if g.plan_ids == (plan_id,)]
        today = clusters.allocate(on_it, usable.get(plan_id, 0))
        assert {g: shares[g][plan_id] for g, _ in on_it} == today


# -- attribution ---------------------------------------------------------------------------------------


def test_nodes_stay_on_their_plan_and_new_room_gets_new_nodes() -> None:
    nodes = [LiveNode(1, A, True), LiveNode(2, A, True)]
    done = attribute(nodes, {A: 2, B: 2})
    assert done.keep == (1, 2) and done.move == () and done.shut_down == () and done.add == (B, B)


def test_at_a_plans_end_its_nodes_carry_over_to_another_plans_room_and_the_surplus_goes_newest_first() -> (
    None
):
    # A's two nodes are the oldest; B's two came later. A ends: B's share is 2, A's 0.
    nodes = [LiveNode(1, A, True), LiveNode(2, A, True), LiveNode(3, B, True), LiveNode(4, B, True)]
    done = attribute(nodes, {A: 0, B: 2})
    assert done.keep == (3, 4) and done.move == () and done.shut_down == (2, 1) and done.add == ()
    # B has room for one more than its own nodes: the oldest of A's carries over, the other goes.
    nodes = [LiveNode(1, A, True), LiveNode(2, A, True), LiveNode(3, B, True)]
    done = attribute(nodes, {A: 0, B: 2})
    assert done.keep == (3,) and done.move == ((1, B),) and done.shut_down == (2,) and done.add == ()
    assert done.held(nodes) == {B: 2}


def test_failed_and_pending_nodes_go_first_then_the_newest() -> None:
    nodes = [LiveNode(1, A, False), LiveNode(2, A, True), LiveNode(3, A, True), LiveNode(4, A, False)]
    assert attribute(nodes, {A: 1}).shut_down == (4, 1, 3)
    assert attribute(nodes, {A: 1}).keep == (2,)


def test_a_node_on_no_plan_of_the_group_moves_to_one_with_room() -> None:
    # an on-demand node of a group since given a plan, and a node of a plan since removed from the group
    nodes = [LiveNode(1, None, True), LiveNode(2, C, True)]
    done = attribute(nodes, {A: 1, B: 2})
    assert done.move == ((1, A), (2, B)) and done.add == (B,) and done.shut_down == ()


def test_on_slurm_a_node_that_must_change_plan_is_replaced() -> None:
    nodes = [LiveNode(1, A, True), LiveNode(2, B, True)]
    done = attribute(nodes, {A: 0, B: 2}, can_move=False)
    assert done.keep == (2,) and done.move == () and done.shut_down == (1,) and done.add == (B,)


live_nodes = st.lists(st.tuples(st.sampled_from([None, A, B, C]), st.booleans()), max_size=10).map(
    lambda found: [LiveNode(i + 1, plan_id, running) for i, (plan_id, running) in enumerate(found)]
)
plan_shares = st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 6), max_size=3)


@given(live_nodes, plan_shares, st.booleans())
def test_every_node_is_kept_moved_or_shut_down_once_and_no_plan_holds_more_than_its_share(
    nodes: list[LiveNode], shares: dict[int, int], can_move: bool
) -> None:
    done = attribute(nodes, shares, can_move=can_move)
    decided = [*done.keep, *(node_id for node_id, _ in done.move), *done.shut_down]
    assert sorted(decided) == [node.node_id for node in nodes]
    held = done.held(nodes)
    for plan_id in shares:
        assert held.get(plan_id, 0) + done.add.count(plan_id) == shares[plan_id]  # each share filled
    plan_of = {node.node_id: node.plan_id for node in nodes}
    assert all(plan_of[node_id] in shares for node_id in done.keep)  # kept on a plan of the group
    if can_move:  # only what no plan can hold is shut down, and nothing is started while a node goes
        assert len(done.shut_down) == max(len(nodes) - sum(shares.values()), 0)
        assert not (done.shut_down and done.add)
    else:
        assert done.move == ()


@given(st.lists(st.booleans(), max_size=10), st.integers(0, 12))
def test_a_group_on_one_plan_keeps_and_sheds_the_nodes_it_always_did(running: list[bool], share: int) -> None:
    nodes = [LiveNode(i + 1, A, up) for i, up in enumerate(running)]
    done = attribute(nodes, {A: share})
    # Before several plans: failed and pending first, then the newest, shut down; the rest kept.
    today = sorted(nodes, key=lambda n: (n.running, -n.node_id))
    surplus = max(len(nodes) - share, 0)
    assert list(done.shut_down) == [n.node_id for n in today[:surplus]]
    assert done.move == () and len(done.add) == max(share - len(nodes), 0)


# -- which plans a group may take -----------------------------------------------------------------------

ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/"
GROUP = GroupFacts("group workers", "workers", "ml.p5.48xlarge", frozenset())
FIELD = "Cluster c, group workers"


def facts(name: str, **changes: object) -> PlanFacts:
    values: dict[str, object] = {
        "arn": ARN + name,
        "target": "hyperpod-cluster",
        "status": "Scheduled",
        "instance_type": "ml.p5.48xlarge",
        "zones": frozenset({"us-west-2a"}),
        **changes,
    }
    return PlanFacts(**values)  # type: ignore[arg-type]


def check(plan: PlanFacts | None, primary: str | None = ARN + "a", further: tuple[str, ...] = ()) -> bool:
    return check_further_plan(GROUP, "us-west-2a", primary, further, plan, "b", field=FIELD)


def test_a_matching_plan_is_taken_and_taking_it_again_changes_nothing() -> None:
    assert check(facts("b")) is False
    assert check(facts("b", status="Active")) is False
    assert check(facts("b"), further=(ARN + "b",)) is True
    assert check(facts("b", status="Expired"), further=(ARN + "b",)) is True  # had it: no new check


@pytest.mark.parametrize(
    ("plan", "primary", "words"),
    [
        (facts("b"), None, "runs on on-demand capacity; give it a TrainingPlanArn"),
        (None, ARN + "a", "this account has no training plan b"),
        (facts("a"), ARN + "a", "is the primary plan of group workers already"),
        (facts("b", target="training-job"), ARN + "a", "serves training-job"),
        (facts("b", status="Pending"), ARN + "a", "is Pending; it must be Scheduled or Active"),
        (facts("b", status="Failed"), ARN + "a", "is Failed"),
        (
            facts("b", instance_type="ml.p4d.24xlarge"),
            ARN + "a",
            "reserves ml.p4d.24xlarge, but group workers",
        ),
        (
            facts("b", zones=frozenset({"us-west-2b"})),
            ARN + "a",
            "is in us-west-2b, but group workers runs in",
        ),
    ],
)
def test_each_refusal_names_its_rule(plan: PlanFacts | None, primary: str | None, words: str) -> None:
    with pytest.raises(ValidationError) as exc:
        check(plan, primary)
    assert exc.value.message.startswith(f"{FIELD}: ") and words in exc.value.message, exc.value.message
