"""Workloads for the simulator (docs/PLANNING.md): the CSV read and written back, with or without the
owners' busy intervals, and the spot jobs' CSV; their refusals naming the line and the column; the
seeded generators keeping to the shapes they promise; and issue 54's knobs (lead-time and slack mixes,
gang sizes and tail, zones, windows cut at the span) and preset, which leave the shapes' workloads as
they were."""

from __future__ import annotations

import hashlib
import random
import statistics
from collections import Counter
from dataclasses import replace

import pytest

from hyperplan.core.workloads import (
    LEAD_MIXES,
    PRESETS,
    SHAPES,
    SLACK_MIXES,
    Mix,
    SpotJob,
    WorkloadRequest,
    WorkloadSpec,
    generate,
    preset,
    read_csv,
    read_spot_csv,
    write_csv,
    write_spot_csv,
)
from hyperplan.errors import ValidationError

HEADER = "arrival_h,instance_type,count,days,start_after_h,end_before_h,target,choice\n"
BUSY_HEADER = HEADER.replace("choice", "choice,busy_h")
SPOT_HEADER = "arrival_h,instance_type,count,run_h,max_wait_h,checkpoint_h\n"


def test_the_csv_reads_back_what_was_written_empty_windows_and_choices_included() -> None:
    text = HEADER + (
        "30,ml.p5.48xlarge,4,5,,,training-job,first\n"
        "0,ml.p5.48xlarge,32,3,24,144.5,hyperpod-cluster,cheapest\n"
        "\n"
        "2.5,ml.p4d.24xlarge,1,1,,48,training-job,earliest\n"
    )
    requests = read_csv(text)
    assert [r.arrival_h for r in requests] == [0, 2.5, 30]  # in arrival order
    assert requests[0] == WorkloadRequest(
        0, "ml.p5.48xlarge", 32, 3, 24, 144.5, "hyperpod-cluster", "cheapest"
    )
    assert (requests[1].start_after_h, requests[1].end_before_h, requests[1].choice) == (None, 48, "earliest")
    assert read_csv(write_csv(requests)) == requests


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrival,instance_type\n", "workload: the first line must be the header"),
        (HEADER + "0,ml.p5.48xlarge,4,5,,,training-job\n", "workload line 2: 7 columns, not 8"),
        (HEADER + "soon,ml.p5.48xlarge,4,5,,,training-job,first\n", "workload line 2, arrival_h: 'soon'"),
        (HEADER + "0,ml.p5.48xlarge,0,5,,,training-job,first\n", "workload line 2, count: '0' is not a"),
        (HEADER + "0,ml.p5.48xlarge,4,5,,,endpoint,first\n", "workload line 2, target: 'endpoint'"),
        (HEADER + "0,ml.p5.48xlarge,4,5,,,training-job,best\n", "workload line 2, choice: 'best'"),
        (HEADER + "0,ml.p5.48xlarge,4,5,48,24,training-job,first\n", "workload line 2, end_before_h: '24'"),
    ],
)
def test_a_bad_workload_names_the_line_and_column(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        read_csv(text)
    assert caught.value.message.startswith(message)


def test_busy_intervals_are_read_in_order_joined_where_they_meet_and_written_back() -> None:
    text = BUSY_HEADER + (
        "0,ml.p5.48xlarge,4,5,,,training-job,first,30-46 0-20 18.5-24\n"
        "1,ml.p5.48xlarge,4,5,,,training-job,first,\n"
    )
    busy, whole_plan = read_csv(text)
    assert busy.busy_h == ((0, 24), (30, 46))  # 0-20 and 18.5-24 overlap: busy from 0 to 24
    assert whole_plan.busy_h == ()  # empty: busy the whole plan
    written = write_csv([busy, whole_plan])
    assert written.splitlines()[1].endswith(",first,0-24 30-46")
    assert read_csv(written) == [busy, whole_plan]


def test_a_workload_without_busy_intervals_is_written_without_the_column() -> None:
    requests = generate(WorkloadSpec(), 0)
    assert write_csv(requests).startswith(HEADER)  # as make_workload.py wrote it before busy_h
    assert read_csv(write_csv(requests)) == requests


@pytest.mark.parametrize(
    ("busy", "message"),
    [
        ("0-20 30", "workload line 2, busy_h: '0-20 30' has '30', which is not START-END"),
        ("20-10", "workload line 2, busy_h: '20-10' has '20-10', which does not end after it starts"),
        ("soon-5", "workload line 2, busy_h: 'soon-5' has 'soon-5', which starts with what is not a number"),
        ("0-5,5-6", "workload line 2, busy_h: '0-5,5-6' has '0-5,5-6', which ends with what is not a number"),
    ],
)
def test_bad_busy_intervals_name_the_line_the_column_and_the_interval(busy: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        read_csv(BUSY_HEADER + f'0,ml.p5.48xlarge,4,5,,,training-job,first,"{busy}"\n')
    assert caught.value.message.startswith(message)


def test_spot_jobs_read_back_what_was_written_in_arrival_order() -> None:
    text = SPOT_HEADER + "12,ml.p5.48xlarge,4,6,48,1\n\n0,ml.p4d.24xlarge,16,12.5,12.5,0.25\n"
    jobs = read_spot_csv(text)
    assert jobs == [
        SpotJob(0, "ml.p4d.24xlarge", 16, 12.5, 12.5, 0.25),
        SpotJob(12, "ml.p5.48xlarge", 4, 6, 48, 1),
    ]
    assert read_spot_csv(write_spot_csv(jobs)) == jobs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEADER, "spot jobs: the first line must be the header arrival_h,instance_type,count,run_h,"),
        (SPOT_HEADER + "0,ml.p5.48xlarge,4,6,48\n", "spot jobs line 2: 5 columns, not 6"),
        (SPOT_HEADER + "0,,4,6,48,1\n", "spot jobs line 2, instance_type: '' is empty"),
        (
            SPOT_HEADER + "0,ml.p5.48xlarge,4,0,48,1\n",
            "spot jobs line 2, run_h: '0' is not a number of hours above 0",
        ),
        (
            SPOT_HEADER + "0,ml.p5.48xlarge,4,6,5,1\n",
            "spot jobs line 2, max_wait_h: '5' is shorter than run_h",
        ),
        (
            SPOT_HEADER + "0,ml.p5.48xlarge,4,6,48,-1\n",
            "spot jobs line 2, checkpoint_h: '-1' is not a number",
        ),
        (
            SPOT_HEADER + "0,ml.p5.48xlarge,1.5,6,48,1\n",
            "spot jobs line 2, count: '1.5' is not a positive whole",
        ),
    ],
)
def test_a_bad_spot_job_names_the_line_and_column(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        read_spot_csv(text)
    assert caught.value.message.startswith(message)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_generators_are_seeded_and_keep_to_their_shape(shape: str) -> None:
    spec = WorkloadSpec(shape=shape)
    requests = generate(spec, 7)
    assert requests == generate(spec, 7) != generate(spec, 8)
    assert {r.count for r in requests} <= {1, 2, 4, 8, 16, 32}  # powers of two, up to half the pool
    assert all(1 <= r.days <= 28 for r in requests)
    assert all(0 <= r.arrival_h <= 28 * 24 for r in requests)
    demand = sum(r.instance_days for r in requests)
    assert 1.3 * 64 * 56 <= demand < 1.3 * 64 * 56 + 32 * 28  # 1.3 x the pool over 8 weeks, just past
    for r in requests:
        assert r.start_after_h is not None and r.end_before_h is not None
        assert r.arrival_h <= r.start_after_h and r.end_before_h - r.start_after_h >= 24 * (r.days + 1)


# What the generator wrote before issue 54's knobs, seed for seed: the first 16 hex digits of the SHA-256
# of write_csv(generate(spec, seed)).
BEFORE_THE_KNOBS = [
    (WorkloadSpec(shape="helios"), 0, "e0e26ddd66ea0e9d"),
    (WorkloadSpec(shape="helios"), 3, "b4ac1ae9c6ff9f58"),
    (WorkloadSpec(shape="pai"), 0, "2595a5d78e31ced3"),
    (WorkloadSpec(shape="pai"), 3, "28d9869df422b57f"),
    (WorkloadSpec(shape="philly"), 0, "62c510bafbd700fb"),
    (WorkloadSpec(shape="philly"), 3, "aff95313848c8396"),
    (
        WorkloadSpec(
            pool_size=16, span_days=21, arrival_days=10, max_days=10, default_window_share=0.3,
            slack=(1.2, 2.0), max_delay_days=3,
        ),
        5,
        "d5831528a79a3756",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "seed", "digest"), BEFORE_THE_KNOBS)
def test_the_knobs_left_at_their_defaults_give_the_workloads_of_before(
    spec: WorkloadSpec, seed: int, digest: str
) -> None:
    written = write_csv(generate(spec, seed))
    assert hashlib.sha256(written.encode()).hexdigest()[:16] == digest


ISSUE_LEADS = (1 / 48, 1, 3, 7, 14)  # days, each plus up to a day
ISSUE_SLACKS = (0, 1, 2, 7, 14)  # days, each plus a day


def test_the_issue54_preset_is_issue_54s_workload() -> None:
    """One pool of 64 over 8 weeks; gangs of powers of two up to 32, the small ones most frequent; whole
    days 1-28 with a median of 3; arrivals over 4 weeks until 1.3 x the capacity is offered; lead times
    and slack from the issue's sets; windows cut at the span; buyers taking the first offering."""
    spec = preset("issue54")
    assert spec is PRESETS["issue54"] and (spec.pool_size, spec.zones, spec.span_days) == (64, 1, 56)
    pooled: list[WorkloadRequest] = []
    for seed in range(3):
        requests = generate(spec, seed)
        assert requests == generate(spec, seed)
        demand = sum(r.instance_days for r in requests)
        assert 1.3 * 64 * 56 <= demand < 1.3 * 64 * 56 + 32 * 28
        pooled += requests
    span_h = 56 * 24
    for r in pooled:
        assert r.count in {1, 2, 4, 8, 16, 32} and 1 <= r.days <= 28 and 0 <= r.arrival_h <= 28 * 24
        assert r.choice == "first" and r.start_after_h is not None and r.end_before_h is not None
        lead = (r.start_after_h - r.arrival_h) / 24  # to the half hour
        assert any(v - 1 / 48 <= lead <= v + 1 + 1 / 48 for v in ISSUE_LEADS), r
        slack = (r.end_before_h - r.start_after_h) / 24 - r.days  # the window's end to the hour
        if r.end_before_h < span_h:
            assert any(abs(slack - (v + 1)) <= 1 / 24 for v in ISSUE_SLACKS), r
        else:
            assert r.end_before_h == span_h and slack <= 15 + 1 / 24, r
    counts = Counter(r.count for r in pooled)
    assert [counts[c] for c in (1, 2, 4, 8, 16, 32)] == sorted(counts.values(), reverse=True)
    assert statistics.median(r.days for r in pooled) == 3
    assert any(r.days >= 14 for r in pooled)  # heavy tailed
    # Cut at the span, some windows no longer hold their plan: they stay so (no one can book them).
    cut = [r for r in pooled if r.end_before_h == span_h]
    assert any(
        r.end_before_h - r.start_after_h < 24 * r.days for r in cut if r.start_after_h and r.end_before_h
    )


def test_an_unknown_preset_is_refused_naming_those_there_are() -> None:
    with pytest.raises(ValidationError, match="workload preset 'nope': one of issue54"):
        preset("nope")


def test_a_mix_draws_its_days_by_weight_plus_its_extra_and_up_to_its_jitter() -> None:
    rng = random.Random(1)
    mix = Mix((0, 10), weights=(3, 1), plus=1, jitter=0.5)
    draws = [mix.draw(rng) for _ in range(4000)]
    assert all(1 <= d < 1.5 or 11 <= d < 11.5 for d in draws)
    assert 0.7 < sum(d < 2 for d in draws) / len(draws) < 0.8  # 3 to 1
    assert {Mix((2, 5)).draw(rng) for _ in range(200)} == {2, 5}  # no weights: equally, no jitter
    assert LEAD_MIXES["issue54"].describe() == "{0.5 h, 1 d, 3 d, 7 d, 14 d} + up to 1 d"
    assert SLACK_MIXES["issue54"].describe() == "{0 d, 1 d, 2 d, 7 d, 14 d} + 1 d"
    assert mix.describe() == "{0 d, 10 d} weighted 3/1 + 1 d + up to 12 h"


def test_the_span_cuts_windows_and_keep_fit_says_whether_they_still_hold_their_plan() -> None:
    late = replace(preset("issue54"), lead=Mix((20,)), slack_days=Mix((0,), plus=1))
    cut, kept = generate(late, 0), generate(replace(late, keep_fit=True), 0)
    assert [(r.arrival_h, r.count, r.days, r.start_after_h) for r in cut] == [
        (r.arrival_h, r.count, r.days, r.start_after_h) for r in kept
    ]
    assert all(r.end_before_h is not None and r.end_before_h <= 56 * 24 for r in cut)
    assert any(
        r.end_before_h - r.start_after_h < 24 * r.days for r in cut if r.end_before_h and r.start_after_h
    )
    for r in kept:
        assert r.end_before_h is not None and r.start_after_h is not None
        assert r.end_before_h - r.start_after_h >= 24 * (r.days + 1)
    assert any(r.end_before_h is not None and r.end_before_h > 56 * 24 for r in kept)


def test_zones_count_in_the_capacity_and_the_shape_can_be_overridden() -> None:
    two = generate(WorkloadSpec(zones=2), 2)
    assert 1.3 * 2 * 64 * 56 <= sum(r.instance_days for r in two) < 1.3 * 2 * 64 * 56 + 32 * 28
    assert max(r.count for r in two) <= 32  # gangs still up to half of one pool
    singles = generate(WorkloadSpec(count_weights=(1,), tail=5.0, max_days=20), 2)
    assert {r.count for r in singles} == {1}
    heavy = generate(WorkloadSpec(count_weights=(1,), tail=0.2, max_days=20), 2)
    assert statistics.mean(r.days for r in singles) < statistics.mean(r.days for r in heavy)


def test_the_grid_s_mixes_leave_sizes_and_arrivals_as_they_are() -> None:
    """Lead times and slack are drawn after the sizes and arrivals: two points of the bench's grid at one
    load and seed differ only in their windows."""
    base = preset("issue54")
    a = generate(replace(base, lead=LEAD_MIXES["soon"], slack_days=SLACK_MIXES["tight"]), 4)
    b = generate(replace(base, lead=LEAD_MIXES["ahead"], slack_days=SLACK_MIXES["loose"]), 4)
    assert [(r.arrival_h, r.count, r.days) for r in a] == [(r.arrival_h, r.count, r.days) for r in b]
    assert [r.start_after_h for r in a] != [r.start_after_h for r in b]
