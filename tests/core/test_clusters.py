from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.clusters import GroupFacts, PlanFacts, allocate, check_binding, check_lifecycle_script
from hyperplan.errors import ValidationError

ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p"
PLAN = PlanFacts(ARN, "hyperpod-cluster", "Scheduled", "ml.p5.48xlarge", frozenset({"us-west-2a"}))
GROUP = GroupFacts("InstanceGroups[1]", "workers", "ml.p5.48xlarge", frozenset({"us-west-2a"}))


def test_a_matching_plan_binds() -> None:
    check_binding(GROUP, PLAN, ARN)
    check_binding(GroupFacts("InstanceGroups[0]", "w", "ml.p5.48xlarge", frozenset()), PLAN, ARN)


@pytest.mark.parametrize(
    ("group", "plan", "words"),
    [
        (GROUP, None, "has no training plan"),
        (
            GROUP,
            PlanFacts(ARN, "training-job", "Scheduled", "ml.p5.48xlarge", frozenset({"us-west-2a"})),
            "serves training-job",
        ),
        (
            GROUP,
            PlanFacts(ARN, "hyperpod-cluster", "Pending", "ml.p5.48xlarge", frozenset({"us-west-2a"})),
            "is Pending",
        ),
        (
            GROUP,
            PlanFacts(ARN, "hyperpod-cluster", "Expired", "ml.p5.48xlarge", frozenset({"us-west-2a"})),
            "is Expired",
        ),
        (
            GROUP,
            PlanFacts(ARN, "hyperpod-cluster", "Active", "ml.p4d.24xlarge", frozenset({"us-west-2a"})),
            "reserves ml.p4d.24xlarge",
        ),
        (
            GroupFacts("InstanceGroups[1]", "w", "ml.p5.48xlarge", frozenset({"us-west-2b"})),
            PLAN,
            "add a subnet of the plan's zone",
        ),
        (
            GroupFacts("InstanceGroups[1]", "w", "ml.p5.48xlarge", frozenset(), capacity_requirements=True),
            PLAN,
            "never both",
        ),
    ],
)
def test_each_rule_refuses_with_its_own_message(
    group: GroupFacts, plan: PlanFacts | None, words: str
) -> None:
    with pytest.raises(ValidationError) as exc:
        check_binding(group, plan, ARN)
    assert words in exc.value.message
    assert exc.value.message.startswith(f"{group.where}.TrainingPlanArn")


def test_allocation_serves_groups_in_creation_order() -> None:
    assert allocate([(1, 2), (2, 2)], 3) == {1: 2, 2: 1}
    assert allocate([(1, 2), (2, 2)], 0) == {1: 0, 2: 0}
    assert allocate([(7, 1), (3, 5)], 10) == {7: 1, 3: 5}


@given(st.lists(st.integers(0, 20), max_size=6), st.integers(0, 50))
def test_allocation_never_exceeds_capacity_or_targets(targets: list[int], capacity: int) -> None:
    shares = allocate(list(enumerate(targets)), capacity)
    assert sum(shares.values()) == min(capacity, sum(targets))
    assert all(0 <= shares[i] <= t for i, t in enumerate(targets))


@pytest.mark.parametrize("script", ["/bin/true", "../../../bin/true", "scripts/../../x.sh", " ", "a\0b"])
def test_on_create_must_stay_inside_the_lifecycle_source(script: str) -> None:
    with pytest.raises(
        ValidationError, match=r"InstanceGroups\[0\]\.LifeCycleConfig\.OnCreate: .* must be a path"
    ):
        check_lifecycle_script("InstanceGroups[0]", script)


def test_on_create_paths_inside_the_source_are_fine() -> None:
    for script in ("on_create.sh", "scripts/on_create.sh", "./on_create.sh", None):
        check_lifecycle_script("InstanceGroups[0]", script)
