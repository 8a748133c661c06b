"""A job on several plans: their windows as one (pending time counts once while any plan could serve),
when the next one opens, and the binding rules naming where a further plan was given."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.jobs import PlanFacts, Window, check_plan, countable, merged_windows, next_opening
from hyperplan.errors import ValidationError

T0 = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p"


def test_overlapping_and_touching_windows_join_and_apart_ones_stay_apart() -> None:
    a = Window(T0, T0 + DAY)
    b = Window(T0 + 12 * HOUR, T0 + 2 * DAY)  # overlaps a
    c = Window(T0 + 2 * DAY, T0 + 3 * DAY)  # touches b's end
    d = Window(T0 + 5 * DAY, T0 + 6 * DAY)
    assert merged_windows([d, c, b, a]) == [Window(T0, T0 + 3 * DAY), d]
    assert merged_windows([a, Window(T0 + HOUR, T0 + 2 * HOUR)]) == [a]  # one inside another
    assert merged_windows([]) == []


def test_an_hour_two_plans_could_serve_counts_once() -> None:
    first = Window(T0, T0 + DAY)
    second = Window(T0 + 12 * HOUR, T0 + DAY + 12 * HOUR)
    merged = merged_windows([first, second])
    assert countable(T0, T0 + 3 * DAY, merged) == DAY + 12 * HOUR
    assert countable(T0, T0 + 3 * DAY, [first, second]) == 2 * DAY  # what adding them up would say


windows = st.lists(
    st.tuples(st.integers(0, 200), st.integers(1, 50)).map(
        lambda w: Window(T0 + w[0] * HOUR, T0 + (w[0] + w[1]) * HOUR)
    ),
    max_size=8,
)


@given(windows, st.integers(-10, 260))
def test_merged_windows_cover_exactly_the_hours_some_window_covers(found: list[Window], hour: int) -> None:
    merged = merged_windows(found)
    instant = T0 + hour * HOUR + timedelta(minutes=30)
    covered = any(w.start <= instant < w.end for w in found)
    assert covered == any(w.start <= instant < w.end for w in merged)
    assert all(earlier.end < later.start for earlier, later in pairwise(merged))


def test_the_next_opening_is_the_first_window_not_begun() -> None:
    found = [Window(T0 + 2 * DAY, T0 + 3 * DAY), Window(T0, T0 + DAY), Window(T0 + 5 * DAY, T0 + 6 * DAY)]
    assert next_opening(found, T0 - HOUR) == T0
    assert next_opening(found, T0) == T0 + 2 * DAY  # the one open now has begun
    assert next_opening(found, T0 + 4 * DAY) == T0 + 5 * DAY
    assert next_opening(found, T0 + 5 * DAY) is None


def test_a_refusal_names_where_the_plan_was_given() -> None:
    cluster_plan = PlanFacts(ARN, "hyperpod-cluster", "Active", "ml.p5.48xlarge", 4, True)
    with pytest.raises(ValidationError) as refused:
        check_plan(cluster_plan, ARN, "ml.p5.48xlarge", 1, field="Plan")
    assert refused.value.message.startswith("Plan: plan ") and "(plan-target rule)" in refused.value.message
    with pytest.raises(ValidationError) as absent:
        check_plan(None, "nope", "ml.p5.48xlarge", 1, field="Plan")
    assert absent.value.message == "Plan: this account has no training plan nope (plan-ownership rule)."
    with pytest.raises(ValidationError) as on_the_wire:
        check_plan(None, ARN, "ml.p5.48xlarge", 1)
    assert on_the_wire.value.message.startswith("ResourceConfig.TrainingPlanArn: ")
