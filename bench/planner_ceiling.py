"""A bench-side experiment (issue 54, point 2): how high can an online placement go on the planner's grid?
A ceiling measured by an oracle that knows the whole future. Not part of `make bench`.

Issue 54 asks ``packing`` for 5 points of the LP bound over ``earliest`` on average over the grid
(bench/planner_grid.py). This script asks whether any planner that must offer what fits could get there:

* **must offer** (the service's rule): every buyer takes the first offering, and a request is refused
  only when nothing fits. The oracle, at each request, tries *every* placement the request can take (every
  whole-day start of one segment in its window, the only starts the search offers; when no single segment
  fits, every two-segment split the search would list: the first part placed earliest, the second at
  the first fit a day after it), books it on a copy of the pool's daily free counts, replays the
  workload's *real* remaining requests with each base policy (``packing``, and ``earliest`` too with
  ``--bases``), and books the placement whose best rollout books the most instance-days. It holds a
  whole trajectory (at first ``packing``'s) and leaves it only for a candidate whose rollout books more
  than the rest of that trajectory would (then that rollout becomes the trajectory held), so it books
  at least what ``packing`` books on every workload. Column "pass 1".
* **passes** (``--passes N``, policy improvement): each further pass starts from the previous pass's
  trajectory and rolls out *its* placements (``packing``'s where one no longer fits) instead of
  ``packing``; each pass books at least what the one before did. Column "must offer": the last pass.
  A rollout of the previous oracle's recorded placements stands in for re-running that oracle inside
  every rollout, which would cost the workload's length again per step.
* **with refusals**: the same oracle, started from the must-offer oracle's final trajectory, may also
  offer nothing for a request that fits, when its rollouts (which follow the held trajectory's
  refusals too) book more without it. Column "refusals", "refuse+" its gain over "must offer": what
  admission control, one request at a time, adds to placement.

Every figure here is what one oracle reached, a floor under the best any planner of its kind could
reach with perfect knowledge, not a proof of the best.

The replay is a model of the search on whole days of one pool (the grid's fleet), written here in
numpy so that thousands of rollouts per workload are affordable: the window's days, the start limit,
``packing``'s score (edges, load and the far-ahead delay, hyperplan/core/search_days.py and
search_rank.py), ``earliest``'s order, and two-segment splits where no single segment fits (the
search's own candidates: the first part placed earliest, the second at the first fit a day after it;
``packing`` scores the first 24 in ``earliest``'s order). Its ``packing`` and ``earliest`` are checked
against ``replay_on_calendar`` (hyperplan/core/replay.py) on every workload: the table's "model
differs" column counts the workloads where they booked other instance-days (0 is expected).

    .venv/bin/python -m bench.planner_ceiling --seeds 5
    .venv/bin/python -m bench.planner_ceiling --seeds 2 --points issue54/issue54/1.3 --passes 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from bench.planner_grid import LOADS, Point, grid_fleet
from bench.server import BENCH_START
from hyperplan.core.bound import lp_bound
from hyperplan.core.fleet import Fleet
from hyperplan.core.replay import hour_zero, jobs_of, replay_on_calendar
from hyperplan.core.workloads import LEAD_MIXES, PRESETS, SLACK_MIXES, WorkloadRequest, generate

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

EDGE_WEIGHT = 5  # packing's (hyperplan/core/search_days.py _EDGE_WEIGHT)
FAR_AHEAD_DAYS = 8  # packing's (hyperplan/core/search_rank.py _FAR_AHEAD_DAYS, _DELAY_COST = 1)
SPLIT_POOL = 24  # packing scores this many of earliest's splits (_SPLIT_POOL x max_offerings 3)
NONE = 1 << 40  # "no such day", as search_days._NONE
LAST = np.iinfo(np.int64).max  # a key past every real one
CONVERGED_EVERY = 8  # rollout steps between checks that the rows still differ where it matters


@dataclass(frozen=True)
class Request:
    """A request as the search sees it, in whole days from hour 0: ``count`` instances for ``days`` days
    inside days [first, stop); the first segment starts by day ``first + start_limit``; ``far``: the
    window opens a week or more ahead (packing's delay cost applies)."""

    count: int
    days: int
    first: int
    stop: int
    start_limit: int
    far: bool

    @property
    def instance_days(self) -> int:
        return self.count * self.days

    @property
    def width(self) -> int:
        return max(self.stop - self.first, 0)


def as_request(fleet: Fleet, r: WorkloadRequest) -> Request:
    """The search's window (hyperplan/core/search_request.py) in days from hour 0."""
    policy = fleet.policy
    horizon_h = policy.horizon.total_seconds() / 3600
    start = r.arrival_h + policy.lead_time.total_seconds() / 3600
    if r.start_after_h is not None:
        start = max(start, r.start_after_h)
    soonest = math.ceil(start * 60 - 1e-6) / 60  # rounded up to the minute
    first = math.ceil(soonest / 24 - 1e-9)
    end = r.end_before_h if r.end_before_h is not None else r.arrival_h + horizon_h
    end = min(end, r.arrival_h + horizon_h + policy.max_days * 24)
    stop = max(math.floor(end / 24 + 1e-9), first)
    latest_start_day = math.floor((r.arrival_h + horizon_h - 24 * first) / 24 + 1e-9)
    days_ahead = math.ceil((24 * first - r.arrival_h) / 24 - 1e-9)
    return Request(r.count, r.days, first, stop, max(latest_start_day, 0), days_ahead >= FAR_AHEAD_DAYS)


@dataclass
class Placed:
    """Where each row's request went: up to two segments [s1, e1) and [s2, e2) in absolute days (e2 = s2
    for one segment); ``found`` False: nothing fits (refused)."""

    found: Bools
    s1: Ints
    e1: Ints
    s2: Ints
    e2: Ints

    def apply(self, free: Ints, count: int) -> None:
        days = np.arange(free.shape[1])[None, :]
        held = (days >= self.s1[:, None]) & (days < self.e1[:, None])
        held |= (days >= self.s2[:, None]) & (days < self.e2[:, None])
        free -= (held & self.found[:, None]) * count


def nothing(rows: int) -> Placed:
    zero = np.zeros(rows, dtype=np.int64)
    return Placed(np.zeros(rows, dtype=bool), zero, zero.copy(), zero.copy(), zero.copy())


def score_ends(window: Ints, count: int) -> tuple[Ints, Ints]:
    """packing's (opens, closes), (B, N + 1): a placement [s, e) of the window scores opens[s] + closes[e]
    + count (e - s) (+ the delay cost); as search_days.packing_ends, in whole numbers."""
    rows, n = window.shape
    step = np.zeros((rows, n + 1), dtype=np.int64)
    step[:, 0] = -window[:, 0]
    step[:, 1:n] = window[:, :-1] - window[:, 1:]
    before = np.zeros((rows, n + 1), dtype=np.int64)
    np.cumsum(window, axis=1, out=before[:, 1:])
    opens = EDGE_WEIGHT * (np.abs(step + count) - np.abs(step)) + before
    closes = EDGE_WEIGHT * (np.abs(step - count) - np.abs(step)) - before
    return opens, closes


def single_fits(window: Ints, r: Request) -> tuple[Bools, Ints]:
    """(B, S): whether one segment fits from each start the search may offer; and (B,) how many of the
    window's days hold the count (fewer than D: no split fits either)."""
    n = window.shape[1]
    starts = min(r.start_limit, n - r.days) + 1
    open_days = np.zeros((window.shape[0], n + 1), dtype=np.int64)
    np.cumsum(window >= r.count, axis=1, out=open_days[:, 1:])
    fits = open_days[:, r.days : r.days + starts] - open_days[:, :starts] == r.days
    return np.asarray(fits), open_days[:, n]


def single_scores(window: Ints, r: Request, starts: int) -> Ints:
    """(B, S): packing's score of one segment from each of the first ``starts`` days."""
    opens, closes = score_ends(window, r.count)
    score = opens[:, :starts] + closes[:, r.days : r.days + starts] + r.count * r.days
    if r.far:
        score = score + r.days * np.arange(starts)[None, :]
    return np.asarray(score)


@dataclass
class Splits:
    """Every two-segment candidate of each row, one per length d of the second part (d = 1 .. D - 1), in
    window days: the first part [s1, s1 + D - d) placed earliest, the second [s2, s2 + d) at the first
    fit a day after it; ``valid`` where both fit."""

    valid: Bools  # (B, D - 1)
    s1: Ints
    s2: Ints
    d: Ints  # (D - 1,)

    def finish(self) -> Ints:
        return np.asarray(self.s2 + self.d[None, :])


def splits(window: Ints, r: Request) -> Splits:
    """The search's two-segment candidates (search_plan._first_level and _final_level, one pool)."""
    rows, n = window.shape
    closed = np.ones((rows, n + 2), dtype=bool)
    closed[:, :n] = window < r.count
    index = np.arange(n + 2)
    next_closed = np.minimum.accumulate(np.where(closed, index, n + 2)[:, ::-1], axis=1)[:, ::-1]
    run = next_closed - index[None, :]  # (B, N + 2)
    lengths = np.arange(r.days + 1)
    long_enough = run[:, None, :] >= lengths[None, :, None]
    first = np.minimum.accumulate(np.where(long_enough, index, NONE)[:, :, ::-1], axis=2)[:, :, ::-1]
    d = np.arange(1, r.days)
    prefix = r.days - d
    b = np.arange(rows)[:, None]
    s1 = first[b, prefix[None, :], 0]
    ok1 = s1 <= r.start_limit
    after = np.minimum(np.where(ok1, s1 + prefix[None, :] + 1, n + 1), n + 1)
    s2 = first[b, d[None, :], after]
    return Splits(ok1 & (s2 < NONE), np.where(ok1, s1, 0), np.where(s2 < NONE, s2, 0), d)


def split_pick(window: Ints, r: Request, rule: str) -> tuple[Splits, Bools, Ints]:
    """Per row: the splits, whether one fits, and the index (into d) of the one ``rule`` offers first."""
    cand = splits(window, r)
    finish = cand.finish()
    d = cand.d[None, :]
    # earliest's order: finish, then (equal prices in one pool) d ascending
    order_key = np.where(cand.valid, finish * 64 + d, NONE)
    found = np.asarray(cand.valid.any(axis=1), dtype=bool)
    if rule == "earliest":
        return cand, found, np.asarray(order_key.argmin(axis=1))
    rank = np.argsort(np.argsort(order_key, axis=1, kind="stable"), axis=1, kind="stable")
    scored = cand.valid & (rank < SPLIT_POOL)
    opens, closes = score_ends(window, r.count)
    b = np.arange(window.shape[0])[:, None]
    prefix = r.days - d
    e1, e2 = cand.s1 + prefix, cand.s2 + d
    score = opens[b, cand.s1] + closes[b, e1] + opens[b, cand.s2] + closes[b, e2] + r.count * r.days
    if r.far:
        score = score + prefix * cand.s1 + d * cand.s2
    key = np.where(scored, (score * 256 + finish) * 64 + d, LAST)
    return cand, found, np.asarray(key.argmin(axis=1))


def place(free: Ints, r: Request, rule: str) -> Placed:
    """What a search ranked by ``rule`` offers first, per row of daily free counts (B, L)."""
    rows = free.shape[0]
    if r.width < r.days:
        return nothing(rows)
    window = free[:, r.first : r.stop]
    fits, open_total = single_fits(window, r)
    placed = nothing(rows)
    one = np.asarray(fits.any(axis=1), dtype=bool)
    if rule == "earliest":
        start = fits.argmax(axis=1)
    else:
        starts = fits.shape[1]
        score = single_scores(window, r, starts)
        start = np.where(fits, score * (window.shape[1] + 1) + np.arange(starts), LAST)
        start = start.argmin(axis=1)
    placed.found = one.copy()
    placed.s1 = r.first + start
    placed.e1 = placed.s1 + r.days
    rest = np.flatnonzero(~one & (open_total >= r.days)) if r.days > 1 else np.zeros(0, dtype=np.int64)
    if rest.size:
        cand, found, pick = split_pick(window[rest], r, rule)
        if found.any():
            at = np.arange(len(rest))
            d = cand.d[pick]
            placed.found[rest] = found
            placed.s1[rest] = np.where(found, r.first + cand.s1[at, pick], 0)
            placed.e1[rest] = np.where(found, placed.s1[rest] + r.days - d, 0)
            placed.s2[rest] = np.where(found, r.first + cand.s2[at, pick], 0)
            placed.e2[rest] = np.where(found, placed.s2[rest] + d, 0)
    return placed


def replay_model(requests: list[Request], capacity: int, span: int, rule: str) -> int:
    """Instance-days the model books replaying the workload with ``rule`` (first offering taken)."""
    free = np.full((1, span), capacity, dtype=np.int64)
    got = 0
    for r in requests:
        placed = place(free, r, rule)
        placed.apply(free, r.count)
        got += r.instance_days * int(placed.found[0])
    return got


def candidates(free: Ints, r: Request, refuse: bool) -> Placed:
    """Every placement the oracle may choose for ``r`` on one row ``free`` (1, L): each whole-day start
    of one segment that fits, or, when none does, each split the search lists; and nothing (a refusal)
    when ``refuse`` or when nothing fits."""
    parts: list[Placed] = []
    if r.width >= r.days:
        window = free[:, r.first : r.stop]
        fits = single_fits(window, r)[0][0]
        starts = np.flatnonzero(fits)
        if starts.size:
            s = r.first + starts
            zero = np.zeros(len(s), dtype=np.int64)
            parts.append(Placed(np.ones(len(s), dtype=bool), s, s + r.days, zero, zero.copy()))
        elif r.days > 1:
            cand = splits(window, r)
            keep = np.flatnonzero(cand.valid[0])
            if keep.size:
                d = cand.d[keep]
                s1, s2 = r.first + cand.s1[0, keep], r.first + cand.s2[0, keep]
                parts.append(Placed(np.ones(len(keep), dtype=bool), s1, s1 + r.days - d, s2, s2 + d))
    if refuse or not parts:
        parts.append(nothing(1))
    return Placed(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in ("found", "s1", "e1", "s2", "e2"))
    )


FIELDS = ("found", "s1", "e1", "s2", "e2")


def take(placed: Placed, row: int) -> Placed:
    """One row of ``placed``, as a Placed of one row."""
    return Placed(*(getattr(placed, f)[row : row + 1].copy() for f in FIELDS))


def stack(parts: Sequence[Placed]) -> Placed:
    return Placed(*(np.concatenate([getattr(p, f) for p in parts]) for f in FIELDS))


def decide(free: Ints, r: Request, rule: str, planned: Placed | None, refuse: bool) -> Placed:
    """Each row's placement of ``r`` by a base policy: ``packing`` or ``earliest``; or ``follow``: the
    placement ``planned`` (one row, a trajectory's) where it still fits, else packing's (a planned
    refusal is kept where refusals are allowed; else the request is offered what fits)."""
    if rule != "follow":
        return place(free, r, rule)
    assert planned is not None
    placed = place(free, r, "packing")
    if not planned.found[0]:
        if refuse:
            return nothing(free.shape[0])
        return placed
    days = np.arange(free.shape[1])
    held = ((days >= planned.s1[0]) & (days < planned.e1[0])) | (
        (days >= planned.s2[0]) & (days < planned.e2[0])
    )
    fits = (free[:, held] >= r.count).all(axis=1)
    for f in FIELDS:
        getattr(placed, f)[fits] = getattr(planned, f)[0]
    return placed


@dataclass(frozen=True)
class Future:
    """The requests after the current one, and what a rollout needs to know of them."""

    requests: Sequence[Request]
    relevant_from: Sequence[int]  # [j]: the first day request j or a later one can reach
    plan: Sequence[Placed]  # [j]: the trajectory's placement of request j (for ``follow``)
    refuse: bool


def rollout(free: Ints, future: Future, rule: str) -> Ints:
    """Instance-days each row books of the future's requests placed by ``rule`` (see :func:`decide`).
    Stops early once the rows agree on every day a request still to come can reach: from there on
    every row books alike."""
    free = free.copy()
    booked = np.zeros(free.shape[0], dtype=np.int64)
    for j, r in enumerate(future.requests):
        if j % CONVERGED_EVERY == 0:
            tail = free[:, future.relevant_from[j] :]
            if (tail == tail[0]).all():
                break
        placed = decide(free, r, rule, future.plan[j] if rule == "follow" else None, future.refuse)
        placed.apply(free, r.count)
        booked += placed.found * r.instance_days
    return booked


def trajectory(free: Ints, future: Future, rule: str) -> list[Placed]:
    """The placements of the future's requests by ``rule`` from one row ``free``, every one of them."""
    free = free.copy()
    out = []
    for j, r in enumerate(future.requests):
        placed = decide(free, r, rule, future.plan[j] if rule == "follow" else None, future.refuse)
        placed.apply(free, r.count)
        out.append(placed)
    return out


@dataclass
class OracleRun:
    booked: int = 0
    moved: int = 0  # requests where the oracle left the trajectory it held (packing's, at first)
    refused_fitting: int = 0  # requests refused although something fitted
    decisions: int = 0
    choices: int = 0  # requests with more than one placement to choose from
    plan: list[Placed] = field(default_factory=list)  # every request's placement, as booked


def oracle_replay(
    requests: list[Request], capacity: int, span: int, bases: Sequence[str], refuse: bool,
    plan: list[Placed] | None = None,
) -> OracleRun:  # fmt: skip
    """The workload replayed by the oracle (see the module's docstring). It holds a whole trajectory,
    at first ``plan`` (default: packing's), and leaves it only for a candidate whose rollout books more
    than the rest of the trajectory would: so it books at least what that trajectory books."""
    firsts = [r.first for r in requests]
    relevant = [min(firsts[j:]) for j in range(len(requests))] + [span]
    free = np.full((1, span), capacity, dtype=np.int64)
    if plan is None:
        plan = trajectory(free, Future(requests, relevant, [], refuse), "packing")
    plan = list(plan)
    ahead = sum(r.instance_days * int(p.found[0]) for r, p in zip(requests, plan, strict=True))
    run = OracleRun()
    for i, r in enumerate(requests):
        held = plan[i]
        run.decisions += 1
        options = candidates(free, r, refuse)
        if len(options.found) > 1:
            run.choices += 1
            rows = np.repeat(free, len(options.found), axis=0)
            options.apply(rows, r.count)
            future = Future(requests[i + 1 :], relevant[i + 1 :], plan[i + 1 :], refuse)
            values = {base: options.found * r.instance_days + rollout(rows, future, base) for base in bases}
            best_base = max(values, key=lambda base: int(values[base].max()))
            best = int(np.argmax(values[best_base]))
            if values[best_base][best] > ahead:
                chosen = take(options, best)
                rest = trajectory(rows[best : best + 1], future, best_base)
                plan[i:] = [chosen, *rest]
                ahead = int(values[best_base][best])
                run.moved += 1
                held = chosen
        run.refused_fitting += bool(options.found.any() and not held.found[0])
        held.apply(free, r.count)
        if (free < 0).any():
            raise AssertionError("the held trajectory no longer fits the calendar")
        got = r.instance_days * int(held.found[0])
        run.booked += got
        ahead -= got
        run.plan.append(held)
    return run


# -- the grid ----------------------------------------------------------------------------------------


COLUMNS = ("earliest", "packing", "pass 1", "must offer", "refusals")


@dataclass
class PointResult:
    point: Point
    shares: dict[str, list[float]] = field(default_factory=lambda: {c: [] for c in COLUMNS})
    model_differs: int = 0  # workloads where the model's packing or earliest booked other than the replay
    moved: int = 0
    refused_fitting: int = 0
    decisions: int = 0
    choices: int = 0
    seconds: float = 0.0

    def mean(self, column: str) -> float:
        return statistics.mean(self.shares[column])

    def below(self, column: str, other: str) -> int:
        return sum(a < b for a, b in zip(self.shares[column], self.shares[other], strict=True))


def measure(
    point: Point, seeds: Sequence[int], bases: Sequence[str], passes: int, with_refusals: bool
) -> PointResult:
    began = time.monotonic()
    spec = point.spec(PRESETS["issue54"])
    fleet = grid_fleet(spec)
    hour0 = hour_zero(BENCH_START, fleet)
    capacity = fleet.pools[0].reservable
    result = PointResult(point)
    for seed in seeds:
        workload = generate(spec, seed)
        bound = lp_bound(*jobs_of(fleet, workload))
        requests = [as_request(fleet, r) for r in workload]
        span = max([r.stop for r in requests] + [1]) + 1
        for ranking in ("earliest", "packing"):
            booked, _ = replay_on_calendar(fleet, workload, hour0, ranking)
            got = sum(b.request.instance_days for b in booked if b.offering is not None)
            result.shares[ranking].append(100 * got / bound)
            result.model_differs += got != replay_model(requests, capacity, span, ranking)
        must = oracle_replay(requests, capacity, span, bases, refuse=False)
        result.shares["pass 1"].append(100 * must.booked / bound)
        result.moved += must.moved
        result.decisions += must.decisions
        result.choices += must.choices
        for _ in range(passes - 1):
            must = oracle_replay(requests, capacity, span, ["follow"], False, must.plan)
        result.shares["must offer"].append(100 * must.booked / bound)
        if with_refusals:  # from the must-offer oracle's trajectory: it can only add
            free_hand = oracle_replay(requests, capacity, span, bases, True, must.plan)
            for _ in range(passes - 1):
                free_hand = oracle_replay(requests, capacity, span, ["follow"], True, free_hand.plan)
            result.shares["refusals"].append(100 * free_hand.booked / bound)
            result.refused_fitting += free_hand.refused_fitting
    result.seconds = time.monotonic() - began
    return result


def points_named(names: list[str] | None) -> list[Point]:
    every = [Point(lead, slack, load) for load in LOADS for lead in LEAD_MIXES for slack in SLACK_MIXES]
    if not names:
        return every
    wanted = set()
    for name in names:
        lead, slack, load = name.split("/")
        wanted.add((lead, slack, float(load)))
    return [p for p in every if (p.lead, p.slack, p.load) in wanted]


def row(r: PointResult, seeds: int) -> str:
    p = r.point
    means = "".join(f"{r.mean(c):10.1f}%" if r.shares[c] else f"{'-':>11}" for c in COLUMNS)
    over = r.mean("must offer") - r.mean("earliest")
    refusals = f"{r.mean('refusals') - r.mean('must offer'):+8.1f}" if r.shares["refusals"] else f"{'-':>8}"
    return (
        f"  {p.lead:8} {p.slack:8} {p.load:4.1f}{means}  {over:+8.1f} {refusals}"
        f"  {100 * r.choices / max(r.decisions, 1):5.1f}% {100 * r.moved / max(r.decisions, 1):5.1f}%"
        f" {r.refused_fitting:6d}"
        f" {r.model_differs:4d}/{2 * seeds} {r.seconds:6.0f}s"
    )


def summary(results: list[PointResult]) -> list[str]:
    have = [c for c in COLUMNS if all(r.shares[c] for r in results)]
    means = {c: statistics.mean(r.mean(c) for r in results) for c in have}
    lines = [
        f"  mean over {len(results)} points: "
        + ", ".join(f"{c} {means[c]:.1f}%" for c in have)
        + "; over earliest: "
        + ", ".join(f"{c} {means[c] - means['earliest']:+.1f}" for c in have if c != "earliest")
    ]
    short = [r for r in results if r.mean("must offer") - r.mean("earliest") < 5.0]
    lines.append(
        f"  must-offer oracle under +5 over earliest at {len(short)} of {len(results)} points:"
        + "".join(
            f" {r.point.lead}/{r.point.slack}/{r.point.load:g}"
            f" ({r.mean('must offer') - r.mean('earliest'):+.1f})"
            for r in short
        )
    )
    return lines


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--points", nargs="*", help="lead/slack/load, e.g. issue54/issue54/1.3 (default: all)"
    )
    parser.add_argument(
        "--bases", nargs="+", default=["packing"], choices=("packing", "earliest"),
        help="the policies the rollouts place the rest by (a candidate's value: the best of them)",
    )  # fmt: skip
    parser.add_argument(
        "--passes", type=int, default=1,
        help="oracle passes: each after the first rolls out the previous one's placements (packing's"
        " where they no longer fit)",
    )  # fmt: skip
    parser.add_argument("--no-refusals", action="store_true", help="skip the oracle with refusals")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    from hyperplan.cli.simulate import quiet_highs

    quiet_highs()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(
        f"oracle: every whole-day start (or split), rollouts of the real remaining requests by"
        f" {' and '.join(args.bases)}, {args.passes} pass(es); seeds {seeds.start}-{seeds.stop - 1}"
    )
    head = "".join(f"{c:>11}" for c in COLUMNS)
    print(
        f"  {'lead':8} {'slack':8} {'load':>4}{head}  must-earl  refuse+  choice  moved refused model    time"
    )
    began = time.monotonic()
    results = []
    for point in points_named(args.points):
        results.append(measure(point, seeds, args.bases, args.passes, not args.no_refusals))
        print(row(results[-1], len(seeds)), flush=True)
    for text in summary(results):
        print(text)
    print(f"  took {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
