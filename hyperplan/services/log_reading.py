"""Reading a log stream's events by position, at a cost bounded by what is read, not by the stream.

A stream is its refs' timed lines one after the other (a job's attempts, in order), and a position in it
is ``(ref, line)``: the ref's index in the stream and a line's number in that ref. The back end reads
lines from an opaque cursor (``Backend.read_lines``), forward only; so each ref has an index, kept in this
process: the cursor of every ``BATCH``-th line, the time of that line, and the bytes before it. The
index is built by reading the ref from its start a batch at a time, as far as a read needs and once (the
lines are never rewritten: a ref's output only grows at its end), after which a read from any position
costs one batch to reach it plus the lines it returns, and a time is found by the checkpoints' times
(lines are written in time order) and one batch.

Every server process builds its own index from the same back end, and so the same positions: a
position handed out by one server reads the same line at another.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from hyperplan.backends.base import Backend, Ref, TimedLine, UnknownResource

BATCH = 2000
"""Lines a checkpoint apart, and read at once."""
INDEXED_REFS = 4096
"""Refs whose index this process keeps (the least recently read are dropped, and rebuilt if read)."""

Position = tuple[int, int]
"""(the ref's index in the stream, the line's number in that ref)."""


@dataclass
class _Index:
    cursors: list[int] = field(default_factory=lambda: [0])
    """cursors[k]: where line k * BATCH starts; a checkpoint is added once the batch before it is full."""
    first_times: list[datetime | None] = field(default_factory=lambda: [None])
    """first_times[k]: the time of line k * BATCH (None until it has been read)."""
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


def batch(backend: Backend, ref: Ref, number: int) -> tuple[TimedLine, ...]:
    """The lines [number * BATCH, (number + 1) * BATCH) of the ref (fewer at its end, none past it)."""
    index = _index(backend, ref)
    while True:
        with _lock:
            known = len(index.cursors) - 1
            if known >= number:
                cursor = index.cursors[number]
                at = number
            else:
                cursor, at = index.cursors[known], known
        lines, next_cursor = _read(backend, ref, cursor)
        _learn(index, at, cursor, lines, next_cursor)
        if at == number:
            return lines
        if len(lines) < BATCH:
            return ()  # the ref ends before that batch


def _read(backend: Backend, ref: Ref, cursor: int) -> tuple[tuple[TimedLine, ...], int]:
    """Up to BATCH lines from `cursor`, and the cursor after them."""
    lines: list[TimedLine] = []
    while len(lines) < BATCH:
        try:
            found = backend.read_lines(ref, cursor, BATCH - len(lines))
        except UnknownResource:
            break  # a ref the back end has forgotten reads as empty
        lines += found.lines
        if not found.lines or found.next_cursor == cursor:
            break
        cursor = found.next_cursor
    return tuple(lines), cursor


def _learn(index: _Index, at: int, cursor: int, lines: Sequence[TimedLine], next_cursor: int) -> None:
    """What a read of batch `at` (from `cursor`) taught: its first line's time, and the next checkpoint
    once the batch is full."""
    with _lock:
        if lines and index.first_times[at] is None:
            index.first_times[at] = lines[0].time
        if len(lines) == BATCH and len(index.cursors) == at + 1 and index.cursors[at] == cursor:
            index.cursors.append(next_cursor)
            index.first_times.append(None)
            index.bytes_before.append(index.bytes_before[at] + sum(_size(line) for line in lines))


def _size(line: TimedLine) -> int:
    return len(line.text.encode()) + 1


def count(backend: Backend, ref: Ref) -> int:
    """The ref's lines so far (reads its last batch, and what is not indexed yet)."""
    index = _index(backend, ref)
    number = len(index.cursors) - 1
    while True:
        lines = batch(backend, ref, number)
        if len(lines) < BATCH:
            return number * BATCH + len(lines)
        number += 1


@dataclass(frozen=True)
class RefSummary:
    lines: int
    first_time: datetime | None
    last_time: datetime | None
    stored_bytes: int


def summary(backend: Backend, ref: Ref) -> RefSummary:
    """Its line count, first and last lines' times and bytes, from the index and its last batch."""
    total = count(backend, ref)
    if total == 0:
        return RefSummary(0, None, None, 0)
    index = _index(backend, ref)
    number = (total - 1) // BATCH
    tail = batch(backend, ref, number)
    with _lock:
        before = index.bytes_before[number]
        first = index.first_times[0]
    return RefSummary(total, first, tail[-1].time, before + sum(_size(line) for line in tail))


def forward(backend: Backend, refs: Sequence[Ref], start: Position) -> Iterator[tuple[Position, TimedLine]]:
    """Each line from `start` on, with its position, across the refs in turn."""
    ref_number, line = start
    while ref_number < len(refs):
        number, skip = divmod(line, BATCH)
        while True:
            lines = batch(backend, refs[ref_number], number)
            for offset in range(skip, len(lines)):
                yield (ref_number, number * BATCH + offset), lines[offset]
            if len(lines) < BATCH:
                break
            number, skip = number + 1, 0
        ref_number, line = ref_number + 1, 0


def end(backend: Backend, refs: Sequence[Ref]) -> Position:
    """The position after the last line: where the stream goes on (in its last ref, the one that may
    still be written)."""
    if not refs:
        return (0, 0)
    return (len(refs) - 1, count(backend, refs[-1]))


def backward(
    backend: Backend, refs: Sequence[Ref], before: Position, limit: int
) -> list[tuple[Position, TimedLine]]:
    """The last `limit` lines before the position `before`, in order."""
    found: list[tuple[Position, TimedLine]] = []
    if not refs:
        return found
    ref_number, line = before
    if ref_number >= len(refs):
        ref_number, line = end(backend, refs)
    line = min(line, count(backend, refs[ref_number]))
    while ref_number >= 0 and len(found) < limit:
        if ref_number < len(refs):
            low = max(0, line - (limit - len(found)))
            found[:0] = _span(backend, refs[ref_number], ref_number, low, line)
        ref_number -= 1
        if ref_number >= 0:
            line = count(backend, refs[ref_number])
    return found


def _span(
    backend: Backend, ref: Ref, ref_number: int, low: int, high: int
) -> list[tuple[Position, TimedLine]]:
    """The ref's lines [low, high), with their positions."""
    out: list[tuple[Position, TimedLine]] = []
    if high <= low:
        return out
    for number in range(low // BATCH, (high + BATCH - 1) // BATCH):
        lines = batch(backend, ref, number)
        for offset, timed in enumerate(lines):
            at = number * BATCH + offset
            if low <= at < high:
                out.append(((ref_number, at), timed))
    return out


def seek(backend: Backend, refs: Sequence[Ref], moment: datetime) -> Position:
    """The position of the first line written at or after `moment` (the end if none is)."""
    for ref_number, ref in enumerate(refs):
        line = _seek_in(backend, ref, moment)
        if line is not None:
            return (ref_number, line)
    return end(backend, refs)


def _seek_in(backend: Backend, ref: Ref, moment: datetime) -> int | None:
    """The first line of the ref written at or after `moment`: from the last checkpoint known to be
    before it, batch by batch (so the index grows as far as `moment`, once)."""
    index = _index(backend, ref)
    with _lock:
        times = list(index.first_times)
    number = 0
    for at, first in enumerate(times):
        if first is None or first >= moment:
            break
        number = at
    while True:
        lines = batch(backend, ref, number)
        if lines and lines[-1].time >= moment:
            return number * BATCH + next(i for i, timed in enumerate(lines) if timed.time >= moment)
        if len(lines) < BATCH:
            return None
        number += 1
