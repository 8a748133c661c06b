"""Borrowing in the planner's simulator (`hyperplan simulate --spot`, docs/PLANNING.md): what the plans a
ranking booked would have lent to a workload's spot jobs, replayed in events. Pure: no clock, no store;
the rules of lending are core/spot.py's, as the server applies them (services/jobs/spot.py).

Every booked plan lends (mode ``idle``, the fleet's default notice, minimum run and stop-lending margin).
Its owner's work uses all of its instances during the owner's busy intervals and none outside them, so a
segment's instances are at every instant busy, lent or idle, and ``idle = reserved - busy - lent``.

- **Starts.** A waiting spot job starts on the idle instances of one segment of its type that is not
  busy, may start a loan now (``may_start_loan``: before the stop-lending point, with room for the
  minimum run) and has all the instances it needs free; of those, the segment that stops lending last
  (as the server chooses). Waiting jobs are served oldest first; a later one that fits starts when an
  earlier one does not (backfill).
- **Reclaims.** When an owner's busy interval starts, the borrowers on the plan are taken back
  (``choose_reclaims`` for the instances the owner needs: all of them); at a segment's stop-lending
  point every borrower left is too. A borrower told exits at once (a spot job exits on SIGTERM), so the
  owner has the instances at the reclaim itself, within the deadline (``reclaim_deadline``): the promise
  is judged with ``promise_kept``. The borrower goes back to its last periodic checkpoint (the work since
  is lost) and waits again.
- **Ends.** A job completes when its running hours since its last saved checkpoint reach the work it
  needs; it is dropped when its maximum wait, counted from its arrival over waits and runs alike, runs
  out (a running one stops then, as SageMaker's ``MaxWaitTimeExceeded``).
- **Money.** Each run is charged per second at the spot price (``spot_price`` of the pool's on-demand
  price, ``run_charge``); the plan's owner is credited its share (``owner_credit``).

Left out: on-demand capacity (a spot job here borrows only, whatever the fleet's ``prefer``), owners'
work that needs part of a plan (a busy interval takes it whole), the time a borrower takes to exit (so no
promise is broken here), the work a checkpoint on SIGTERM would save (only the periodic ones count), and
the accounts (a plan lends to every spot job, its owner's included).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

from hyperplan.core.fleet import Fleet, PoolKey
from hyperplan.core.offerings import Offering
from hyperplan.core.spot import (
    Lending,
    Loan,
    choose_reclaims,
    lendable,
    lending_from,
    may_start_loan,
    owner_credit,
    promise_kept,
    reclaim_deadline,
    run_charge,
    spot_price,
    stop_lending_at,
)
from hyperplan.core.workloads import Hours, SpotJob

HOUR = timedelta(hours=1)
Interval = tuple[datetime, datetime]  # [start, end)

COMPLETED, RECLAIMED, DROPPED = "completed", "reclaimed", "dropped"  # how a run ended


@dataclass(frozen=True)
class LendingSegment:
    """One segment of a booked plan, as a lender: its instances, when they are the plan's, and when its
    owner's work uses them all."""

    plan: int  # the booked plan's number (all of a plan's segments share it and its busy intervals)
    pool_key: PoolKey
    start: datetime
    end: datetime
    reclaim_at: datetime  # the segment's end less the fleet's reclaim lead for the plan's target
    count: int
    busy: tuple[Interval, ...]  # the owner's busy intervals inside [start, end), sorted and disjoint

    def owner_use(self, now: datetime) -> int:
        """The instances the owner's work uses at ``now``: all of them in a busy interval, else none."""
        return self.count if any(low <= now < high for low, high in self.busy) else 0


@dataclass(frozen=True)
class Borrower:
    """A spot job as the model runs it, in times rather than the workload's hours."""

    number: int  # its line's order in the spot jobs (oldest first: by arrival, then this)
    instance_type: str
    count: int
    arrival: datetime
    work: timedelta  # the running time it needs to complete
    deadline: datetime  # its arrival plus its maximum wait: it is dropped then if not complete
    checkpoint: timedelta  # running time between its checkpoints

    def saved(self, progress: timedelta, ran: timedelta) -> timedelta:
        """Its progress kept after a run of ``ran`` that started from ``progress``: the run's whole
        checkpoints only (each checkpoint is taken ``checkpoint`` into the run, and at every multiple). A
        checkpoint interval too short to be a microsecond keeps it all."""
        if self.checkpoint <= timedelta(0):
            return progress + ran
        return progress + self.checkpoint * math.floor(ran / self.checkpoint)


@dataclass(frozen=True)
class Run:
    """A borrower's time on one segment's instances, from its start until it gave them back."""

    borrower: int
    segment: int  # index into the segments replayed
    count: int
    start: datetime
    end: datetime
    ended_by: str  # COMPLETED, RECLAIMED or DROPPED
    lost: timedelta = timedelta(0)  # work since its last checkpoint, lost at a reclaim
    deadline: datetime | None = None  # a reclaimed run's: when it had to be gone at the latest
    promise_kept: bool | None = None  # a reclaimed run's: whether the owner had the instances in time


@dataclass(frozen=True)
class BorrowingOutcome:
    """What the plans of one ranking lent. Instance-times are instances x time (exact timedeltas; divide
    by ``HOUR`` for instance-hours): ``reserved`` is every segment's count over its length, and ``busy``,
    ``lent`` and ``idle`` are measured instant by instant, so they add up to it only if no instant lent
    more than the owner left idle."""

    reserved: timedelta
    busy: timedelta
    idle: timedelta
    lent: timedelta
    lost: timedelta  # of the lent time, the work lost at reclaims (redone after the borrower resumes)
    reclaims: int  # borrower runs taken back
    promises_kept: int
    jobs: int
    completed: int
    dropped: int
    revenue: Decimal  # what the borrowers paid, at the spot price
    credits: Decimal  # what the plans' owners were credited of it
    runs: tuple[Run, ...]


# -- the inputs, from what was booked and the workload's hours -----------------------------------------


def lending_segments(
    plan: int, offering: Offering, busy_h: tuple[Hours, ...], fleet: Fleet
) -> list[LendingSegment]:
    """A booked plan's segments as lenders; ``busy_h`` are hours from the plan's start (its first
    segment's), each interval cut to the segments it meets. No busy interval at all is the workload's
    "busy the whole plan", the assumption before busy intervals were given: such a plan lends nothing."""
    lead = fleet.policy.reclaim_lead_for(offering.target)
    if busy_h:
        busy = [(offering.start + low * HOUR, offering.start + high * HOUR) for low, high in busy_h]
    else:
        busy = [(offering.start, offering.end)]
    return [
        LendingSegment(
            plan=plan,
            pool_key=segment.pool_key,
            start=segment.start,
            end=segment.end,
            reclaim_at=segment.end - lead,
            count=segment.count,
            busy=tuple(
                (max(low, segment.start), min(high, segment.end))
                for low, high in busy
                if low < segment.end and high > segment.start
            ),
        )
        for segment in offering.segments
    ]


def borrowers(jobs: Sequence[SpotJob], hour0: datetime) -> list[Borrower]:
    """The workload's spot jobs in times from ``hour0``, oldest first."""
    ordered = sorted(enumerate(jobs), key=lambda pair: (pair[1].arrival_h, pair[0]))
    return [
        Borrower(
            number=number,
            instance_type=job.instance_type,
            count=job.count,
            arrival=hour0 + job.arrival_h * HOUR,
            work=job.run_h * HOUR,
            deadline=hour0 + (job.arrival_h + job.max_wait_h) * HOUR,
            checkpoint=job.checkpoint_h * HOUR,
        )
        for number, (_, job) in enumerate(ordered)
    ]


# -- the replay ----------------------------------------------------------------------------------------


@dataclass
class _Open:
    """A borrower's run under way."""

    segment: int
    start: datetime
    progress: timedelta  # the work saved when it started (it resumes from there)


@dataclass
class _Replay:
    """The replay's state between events: who waits, who runs where since when, what each job has
    saved, and the instance-time counted so far."""

    segments: Sequence[LendingSegment]
    borrowers: Sequence[Borrower]
    fleet: Fleet
    lending: Lending
    arrived: int = 0  # borrowers[:arrived] have arrived
    waiting: list[int] = field(default_factory=list)  # borrower numbers, oldest first
    open: dict[int, _Open] = field(default_factory=dict)
    progress: dict[int, timedelta] = field(default_factory=dict)
    ended: dict[int, str] = field(default_factory=dict)  # COMPLETED or DROPPED
    runs: list[Run] = field(default_factory=list)
    busy: timedelta = timedelta(0)
    lent: timedelta = timedelta(0)
    idle: timedelta = timedelta(0)

    def step(self, now: datetime) -> None:
        """Everything due at ``now``: ends first (completions before drops, drops before reclaims, so a
        borrower finishing as the owner comes has finished), then arrivals and starts."""
        self._complete(now)
        self._drop(now)
        self._reclaim(now)
        while self.arrived < len(self.borrowers) and self.borrowers[self.arrived].arrival <= now:
            self.waiting.append(self.arrived)
            self.arrived += 1
        self._start(now)

    def next_completion(self) -> datetime | None:
        ends = [run.start + self.borrowers[number].work - run.progress for number, run in self.open.items()]
        return min(ends, default=None)

    def account(self, now: datetime, until: datetime) -> None:
        """Each segment's instances over ``[now, until)``, in which nothing changes: busy, lent or idle."""
        lent_on = self._lent_per_segment()
        for index, segment in enumerate(self.segments):
            if not segment.start <= now < segment.end:
                continue
            busy = segment.owner_use(now)
            lent = lent_on.get(index, 0)
            self.busy += (until - now) * busy
            self.lent += (until - now) * lent
            self.idle += (until - now) * (segment.count - busy - lent)

    def _complete(self, now: datetime) -> None:
        for number, run in list(self.open.items()):
            borrower = self.borrowers[number]
            if run.start + borrower.work - run.progress <= now:
                self._end_run(number, now, COMPLETED)
                self.progress[number] = borrower.work
                self.ended[number] = COMPLETED

    def _drop(self, now: datetime) -> None:
        for number in [*self.open, *self.waiting]:
            if self.borrowers[number].deadline <= now and number not in self.ended:
                if number in self.open:
                    self._end_run(number, now, DROPPED)
                else:
                    self.waiting.remove(number)
                self.ended[number] = DROPPED

    def _reclaim(self, now: datetime) -> None:
        """Borrowers taken back from segments whose owner's work starts now, or that stop lending."""
        for index, segment in enumerate(self.segments):
            numbers = [number for number, run in self.open.items() if run.segment == index]
            if not numbers:
                continue
            if segment.owner_use(now):
                needed = sum(self.borrowers[number].count for number in numbers)  # the owner takes them all
            elif now >= stop_lending_at(segment.reclaim_at, self.lending):
                needed = segment.count  # every borrower left
            else:
                continue
            loans = [Loan(n, self.borrowers[n].count, self.open[n].start, False) for n in numbers]
            deadline = reclaim_deadline(now, self.lending, segment.reclaim_at)
            for number in choose_reclaims(loans, needed, now, self.lending):
                self._interrupt(number, now, deadline)

    def _interrupt(self, number: int, now: datetime, deadline: datetime) -> None:
        """The borrower told now exits at once: the owner has its instances now; it keeps its whole
        checkpoints and waits again, in its place among the oldest."""
        borrower, run = self.borrowers[number], self.open.pop(number)
        saved = borrower.saved(run.progress, now - run.start)
        self.runs.append(
            Run(
                number, run.segment, borrower.count, run.start, now, RECLAIMED,
                lost=run.progress + (now - run.start) - saved,
                deadline=deadline,
                promise_kept=promise_kept(now, now, deadline, self.fleet.spot.kill_grace),
            )
        )  # fmt: skip
        self.progress[number] = saved
        self.waiting = sorted([*self.waiting, number])

    def _start(self, now: datetime) -> None:
        """Waiting borrowers placed oldest first; a later one that fits starts when an earlier one
        does not. Each takes all its instances from one segment of its type: of those that lend it
        enough, the one that stops lending last (ties: the first booked), as the server chooses."""
        free = self._free_to_lend(now)
        for number in list(self.waiting):
            borrower = self.borrowers[number]
            fits = [
                index
                for index, count in free.items()
                if count >= borrower.count and self.segments[index].pool_key[0] == borrower.instance_type
            ]
            if not fits:
                continue
            chosen = max(fits, key=lambda index: (self._stops_lending(index), -index))
            free[chosen] -= borrower.count
            self.waiting.remove(number)
            self.open[number] = _Open(chosen, now, self.progress.get(number, timedelta(0)))

    def _stops_lending(self, index: int) -> datetime:
        return stop_lending_at(self.segments[index].reclaim_at, self.lending)

    def _free_to_lend(self, now: datetime) -> dict[int, int]:
        """The segments that may start a loan now (``may_start_loan``), with the instances each could
        lend (``lendable``: neither the owner's nor lent already)."""
        lent_on = self._lent_per_segment()
        return {
            index: lendable(segment.count, segment.owner_use(now), lent_on.get(index, 0))
            for index, segment in enumerate(self.segments)
            if segment.start <= now < segment.end and may_start_loan(now, segment.reclaim_at, self.lending)
        }

    def _lent_per_segment(self) -> dict[int, int]:
        lent: dict[int, int] = {}
        for number, run in self.open.items():
            lent[run.segment] = lent.get(run.segment, 0) + self.borrowers[number].count
        return lent

    def _end_run(self, number: int, now: datetime, how: str) -> None:
        run = self.open.pop(number)
        self.runs.append(Run(number, run.segment, self.borrowers[number].count, run.start, now, how))


def simulate_borrowing(
    segments: Sequence[LendingSegment], jobs: Sequence[Borrower], fleet: Fleet, places: int
) -> BorrowingOutcome:
    """The segments' lending to the spot jobs (oldest first, as :func:`borrowers` orders them), replayed
    from the first event to the last; ``places`` are the currency's decimal places, to which each run's
    charge and credit are rounded as the server rounds them."""
    replay = _Replay(segments, jobs, fleet, lending_from(fleet.spot))
    due = sorted(_event_times(segments, jobs, replay.lending), reverse=True)  # the soonest last
    now = due.pop() if due else None
    while now is not None:
        replay.step(now)
        while due and due[-1] <= now:
            due.pop()
        following = _soonest(due[-1] if due else None, replay.next_completion())
        if following is not None:
            replay.account(now, following)
        now = following
    return _outcome(replay, segments, jobs, fleet, places)


def _soonest(*times: datetime | None) -> datetime | None:
    return min((t for t in times if t is not None), default=None)


def _event_times(
    segments: Sequence[LendingSegment], jobs: Sequence[Borrower], lending: Lending
) -> set[datetime]:
    """The instants at which something may change, other than completions (which follow from starts)."""
    times: set[datetime] = set()
    for segment in segments:
        times.update((segment.start, segment.end, stop_lending_at(segment.reclaim_at, lending)))
        for low, high in segment.busy:
            times.update((low, high))
    for job in jobs:
        times.update((job.arrival, job.deadline))
    return times


def _outcome(
    replay: _Replay, segments: Sequence[LendingSegment], jobs: Sequence[Borrower], fleet: Fleet, places: int
) -> BorrowingOutcome:
    reclaimed = [run for run in replay.runs if run.ended_by == RECLAIMED]
    revenue, credits = _money(replay.runs, segments, fleet, places)
    return BorrowingOutcome(
        reserved=sum(((s.end - s.start) * s.count for s in segments), timedelta(0)),
        busy=replay.busy,
        idle=replay.idle,
        lent=replay.lent,
        lost=sum((run.lost * run.count for run in reclaimed), timedelta(0)),
        reclaims=len(reclaimed),
        promises_kept=sum(1 for run in reclaimed if run.promise_kept),
        jobs=len(jobs),
        completed=sum(1 for how in replay.ended.values() if how == COMPLETED),
        dropped=sum(1 for how in replay.ended.values() if how == DROPPED),
        revenue=revenue,
        credits=credits,
        runs=tuple(replay.runs),
    )


def _money(
    runs: Sequence[Run], segments: Sequence[LendingSegment], fleet: Fleet, places: int
) -> tuple[Decimal, Decimal]:
    """What the runs cost their borrowers and what the owners were credited, run by run as the server
    settles them."""
    pools = {pool.key: pool for pool in fleet.pools}
    revenue = credits = Decimal(0).scaleb(-places)
    for run in runs:
        pool = pools[segments[run.segment].pool_key]
        price = spot_price(pool.on_demand_price_per_instance_hour, fleet.spot)
        charge = run_charge(price, run.count, (run.end - run.start).total_seconds(), places)
        revenue += charge
        credits += owner_credit(charge, fleet.spot.lender_share, places)
    return revenue, credits
