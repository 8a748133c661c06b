"""Workloads for the simulator (docs/PLANNING.md): the CSV read and written back, with or without the
owners' busy intervals, and the spot jobs' CSV; their refusals naming the line and the column; and the
seeded generators keeping to the shapes they promise."""

from __future__ import annotations

import pytest

from hyperplan.core.workloads import (
    SHAPES,
    SpotJob,
    WorkloadRequest,
    WorkloadSpec,
    generate,
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
