"""Borrowing in the simulator (core/borrowing.py, docs/PLANNING.md): what booked plans lend to spot jobs
while their owners are not busy. Random plans, busy intervals and spot jobs keep the rules an owner and a
borrower rely on (nothing lent that the owner uses or was promised back, every instance-hour counted
once, completed jobs ran long enough); worked examples pin the figures down."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.core.borrowing import (
    COMPLETED,
    DROPPED,
    HOUR,
    RECLAIMED,
    BorrowingOutcome,
    LendingSegment,
    borrowers,
    lending_segments,
    simulate_borrowing,
)
from hyperplan.core.fleet import SpotPolicy
from hyperplan.core.offerings import Offering, Segment
from hyperplan.core.spot import lending_from, stop_lending_at
from hyperplan.core.workloads import SpotJob

from .support import fleet, pool, utc

P5, P4 = "ml.p5.48xlarge", "ml.p4d.24xlarge"
P5A, P5B, P4A = (P5, "us-west-2a"), (P5, "us-west-2b"), (P4, "us-west-2a")
HOUR0 = utc(2026, 3, 2, 11, 30)
LEAD = timedelta(minutes=30)  # the default reclaim lead of training-job plans
SPOT = SpotPolicy(notice=timedelta(minutes=2), min_run=timedelta(minutes=30), stop_margin=timedelta(hours=1))
FLEET = replace(
    fleet(pool("a", 16, "10.00"), pool("b", 16, "10.00"), pool("a", 16, "20.00", kind=P4)), spot=SPOT
)
LENDING = lending_from(SPOT)


def at(hours: float) -> datetime:
    return HOUR0 + hours * HOUR


def segment(
    plan: int,
    start_h: float,
    end_h: float,
    count: int,
    *busy_h: tuple[float, float],
    key: tuple[str, str] = P5A,
) -> LendingSegment:
    return LendingSegment(
        plan, key, at(start_h), at(end_h), at(end_h) - LEAD, count, tuple((at(a), at(b)) for a, b in busy_h)
    )


def job(
    arrival_h: float, count: int, run_h: float, max_wait_h: float = 1000, checkpoint_h: float = 1
) -> SpotJob:
    return SpotJob(arrival_h, P5, count, run_h, max_wait_h, checkpoint_h)


def simulate(segments: list[LendingSegment], jobs: list[SpotJob]) -> BorrowingOutcome:
    return simulate_borrowing(segments, borrowers(jobs, HOUR0), FLEET, 2)


def hours(instance_time: timedelta) -> float:
    return instance_time / HOUR


def runs_of(outcome: BorrowingOutcome, borrower: int) -> list[tuple[float, float, str]]:
    return [
        ((run.start - HOUR0) / HOUR, (run.end - HOUR0) / HOUR, run.ended_by)
        for run in outcome.runs
        if run.borrower == borrower
    ]


# -- worked examples ---------------------------------------------------------------------------------


def test_a_borrower_is_reclaimed_when_the_owner_comes_and_resumes_when_the_owner_is_done() -> None:
    # A plan of 8 for two days, its owner busy from hour 10 to 20.
    plan = segment(1, 0, 48, 8, (10, 20))
    outcome = simulate([plan], [job(0, 4, 15), job(1, 4, 3.5), job(2, 2, 2)])
    # The first runs 10 hours, is taken back at hour 10 and resumes at 20 for the 5 it still needs.
    assert runs_of(outcome, 0) == [(0, 10, RECLAIMED), (20, 25, COMPLETED)]
    assert runs_of(outcome, 1) == [(1, 4.5, COMPLETED)]
    assert runs_of(outcome, 2) == [(4.5, 6.5, COMPLETED)]  # waits for the 4 lent to the second
    assert (outcome.reclaims, outcome.promises_kept, outcome.completed, outcome.dropped) == (1, 1, 3, 0)
    assert hours(outcome.reserved) == 8 * 48
    assert hours(outcome.busy) == 8 * 10
    assert hours(outcome.lent) == 4 * 15 + 4 * 3.5 + 2 * 2
    assert hours(outcome.idle) == 8 * 48 - 8 * 10 - 78
    # 78 instance-hours at 0.35 x 10.00, run by run; the owner gets 0.8 of each charge.
    assert outcome.revenue == Decimal("273.00")
    assert outcome.credits == Decimal("218.40")


def test_a_reclaim_loses_the_work_since_the_last_checkpoint() -> None:
    outcome = simulate([segment(1, 0, 48, 8, (10, 20))], [job(0, 2, 12, checkpoint_h=4)])
    # 10 hours run, checkpoints at 4 and 8: 2 hours lost, so 12 - 8 = 4 more after the owner is done.
    assert runs_of(outcome, 0) == [(0, 10, RECLAIMED), (20, 24, COMPLETED)]
    assert hours(outcome.lost) == 2 * 2
    assert hours(outcome.lent) == 2 * 14


def test_a_later_job_that_fits_starts_before_an_earlier_one_that_does_not() -> None:
    outcome = simulate([segment(1, 0, 48, 4, (0, 5))], [job(0, 8, 1), job(1, 2, 3), job(2, 3, 1)])
    assert runs_of(outcome, 0) == []  # 8 never fit a plan of 4
    assert runs_of(outcome, 1) == [(5, 8, COMPLETED)]
    assert runs_of(outcome, 2) == [(8, 9, COMPLETED)]  # 3 more did not fit beside the 2
    assert outcome.dropped == 1 and outcome.completed == 2


def test_a_job_whose_wait_runs_out_is_dropped_waiting_or_running() -> None:
    outcome = simulate(
        [segment(1, 0, 48, 4, (0, 10))], [job(0, 4, 2, max_wait_h=5), job(1, 4, 8, max_wait_h=14)]
    )
    assert runs_of(outcome, 0) == []  # its 5 hours pass while the owner is busy
    assert runs_of(outcome, 1) == [(10, 15, DROPPED)]  # 14 hours from its arrival at 1
    assert (outcome.completed, outcome.dropped) == (0, 2)


def test_lending_stops_before_the_segment_is_reclaimed_and_borrowers_left_are_taken_back() -> None:
    # Reclaimed at hour 24 less 30 minutes; the margin of an hour: lending stops at 22.5.
    plan = segment(1, 0, 24, 4, (0, 22))
    outcome = simulate([plan], [job(21, 2, 5), job(22.1, 2, 1)])
    assert runs_of(outcome, 0) == [(22, 22.5, RECLAIMED)]  # started with its 30-minute minimum run to go
    assert runs_of(outcome, 1) == []  # too late for a minimum run: it waits and is never placed
    (reclaimed,) = [run for run in outcome.runs if run.ended_by == RECLAIMED]
    assert reclaimed.deadline == at(22.5) + SPOT.notice and reclaimed.promise_kept


def test_a_spot_job_takes_the_segment_that_stops_lending_last() -> None:
    early, late = segment(1, 0, 24, 4, key=P5A), segment(2, 0, 48, 4, key=P5B)  # never busy
    outcome = simulate([early, late], [job(0, 2, 1)])
    assert [run.segment for run in outcome.runs] == [1]


def test_a_spot_job_borrows_only_its_own_type() -> None:
    outcome = simulate([segment(1, 0, 48, 8, key=P4A)], [job(0, 2, 1, max_wait_h=10)])
    assert outcome.runs == () and outcome.dropped == 1
    assert hours(outcome.lent) == 0 and hours(outcome.idle) == 8 * 48


def test_a_plan_without_busy_intervals_is_busy_the_whole_plan_and_lends_nothing() -> None:
    two_days = Offering(
        "training-job",
        (Segment(P5A, at(0), at(24), 4), Segment(P5B, at(48), at(72), 4)),
        Decimal("1.00"),
        "USD",
    )
    (first, second) = lending_segments(1, two_days, (), FLEET)
    assert first.busy == ((at(0), at(24)),) and second.busy == ((at(48), at(72)),)
    outcome = simulate([first, second], [job(0, 1, 1)])
    assert (hours(outcome.busy), hours(outcome.idle), hours(outcome.lent)) == (192, 0, 0)
    # Busy hours count from the plan's start, cut to each segment; the gap between them holds nothing.
    first, second = lending_segments(1, two_days, ((20, 50), (60, 61)), FLEET)
    assert first.busy == ((at(20), at(24)),)
    assert second.busy == ((at(48), at(50)), (at(60), at(61)))
    assert first.reclaim_at == at(24) - LEAD


# -- properties over random plans, busy intervals and spot jobs ---------------------------------------

MINUTES = st.integers(min_value=0, max_value=72 * 60)


@st.composite
def plans(draw: st.DrawFn) -> list[LendingSegment]:
    """Up to four plans of one or two segments in three pools, each with busy intervals in minutes."""
    segments = []
    for plan in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from([P5A, P5B, P4A]))
        count = draw(st.integers(1, 8))
        cuts = sorted(draw(st.lists(MINUTES, min_size=2, max_size=4, unique=True)))
        spans = list(zip(cuts[0::2], cuts[1::2], strict=False))
        busy_cuts = sorted(draw(st.lists(MINUTES, max_size=6, unique=True)))
        busy = [(at(a / 60), at(b / 60)) for a, b in zip(busy_cuts[0::2], busy_cuts[1::2], strict=False)]
        for low, high in spans:
            start, end = at(low / 60), at(high / 60)
            cut = tuple((max(a, start), min(b, end)) for a, b in busy if a < end and b > start)
            segments.append(LendingSegment(plan, key, start, end, end - LEAD, count, cut))
    return segments


JOBS = st.lists(
    st.builds(
        SpotJob,
        arrival_h=st.integers(0, 60 * 60).map(lambda m: m / 60),
        instance_type=st.sampled_from([P5, P4]),
        count=st.integers(1, 8),
        run_h=st.integers(1, 20 * 60).map(lambda m: m / 60),
        max_wait_h=st.integers(20 * 60, 60 * 60).map(lambda m: m / 60),
        checkpoint_h=st.integers(1, 5 * 60).map(lambda m: m / 60),
    ),
    max_size=12,
)


def lent_at(outcome: BorrowingOutcome, index: int, now: datetime) -> int:
    return sum(run.count for run in outcome.runs if run.segment == index and run.start <= now < run.end)


@settings(max_examples=150)
@given(plans(), JOBS)
def test_nothing_is_lent_that_the_owner_uses_and_every_instance_hour_is_counted_once(
    segments: list[LendingSegment], jobs: list[SpotJob]
) -> None:
    outcome = simulate(segments, jobs)
    for index, plan in enumerate(segments):
        # Lent grows only when a run starts, busy only when an interval starts: checking there is enough.
        instants = {run.start for run in outcome.runs if run.segment == index} | {low for low, _ in plan.busy}
        for now in instants:
            assert lent_at(outcome, index, now) <= plan.count - plan.owner_use(now)
    assert outcome.idle + outcome.busy + outcome.lent == outcome.reserved
    assert min(outcome.idle, outcome.busy, outcome.lent) >= timedelta(0)
    assert outcome.lent == sum(((run.end - run.start) * run.count for run in outcome.runs), timedelta(0))
    assert outcome.busy == sum(
        ((high - low) * plan.count for plan in segments for low, high in plan.busy), timedelta(0)
    )


@settings(max_examples=150)
@given(plans(), JOBS)
def test_a_borrower_never_runs_while_the_owner_is_busy_or_past_the_stop_lending_point_and_its_notice(
    segments: list[LendingSegment], jobs: list[SpotJob]
) -> None:
    outcome = simulate(segments, jobs)
    for run in outcome.runs:
        plan = segments[run.segment]
        stop = stop_lending_at(plan.reclaim_at, LENDING)
        assert plan.start <= run.start and run.start + LENDING.min_run <= stop  # may_start_loan's rule
        assert run.end <= stop + LENDING.notice
        assert all(run.end <= low or high <= run.start for low, high in plan.busy)
        if run.ended_by == RECLAIMED:
            assert run.deadline is not None and run.end <= run.deadline <= run.end + LENDING.notice
            assert run.promise_kept
    assert outcome.promises_kept == outcome.reclaims == sum(run.ended_by == RECLAIMED for run in outcome.runs)


@settings(max_examples=150)
@given(plans(), JOBS)
def test_every_job_completes_or_is_dropped_and_a_completed_one_ran_at_least_what_it_needs(
    segments: list[LendingSegment], jobs: list[SpotJob]
) -> None:
    outcome = simulate(segments, jobs)
    assert outcome.completed + outcome.dropped == outcome.jobs == len(jobs)
    for number, borrower in enumerate(borrowers(jobs, HOUR0)):
        runs = [run for run in outcome.runs if run.borrower == number]
        assert all(segments[run.segment].pool_key[0] == borrower.instance_type for run in runs)
        assert all(borrower.arrival <= run.start and run.end <= borrower.deadline for run in runs)
        assert all(a.end <= b.start for a, b in pairwise(runs))  # one run at a time
        if runs and runs[-1].ended_by == COMPLETED:
            assert sum((run.end - run.start for run in runs), timedelta(0)) >= borrower.work
            assert all(run.ended_by == RECLAIMED for run in runs[:-1])
    assert outcome.completed == sum(run.ended_by == COMPLETED for run in outcome.runs)
    assert Decimal(0) <= outcome.credits <= outcome.revenue
