"""Reading a log stream's events by position, at a cost bounded by what is read, not by the stream.

A stream is its refs' timed lines one after the other (a job's attempts, in order), and a position in it
is ``(ref, line)``: the ref's index in the stream and a line's number in that ref. The back end reads
lines from an opaque cursor (``Backend.read_lines``), forward only; so each ref has an index, kept in this
process: checkpoints, each the number of a line, the cursor where it starts, its time and the bytes
before it. A checkpoint follows the one before it after ``BATCH`` lines or once the lines between them
hold ``SPAN_BYTES``, whichever comes first, so that reaching any position costs at most that much
reading. The index is built by reading the ref from its start, as far as a read needs and once (the
lines are never rewritten: a ref's output only grows at its end), after which a read from any position
costs one span to reach it plus the lines it returns, and a time is found by the checkpoints' times
(lines are written in time order) and a span.

Memory is bounded by bytes as well as lines: the back end is asked for ``READ_BYTES`` of text at a time
(a read holds that and one line at most, and a log line is at most 64 KiB: backends/timedlog.py), lines
are handed on one by one as they are read, and a backward read keeps only the lines that fit the
caller's page (core/page_bytes.py).

Every server process builds its own index from the same back end; positions do not depend on where the
checkpoints fall, so a position handed out by one server reads the same line at another.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from hyperplan.backends.base import Backend, Ref, TimedLine, TimedLines, UnknownResource
from hyperplan.core.page_bytes import MAX_PAGE_BYTES

BATCH = 2000
"""The most lines between two checkpoints, and the most asked of the back end at once."""
SPAN_BYTES = 1 << 20
"""Bytes of lines after which the next checkpoint comes (give or take one read)."""
READ_BYTES = 64 * 1024
"""Text one read of the back end stops at (the line that reaches it included)."""
INDEXED_REFS = 4096
"""Refs whose index this process keeps (the least recently read are dropped, and rebuilt if read)."""

Position = tuple[int, int]
"""(the ref's index in the stream, the line's number in that ref)."""


@dataclass
class _Index:
    lines: list[int] = field(default_factory=lambda: [0])
    """lines[k]: the number of checkpoint k's line; a checkpoint is added once the span before it is full."""
    cursors: list[int] = field(default_factory=lambda: [0])
    """cursors[k]: where that line starts."""
    first_times: list[datetime | None] = field(default_factory=lambda: [None])
    """first_times[k]: that line's time (None until it has been read)."""
    bytes_before: list[int] = field(default_factory=lambda: [0])


_lock = threading.Lock()
_indexes: weakref.WeakKeyDictionary[Backend, OrderedDict[Ref, _Index]] = weakref.WeakKeyDictionary()
"""Each back end's refs' indexes: they go with the back end (a test's server, and its fake back end)."""


def _index(backend: Backend, ref: Ref) -> _Index:
    with _lock:
        indexes = _indexes.setdefault(backend, OrderedDict())
        found = indexes.get(ref)
        if found is None:
            found = indexes[ref] = _Index()
            while len(indexes) > INDEXED_REFS:
                indexes.popitem(last=False)
        else:
            indexes.move_to_end(ref)
        return found


def _size(line: TimedLine) -> int:
    return len(line.text.encode()) + 1


def _read(backend: Backend, ref: Ref, cursor: int, limit: int) -> TimedLines:
    """One bounded read of the back end (a ref it has forgotten reads as empty)."""
    try:
        return backend.read_lines(ref, cursor, limit, max_bytes=READ_BYTES)
    except UnknownResource:
        return TimedLines((), cursor)


def _checkpoint_for(index: _Index, line: int) -> int:
    """The last checkpoint known at or before `line`."""
    with _lock:
        return bisect.bisect_right(index.lines, line) - 1


def _checkpoint_line(index: _Index, line: int) -> int:
    """The line of the last checkpoint known at or before `line`."""
    with _lock:
        return index.lines[bisect.bisect_right(index.lines, line) - 1]


def _lines_from(backend: Backend, ref: Ref, start: int) -> Iterator[tuple[int, TimedLine]]:
    """The ref's lines from number `start` on, with their numbers: read from the last checkpoint at or
    before it, a bounded read at a time, adding checkpoints (and their times) as spans fill."""
    index = _index(backend, ref)
    known = _checkpoint_for(index, start)
    with _lock:
        number, cursor, before = index.lines[known], index.cursors[known], index.bytes_before[known]
    checkpoint: int | None = known  # None once another reader's checkpoints differ from this one's
    span_lines = span_bytes = 0
    while True:
        found = _read(backend, ref, cursor, BATCH - span_lines)
        if not found.lines and found.next_cursor == cursor:
            return  # the ref's end, for now
        if checkpoint is not None and span_lines == 0 and found.lines:
            _learn_time(index, checkpoint, found.lines[0].time)
        for line in found.lines:
            if number >= start:
                yield number, line
            number += 1
            span_lines += 1
            span_bytes += _size(line)
        cursor = found.next_cursor
        if span_lines >= BATCH or span_bytes >= SPAN_BYTES:
            before += span_bytes
            if checkpoint is not None:
                checkpoint = _learn_checkpoint(index, checkpoint, number, cursor, before)
            span_lines = span_bytes = 0


def _learn_time(index: _Index, checkpoint: int, time: datetime) -> None:
    with _lock:
        if index.first_times[checkpoint] is None:
            index.first_times[checkpoint] = time


def _learn_checkpoint(index: _Index, previous: int, line: int, cursor: int, before: int) -> int | None:
    """Checkpoint `previous` + 1 at `line` (added unless known); None if another reader placed it
    elsewhere (its spans are as good: this reader goes on without learning)."""
    with _lock:
        if len(index.lines) == previous + 1:
            index.lines.append(line)
            index.cursors.append(cursor)
            index.first_times.append(None)
            index.bytes_before.append(before)
        return previous + 1 if index.lines[previous + 1] == line else None


@dataclass(frozen=True)
class RefSummary:
    lines: int
    first_time: datetime | None
    last_time: datetime | None
    stored_bytes: int


def summary(backend: Backend, ref: Ref) -> RefSummary:
    """Its line count, first and last lines' times and bytes, from the index and what follows its last
    checkpoint."""
    index = _index(backend, ref)
    with _lock:
        last = len(index.lines) - 1
        total, stored = index.lines[last], index.bytes_before[last]
    last_line: TimedLine | None = None
    for number, line in _lines_from(backend, ref, total):
        total, stored, last_line = number + 1, stored + _size(line), line
    if total == 0:
        return RefSummary(0, None, None, 0)
    if last_line is None:  # the ref ends at a checkpoint: its last line is the span's before it
        last_line = _line_at(backend, ref, total - 1)
    with _lock:
        first = index.first_times[0]
    if first is None:  # another reader placed the checkpoints and has not read line 0 yet
        first = _line_at(backend, ref, 0).time
    return RefSummary(total, first, last_line.time, stored)


def _line_at(backend: Backend, ref: Ref, number: int) -> TimedLine:
    """A line known to be there."""
    return next(line for at, line in _lines_from(backend, ref, number) if at == number)


def count(backend: Backend, ref: Ref) -> int:
    """The ref's lines so far (reads what follows its last checkpoint)."""
    index = _index(backend, ref)
    with _lock:
        total = index.lines[-1]
    for number, _line in _lines_from(backend, ref, total):
        total = number + 1
    return total


def forward(backend: Backend, refs: Sequence[Ref], start: Position) -> Iterator[tuple[Position, TimedLine]]:
    """Each line from `start` on, with its position, across the refs in turn (read as it is taken)."""
    ref_number, line = start
    while ref_number < len(refs):
        for number, timed in _lines_from(backend, refs[ref_number], line):
            yield (ref_number, number), timed
        ref_number, line = ref_number + 1, 0


def end(backend: Backend, refs: Sequence[Ref]) -> Position:
    """The position after the last line: where the stream goes on (in its last ref, the one that may
    still be written)."""
    if not refs:
        return (0, 0)
    return (len(refs) - 1, count(backend, refs[-1]))


def backward(
    backend: Backend,
    refs: Sequence[Ref],
    before: Position,
    limit: int,
    size_of: Callable[[TimedLine], int],
    max_bytes: int = MAX_PAGE_BYTES,
) -> list[tuple[Position, TimedLine]]:
    """The last lines before the position `before`, in order: at most `limit`, and as many as weigh at
    most `max_bytes` by `size_of` (the last line always, however large: core/page_bytes.py). Each span
    back from `before` is read forward, keeping only the lines that still fit."""
    if not refs:
        return []
    ref_number, line = before
    if ref_number >= len(refs):
        ref_number, line = end(backend, refs)
    line = min(line, count(backend, refs[ref_number]))
    page = _Tail(limit, max_bytes, size_of)
    while ref_number >= 0:
        high = line
        while high > 0 and not page.full:
            low = _checkpoint_line(_index(backend, refs[ref_number]), high - 1)
            page.prepend(_span_back(backend, refs[ref_number], ref_number, low, high, page))
            high = low
        if page.full:
            break
        ref_number -= 1
        if ref_number >= 0:
            line = count(backend, refs[ref_number])
    return page.lines()


class _Tail:
    """A backward page being filled, newest first: the lines taken so far and what they weigh."""

    def __init__(self, limit: int, max_bytes: int, size_of: Callable[[TimedLine], int]) -> None:
        self.limit, self.max_bytes, self.size_of = limit, max_bytes, size_of
        self.taken: deque[tuple[Position, TimedLine]] = deque()
        self.used = 0
        self.full = limit <= 0

    def prepend(self, window: tuple[deque[tuple[Position, TimedLine]], int, bool]) -> None:
        lines, weight, cut = window
        self.taken.extendleft(reversed(lines))
        self.used += weight
        self.full = self.full or cut or len(self.taken) >= self.limit

    def lines(self) -> list[tuple[Position, TimedLine]]:
        return list(self.taken)


def _span_back(
    backend: Backend, ref: Ref, ref_number: int, low: int, high: int, page: _Tail
) -> tuple[deque[tuple[Position, TimedLine]], int, bool]:
    """The last of the ref's lines [low, high) that fit what is left of the page: (those lines, their
    weight, whether some of the span's lines did not fit). Read forward, keeping a window of the lines
    that would fit if the span ended there (the longest such run: weights are never negative)."""
    room_lines, room_bytes = page.limit - len(page.taken), page.max_bytes - page.used
    must_take_one = not page.taken
    window: deque[tuple[Position, TimedLine]] = deque()
    weights: deque[int] = deque()
    weight, cut = 0, False
    for number, line in _lines_from(backend, ref, low):
        if number >= high:
            break
        size = page.size_of(line)
        window.append(((ref_number, number), line))
        weights.append(size)
        weight += size
        while window and (len(window) > room_lines or weight > room_bytes):
            if must_take_one and len(window) == 1:
                break
            window.popleft()
            weight -= weights.popleft()
            cut = True
    return window, weight, cut


def seek(backend: Backend, refs: Sequence[Ref], moment: datetime) -> Position:
    """The position of the first line written at or after `moment` (the end if none is)."""
    for ref_number, ref in enumerate(refs):
        line = _seek_in(backend, ref, moment)
        if line is not None:
            return (ref_number, line)
    return end(backend, refs)


def _seek_in(backend: Backend, ref: Ref, moment: datetime) -> int | None:
    """The first line of the ref written at or after `moment`: from the last checkpoint known to be
    before it, line by line (so the index grows as far as `moment`, once)."""
    index = _index(backend, ref)
    with _lock:
        times = list(index.first_times)
        lines = list(index.lines)
    start = 0
    for at, first in enumerate(times):
        if first is None or first >= moment:
            break
        start = lines[at]
    for number, line in _lines_from(backend, ref, start):
        if line.time >= moment:
            return number
    return None
