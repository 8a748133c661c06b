"""The days a search reads of the calendar (:class:`_PoolDays`, step 1 of core/search.py's "How") and
what the planning derives from them alone: the runs of open days, the tables that answer "the first day
that opens d open days in a row" (:class:`_Fits`, step 2), and the packing score's parts. The calendar
keeps all of it until it next changes, for the searches that read the same days: hence read-only arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import PoolKey
from hyperplan.core.offerings import Offering
from hyperplan.core.search_request import _Query

_NONE = 1 << 40  # "no such day": larger than any day index, and still so after adding a length

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
A = TypeVar("A", bound=np.ndarray)

# Per calendar read, the run tables of at most this many plan lengths are kept (each is O(P D R)).
_RUN_TABLES_KEPT = 8
# _Fits answers from a table of every answer when it holds at most this many (8 bytes each: 256 KiB).
_DENSE_FITS = 32_768


# -- one pool's days ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _PoolDays:
    """Every pool's whole days of the window, one row per pool of the query: the fewest free instances
    over each and which can hold the count; whether each pool's partial day can; and what the planning
    derives from these alone, kept with them (the calendar keeps the whole for searches that read the
    same days, see :meth:`read`)."""

    free_days: Ints  # (P, N)
    open_days: npt.NDArray[np.bool_]  # (P, N)
    partial_open: npt.NDArray[np.bool_]  # (P,)
    count: int
    # run_length[p, j]: how many open days follow from day j on (and two padding days past the end)
    run_length: Ints  # (P, N + 2)

    @staticmethod
    def read(calendar: CapacityCalendar, query: _Query) -> _PoolDays:
        """The days, as the calendar keeps them between two of its changes for searches that read
        the same ones (every search of a type and count without a window, in the same minute)."""
        keys = tuple(pool.key for pool in query.pools)
        soonest = query.soonest if query.has_partial_day else None
        key = ("search days", keys, query.count, query.first_boundary, query.n_days, soonest)
        return calendar.derived(key, lambda: _PoolDays._read(calendar, keys, query))

    @staticmethod
    def _read(calendar: CapacityCalendar, keys: tuple[PoolKey, ...], query: _Query) -> _PoolDays:
        free_days = calendar.free_days_of(keys, query.first_boundary, query.n_days)
        partial_open = np.zeros(len(keys), dtype=bool)
        if query.has_partial_day:
            partial_open[:] = calendar.can_book_each(keys, query.soonest, query.first_boundary, query.count)
        return _PoolDays.of(free_days, query.count, partial_open)

    @staticmethod
    def of(free_days: Ints, count: int, partial_open: npt.NDArray[np.bool_]) -> _PoolDays:
        open_days = free_days >= count
        pools, days = open_days.shape
        index = np.arange(days + 2)
        closed = np.ones((pools, days + 2), dtype=bool)
        closed[:, :days] = ~open_days
        next_closed = np.minimum.accumulate(np.where(closed, index, days + 2)[:, ::-1], axis=1)[:, ::-1]
        run_length = next_closed - index
        return _PoolDays(
            _shared(free_days), _shared(open_days), _shared(partial_open), count, _shared(run_length)
        )

    # Derived on first use (each search needs only some), kept for the next search of the same days.

    @cached_property
    def run_sizes(self) -> Ints:
        """(P, N): a maximal run's length on the day it starts, 0 on the other days."""
        starts = self.open_days.copy()
        starts[:, 1:] &= ~self.open_days[:, :-1]
        return _shared(np.where(starts, self.run_length[:, : starts.shape[1]], 0))

    @cached_property
    def plans(self) -> dict[tuple[object, ...], tuple[Offering, ...]]:
        """:func:`search.plan_offerings`'s answers from these days, per query (see there)."""
        return {}

    @cached_property
    def run_tables(self) -> dict[int, tuple[Ints, Ints, Ints]]:
        """_Fits's tables of the runs, per longest length asked about."""
        return {}

    @cached_property
    def answer_tables(self) -> dict[int, Ints]:
        """_Fits's tables of every answer, per longest length asked about."""
        return {}

    @cached_property
    def score_ends(self) -> tuple[Floats, Floats]:
        """The packing ranking's score of a placement [s, e) in pool p is opens[p, s] + closes[p, e] +
        count x (e - s): what its start and its end each add, apart (see :func:`packing_ends`)."""
        opens, closes = packing_ends(self.free_days, self.count)
        return _shared(opens), _shared(closes)


def _shared(array: A) -> A:
    """The array, made read-only: it is shared by the searches that read the same days."""
    array.flags.writeable = False
    return array


class _Fits:
    """Answers "the first day a >= j that opens d open days in a row, in pool p" for whole arrays of
    (p, d, j) at once: the first day a >= j whose run of open days is at least d long (a day inside a
    shorter run is followed only by shorter ones in it, so that day is j itself or the start of a later
    run). Built on the first question (a packing search that finds a single segment asks none).

    Two ways to the same answers, by size. When the table of every answer, ``first[p, d, j]``, is
    small (up to _DENSE_FITS entries: the usual windows and lengths), it is built in one numpy pass over
    ``run_length`` and each question is one look-up. Otherwise (long plans in long windows) the answers
    come from the maximal runs: j itself, or the start of the first run after j that is long enough,
    from tables that cost O(P (N + D R)) for R runs, not O(P D N), and a few look-ups per question."""

    def __init__(self, grids: _PoolDays, max_length: int) -> None:
        self.last_day = grids.open_days.shape[1] + 1  # one past the window: never open, so lookups
        # beyond are clipped to it
        self.grids, self.run_length, self.max_length = grids, grids.run_length, max_length
        pools, width = grids.run_length.shape
        self.dense = pools * (max_length + 1) * width <= _DENSE_FITS
        self._tables: tuple[Ints, Ints, Ints] | None = None
        self._answers: Ints | None = None

    def _table(self) -> Ints:
        """first[p, d, j] for every pool, length 0..max_length and day 0..N + 1; _NONE where none."""
        if self._answers is None:
            kept = self.grids.answer_tables  # kept with the days, as the runs' tables are
            self._answers = kept.get(self.max_length)
            if self._answers is None:
                self._answers = self._build_table()
                if len(kept) < _RUN_TABLES_KEPT:
                    kept[self.max_length] = self._answers
        return self._answers

    def _build_table(self) -> Ints:
        width = self.run_length.shape[1]
        long_enough = self.run_length[:, None, :] >= np.arange(self.max_length + 1)[None, :, None]
        day_if = np.where(long_enough, np.arange(width), _NONE)
        return _shared(np.minimum.accumulate(day_if[:, :, ::-1], axis=2)[:, :, ::-1])

    def _runs(self) -> tuple[Ints, Ints, Ints]:
        """(run_start, run_after, next_run): per pool, each run's first day (padded with a last run
        "none" that starts at _NONE); how many runs start at or before each day; and next_run[p, d, r],
        the first run at or after run r that is at least d days long."""
        if self._tables is None:
            # kept with the days, for the next search of them for as many days
            kept = self.grids.run_tables
            self._tables = kept.get(self.max_length)
            if self._tables is None:
                self._tables = self._build()
                if len(kept) < _RUN_TABLES_KEPT:
                    kept[self.max_length] = self._tables
        return self._tables

    def _build(self) -> tuple[Ints, Ints, Ints]:
        open_days = self.grids.open_days
        pools, days = open_days.shape
        starts = np.zeros((pools, days + 2), dtype=bool)
        starts[:, 0] = open_days[:, 0]
        starts[:, 1:days] = open_days[:, 1:] & ~open_days[:, :-1]
        run_after = np.cumsum(starts, axis=1)
        runs = int(run_after[:, -1].max())
        pool_of, first_day = np.nonzero(starts)
        rank = run_after[pool_of, first_day] - 1
        run_start = np.full((pools, runs + 1), _NONE, dtype=np.int64)
        run_start[pool_of, rank] = first_day
        lengths = np.zeros((pools, runs + 1), dtype=np.int64)
        lengths[pool_of, rank] = self.run_length[pool_of, first_day]
        long_enough = lengths[:, None, :] >= np.arange(self.max_length + 1)[None, :, None]
        long_enough[:, :, runs] = True
        index = np.where(long_enough, np.arange(runs + 1), runs)
        next_run = np.minimum.accumulate(index[:, :, ::-1], axis=2)[:, :, ::-1]
        return _shared(run_start), _shared(run_after), _shared(next_run)

    def first(self, pool: Ints | int, length: Ints | int, day: Ints | int) -> Ints:
        day = np.minimum(day, self.last_day)
        if self.dense:
            return np.asarray(self._table()[pool, length, day], dtype=np.int64)
        run_start, run_after, next_run = self._runs()
        here = self.run_length[pool, day] >= length
        later = run_start[pool, next_run[pool, length, run_after[pool, day]]]
        return np.asarray(np.where(here, day, later), dtype=np.int64)


# -- the packing score's parts -----------------------------------------------------------------------

# How much a placement's ragged edges weigh against what it leaves free (docs/PLANNING.md).
_EDGE_WEIGHT = 5.0


def packing_ends(free_days: Ints, count: int) -> tuple[Floats, Floats]:
    """(opens, closes), each (P, N + 1): a placement [s, e) of ``count`` in pool p scores
    ``opens[p, s] + closes[p, e] + count * (e - s)``.

    Its score is ``_EDGE_WEIGHT`` x (how much its steps grow) - (what it leaves free while it holds).
    With ``step[j]`` = free count of day j - 1 - free count of day j (the day before the window
    counts as full, 0 free; the day after it as the last day, no step), a placement [s, e) turns the
    step at s into step[s] + count and the one at e into step[e] - count, and leaves free the sum of
    days s..e-1 less count x (e - s). Every term is a whole number, so the sums are exact in floats
    and equal the score however they are grouped."""
    # Few array steps, both parts at once (each step is a numpy call, the arrays are small). Every
    # value is a whole number far below 2**53, so these floats are exact whatever the order.
    pools, days = free_days.shape
    step = np.zeros((pools, days + 1))
    if days:  # step[j] = free[j - 1] - free[j]: 0 - free[0] on day 0, nothing after the last day
        step[:, :days] = free_days
        step[:, 1:days] -= free_days[:, :-1]
        np.negative(step, out=step)
    free_before = np.zeros((pools, days + 1))
    np.cumsum(free_days, axis=1, out=free_before[:, 1:])
    both = step + np.array([count, -count], dtype=np.float64)[:, None, None]  # (2, P, N + 1)
    np.abs(both, out=both)
    both -= np.abs(step)
    both *= _EDGE_WEIGHT
    both[0] += free_before
    both[1] -= free_before
    opens, closes = both[0], both[1]
    return opens, closes
