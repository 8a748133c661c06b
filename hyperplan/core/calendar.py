"""Booked capacity per pool over time, in 30-minute slots aligned to the Unix epoch.

Slots are aligned to the epoch, so 11:30 UTC (and every half hour) is a slot boundary. A booking holds
every slot it touches at all: one from 11:39 holds the 11:30-12:00 slot whole. Being conservative this
way is what guarantees that no pool is booked above its ``reservable`` count at any instant, whatever
the minutes of the bookings.

The calendar is the fast, in-memory view that searches read; the database's rows are the authority,
checked inside the booking transaction with :func:`peak_booked_slots` (see there why not
:func:`peak_booked`). Not thread-safe: callers lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt

from hyperplan.core.fleet import Pool, PoolKey
from hyperplan.errors import ResourceLimitExceeded

SLOT = timedelta(minutes=30)
SLOTS_PER_DAY = 48
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SLOT_MICROS = 30 * 60 * 1_000_000
_FIRST_ALLOCATION = 64 * SLOTS_PER_DAY  # slots; grown by doubling, so growth is amortised O(1)

Counts = npt.NDArray[np.int32]
Ints = npt.NDArray[np.int64]
Interval = tuple[datetime, datetime, int]
T = TypeVar("T")
_MISSING = object()
_DERIVED = 256  # values kept by CapacityCalendar.derived


# -- slot arithmetic ---------------------------------------------------------------------------------


def _micros(moment: datetime) -> int:
    if moment.tzinfo is None:
        raise ValueError(f"naive datetime {moment}: the calendar needs aware (UTC) times")
    return (moment - EPOCH) // timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """``moment`` in microseconds since the epoch, as the store keeps times (store/types.py)."""
    return _micros(moment)


def slot_of(moment: datetime) -> int:
    """The slot that contains ``moment``."""
    return _micros(moment) // _SLOT_MICROS


def slot_after(moment: datetime) -> int:
    """The first slot that starts at or after ``moment``."""
    return -(-_micros(moment) // _SLOT_MICROS)


def slot_start(slot: int) -> datetime:
    return EPOCH + slot * SLOT


def slot_span(start: datetime, end: datetime) -> tuple[int, int]:
    """The slots ``[first, stop)`` that ``[start, end)`` touches at all (none if it is empty)."""
    first = slot_of(start)
    return (first, slot_after(end)) if start < end else (first, first)


# -- one pool's booked counts -----------------------------------------------------------------------


class _Track:
    """Booked instances of one pool, slot by slot, over a stretch that grows when bookings need it."""

    def __init__(self) -> None:
        self.base = 0
        self.counts: Counts = np.zeros(0, dtype=np.int32)
        # Per phase (the first slot of a day, mod 48): the first slot of the first day and the peak of
        # each day from there. Searches read whole days, all starting at the same hour, many times
        # between two bookings; any change drops them.
        self._day_peaks: dict[int, tuple[int, Ints]] = {}

    @property
    def stop(self) -> int:
        return self.base + len(self.counts)

    def read(self, first: int, stop: int) -> Counts:
        """A copy of slots ``[first, stop)``; slots never booked read as zero (nothing is allocated)."""
        result = np.zeros(max(stop - first, 0), dtype=np.int32)
        lo, hi = max(first, self.base), min(stop, self.stop)
        if lo < hi:
            result[lo - first : hi - first] = self.counts[lo - self.base : hi - self.base]
        return result

    def peak(self, first: int, stop: int) -> int:
        lo, hi = max(first, self.base), min(stop, self.stop)
        return int(self.counts[lo - self.base : hi - self.base].max()) if lo < hi else 0

    def add(self, first: int, stop: int, delta: int) -> None:
        self._cover(first, stop)
        self.counts[first - self.base : stop - self.base] += delta
        self._day_peaks.clear()

    def day_peaks(self, first: int, days: int) -> Ints:
        """The most booked in each of ``days`` days of 48 slots from slot ``first``."""
        result = np.zeros(days, dtype=np.int64)
        self.day_peaks_into(first, result)
        return result

    def day_peaks_into(self, first: int, result: Ints) -> None:
        """:meth:`day_peaks` written into ``result`` (zeros, one per day), rather than a new array."""
        phase = first % SLOTS_PER_DAY
        memo = self._day_peaks.get(phase)
        if memo is None:
            memo = self._day_peaks[phase] = self._peaks_from(phase)
        start, peaks = memo
        days = len(result)
        offset = (first - start) // SLOTS_PER_DAY  # a whole number of days: both slots share the phase
        lo, hi = max(offset, 0), min(offset + days, len(peaks))
        if lo < hi:
            result[lo - offset : hi - offset] = peaks[lo:hi]

    def _peaks_from(self, phase: int) -> tuple[int, Ints]:
        """Every day of this phase that the stretch touches, and its peak (slots outside read as 0)."""
        start = self.base - (self.base - phase) % SLOTS_PER_DAY
        days = -(-(self.stop - start) // SLOTS_PER_DAY)
        padded = np.zeros(days * SLOTS_PER_DAY, dtype=np.int64)
        padded[self.base - start : self.stop - start] = self.counts
        peaks = padded.reshape(days, SLOTS_PER_DAY).max(axis=1)
        peaks.flags.writeable = False
        return start, peaks

    def _cover(self, first: int, stop: int) -> None:
        if not len(self.counts):
            self.base = first
            self.counts = np.zeros(max(stop - first, _FIRST_ALLOCATION), dtype=np.int32)
            return
        if first >= self.base and stop <= self.stop:
            return
        # Grow by at least the current size on the side that needs it, so that a run of bookings
        # creeping forward one day at a time copies the array O(log n) times, not n times.
        size = len(self.counts)
        new_base = min(first, self.base - size) if first < self.base else self.base
        new_stop = max(stop, self.stop + size) if stop > self.stop else self.stop
        grown = np.zeros(new_stop - new_base, dtype=np.int32)
        grown[self.base - new_base : self.stop - new_base] = self.counts
        self.base, self.counts = new_base, grown


# -- the calendar ------------------------------------------------------------------------------------


class CapacityCalendar:
    """Booked and free capacity of every pool, over all time.

    A pool the calendar was not given has nothing reservable: it can never be booked.
    """

    def __init__(self, pools: Iterable[Pool]) -> None:
        self._reservable = {pool.key: pool.reservable for pool in pools}
        self._tracks: dict[PoolKey, _Track] = {}
        # Capacity plans returned (core/returns.py), per pool: what a resale discount prices
        # (core/pricing.py). Only ever added to: a returned window stays returned once resold.
        self._returned: dict[PoolKey, _Track] = {}
        self._derived: dict[Hashable, object] = {}

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, kept until the calendar next changes: for values a reader derives from the
        calendar as it is (a search's days), which many reads between two bookings ask for again. The
        key must name everything the value depends on besides the calendar. At most _DERIVED values
        are kept; the least recently asked for go first (a value asked for again moves to the end: the
        days of a search without a window, asked for again and again, outlive the many windows' days
        that are asked for once)."""
        derived = self._derived
        found = derived.pop(key, _MISSING)
        if found is _MISSING:
            found = make()
            if len(derived) >= _DERIVED:
                del derived[next(iter(derived))]
        derived[key] = found
        return cast(T, found)

    def _changed(self) -> None:
        self.forget_derived()

    def forget_derived(self) -> None:
        """Drop what `derived` keeps, as a change does (benchmarks time a search that reads afresh)."""
        self._derived.clear()

    def reservable(self, pool_key: PoolKey) -> int:
        return self._reservable.get(pool_key, 0)

    def set_reservable(self, pool_key: PoolKey, count: int) -> None:
        """What the pool can hold from now on (fewer while some of its nodes are unhealthy). Bookings
        already held stay; free capacity reads as 0 where they exceed it."""
        if count < 0:
            raise ValueError(f"a pool holds at least 0 instances, not {count}")
        self._reservable[pool_key] = count
        self._changed()

    @property
    def nbytes(self) -> int:
        """Memory held by the booked counts of all pools."""
        return sum(track.counts.nbytes for track in self._tracks.values())

    def can_book(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> bool:
        first, stop = _checked_span(start, end, count)
        return self._peak(pool_key, first, stop) + count <= self.reservable(pool_key)

    def can_book_each(
        self, pool_keys: Sequence[PoolKey], start: datetime, end: datetime, count: int
    ) -> list[bool]:
        """:meth:`can_book` for each of several pools (the span's slots worked out once)."""
        first, stop = _checked_span(start, end, count)
        return [self._peak(key, first, stop) + count <= self.reservable(key) for key in pool_keys]

    def book(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> None:
        """Hold ``count`` instances over ``[start, end)``; ResourceLimitExceeded if they are not free."""
        first, stop = _checked_span(start, end, count)
        peak, reservable = self._peak(pool_key, first, stop), self.reservable(pool_key)
        if peak + count > reservable:
            raise ResourceLimitExceeded(
                f"{pool_key[0]} in {pool_key[1]} has {max(reservable - peak, 0)} of {reservable} "
                f"instances free between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC; "
                f"{count} were asked for."
            )
        self._track(pool_key).add(first, stop, count)
        self._changed()

    def restore(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> None:
        """Hold a booking that already exists (read back from the database) without checking it:
        a fleet file may have shrunk a pool below what was sold. Free capacity then reads as 0."""
        first, stop = _checked_span(start, end, count)
        self._track(pool_key).add(first, stop, count)
        self._changed()

    def release(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> None:
        """Undo :meth:`book` (or :meth:`restore`) of exactly these arguments."""
        first, stop = _checked_span(start, end, count)
        track = self._tracks.get(pool_key)
        if track is None or int(track.read(first, stop).min()) < count:
            raise ValueError(f"release of {count} x {pool_key} over [{start}, {end}) that was not booked")
        track.add(first, stop, -count)
        self._changed()

    def mark_returned(self, pool_key: PoolKey, start: datetime, end: datetime, count: int) -> None:
        """Note that ``count`` instances of ``[start, end)`` came back from a plan's return (the release
        itself is :meth:`release`'s): a search prices what it can offer only from them."""
        first, stop = _checked_span(start, end, count)
        self._returned.setdefault(pool_key, _Track()).add(first, stop, count)
        self._changed()

    def has_returned(self, pool_keys: Iterable[PoolKey]) -> bool:
        """Whether any of the pools ever had capacity returned (most never do)."""
        return any(key in self._returned for key in pool_keys)

    def returned_days_of(self, pool_keys: Sequence[PoolKey], start: datetime, days: int) -> Ints:
        """The most returned instances at any time of each of ``days`` days from ``start``, one row per
        pool (zeros where none was)."""
        return _day_peaks_of(self._returned, pool_keys, start, days)

    def booked(self, pool_key: PoolKey, start: datetime, end: datetime) -> Counts:
        """Booked instances in each slot that ``[start, end)`` touches."""
        first, stop = slot_span(start, end)
        return self._read(pool_key, first, stop)

    def free(self, pool_key: PoolKey, start: datetime, end: datetime) -> Counts:
        """Instances that can still be booked in each slot that ``[start, end)`` touches."""
        free = self.reservable(pool_key) - self.booked(pool_key, start, end)
        return np.maximum(free, 0, dtype=np.int32)

    def free_days(self, pool_key: PoolKey, start: datetime, days: int) -> Ints:
        """The fewest instances that can still be booked over each of ``days`` days of 24 hours from
        ``start`` (a slot boundary): what :meth:`free` gives, day by day, at its minimum."""
        first = slot_of(start)
        track = self._tracks.get(pool_key)
        peaks = track.day_peaks(first, days) if track else np.zeros(days, dtype=np.int64)
        return np.maximum(self.reservable(pool_key) - peaks, 0)

    def free_days_of(self, pool_keys: Sequence[PoolKey], start: datetime, days: int) -> Ints:
        """:meth:`free_days` of several pools at once: one row per pool, in the order given."""
        peaks = _day_peaks_of(self._tracks, pool_keys, start, days)
        reservable = np.array([self.reservable(pool_key) for pool_key in pool_keys], dtype=np.int64)
        return np.maximum(reservable[:, None] - peaks, 0)

    def booked_profile(self, pool_key: PoolKey, start: datetime, end: datetime) -> list[tuple[datetime, int]]:
        """``(slot start, booked)`` at the start of the window and wherever the booked count changes."""
        first, stop = slot_span(start, end)
        counts = self._read(pool_key, first, stop)
        if not len(counts):
            return []
        changes = np.flatnonzero(np.diff(counts)) + 1
        starts = np.concatenate(([0], changes))
        return [(slot_start(first + int(i)), int(counts[i])) for i in starts]

    def _read(self, pool_key: PoolKey, first: int, stop: int) -> Counts:
        track = self._tracks.get(pool_key)
        return track.read(first, stop) if track else np.zeros(max(stop - first, 0), dtype=np.int32)

    def _peak(self, pool_key: PoolKey, first: int, stop: int) -> int:
        track = self._tracks.get(pool_key)
        return track.peak(first, stop) if track else 0

    def _track(self, pool_key: PoolKey) -> _Track:
        return self._tracks.setdefault(pool_key, _Track())


def _day_peaks_of(
    tracks: Mapping[PoolKey, _Track], pool_keys: Sequence[PoolKey], start: datetime, days: int
) -> Ints:
    """Each pool's most counted in each of ``days`` days from ``start``, one row per pool (zeros for a
    pool without a track)."""
    first = slot_of(start)
    peaks = np.zeros((len(pool_keys), days), dtype=np.int64)
    for row, pool_key in enumerate(pool_keys):
        track = tracks.get(pool_key)
        if track:
            track.day_peaks_into(first, peaks[row])
    return peaks


def _checked_span(start: datetime, end: datetime, count: int) -> tuple[int, int]:
    if not start < end:
        raise ValueError(f"empty booking [{start}, {end})")
    if count < 1:
        raise ValueError(f"a booking holds at least one instance, not {count}")
    return slot_span(start, end)


# -- the authoritative check, on rows read from the database ----------------------------------------


def peak_booked(intervals: Iterable[Interval], window_start: datetime, window_end: datetime) -> int:
    """The most instances that ``intervals`` hold at any one instant of ``[window_start, window_end)``.

    An exact sweep: ends are exclusive, so one booking ending at 11:30 and another starting at 11:30
    never count together.
    """
    events: list[tuple[int, int]] = []
    low, high = _micros(window_start), _micros(window_end)
    for start, end, count in intervals:
        events.extend(_clipped(_micros(start), _micros(end), count, low, high))
    return _sweep(events)


def peak_booked_slots(intervals: Iterable[Interval], window_start: datetime, window_end: datetime) -> int:
    """Like :func:`peak_booked`, but with every interval and the window widened to whole 30-minute
    slots, exactly as :class:`CapacityCalendar` holds them.

    This is the one the booking transaction uses: ``peak_booked_slots(rows, start, end) + count <=
    reservable`` accepts a segment exactly when ``CapacityCalendar.can_book`` would on a calendar
    holding the same rows. With the exact sweep the store could accept a segment starting at 11:39
    next to one ending at 11:35 that the calendar refuses (both hold the 11:30 slot), and the
    calendar's ``book`` after the commit would then fail. The slot check is never looser than the exact
    one, so the invariant (never above reservable at any instant) holds either way.
    """
    return peak_in_slots(
        ((*slot_span(start, end), count) for start, end, count in intervals),
        *slot_span(window_start, window_end),
    )


def micros_slot_span(start: int, end: int, count: int) -> tuple[int, int, int]:
    """:func:`slot_span` of ``[start, end)`` given in microseconds since the epoch (as the store keeps
    times), with the ``count`` held over it: the booking check reads the store's rows so, and skips a
    datetime per row and its conversion back."""
    first = start // _SLOT_MICROS
    return (first, -(-end // _SLOT_MICROS) if start < end else first, count)


def peak_in_slots(spans: Iterable[tuple[int, int, int]], low: int, high: int) -> int:
    """:func:`peak_booked_slots` of intervals already widened to their slots ``(first, stop, count)``,
    over the slots ``[low, high)``. Written out (no call per row): a purchase's check weighs tens of
    rows, in the writers' turn too."""
    events: list[tuple[int, int]] = []
    add = events.append
    for first, stop, count in spans:
        first, stop = max(first, low), min(stop, high)
        if first < stop:
            add((first, count))
            add((stop, -count))
    events.sort()  # an instant's ends (negative deltas) before its starts
    running = peak = 0
    for _, delta in events:
        running += delta
        if running > peak:
            peak = running
    return peak


def _clipped(start: int, end: int, count: int, low: int, high: int) -> list[tuple[int, int]]:
    start, end = max(start, low), min(end, high)
    return [(start, count), (end, -count)] if start < end else []


def _sweep(events: list[tuple[int, int]]) -> int:
    # Sorting (time, delta) puts an instant's ends (negative deltas) before its starts.
    running = peak = 0
    for _, delta in sorted(events):
        running += delta
        peak = max(peak, running)
    return peak
