"""Workloads for the simulator (docs/PLANNING.md): the CSV read and written back, its refusals naming
the line and the column, and the seeded generators keeping to the shapes they promise."""

from __future__ import annotations

import pytest

from hyperplan.core.workloads import SHAPES, WorkloadRequest, WorkloadSpec, generate, read_csv, write_csv
from hyperplan.errors import ValidationError

HEADER = "arrival_h,instance_type,count,days,start_after_h,end_before_h,target,choice\n"


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
