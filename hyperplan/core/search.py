"""SearchTrainingPlanOfferings for a new plan: priced offerings of 1..K segments, best first.

The rules (docs/DECISIONS.md, "Booking policy"):

* Time is cut into *days* from one 11:30 UTC boundary to the next (``policy.segment_end``). Every
  segment ends on a boundary and holds whole days, except that a segment starting at the *soonest*
  start (``max(StartTimeAfter, now + 30 min)`` rounded up to the minute), when that falls between two
  boundaries, also holds the partial day up to the next boundary. Its DurationHours/Minutes and price
  count that real length. Other segments start on boundaries.
* The segments' whole days add up to D = ceil(DurationHours / 24), within ``[min_days, max_days]``.
* The window: the first segment starts no earlier than the soonest start and no later than
  ``now + horizon`` (56 days); every segment ends by EndTimeBefore, which defaults to ``now + horizon``:
  the default window ``[now + 30 min, now + 56 days]`` holds the whole plan. An EndTimeBefore later
  than ``now + horizon + max_days`` is cut back to that (no plan could use more).
* hyperpod-cluster offerings keep all segments in one pool (one AZ); training-job offerings may take
  each segment from any pool of the type. Two segments of one offering in the same pool are never
  adjacent (that would be one segment), so they never overlap and can be booked one by one.
* Best first, as the fleet's ``policy.ranking`` says (docs/PLANNING.md). ``earliest`` (AWS's order):
  fewest segments, then earliest finish, then lowest price; what follows describes it. ``packing`` (the
  default): fewest segments, then the placement that leaves the calendar best able to take later
  requests (:class:`_Packer`), then earliest finish and price; ``earliest``'s first offering is always
  among those it returns.

Which offerings: the best one is exact. Then variety: the search takes distinct *shapes* (the list of
(start, end) of the segments) in best-first order, so that it returns, say, the same 10 days in AZ a,
the same days with the partial first day added, and 10 days starting a day later, rather than one
shape in three AZs; only when fewer than ``max_offerings`` shapes exist does it add the same shape in
other pools. A split is left out when an offering with fewer segments starts no later and finishes
no later (it would only be a worse copy). The chosen offerings are then sorted best first.
Offerings with k + 1 segments are only looked for while fewer than ``max_offerings`` shapes have been
found with k or fewer (AWS: "if one block does not fit, it tries two").

How (N days in the window, P pools of the type, D days asked for, R runs of open days in a pool):

1. Per pool, the minimum free count over each whole day (the calendar keeps each pool's daily peaks
   between two changes of it: one numpy reduction over the pool's slots after a change, then a slice)
   and whether the partial day is free; a day is *open* if it holds the count. This is all a search
   reads of the calendar (:func:`read_days`, under the live calendar's lock); the rest works on values.
   The calendar keeps what was read, and what the planning derives from it alone (runs of open days,
   their tables, the packing scores' parts, and the offerings planned from them), until it next
   changes (``CapacityCalendar.derived``), keyed by pools, count and window: searches without a window,
   which read the same days, share it, and the same search asked again is not planned again.
   Every pool is one row of the same arrays, so that each step below works on all pools at once.
2. ``first(p, d, j)``: the first day a >= j that opens d open days in a row in pool p. It is j when the
   run of open days from j is long enough, else the start of the first long-enough run after j. Usually
   read from a table of every answer (O(P D N), one numpy pass; one look-up per query); when that table
   would be large (long plans in long windows), from a ``next_run[p, d, r]`` table built from the
   maximal runs (O(P (N + D R)); a few look-ups per query). Either way on whole arrays of queries.
3. One segment: per pool, the first ``max_offerings`` starts ``first(p, D, 0)``, ``first(p, D, a + 1)``...
   Before combining several: each segment lies in one run of open days, so a plan of at most K
   segments needs K runs (of one pool, for a cluster) at least D days long together; without them the
   search stops there, empty (most searches that find nothing).
4. k segments: placing segments earliest-first (greedy) gives the earliest finish for a given list of
   lengths and pools. Level 1 is ``first(p, t, 0)`` for every pool p and length t. The final level k
   combines each level k - 1 prefix (last pool q, t days) with a last segment (pool p, d = D - t days)
   starting at ``first(p, d, end(q, t) + (q == p))``: O(P^2 D) look-ups, all vectorised, and every
   (q, p, d) is a candidate, so for K = 2 both finish and price are exact. Levels between (only when
   K > 2) keep, per (pool, total days), the earliest-finishing prefix, cheapest among those, continuing
   the prefix after which that pool can start soonest: O(P D^2 + P^2 D) per level, linear in K, rather
   than enumerating the compositions of D into K parts (which grow as D^(K-1)). With K > 2 the finish
   stays exact; the price tie-break can miss a cheaper mix of pools with the same finish.
Total: O(P N 48 + P D R + P^2 D) for K = 2; add O(K P D^2) for K > 2.
With P of 1 to 3 and N about 120, the arrays are small and a search's time is mostly the fixed cost of
each numpy call: the code keeps the number of calls low (whole-array steps, results kept per calendar
read) rather than the number of elements. The deeper levels are only computed when the shallower ones
did not give ``max_offerings`` shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from functools import cached_property, lru_cache
from typing import NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import SERVED_TARGETS, BookingPolicy, Fleet, Pool, PoolKey
from hyperplan.errors import ValidationError

DAY = timedelta(days=1)
UNSERVED_TARGETS = ("endpoint", "studio-apps")
_CENT = Decimal("0.01")
_MINUTE = timedelta(minutes=1)
_NONE = 1 << 40  # "no such day": larger than any day index, and still so after adding a length

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
A = TypeVar("A", bound=np.ndarray)


# -- values in and out -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SearchRequest:
    instance_type: str
    instance_count: int
    duration_hours: int
    target: str
    start_after: datetime | None = None
    end_before: datetime | None = None


def _hours_minutes(length: timedelta) -> tuple[int, int]:
    hours, minutes = divmod(length // timedelta(minutes=1), 60)
    return int(hours), int(minutes)


@dataclass(frozen=True)
class Segment:
    """``count`` instances of one pool over ``[start, end)``."""

    pool_key: PoolKey
    start: datetime
    end: datetime
    count: int

    @property
    def duration_hours_minutes(self) -> tuple[int, int]:
        return _hours_minutes(self.end - self.start)


@dataclass(frozen=True)
class Offering:
    target: str
    segments: tuple[Segment, ...]
    upfront_fee: Decimal
    currency: str

    @property
    def start(self) -> datetime:
        return self.segments[0].start

    @property
    def end(self) -> datetime:
        return self.segments[-1].end

    @property
    def duration_hours_minutes(self) -> tuple[int, int]:
        """The segments' real lengths added up (gaps between segments are not counted)."""
        return _hours_minutes(sum((s.end - s.start for s in self.segments), timedelta()))

    @property
    def instance_type(self) -> str:
        return self.segments[0].pool_key[0]

    @property
    def instance_count(self) -> int:
        return self.segments[0].count


def segment_price(pool: Pool, start: datetime, end: datetime, count: int) -> Decimal:
    """count x real hours x price, to the cent (half up). An offering's fee is the sum of its
    segments' prices, so that invoices itemised per segment add up to the fee."""
    return _price(pool.price_per_instance_hour, (end - start) // _MINUTE, count)


@lru_cache(maxsize=4096)
def _price(per_instance_hour: Decimal, minutes: int, count: int) -> Decimal:
    # Kept: a search prices its offerings' segments, and the same lengths come back all the time.
    return (count * minutes * per_instance_hour / 60).quantize(_CENT, rounding=ROUND_HALF_UP)


# -- the search --------------------------------------------------------------------------------------


def search(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> list[Offering]:
    """Offerings for ``request`` at ``now``, best first; at most ``policy.max_offerings``; [] if none
    fits. A ValidationError names the request member that is wrong."""
    return plan_offerings(fleet, read_days(fleet, calendar, request, now))


@dataclass(frozen=True)
class DaysRead:
    """What a search reads from the calendar: its validated query and each pool's days. A value: the
    calendar may change once it is read, and the planning (most of a search's time) needs no lock."""

    query: _Query
    grids: _PoolDays


def read_days(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> DaysRead:
    """The first half of :func:`search`: validate the request and read the calendar (a caller that
    shares the calendar between threads holds its lock over this only)."""
    query = _query(fleet, request, now)
    return DaysRead(query, _PoolDays.read(calendar, query))


def plan_offerings(fleet: Fleet, read: DaysRead) -> list[Offering]:
    """The second half of :func:`search`: the offerings, from what :func:`read_days` read.

    The offerings are a function of the days read and the query alone, so they are kept with the days
    (which the calendar keeps until it next changes): the same search asked again before the next
    change (the same type, count, length and target, without a window, in the same minute) is answered
    from there rather than planned again."""
    kept, key = read.grids.plans, _plan_key(fleet.policy.ranking, read.query)
    found = kept.get(key)
    if found is None:
        found = _plan(fleet.policy.ranking, read)
        if len(kept) < _PLANS_KEPT:
            kept[key] = found
    return list(found)


# Per calendar read, the offerings of at most this many searches are kept (a few Offering values each).
_PLANS_KEPT = 64


def _plan_key(ranking: str, query: _Query) -> tuple[object, ...]:
    """Everything the planning reads besides the days: the query, with its pools as what the planning
    reads of them (a pool's node list can be long, and the days read already name the pools)."""
    pools = tuple((pool.key, pool.price_per_instance_hour, pool.currency) for pool in query.pools)
    return (
        ranking,
        query.target,
        query.count,
        query.days,
        pools,
        query.soonest,
        query.first_boundary,
        query.n_days,
        query.latest_start_day,
        query.max_segments,
        query.max_offerings,
    )


def _plan(ranking: str, read: DaysRead) -> tuple[Offering, ...]:
    planner = _Planner(read.query, read.grids)
    if planner.fits is None:  # the window is shorter than the plan
        return ()
    chosen = _Packer(planner).best() if ranking == "packing" else planner.best()
    return tuple(_offering(read.query, candidate) for candidate in chosen)


@dataclass(frozen=True)
class _Query:
    """A validated request, with its window cut into days."""

    target: str
    count: int
    days: int  # D: whole days to cover
    pools: tuple[Pool, ...]  # of the type, each able to hold the count
    soonest: datetime
    first_boundary: datetime  # day 0 starts here; == soonest when there is no partial day
    n_days: int  # whole days inside the window
    latest_start_day: int  # the last day a segment may open the plan on (negative: only the soonest)
    max_segments: int
    max_offerings: int

    @property
    def has_partial_day(self) -> bool:
        return self.soonest < self.first_boundary

    def day_start(self, day: int) -> datetime:
        return self.first_boundary + day * DAY


# -- validation --------------------------------------------------------------------------------------


def _query(fleet: Fleet, request: SearchRequest, now: datetime) -> _Query:
    policy = fleet.policy
    _check_target(request.target)
    pools = _pools_for(fleet, request)
    days = _days_for(policy, request.duration_hours)
    soonest, latest_start, end_limit = _window(policy, request, _utc(now, "now"))
    first_boundary = _next_boundary(soonest, policy)
    return _Query(
        target=request.target,
        count=request.instance_count,
        days=days,
        pools=pools,
        soonest=soonest,
        first_boundary=first_boundary,
        n_days=max((end_limit - first_boundary) // DAY, 0),
        latest_start_day=(latest_start - first_boundary) // DAY,
        max_segments=policy.max_segments,
        max_offerings=policy.max_offerings,
    )


def _check_target(target: str) -> None:
    served = " and ".join(SERVED_TARGETS)
    if not target:
        raise ValidationError("TargetResources is required: one of training-job, hyperpod-cluster.")
    if target in UNSERVED_TARGETS:
        raise ValidationError(
            f"TargetResources: this deployment does not serve {target}; it serves {served}."
        )
    if target not in SERVED_TARGETS:
        raise ValidationError(
            f"TargetResources: {target!r} is not a target; this deployment serves {served}."
        )


def _pools_for(fleet: Fleet, request: SearchRequest) -> tuple[Pool, ...]:
    instance_type, count = request.instance_type, request.instance_count
    if not instance_type:
        raise ValidationError("InstanceType is required.")
    pools = tuple(pool for pool in fleet.pools_of_type(instance_type) if pool.reservable > 0)
    if not pools:
        served = ", ".join(fleet.reservable_types()) or "none"
        raise ValidationError(
            f"InstanceType: {instance_type} cannot be reserved in this deployment; "
            f"it offers plans for {served}."
        )
    allowed = fleet.policy.allowed_counts
    if not count or count < 1:
        raise ValidationError("InstanceCount must be at least 1.")
    if allowed is not None and count not in allowed:
        listed = ", ".join(map(str, allowed))
        raise ValidationError(f"InstanceCount: {count} is not allowed; plans hold {listed} instances.")
    largest = max(pool.reservable for pool in pools)
    if count > largest:
        raise ValidationError(
            f"InstanceCount: {count} is more than any {instance_type} pool can hold; "
            f"the largest holds {largest}."
        )
    return tuple(pool for pool in pools if pool.reservable >= count)


def _days_for(policy: BookingPolicy, duration_hours: int) -> int:
    if not duration_hours or duration_hours < 1:
        raise ValidationError("DurationHours must be at least 1.")
    days = -(-duration_hours // 24)
    if not policy.min_days <= days <= policy.max_days:
        raise ValidationError(
            f"DurationHours: {duration_hours} hours is {days} days; plans last {policy.min_days} to "
            f"{policy.max_days} days ({policy.min_days * 24} to {policy.max_days * 24} hours)."
        )
    return days


def _window(
    policy: BookingPolicy, request: SearchRequest, now: datetime
) -> tuple[datetime, datetime, datetime]:
    """(soonest start, latest start, latest end)."""
    earliest, latest_start = now + policy.lead_time, now + policy.horizon
    start_after = _utc(request.start_after, "StartTimeAfter") if request.start_after else None
    start = max(earliest, start_after) if start_after else earliest  # a past StartTimeAfter is clamped
    # Compared before any arithmetic on it: rounding the year 9999 up a minute would overflow.
    if start > latest_start or _ceil_minute(start) > latest_start:
        raise ValidationError(
            f"StartTimeAfter: {_show(start)} is too late; plans start at most "
            f"{policy.horizon.days} days ahead, by {_show(latest_start)}."
        )
    soonest = _ceil_minute(start)
    end_limit = _utc(request.end_before, "EndTimeBefore") if request.end_before else latest_start
    if end_limit < start + DAY:
        raise ValidationError(
            f"EndTimeBefore: {_show(end_limit)} must be at least 24 hours after the earliest start, "
            f"{_show(start)}."
        )
    return soonest, latest_start, min(end_limit, latest_start + policy.max_days * DAY)


def _utc(moment: datetime | None, name: str) -> datetime:
    if moment is None or moment.tzinfo is None:
        raise ValidationError(f"{name}: {moment} is not a time with a time zone.")
    return moment.astimezone(UTC)


def _ceil_minute(moment: datetime) -> datetime:
    floor = moment.replace(second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(minutes=1)


def _next_boundary(moment: datetime, policy: BookingPolicy) -> datetime:
    """The first segment end (11:30 UTC) at or after ``moment``."""
    boundary = datetime.combine(moment.date(), policy.segment_end, tzinfo=UTC)
    return boundary if boundary >= moment else boundary + DAY


def _show(moment: datetime) -> str:
    return f"{moment:%Y-%m-%dT%H:%M:%S}Z"


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
        """:func:`plan_offerings`'s answers from these days, per query (see there)."""
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
        count x (e - s): what its start and its end each add, apart (see :meth:`_Packer.ends`)."""
        opens, closes = _Packer.ends(self.free_days, self.count)
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


# -- candidates --------------------------------------------------------------------------------------

# Per calendar read, the run tables of at most this many plan lengths are kept (each is O(P D R)).
_RUN_TABLES_KEPT = 8
# Ranked candidates of several segments are traced back through their levels this many at a time: as
# many as the packing ranking asks for (_SPLIT_POOL x the default max_offerings), in one batch.
_TRACED_AT_ONCE = 24
# _Fits answers from a table of every answer when it holds at most this many (8 bytes each: 256 KiB).
_DENSE_FITS = 32_768

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


# -- the packing ranking -----------------------------------------------------------------------------


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

    With one segment, every start of every pool in the window is scored at once. With more, the
    candidates are the first ``_SPLIT_POOL x max_offerings`` of the earliest ranking's with that many
    segments (each placed earliest-first), scored alike. A score is a sum of parts that each depend on
    one end of the placement (see :meth:`ends`), computed once per calendar read: O(P N)."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner
        self.query = planner.query

    # Read on first use: a search where nothing fits scores nothing, and need not derive them.
    @property
    def opens(self) -> Floats:
        return self.planner.grids.score_ends[0]

    @property
    def closes(self) -> Floats:
        return self.planner.grids.score_ends[1]

    @staticmethod
    def ends(free_days: Ints, count: int) -> tuple[Floats, Floats]:
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
        return np.asarray(
            self.opens[pool, starts] + self.closes[pool, stops] + self.query.count * (stops - starts),
            dtype=np.float64,
        )

    def _scores_from(self, starts: int, days: int) -> Floats:
        """(P, starts): the scores of placements of ``days`` days in every pool from each of the first
        ``starts`` days (each must end in the window)."""
        return self.opens[:, :starts] + self.closes[:, days : days + starts] + self.query.count * days

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


_EDGE_WEIGHT = 5.0
_SPLIT_POOL = 8


def _offering(query: _Query, candidate: _Candidate) -> Offering:
    segments, fee = [], Decimal("0.00")
    for index, (pool_index, start_day, stop_day) in enumerate(candidate.segments):
        pool = query.pools[pool_index]
        start = query.soonest if index == 0 and candidate.partial else query.day_start(start_day)
        end = query.day_start(stop_day)
        segments.append(Segment(pool.key, start, end, query.count))
        fee += segment_price(pool, start, end, query.count)
    return Offering(query.target, tuple(segments), fee, query.pools[0].currency)
