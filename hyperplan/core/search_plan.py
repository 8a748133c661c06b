"""The planning on the days read: the candidates of 1..K segments, level by level, each level best first
in the ``earliest`` ranking's order (steps 3 and 4 of core/search.py's "How"), and that ranking's choice
of offerings among them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from hyperplan.core.search_days import _NONE, Floats, Ints, _Fits, _PoolDays
from hyperplan.core.search_request import _Query

# Ranked candidates of several segments are traced back through their levels this many at a time: as
# many as the packing ranking asks for (search_rank._SPLIT_POOL x the default max_offerings), in one batch.
_TRACED_AT_ONCE = 24

Placed = tuple[int, int, int]  # (pool index, first day, stop day)


class _Candidate(NamedTuple):
    # A named tuple: a search makes dozens, and a tuple is made for less than a frozen dataclass.
    segments: tuple[Placed, ...]
    partial: bool  # the first segment starts at the soonest start, holding the partial day too
    cost: float  # for ranking only; the fee is computed exactly from the segments

    @property
    def finish(self) -> int:
        return self.segments[-1][2]

    @property
    def shape(self) -> tuple[tuple[int, int], ...]:
        first = -1 if self.partial else self.segments[0][1]
        return ((first, self.segments[0][2]), *((start, stop) for _, start, stop in self.segments[1:]))

    @property
    def rank(self) -> tuple[int, int, float]:
        return (len(self.segments), self.finish, self.cost)


@dataclass
class _Level:
    """Best prefixes of k segments, per (last pool, total days): where they end and how they got there."""

    end: Ints  # (P, D + 1); _NONE where no prefix exists
    cost: Floats
    first_start: Ints
    first_pool: Ints
    previous_pool: Ints  # -1 on level 1
    last_start: Ints
    parent: _Level | None = None  # level k - 1


class _Planner:
    def __init__(self, query: _Query, grids: _PoolDays) -> None:
        self.query = query
        self.grids = grids
        self.pools = len(query.pools)
        self.hyperpod = query.target == "hyperpod-cluster"
        days = query.days
        shape_ok = query.n_days >= days
        self.fits = _Fits(grids, days) if shape_ok else None
        hourly = np.array([float(pool.price_per_instance_hour) * query.count for pool in query.pools])
        self.day_cost = hourly * 24
        partial_hours = (query.first_boundary - query.soonest) / timedelta(hours=1)
        self.partial_cost = hourly * partial_hours
        self.partial_open = grids.partial_open
        # With no boundary start left in the window, the plan must start at the soonest start.
        self.start_limit = max(query.latest_start_day, 0)
        self.only_partial = query.latest_start_day < 0
        # (first day, stop day) of every candidate handed out so far; the partial day's start is -1.
        self.spans: list[tuple[int, int]] = []

    def may_fit(self) -> bool:
        """False when no plan can fit, read off the runs of open days alone: each segment lies in one
        run of its pool and a run holds at most its length of a plan's days, so a plan of at most K
        segments needs K runs (of one pool, for a cluster) at least D days long together. Most searches
        that find nothing stop here rather than combine every split to learn it."""
        if self.fits is None:
            return False
        segments, days = min(self.query.max_segments, self.query.days), self.query.days
        lengths = self.grids.run_sizes
        if self.hyperpod:
            longest = np.sort(lengths, axis=1)[:, -segments:].sum(axis=1).max()
        else:
            longest = np.sort(lengths, axis=None)[-segments:].sum()
        return bool(longest >= days)

    def best(self) -> list[_Candidate]:
        if not self.may_fit():
            return []
        wanted = self.query.max_offerings
        chosen: list[_Candidate] = []
        spare: list[_Candidate] = []
        seen: set[tuple[tuple[int, int], ...]] = set()
        for candidate in self._candidates():
            shape = candidate.shape  # made anew at each read: read once
            self.spans.append((shape[0][0], candidate.finish))
            if shape in seen:
                spare.append(candidate)
                continue
            seen.add(shape)
            chosen.append(candidate)
            if len(chosen) == wanted:
                break
        chosen.extend(spare[: wanted - len(chosen)])
        return sorted(chosen, key=lambda c: c.rank)

    def _candidates(self, singles: bool = True) -> Iterator[_Candidate]:
        """Every candidate, level by level, each level best first. The caller stops when it has enough,
        so deeper levels are only computed when shallower ones did not give enough shapes. ``singles``
        False: the caller knows that no single segment fits."""
        if singles:
            yield from sorted(self._single_segments(), key=lambda c: c.rank)
        level = self._first_level()
        for k in range(2, min(self.query.max_segments, self.query.days) + 1):
            yield from self._final_level(level, k)
            if k < self.query.max_segments:
                level = self._middle_level(level, k)

    # -- one segment

    def _single_segments(self) -> Iterator[_Candidate]:
        assert self.fits is not None
        days = self.query.days
        for p in range(self.pools):
            start, found = int(self.fits.first(p, days, 0)), 0
            while start <= self.start_limit and found < self.query.max_offerings:
                found += 1
                yield from self._with_variant(((p, start, start + days),), float(self.day_cost[p] * days))
                start = int(self.fits.first(p, days, start + 1))

    def _with_variant(self, segments: tuple[Placed, ...], cost: float) -> Iterator[_Candidate]:
        """The candidate, and the same with the partial day added when it starts on day 0."""
        pool, start, _ = segments[0]
        if not self.only_partial or start != 0:
            yield _Candidate(segments, False, cost)
        if start == 0 and self.partial_open[pool]:
            yield _Candidate(segments, True, cost + float(self.partial_cost[pool]))

    # -- several segments

    def _first_level(self) -> _Level:
        assert self.fits is not None
        pools, totals = self.pools, np.arange(self.query.days + 1)
        starts = self.fits.first(np.arange(pools)[:, None], totals[None, :], 0)
        end = np.where((starts <= self.start_limit) & (totals > 0), starts + totals, _NONE)
        pool_of = np.broadcast_to(np.arange(pools)[:, None], end.shape).copy()
        return _Level(
            end=end,
            cost=self.day_cost[:, None] * totals[None, :],
            first_start=starts,
            first_pool=pool_of,
            previous_pool=np.full(end.shape, -1),
            last_start=starts,
        )

    def _extend(self, level: _Level, total: int, k: int) -> tuple[Ints, ...] | None:
        """Every (previous pool q, pool p, last length d) that ends a k-segment plan of ``total`` days,
        in the order of an array of shape (Q, P, d): q, p, d, the last segment's start and the plan's
        end, of those that fit."""
        assert self.fits is not None
        lengths = np.arange(1, total - (k - 1) + 1)
        if not len(lengths):
            return None
        pools = np.arange(self.pools)
        q, p, d = pools[:, None, None], pools[None, :, None], lengths[None, None, :]
        prefix_end = level.end[q, total - d]
        start = self.fits.first(p, d, prefix_end + (q == p))  # the same pool needs a day's gap
        fits = (prefix_end < _NONE) & (start < _NONE)
        if self.hyperpod:
            fits &= q == p
        # The (q, p, d) of each that fits, from its place in the (Q, P, d) array.
        found = np.flatnonzero(fits)
        span = len(lengths)
        found_d = found % span + 1
        found_start = start.ravel()[found]
        return (
            found // (self.pools * span),
            found // span % self.pools,
            found_d,
            found_start,
            found_start + found_d,
        )

    def _final_level(self, level: _Level, k: int) -> Iterator[_Candidate]:
        extended = self._extend(level, self.query.days, k)
        if extended is None:
            return
        q, p, d, start, end = extended
        prefix = self.query.days - d
        cost = level.cost[q, prefix] + self.day_cost[p] * d
        first_start, first_pool = level.first_start[q, prefix], level.first_pool[q, prefix]
        variant = (first_start == 0) & self.partial_open[first_pool]
        if self.only_partial:
            whole = np.zeros(len(end), dtype=bool)
        elif self.spans:
            whole = ~self._dominated(first_start, end)
        else:
            whole = np.ones(len(end), dtype=bool)
        if self.spans:
            variant &= ~self._dominated(-1, end)
        variant_cost = cost + self.partial_cost[first_pool]
        yield from self._ranked(level, q, p, d, start, end, (cost, variant_cost), (whole, variant))

    def _dominated(self, first_day: Ints | int, stop_day: Ints) -> npt.NDArray[np.bool_]:
        """Whether an offering with fewer segments, already handed out, starts no later and finishes no
        later: a split of a stretch that one segment covers is only a worse copy of it."""
        if not self.spans:
            return np.zeros(len(stop_day), dtype=bool)
        spans = np.array(self.spans)
        starts_later = np.asarray(first_day).reshape(-1, 1) >= spans[None, :, 0]
        finishes_later = stop_day[:, None] >= spans[None, :, 1]
        return np.asarray((starts_later & finishes_later).any(axis=1), dtype=bool)

    def _ranked(
        self, level: _Level, q: Ints, p: Ints, d: Ints, start: Ints, end: Ints,
        cost: tuple[Floats, Floats], keep: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]],
    ) -> Iterator[_Candidate]:  # fmt: skip
        """The plans kept of each (q, p, d), with whole days only (cost[0], keep[0]) and with the partial
        day (cost[1], keep[1]), in the order of the earliest ranking: end, then cost, then that order."""
        listed = np.flatnonzero(np.concatenate(keep))  # the whole-day ones first, then the partial
        ends = np.concatenate((end, end))[listed]
        costs = np.concatenate(cost)[listed]
        partial = listed >= len(end)
        which = listed - len(end) * partial
        order = np.lexsort((costs, ends))
        # Most callers take a few: the candidates are traced a batch at a time, each batch at once.
        for first in range(0, len(order), _TRACED_AT_ONCE):
            batch = order[first : first + _TRACED_AT_ONCE]
            j = which[batch]
            last_start = start[j]
            parts = self._traced(level, q[j], self.query.days - d[j])
            parts.append((p[j].tolist(), last_start.tolist(), (last_start + d[j]).tolist()))
            segments = zip(*(zip(*part, strict=True) for part in parts), strict=True)
            flags, cost_of = partial[batch].tolist(), costs[batch].tolist()
            for placed, flag, ranked_cost in zip(segments, flags, cost_of, strict=True):
                yield _Candidate(placed, flag, ranked_cost)

    def _middle_level(self, level: _Level, k: int) -> _Level:
        """Level k from level k - 1, for every (pool, total days) at once: the earliest-ending plan,
        cheapest of those. O(P D^2) look-ups, vectorised."""
        assert self.fits is not None
        after, after_cost, after_pool = self._best_prefixes(level)
        pools = np.arange(self.pools)[:, None, None]
        lengths = np.arange(1, self.query.days)[None, None, :]
        prefix = np.arange(self.query.days + 1)[None, :, None] - lengths  # (1, D + 1, D - 1): [total, d]
        usable = prefix >= k - 1
        prefix = np.broadcast_to(np.maximum(prefix, 0), (self.pools, *prefix.shape[1:]))
        start = self.fits.first(pools, lengths, after[pools, prefix])
        end = np.where(usable & (start < _NONE), start + lengths, _NONE)
        cost = np.where(end < _NONE, after_cost[pools, prefix] + self.day_cost[pools] * lengths, np.inf)
        # Per (pool, total): the earliest end over the last segment's length, then the cheapest of those.
        pick = np.where(end == end.min(axis=2, keepdims=True), cost, np.inf).argmin(axis=2)[..., None]
        chosen_prefix = np.take_along_axis(prefix, pick, 2)[..., 0]
        rows = np.arange(self.pools)[:, None]
        previous = after_pool[rows, chosen_prefix]
        return _Level(
            end=np.take_along_axis(end, pick, 2)[..., 0],
            cost=np.take_along_axis(cost, pick, 2)[..., 0],
            first_start=level.first_start[previous, chosen_prefix],
            first_pool=level.first_pool[previous, chosen_prefix],
            previous_pool=previous,
            last_start=np.take_along_axis(np.broadcast_to(start, end.shape), pick, 2)[..., 0],
            parent=level,
        )

    def _best_prefixes(self, level: _Level) -> tuple[Ints, Floats, Ints]:
        """Per (pool p, total t), the level's prefix of t days after which a segment in pool p can start
        soonest, cheapest of those: (that first day, the prefix's cost, the pool of its last segment)."""
        q = np.arange(self.pools)[:, None, None]
        p = np.arange(self.pools)[None, :, None]
        after = level.end[:, None, :] + (q == p)  # (Q, P, D + 1); the same pool needs a day's gap
        possible = (level.end[:, None, :] < _NONE) & ((q == p) | (not self.hyperpod))
        after = np.where(possible, after, _NONE)
        cost = np.where(possible, level.cost[:, None, :], np.inf)
        soonest = after.min(axis=0)
        best_q = np.where(after == soonest, cost, np.inf).argmin(axis=0)
        return soonest, np.take_along_axis(cost, best_q[None], 0)[0], best_q

    def _traced(self, level: _Level, pool: Ints, total: Ints) -> list[tuple[list[int], list[int], list[int]]]:
        """The segments of the level's prefixes ending in ``pool`` with ``total`` days, for arrays of
        them at once: per segment, in time order, (pools, first days, stop days) of the prefixes."""
        parts = []
        current: _Level | None = level
        while current is not None:
            start, end = current.last_start[pool, total], current.end[pool, total]
            parts.append((pool.tolist(), start.tolist(), end.tolist()))
            pool, total = current.previous_pool[pool, total], total - (end - start)
            current = current.parent
        parts.reverse()
        return parts
