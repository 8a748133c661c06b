"""The search as it was before it was made cheaper (hyperplan/core/search.py at that time), kept as the
oracle that tests/core/test_search_same.py compares the live search with: the same offerings (segments,
prices, order) for every request of a seeded corpus. Test-only; never imported by the service.

Two changes from the copied code: a pool's free days are read slot by slot (``CapacityCalendar.free``,
then the minimum of each day's 48 slots) rather than through the calendar's day-peaks memo, so that
the oracle does not share that path with the code it checks; and a type no plan can reserve, or a window
that holds no day, is refused in the live words (core/served_types.py, search_request._too_short), which
have changed since: the oracle checks which requests are refused and where, not how it is said."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import numpy.typing as npt

from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import SERVED_TARGETS, BookingPolicy, Fleet, Pool, PoolKey
from hyperplan.core.search_request import _too_short
from hyperplan.core.served_types import check_reservable
from hyperplan.errors import ValidationError

DAY = timedelta(days=1)
UNSERVED_TARGETS = ("endpoint", "studio-apps")
_CENT = Decimal("0.01")
_NONE = 1 << 40  # "no such day": larger than any day index, and still so after adding a length

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]


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
    minutes = (end - start) // timedelta(minutes=1)
    return (count * minutes * pool.price_per_instance_hour / 60).quantize(_CENT, rounding=ROUND_HALF_UP)


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
    grids: tuple[_PoolDays, ...]


def read_days(fleet: Fleet, calendar: CapacityCalendar, request: SearchRequest, now: datetime) -> DaysRead:
    """The first half of :func:`search`: validate the request and read the calendar (a caller that
    shares the calendar between threads holds its lock over this only)."""
    query = _query(fleet, request, now)
    return DaysRead(query, tuple(_PoolDays.read(calendar, pool, query) for pool in query.pools))


def plan_offerings(fleet: Fleet, read: DaysRead) -> list[Offering]:
    """The second half of :func:`search`: the offerings, from what :func:`read_days` read."""
    planner = _Planner(read.query, list(read.grids))
    chosen = _Packer(planner).best() if fleet.policy.ranking == "packing" else planner.best()
    return [_offering(read.query, candidate) for candidate in chosen]


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
    days_ahead: int  # whole days from the search to day 0, rounded up

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
        days_ahead=math.ceil((first_boundary - now) / DAY),
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
    check_reservable(fleet, instance_type)
    pools = tuple(pool for pool in fleet.pools_of_type(instance_type) if pool.reservable > 0)
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
        raise ValidationError(_too_short(policy, start_after, end_limit, start, now))
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
    """Which whole days of the window can hold the count in one pool, and whether the partial day can."""

    pool: Pool
    open_days: npt.NDArray[np.bool_]
    partial_open: bool
    free_days: Ints  # the fewest free instances over each whole day (the packing ranking reads them)

    @staticmethod
    def read(calendar: CapacityCalendar, pool: Pool, query: _Query) -> _PoolDays:
        slots = calendar.free(pool.key, query.first_boundary, query.day_start(query.n_days))
        free_days = slots.reshape(query.n_days, 48).min(axis=1).astype(np.int64)
        partial_open = query.has_partial_day and calendar.can_book(
            pool.key, query.soonest, query.first_boundary, query.count
        )
        return _PoolDays(pool, free_days >= query.count, partial_open, free_days)


def _run_lengths(open_days: npt.NDArray[np.bool_]) -> Ints:
    """For each day j (and two padding days past the end), how many open days follow from j on."""
    n = len(open_days)
    index = np.arange(n + 2)
    closed = np.concatenate([~open_days, [True, True]])
    next_closed = np.minimum.accumulate(np.where(closed, index, n + 2)[::-1])[::-1]
    return (next_closed - index).astype(np.int64)


class _Fits:
    """Answers "the first day a >= j that opens d open days in a row, in pool p" for whole arrays of
    (p, d, j) at once, from the maximal runs of open days: either j itself, or the start of the first
    run after j that is long enough. Building it costs O(P (N + D R)) for R runs, not O(P D N)."""

    def __init__(self, open_days: list[npt.NDArray[np.bool_]], max_length: int) -> None:
        days = len(open_days[0])
        self.last_day = days + 1  # one past the window: never open, so lookups beyond are clipped to it
        starts = [np.flatnonzero(row & ~np.concatenate([[False], row[:-1]])) for row in open_days]
        runs = len(max(starts, key=len))
        self.run_length = np.stack([_run_lengths(row) for row in open_days])  # (P, N + 2), from each day
        # Per pool, padded to the same number of runs; the extra last run is "none": starts at _NONE.
        self.run_start = np.full((len(open_days), runs + 1), _NONE, dtype=np.int64)
        lengths = np.zeros((len(open_days), runs + 1), dtype=np.int64)
        for p, first_days in enumerate(starts):
            self.run_start[p, : len(first_days)] = first_days
            lengths[p, : len(first_days)] = self.run_length[p, first_days]
        everyday = np.arange(days + 2)
        self.run_after = np.stack([np.searchsorted(s, everyday, side="right") for s in starts])
        # next_run[p, d, r]: the first run at or after run r that is at least d days long.
        long_enough = lengths[:, None, :] >= np.arange(max_length + 1)[None, :, None]
        long_enough[:, :, runs] = True
        index = np.where(long_enough, np.arange(runs + 1), runs)
        self.next_run = np.minimum.accumulate(index[:, :, ::-1], axis=2)[:, :, ::-1]

    def first(self, pool: Ints | int, length: Ints | int, day: Ints | int) -> Ints:
        day = np.minimum(day, self.last_day)
        here = self.run_length[pool, day] >= length
        later = self.run_start[pool, self.next_run[pool, length, self.run_after[pool, day]]]
        return np.asarray(np.where(here, day, later), dtype=np.int64)


# -- candidates --------------------------------------------------------------------------------------

Placed = tuple[int, int, int]  # (pool index, first day, stop day)


@dataclass(frozen=True)
class _Candidate:
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
    def __init__(self, query: _Query, grids: list[_PoolDays]) -> None:
        self.query = query
        self.grids = grids
        self.hyperpod = query.target == "hyperpod-cluster"
        days = query.days
        shape_ok = query.n_days >= days
        self.fits = _Fits([g.open_days for g in grids], days) if shape_ok else None
        hourly = np.array([float(g.pool.price_per_instance_hour) * query.count for g in grids])
        self.day_cost = hourly * 24
        partial_hours = (query.first_boundary - query.soonest) / timedelta(hours=1)
        self.partial_cost = hourly * partial_hours
        self.partial_open = np.array([g.partial_open for g in grids], dtype=bool)
        # With no boundary start left in the window, the plan must start at the soonest start.
        self.start_limit = max(query.latest_start_day, 0)
        self.only_partial = query.latest_start_day < 0
        # (first day, stop day) of every candidate handed out so far; the partial day's start is -1.
        self.spans: list[tuple[int, int]] = []

    def best(self) -> list[_Candidate]:
        if self.fits is None:
            return []
        wanted = self.query.max_offerings
        chosen: list[_Candidate] = []
        spare: list[_Candidate] = []
        seen: set[tuple[tuple[int, int], ...]] = set()
        for candidate in self._candidates():
            self.spans.append((candidate.shape[0][0], candidate.finish))
            if candidate.shape in seen:
                spare.append(candidate)
                continue
            seen.add(candidate.shape)
            chosen.append(candidate)
            if len(chosen) == wanted:
                break
        chosen.extend(spare[: wanted - len(chosen)])
        return sorted(chosen, key=lambda c: c.rank)

    def _candidates(self) -> Iterator[_Candidate]:
        """Every candidate, level by level, each level best first. The caller stops when it has enough,
        so deeper levels are only computed when shallower ones did not give enough shapes."""
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
        for p in range(len(self.grids)):
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
        pools, totals = len(self.grids), np.arange(self.query.days + 1)
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
        """Every (previous pool q, pool p, last length d) that ends a k-segment plan of ``total`` days:
        arrays of shape (Q, P, d) of q, p, d, the last segment's start and the plan's end."""
        assert self.fits is not None
        lengths = np.arange(1, total - (k - 1) + 1)
        if not len(lengths):
            return None
        pools = np.arange(len(self.grids))
        q, p, d = pools[:, None, None], pools[None, :, None], lengths[None, None, :]
        prefix_end = level.end[q, total - d]
        start = self.fits.first(p, d, prefix_end + (q == p))  # the same pool needs a day's gap
        end = np.where((prefix_end < _NONE) & (start < _NONE), start + d, _NONE)
        if self.hyperpod:
            end = np.where(q == p, end, _NONE)
        q, p, d = np.broadcast_arrays(q, p, d)
        return q, p, d, np.broadcast_to(start, end.shape), end

    def _final_level(self, level: _Level, k: int) -> Iterator[_Candidate]:
        extended = self._extend(level, self.query.days, k)
        if extended is None:
            return
        q, p, d, start, end = (array.ravel() for array in extended)
        valid = end < _NONE
        q, p, d, start, end = q[valid], p[valid], d[valid], start[valid], end[valid]
        prefix = self.query.days - d
        cost = level.cost[q, prefix] + self.day_cost[p] * d
        first_start, first_pool = level.first_start[q, prefix], level.first_pool[q, prefix]
        variant = (first_start == 0) & self.partial_open[first_pool] & ~self._dominated(-1, end)
        variant_cost = cost + self.partial_cost[first_pool]
        rows = [(end, cost, False, ~self._dominated(first_start, end)), (end, variant_cost, True, variant)]
        if self.only_partial:
            rows = rows[1:]
        yield from self._ranked(level, q, p, d, start, rows)

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
        self, level: _Level, q: Ints, p: Ints, d: Ints, start: Ints,
        rows: list[tuple[Ints, Floats, bool, npt.NDArray[np.bool_]]],
    ) -> Iterator[_Candidate]:  # fmt: skip
        ends = np.concatenate([end[keep] for end, _, _, keep in rows])
        costs = np.concatenate([cost[keep] for _, cost, _, keep in rows])
        which = np.concatenate([np.flatnonzero(keep) for *_, keep in rows])
        partial = np.concatenate([np.full(int(keep.sum()), flag) for _, _, flag, keep in rows])
        for i in np.lexsort((costs, ends)):
            j = int(which[i])
            prefix = self._trace(level, int(q[j]), self.query.days - int(d[j]))
            last = (int(p[j]), int(start[j]), int(start[j] + d[j]))
            yield _Candidate((*prefix, last), bool(partial[i]), float(costs[i]))

    def _middle_level(self, level: _Level, k: int) -> _Level:
        """Level k from level k - 1, for every (pool, total days) at once: the earliest-ending plan,
        cheapest of those. O(P D^2) look-ups, vectorised."""
        assert self.fits is not None
        after, after_cost, after_pool = self._best_prefixes(level)
        pools = np.arange(len(self.grids))[:, None, None]
        lengths = np.arange(1, self.query.days)[None, None, :]
        prefix = np.arange(self.query.days + 1)[None, :, None] - lengths  # (1, D + 1, D - 1): [total, d]
        usable = prefix >= k - 1
        prefix = np.broadcast_to(np.maximum(prefix, 0), (len(self.grids), *prefix.shape[1:]))
        start = self.fits.first(pools, lengths, after[pools, prefix])
        end = np.where(usable & (start < _NONE), start + lengths, _NONE)
        cost = np.where(end < _NONE, after_cost[pools, prefix] + self.day_cost[pools] * lengths, np.inf)
        # Per (pool, total): the earliest end over the last segment's length, then the cheapest of those.
        pick = np.where(end == end.min(axis=2, keepdims=True), cost, np.inf).argmin(axis=2)[..., None]
        chosen_prefix = np.take_along_axis(prefix, pick, 2)[..., 0]
        rows = np.arange(len(self.grids))[:, None]
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
        q = np.arange(len(self.grids))[:, None, None]
        p = np.arange(len(self.grids))[None, :, None]
        after = level.end[:, None, :] + (q == p)  # (Q, P, D + 1); the same pool needs a day's gap
        possible = (level.end[:, None, :] < _NONE) & ((q == p) | (not self.hyperpod))
        after = np.where(possible, after, _NONE)
        cost = np.where(possible, level.cost[:, None, :], np.inf)
        soonest = after.min(axis=0)
        best_q = np.where(after == soonest, cost, np.inf).argmin(axis=0)
        return soonest, np.take_along_axis(cost, best_q[None], 0)[0], best_q

    def _trace(self, level: _Level, pool: int, total: int) -> tuple[Placed, ...]:
        """The segments of the level's prefix ending in ``pool`` with ``total`` days, in time order."""
        segments: list[Placed] = []
        current: _Level | None = level
        while current is not None:
            start, end = int(current.last_start[pool, total]), int(current.end[pool, total])
            segments.append((pool, start, end))
            pool, total = int(current.previous_pool[pool, total]), total - (end - start)
            current = current.parent
        return tuple(reversed(segments))


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

    With one segment, every start of every pool in the window is scored at once (prefix sums over the
    daily free counts: O(P N)). With more, the candidates are the first ``_SPLIT_POOL x max_offerings``
    of the earliest ranking's with that many segments (each placed earliest-first), scored alike."""

    def __init__(self, planner: _Planner) -> None:
        self.planner = planner
        self.query = planner.query
        # A window opening 8 or more days ahead: a placement also costs a day held per day it starts late.
        self.delay = 1.0 if self.query.days_ahead >= 8 else 0.0
        # (pools, days): every pool's window has the same days, so that placements in several pools
        # are scored in one go
        self.free = np.stack([g.free_days.astype(np.float64) for g in planner.grids])
        self.free_sum = np.concatenate([np.zeros((len(self.free), 1)), np.cumsum(self.free, axis=1)], axis=1)

    def best(self) -> list[_Candidate]:
        if self.planner.fits is None:
            return []
        singles = self._singles()
        if singles is not None:
            ranked, hurry = singles
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
            if candidate.shape in shapes:
                if len(spare) < wanted:
                    spare.append((score, candidate))
                continue
            shapes.add(candidate.shape)
            chosen.append((score, candidate))
            if len(chosen) == wanted:
                break
        chosen.extend(spare[: wanted - len(chosen)])
        if not any(_same(c, hurry[1]) for _, c in chosen):
            chosen[-1:] = [hurry]
        return [c for _, c in sorted(chosen, key=lambda sc: (sc[0], sc[1].finish, sc[1].cost))]

    def _scores(self, pool: Ints | int, starts: Ints, stops: Ints) -> Floats:
        """The scores of placements [start, stop), each in its pool (see the class's docstring)."""
        free, count, days = self.free, self.query.count, self.free.shape[1]
        held = self.free_sum[pool, stops] - self.free_sum[pool, starts] - count * (stops - starts)
        before = np.where(starts > 0, free[pool, np.maximum(starts - 1, 0)], 0.0)
        after = np.where(stops < days, free[pool, np.minimum(stops, days - 1)], free[pool, stops - 1])
        first, last = free[pool, starts], free[pool, stops - 1]
        steps = np.abs(before - first) + np.abs(last - after)
        steps_then = np.abs(before - first + count) + np.abs(last - count - after)
        late = self.delay * (stops - starts) * starts
        return np.asarray(_EDGE_WEIGHT * (steps_then - steps) - held + late, dtype=np.float64)

    def _singles(self) -> tuple[Iterator[tuple[float, _Candidate]], tuple[float, _Candidate]] | None:
        """Every one-segment placement (and the same with the partial day where it starts on day 0),
        best first, made lazily; and the earliest ranking's first. None if none fits."""
        planner, days = self.planner, self.query.days
        assert planner.fits is not None
        pools, starts, partial, scores = [], [], [], []
        for p in range(len(planner.grids)):
            fitting = np.flatnonzero(planner.fits.run_length[p, : planner.start_limit + 1] >= days)
            whole = fitting[fitting != 0] if planner.only_partial else fitting
            with_partial = (
                fitting[:1] if len(fitting) and fitting[0] == 0 and planner.partial_open[p] else fitting[:0]
            )
            for group, flag in ((whole, False), (with_partial, True)):
                pools.append(np.full(len(group), p))
                starts.append(group)
                partial.append(np.full(len(group), flag))
                scores.append(self._scores(p, group, group + days) if len(group) else np.zeros(0))
        pool, start = np.concatenate(pools), np.concatenate(starts)
        if not len(start):
            return None
        is_partial, score = np.concatenate(partial), np.concatenate(scores)
        cost = planner.day_cost[pool] * days + np.where(is_partial, planner.partial_cost[pool], 0.0)

        def made(i: int) -> tuple[float, _Candidate]:
            placed = ((int(pool[i]), int(start[i]), int(start[i]) + days),)
            return float(score[i]), _Candidate(placed, bool(is_partial[i]), float(cost[i]))

        # The earliest ranking's order among equals is by pool, then start, the whole day first.
        order = np.lexsort((is_partial, start, pool, cost, start, score))
        hurry = made(int(np.lexsort((is_partial, start, pool, cost, start))[0]))
        return (made(int(i)) for i in order), hurry

    def _splits(self) -> list[tuple[float, _Candidate]]:
        """The earliest ranking's first candidates with the fewest segments (no single one fits)."""
        found: list[_Candidate] = []
        for candidate in self.planner._candidates():
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
