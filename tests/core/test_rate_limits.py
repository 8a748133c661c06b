"""Token buckets as values: what a burst admits, how they refill, and what no sequence of requests beats."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.rate_limits import (
    DEFAULT_RATE_LIMITS,
    Bucket,
    RateLimit,
    RequestClass,
    effective,
    lease,
    native_class,
    sagemaker_class,
    take,
)
from hyperplan.errors import ValidationError
from tests.core.test_fleet import MINIMAL


def admitted(limit: RateLimit, times: list[float]) -> list[float]:
    bucket: Bucket | None = None
    passed = []
    for now in times:
        bucket, wait = take(limit, bucket, now)
        if wait is None:
            passed.append(now)
    return passed


def test_a_quiet_account_gets_its_burst_at_once_then_waits_one_refill() -> None:
    limit = RateLimit(rate=2, burst=5)
    bucket = None
    for _ in range(5):
        bucket, wait = take(limit, bucket, 100.0)
        assert wait is None
    bucket, wait = take(limit, bucket, 100.0)
    assert wait == pytest.approx(0.5)  # one token at 2 a second
    _, wait = take(limit, bucket, 100.5)
    assert wait is None


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    limit = RateLimit(rate=1, burst=3)
    bucket, _ = take(limit, None, 0.0)
    # a day of silence refills to the burst, not to 86,400 tokens
    assert len(admitted(limit, [86_400.0] * 10)) == 3
    bucket, _ = take(limit, bucket, 86_400.0)
    assert bucket.tokens == pytest.approx(2.0)


def test_time_running_backwards_gives_nothing() -> None:
    limit = RateLimit(rate=10, burst=1)
    bucket, wait = take(limit, None, 50.0)
    assert wait is None
    bucket, wait = take(limit, bucket, 10.0)  # an earlier instant: no refill, and no going back
    assert wait is not None and bucket.at == 50.0


@given(
    rate=st.floats(min_value=0.1, max_value=100),
    burst=st.integers(min_value=1, max_value=50),
    gaps=st.lists(st.floats(min_value=0, max_value=2), min_size=1, max_size=300),
)
def test_no_sequence_of_requests_gets_more_than_burst_plus_rate_times_the_window(
    rate: float, burst: int, gaps: list[float]
) -> None:
    limit = RateLimit(rate, burst)
    times = []
    now = 0.0
    for gap in gaps:
        now += gap
        times.append(now)
    passed = admitted(limit, times)
    for i, start in enumerate(passed):
        for j in range(i, len(passed)):
            assert j - i + 1 <= burst + rate * (passed[j] - start) + 1e-6


@given(gap=st.floats(min_value=0, max_value=10), rate=st.floats(min_value=0.1, max_value=100))
def test_a_refused_request_is_admitted_once_its_wait_has_passed(gap: float, rate: float) -> None:
    limit = RateLimit(rate, 1)
    bucket, _ = take(limit, None, 0.0)
    bucket, wait = take(limit, bucket, gap / 1000)
    if wait is not None:
        _, again = take(limit, bucket, gap / 1000 + wait + 1e-9)
        assert again is None


def test_operations_fall_into_their_classes() -> None:
    assert sagemaker_class("SearchTrainingPlanOfferings") is RequestClass.SEARCH
    assert sagemaker_class("CreateTrainingPlan") is RequestClass.PURCHASE
    assert sagemaker_class("ExtendTrainingPlan") is RequestClass.PURCHASE
    assert sagemaker_class("DescribeTrainingPlan") is RequestClass.READ
    assert sagemaker_class("ListClusterNodes") is RequestClass.READ
    assert sagemaker_class("CreateTrainingJob") is RequestClass.WRITE
    assert sagemaker_class("DeleteCluster") is RequestClass.WRITE
    assert native_class("GET") is RequestClass.READ
    assert native_class("PATCH") is RequestClass.WRITE


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (-1, 1), (float("nan"), 1), (1, 0), (1, 1.5)])
def test_a_limit_that_admits_nothing_or_is_not_a_number_is_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValidationError):
        RateLimit(rate, burst)


def test_an_account_s_own_limits_go_over_the_fleet_s() -> None:
    mine = effective(DEFAULT_RATE_LIMITS, {RequestClass.SEARCH: RateLimit(1, 2), RequestClass.READ: None})
    assert mine[RequestClass.SEARCH] == RateLimit(1, 2)
    assert mine[RequestClass.READ] == DEFAULT_RATE_LIMITS[RequestClass.READ]


def test_the_fleet_file_sets_some_classes_and_keeps_the_defaults_for_the_rest() -> None:
    fleet = parse_fleet(MINIMAL + "\n[rate_limits]\nsearch = { rate = 0.5, burst = 3 }\n")
    assert fleet.rate_limits[RequestClass.SEARCH] == RateLimit(0.5, 3)
    assert fleet.rate_limits[RequestClass.WRITE] == DEFAULT_RATE_LIMITS[RequestClass.WRITE]
    assert parse_fleet(MINIMAL).rate_limits == DEFAULT_RATE_LIMITS


@pytest.mark.parametrize(
    ("table", "named"),
    [
        ("searches = { rate = 1, burst = 1 }", "rate_limits.searches: unknown key"),
        ("search = { rate = 1 }", "rate_limits.search.burst: required"),
        ("search = { rate = 0, burst = 1 }", "rate_limits.search: a rate is"),
        ('search = { rate = "fast", burst = 1 }', "rate_limits.search.rate: 'fast' is not"),
        ("search = { rate = 1, burst = 0 }", "rate_limits.search.burst: 0 is less than 1"),
        ("search = { rate = 1, burst = 2, per = 3 }", "rate_limits.search.per: unknown key"),
    ],
)
def test_a_wrong_rate_limit_in_the_fleet_file_is_named(table: str, named: str) -> None:
    with pytest.raises(ValidationError, match=named.replace(".", r"\.")):
        parse_fleet(MINIMAL + f"\n[rate_limits]\n{table}\n")


def test_a_lease_takes_whole_tokens_up_to_what_the_bucket_holds_and_never_more_than_one_bucket() -> None:
    limit = RateLimit(2, 5)
    bucket, granted, wait = lease(limit, None, 100.0, 3)  # a new bucket starts full
    assert (granted, wait, bucket) == (3, None, Bucket(2.0, 100.0))
    bucket, granted, _ = lease(limit, bucket, 100.0, 3)
    assert (granted, bucket.tokens) == (2, 0.0)  # what was left, not the batch
    bucket, granted, wait = lease(limit, bucket, 100.25, 3)
    assert (granted, wait) == (0, 0.25)  # half a token: refused, with the time to a whole one
    bucket, granted, _ = lease(limit, bucket, 99.0, 3)  # a clock behind: no time gained, none lost
    assert (granted, bucket.at) == (0, 100.25)
    bucket, granted, _ = lease(limit, bucket, 200.0, 9)
    assert granted == 5  # refilled to the burst, never above


@given(st.lists(st.tuples(st.floats(0, 10), st.integers(1, 20)), max_size=40))
def test_leases_never_grant_more_than_burst_plus_rate_times_elapsed(steps: list[tuple[float, int]]) -> None:
    limit = RateLimit(3, 7)
    bucket, now, granted_total = None, 0.0, 0
    for gap, want in steps:
        now += gap
        bucket, granted, _ = lease(limit, bucket, now, want)
        assert granted <= want
        granted_total += granted
    assert granted_total <= limit.burst + limit.rate * now + 1e-9


def test_tokens_given_back_count_again_up_to_the_burst() -> None:
    limit = RateLimit(1, 10)
    bucket, granted, _ = lease(limit, Bucket(0.0, 50.0), 50.0, 5, returned=3)
    assert (granted, bucket.tokens) == (3, 0.0)
    bucket, granted, _ = lease(limit, Bucket(9.0, 50.0), 50.0, 1, returned=4)
    assert (granted, bucket.tokens) == (1, 9.0)  # 13 capped at 10, less the one taken
