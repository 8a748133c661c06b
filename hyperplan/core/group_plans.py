"""An instance group fed by several training plans, as pure functions (docs/DECISIONS.md, "Consumers").

A plan group has a primary plan (the wire's TrainingPlanArn) and may have further plans, in the order
they were added. Three rules live here:

- ``check_further_plan``: which plan a group may take as a further plan (the binding rules of
  ``core/clusters.py``, plus the group's zone, which its primary plan fixed).
- ``allocate``: the capacity of an account's plans shared among its plan groups. Groups are served in
  creation order; each takes what it still wants from its plans in order (primary first), as much as each
  has left after the earlier groups. With one plan per group this is ``core.clusters.allocate`` per plan.
- ``attribute``: which plan each live node of a group runs on once the shares are known. A node stays on
  its plan while the plan's share has room, moves to another plan with room otherwise (the same node, no
  new lifecycle run), and only what no plan can hold is shut down; room left gets new nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hyperplan.core.clusters import GroupFacts, PlanFacts, check_binding
from hyperplan.errors import ValidationError


@dataclass(frozen=True)
class GroupDemand:
    """What a plan group asks of its plans: up to `target` instances, from `plan_ids` in order (the
    primary first, then the further plans in the order they were added)."""

    group_id: int
    target: int
    plan_ids: tuple[int, ...]


def allocate(groups: Sequence[GroupDemand], usable: Mapping[int, int]) -> dict[int, dict[int, int]]:
    """Each group's share of each of its plans: {group id: {plan id: count}}, every plan of the group
    present (0 when it gives nothing). `groups` come in creation order; `usable` is each plan's capacity
    that may serve now (absent: none)."""
    left = {plan_id: max(count, 0) for plan_id, count in usable.items()}
    shares: dict[int, dict[int, int]] = {}
    for group in groups:
        wanted = max(group.target, 0)
        taken: dict[int, int] = {}
        for plan_id in group.plan_ids:
            if plan_id in taken:  # a plan listed twice serves once
                continue
            taken[plan_id] = min(wanted, left.get(plan_id, 0))
            wanted -= taken[plan_id]
            left[plan_id] = left.get(plan_id, 0) - taken[plan_id]
        shares[group.group_id] = taken
    return shares


@dataclass(frozen=True)
class LiveNode:
    """A node that holds a place in its group: its id (the older the smaller), the plan it runs on (None:
    none of the group's, e.g. an on-demand node of a group that was given a plan), and whether it runs
    (a failed or still-pending node does not)."""

    node_id: int
    plan_id: int | None
    running: bool


@dataclass(frozen=True)
class Attribution:
    """What becomes of a group's live nodes: `keep` stay on their plan; `move` change plan (node id, new
    plan id) without any other change; `shut_down` go (in the order chosen); `add` is one plan id per new
    node to start."""

    keep: tuple[int, ...] = ()
    move: tuple[tuple[int, int], ...] = ()
    shut_down: tuple[int, ...] = ()
    add: tuple[int, ...] = ()

    def held(self, nodes: Sequence[LiveNode]) -> dict[int, int]:
        """How many of the existing nodes each plan holds once this is done (new ones not counted)."""
        plan_of = {node.node_id: node.plan_id for node in nodes}
        counts: dict[int, int] = {}
        for node_id in self.keep:
            plan_id = plan_of[node_id]
            assert plan_id is not None  # a kept node is on a plan of the group
            counts[plan_id] = counts.get(plan_id, 0) + 1
        for _, plan_id in self.move:
            counts[plan_id] = counts.get(plan_id, 0) + 1
        return counts


def _preferred(nodes: Sequence[LiveNode]) -> list[LiveNode]:
    """The order nodes are kept in: running ones first, oldest first; then the failed and still-pending
    ones, oldest first. Shutting down goes the other way: failed and pending first, newest first (as a
    group on one plan always did)."""
    return sorted(nodes, key=lambda node: (not node.running, node.node_id))


def attribute(nodes: Sequence[LiveNode], shares: Mapping[int, int], can_move: bool = True) -> Attribution:
    """Each live node on a plan whose share has room, in `shares`' order (the group's plan order).

    A node keeps its plan while that plan's share has room; one whose plan has none left moves to the
    first plan with room, unless `can_move` is False (a Slurm node is a job inside its plan's reservation:
    it is shut down and a new node started on the other plan instead); the rest are shut down, and the
    room left gets new nodes, each on the first plan with room."""
    room = {plan_id: max(count, 0) for plan_id, count in shares.items()}
    keep: list[int] = []
    homeless: list[LiveNode] = []
    for node in _preferred(nodes):
        if node.plan_id is not None and room.get(node.plan_id, 0) > 0:
            room[node.plan_id] -= 1
            keep.append(node.node_id)
        else:
            homeless.append(node)
    move: list[tuple[int, int]] = []
    gone: list[LiveNode] = []
    for node in homeless:
        plan_id = next((p for p, r in room.items() if r > 0), None) if can_move else None
        if plan_id is None:
            gone.append(node)
            continue
        room[plan_id] -= 1
        move.append((node.node_id, plan_id))
    add = [plan_id for plan_id, left in room.items() for _ in range(left)]
    shut_down = [node.node_id for node in reversed(_preferred(gone))]
    return Attribution(tuple(keep), tuple(move), tuple(shut_down), tuple(add))


def check_further_plan(
    group: GroupFacts,
    zone: str,
    primary_arn: str | None,
    further_arns: Sequence[str],
    plan: PlanFacts | None,
    plan_ref: str,
    field: str,
) -> bool:
    """Refuse, naming the rule, a plan that may not be a further plan of `group` (in `zone`, the zone its
    primary plan fixed); returns True when it is one already (adding it again changes nothing). `plan` is
    None when the caller has no plan `plan_ref` (absent, or another account's: the same answer)."""
    if primary_arn is None:
        raise ValidationError(
            f"{field}: group {group.name} runs on on-demand capacity; give it a TrainingPlanArn "
            "(UpdateCluster) before adding further plans."
        )
    if plan is not None and plan.arn == primary_arn:
        raise ValidationError(f"{field}: plan {plan.arn} is the primary plan of group {group.name} already.")
    if plan is not None and plan.arn in further_arns:
        return True
    anywhere = GroupFacts(group.where, group.name, group.instance_type, frozenset())
    check_binding(anywhere, plan, plan_ref, field=field)
    assert plan is not None  # check_binding refuses a missing plan
    if zone not in plan.zones:
        raise ValidationError(
            f"{field}: plan {plan.arn} is in {', '.join(sorted(plan.zones))}, but group {group.name} runs "
            f"in {zone}, its primary plan's zone; a group's plans must all be in its zone."
        )
    return False
