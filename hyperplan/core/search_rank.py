"""The ``packing`` ranking (docs/PLANNING.md): the placements with the fewest segments, ordered by how
well they leave the calendar able to take later requests."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from hyperplan.core.search_days import Floats, Ints
from hyperplan.core.search_plan import _Candidate, _Planner


class _Packer:
    """The ``packing`` ranking: among the placements with the fewest segments, the one that leaves the
    calendar best able to take later requests comes first; ties go to the earliest end, then the lowest
    price. The earliest ranking's first offering is always among those returned.

    A placement's score (the lower, the better) weighs two things, read from each day's free count:

    * where it is least loaded: it loses what the pool leaves free on the days it holds (instance-days),
      so that bookings spread over their windows and keep the busy days for requests with tight ones;
    * how flush it sits: it gains ``_EDGE_WEIGHT`` x how much the free count's steps at its two ends grow
      (instances; the day before the window counts as full), so that it fills a gap to the level of its
      neighbours rather than cut a ragged edge that only a request of just that size could use.

    When the caller says how far ahead the window opens (``days_ahead``: whole days from the search to
    the window's first day, rounded up) and that is more than a week (``_FAR_AHEAD_DAYS``), a placement
    also costs ``_DELAY_COST`` per day it holds for each day it starts after the window's first: such a
    window's first days can be reached only by requests that plan as far ahead, so fewer requests are
    still to come for them than for the days after; spreading the booking later would leave them idle
    (issue 54's grid, docs/PLANNING.md). Without ``days_ahead`` (None), or with a window that opens
    within a week, the score is the two parts above alone.

    With one segment, every start of every pool in the window is scored at once. With more, the
    candidates are the first ``_SPLIT_POOL x max_offerings`` of the earliest ranking's with that many
    segments (each placed earliest-first), scored alike. A score is a sum of parts that each depend on
    one end of the placement (see :meth:`ends`), computed once per calendar read: O(P N)."""

    def __init__(self, planner: _Planner, days_ahead: int | None = None) -> None:
        self.planner = planner
        self.query = planner.query
        far = days_ahead is not None and days_ahead >= _FAR_AHEAD_DAYS
        self.delay_cost = _DELAY_COST if far else 0.0

    # Read on first use: a search where nothing fits scores nothing, and need not derive them.
    @property
    def opens(self) -> Floats:
        return self.planner.grids.score_ends[0]

    @property
    def closes(self) -> Floats:
        return self.planner.grids.score_ends[1]

    # The score's parts (search_days.packing_ends) are made with the days read, since each calendar
    # read keeps them; the properties above name them for this ranking.

    def best(self) -> list[_Candidate]:
        if self.planner.fits is None:
            return []
        singles = self._singles()
        if singles is not None:
            ranked, hurry = singles
        elif not self.planner.may_fit():
            return []
        else:
            scored = self._splits()
            if not scored:
                return []
            hurry = min(scored, key=lambda sc: sc[1].rank)  # the earliest ranking's first
            ranked = iter(sorted(scored, key=lambda sc: (sc[0], sc[1].finish, sc[1].cost)))
        chosen: list[tuple[float, _Candidate]] = []
        spare: list[tuple[float, _Candidate]] = []
        shapes: set[tuple[tuple[int, int], ...]] = set()
        wanted = self.query.max_offerings
        for score, candidate in ranked:
            shape = candidate.shape  # made anew at each read: read once
            if shape in shapes:
                if len(spare) < wanted:
                    spare.append((score, candidate))
                continue
            shapes.add(shape)
            chosen.append((score, candidate))
            if len(chosen) == wanted:
                break
        chosen.extend(spare[: wanted - len(chosen)])
        if not any(_same(c, hurry[1]) for _, c in chosen):
            chosen[-1:] = [hurry]
        return [c for _, c in sorted(chosen, key=lambda sc: (sc[0], sc[1].finish, sc[1].cost))]

    def _scores(self, pool: Ints, starts: Ints, stops: Ints) -> Floats:
        """The scores of placements [start, stop), each in its pool (see :meth:`ends`)."""
        held = stops - starts
        score = self.opens[pool, starts] + self.closes[pool, stops] + self.query.count * held
        if self.delay_cost:
            score = score + self.delay_cost * held * starts
        return np.asarray(score, dtype=np.float64)

    def _scores_from(self, starts: int, days: int) -> Floats:
        """(P, starts): the scores of placements of ``days`` days in every pool from each of the first
        ``starts`` days (each must end in the window)."""
        score = self.opens[:, :starts] + self.closes[:, days : days + starts] + self.query.count * days
        if self.delay_cost:
            score = score + self.delay_cost * days * np.arange(starts)
        return score

    def _singles(self) -> tuple[Iterator[tuple[float, _Candidate]], tuple[float, _Candidate]] | None:
        """Every one-segment placement (and the same with the partial day where it starts on day 0),
        best first, made lazily; and the earliest ranking's first. None if none fits."""
        planner, days = self.planner, self.query.days
        assert planner.fits is not None
        # Every pool at once: (pool, start) of the whole-day placements, then the pools whose day-0
        # placement may take the partial day too. The order they are listed in does not matter: the
        # sorts below have a key that tells any two placements apart.
        # Starts past the window's last D days never fit: a run from there would leave the window.
        starts = min(planner.start_limit, self.query.n_days - days) + 1
        fitting = planner.fits.run_length[:, :starts] >= days
        with_partial = np.flatnonzero(fitting[:, 0] & planner.partial_open)
        whole = fitting[:, :0] if planner.only_partial else fitting  # only_partial: day 0, partial only
        whole_pool, whole_start = np.nonzero(whole)
        pool = np.concatenate([whole_pool, with_partial])
        if not len(pool):
            return None
        start = np.concatenate([whole_start, np.zeros(len(with_partial), dtype=np.int64)])
        is_partial = np.zeros(len(pool), dtype=bool)
        is_partial[len(whole_pool) :] = True
        every = self._scores_from(starts, days)
        score = np.concatenate([every[whole], every[with_partial, 0]])
        whole_cost = planner.day_cost * days
        cost = np.concatenate(
            [whole_cost[whole_pool], whole_cost[with_partial] + planner.partial_cost[with_partial]]
        )

        def made(i: int) -> tuple[float, _Candidate]:
            placed = ((int(pool[i]), int(start[i]), int(start[i]) + days),)
            return float(score[i]), _Candidate(placed, bool(is_partial[i]), float(cost[i]))

        # Best first: score, start, cost, then (as the earliest ranking's order among equals) pool, the
        # whole day first. Each key of a lexsort is a sort of its own, so keys are paired up where that
        # keeps the order: a score is a whole number and a start lies in [0, N], so score x (N + 1) +
        # start orders as (score, start), exactly in floats; so does 2 pool + partial as (pool, partial).
        pool_then_partial = 2 * pool + is_partial
        score_then_start = score * (self.query.n_days + 1) + start
        order = np.lexsort((pool_then_partial, cost, score_then_start))
        hurry = made(int(np.lexsort((pool_then_partial, cost, start))[0]))
        return (made(int(i)) for i in order), hurry

    def _splits(self) -> list[tuple[float, _Candidate]]:
        """The earliest ranking's first candidates with the fewest segments (no single one fits)."""
        found: list[_Candidate] = []
        for candidate in self.planner._candidates(singles=False):
            if found and len(candidate.segments) > len(found[0].segments):
                break
            found.append(candidate)
            if len(found) == _SPLIT_POOL * self.query.max_offerings:
                break
        if not found:
            return []
        # Every segment of every candidate scored at once; a candidate's score is its segments' sum.
        pools, starts, stops = np.array([s for c in found for s in c.segments]).T
        each = iter(self._scores(pools, starts, stops).tolist())
        scored = []
        for candidate in found:
            score = 0.0
            for _ in candidate.segments:
                score += next(each)
            scored.append((score, candidate))
        return scored


def _same(a: _Candidate, b: _Candidate) -> bool:
    return a.segments == b.segments and a.partial == b.partial


_SPLIT_POOL = 8
# A window that opens this many days or more after the search (rounded up) is far ahead: its placements
# pay _DELAY_COST per day held for each day they start after its first (see _Packer). Measured on issue
# 54's grid (docs/PLANNING.md): beyond a week, filling such windows from the front books more; the
# project's older workloads, whose windows open within a week, are left as they were. A whole number, so
# that scores stay whole numbers (the order key of _singles relies on it).
_FAR_AHEAD_DAYS = 8
_DELAY_COST = 1.0
