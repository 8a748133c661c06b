"""The pure rules of training jobs: the status machine, the queue, pending and running time, binding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.jobs import (
    FINAL,
    JOB_LIFECYCLE,
    PRIMARY,
    RUNNING,
    WAITING,
    JobStatus,
    PlanFacts,
    Secondary,
    Window,
    check_plan,
    countable,
    has_capacity_left,
    reached_at,
    select_to_start,
    usable_windows,
)
from hyperplan.core.status import IllegalTransition
from hyperplan.errors import ValidationError

T0 = datetime(2026, 12, 1, 11, 30, tzinfo=UTC)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
LEAD = timedelta(minutes=30)
ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/p"

# -- the status machine --------------------------------------------------------------------------------


def test_every_secondary_status_has_a_primary_and_a_row_in_the_machine() -> None:
    assert set(PRIMARY) == set(JOB_LIFECYCLE.moves) == set(Secondary)
    assert {PRIMARY[s] for s in FINAL} == {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED}
    assert all(PRIMARY[s] == JobStatus.IN_PROGRESS for s in (*WAITING, *RUNNING, Secondary.UPLOADING))
    assert PRIMARY[Secondary.INTERRUPTED] == PRIMARY[Secondary.MAX_RUNTIME_EXCEEDED] == JobStatus.STOPPED


def test_every_status_is_reachable_from_starting_and_every_path_can_end() -> None:
    reached, frontier = {Secondary.STARTING}, [Secondary.STARTING]
    while frontier:
        for following in JOB_LIFECYCLE.moves[frontier.pop()]:
            if following not in reached:
                reached.add(following)
                frontier.append(following)
    assert reached == set(Secondary)
    for status in Secondary:  # from anywhere, some final status can still be reached
        seen, stack = set(), [status]
        while stack:
            current = stack.pop()
            seen.add(current)
            stack.extend(s for s in JOB_LIFECYCLE.moves[current] if s not in seen)
        assert seen & FINAL


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (Secondary.TRAINING, Secondary.PENDING),  # reclaimed: back to the queue
        (Secondary.PENDING, Secondary.DOWNLOADING),
        (Secondary.DOWNLOADING, Secondary.PENDING),  # reclaimed while preparing
        (Secondary.STOPPING, Secondary.INTERRUPTED),
        (Secondary.PENDING, Secondary.FAILED),  # InsufficientCapacityError
        (Secondary.UPLOADING, Secondary.COMPLETED),
    ],
)
def test_the_moves_jobs_make(current: Secondary, new: Secondary) -> None:
    JOB_LIFECYCLE.check(current, new)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (Secondary.COMPLETED, Secondary.TRAINING),
        (Secondary.PENDING, Secondary.TRAINING),  # instances are always prepared first
        (Secondary.PENDING, Secondary.PENDING),
        (Secondary.UPLOADING, Secondary.PENDING),  # the processes are done: nothing to take back
        (Secondary.STOPPED, Secondary.PENDING),
    ],
)
def test_moves_that_would_be_bugs_are_refused(current: Secondary, new: Secondary) -> None:
    with pytest.raises(IllegalTransition, match=f"from {current} to {new}"):
        JOB_LIFECYCLE.check(current, new)


# -- the queue -------------------------------------------------------------------------------------------


def test_first_in_first_out() -> None:
    assert select_to_start([(1, 2), (2, 2), (3, 2)], 4) == [1, 2]


def test_a_later_smaller_job_backfills_when_an_earlier_one_does_not_fit() -> None:
    assert select_to_start([(1, 3), (2, 2), (3, 1)], 4) == [1, 3]
    assert select_to_start([(1, 4), (2, 2), (3, 1)], 3) == [2, 3]


def test_nothing_free_starts_nothing() -> None:
    assert select_to_start([(1, 1)], 0) == []
    assert select_to_start([], 8) == []


@given(st.lists(st.integers(1, 8), max_size=12), st.integers(0, 16))
def test_the_queue_never_gives_more_than_is_free_and_keeps_order(counts: list[int], free: int) -> None:
    queue = list(enumerate(counts, start=1))
    started = select_to_start(queue, free)
    assert sum(counts[i - 1] for i in started) <= free
    assert started == sorted(started)
    left = free - sum(counts[i - 1] for i in started)
    # Greedy: every job passed over was too big for what was left when its turn came.
    remaining = free
    for job_id, count in queue:
        if job_id in started:
            remaining -= count
        else:
            assert count > remaining
    assert left == remaining


# -- pending and running time ----------------------------------------------------------------------------

TWO_SEGMENTS = [(T0, T0 + DAY), (T0 + 3 * DAY, T0 + 4 * DAY)]


def test_usable_windows_end_at_the_reclaim_time() -> None:
    assert usable_windows(TWO_SEGMENTS, LEAD) == [
        Window(T0, T0 + DAY - LEAD),
        Window(T0 + 3 * DAY, T0 + 4 * DAY - LEAD),
    ]
    assert usable_windows([(T0, T0 + LEAD)], LEAD) == []  # nothing usable at all


def test_pending_time_counts_only_inside_the_windows() -> None:
    windows = usable_windows(TWO_SEGMENTS, LEAD)
    assert countable(T0 - DAY, T0, windows) == timedelta(0)  # before the plan starts
    assert countable(T0 - DAY, T0 + HOUR, windows) == HOUR
    assert countable(T0 + DAY - LEAD, T0 + 3 * DAY, windows) == timedelta(0)  # reclaim to next start
    assert countable(T0, T0 + 5 * DAY, windows) == 2 * (DAY - LEAD)


def test_a_limit_is_reached_in_a_later_window_when_the_first_runs_out() -> None:
    windows = usable_windows(TWO_SEGMENTS, LEAD)
    assert reached_at(T0 - DAY, timedelta(0), HOUR, windows) == T0 + HOUR
    # 23.5 hours in the first window, the other half hour in the second
    assert reached_at(T0, timedelta(0), DAY, windows) == T0 + 3 * DAY + LEAD
    assert reached_at(T0 + 3 * DAY, DAY - LEAD, DAY, windows) == T0 + 3 * DAY + LEAD
    assert reached_at(T0, timedelta(0), 2 * DAY, windows) is None  # the plan ends first
    assert reached_at(T0 + HOUR, 2 * HOUR, HOUR, windows) == T0 + HOUR  # already over


@given(
    st.integers(-48, 120).map(lambda h: T0 + h * HOUR),
    st.integers(1, 96).map(lambda h: h * HOUR),
)
def test_reached_at_agrees_with_countable(since: datetime, limit: timedelta) -> None:
    windows = usable_windows(TWO_SEGMENTS, LEAD)
    due = reached_at(since, timedelta(0), limit, windows)
    if due is None:
        assert countable(since, T0 + 10 * DAY, windows) < limit
    else:
        assert countable(since, due, windows) == limit


def test_capacity_left_until_the_last_reclaim() -> None:
    windows = usable_windows(TWO_SEGMENTS, LEAD)
    assert has_capacity_left(windows, T0 + 2 * DAY)
    assert not has_capacity_left(windows, T0 + 4 * DAY - LEAD)
    assert not has_capacity_left([], T0)


# -- binding to a plan -------------------------------------------------------------------------------------

PLAN = PlanFacts(ARN, "training-job", "Scheduled", "ml.p5.48xlarge", 4, capacity_left=True)


def test_a_matching_plan_binds() -> None:
    check_plan(PLAN, ARN, "ml.p5.48xlarge", 4)
    check_plan(PlanFacts(ARN, "training-job", "Active", "ml.p5.48xlarge", 4, True), ARN, "ml.p5.48xlarge", 1)


@pytest.mark.parametrize(
    ("plan", "instance_type", "count", "words"),
    [
        (None, "ml.p5.48xlarge", 1, "plan-ownership rule"),
        (
            PlanFacts(ARN, "hyperpod-cluster", "Active", "ml.p5.48xlarge", 4, True),
            "ml.p5.48xlarge",
            1,
            "plan-target",
        ),
        (
            PlanFacts(ARN, "training-job", "Pending", "ml.p5.48xlarge", 4, True),
            "ml.p5.48xlarge",
            1,
            "is Pending",
        ),
        (
            PlanFacts(ARN, "training-job", "Expired", "ml.p5.48xlarge", 4, False),
            "ml.p5.48xlarge",
            1,
            "is Expired",
        ),
        (
            PlanFacts(ARN, "training-job", "Active", "ml.p5.48xlarge", 4, False),
            "ml.p5.48xlarge",
            1,
            "no capacity",
        ),
        (PLAN, "ml.p4d.24xlarge", 1, "instance-type rule"),
        (PLAN, "ml.p5.48xlarge", 8, "plan-capacity rule"),
    ],
)
def test_each_binding_rule_is_refused_by_name(
    plan: PlanFacts | None, instance_type: str, count: int, words: str
) -> None:
    with pytest.raises(ValidationError, match=words):
        check_plan(plan, ARN, instance_type, count)
