"""Reading log streams by position (hyperplan/services/jobs/log_reading.py) and the tokens that carry one
(hyperplan/core/log_events.py): a page costs what it holds, not the stream.

The streams are timed log files in the back ends' own format, read by the local back end's reader
(backends/timedlog.py), whose cursor is a byte offset; what the readers asked of them is counted.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from hyperplan.backends import timedlog
from hyperplan.backends.base import Backend, TaskRef, TimedLine, TimedLines, timed_line
from hyperplan.core import log_events
from hyperplan.errors import InvalidParameter
from hyperplan.services.jobs import log_reading

T0 = datetime(2026, 12, 31, 23, 50, tzinfo=UTC)
BATCH = 40
"""Checkpoints this far apart here (the module's own, a few thousand, would only make the test slow)."""


TAIL = BATCH // 2  # the first attempt's lines past its last full batch


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_reading, "BATCH", BATCH)


class TimedFiles:
    """A back end's read_lines over timed log files, one a ref, counting the lines it returns."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lines_read = 0

    def write(self, ref: TaskRef, first: int, count: int) -> None:
        with (self.root / ref.task_id).open("a") as log:
            for number in range(first, first + count):
                at = T0 + timedelta(seconds=number)
                log.write(f"{int(at.timestamp())}.000000 o line {number}\n")

    def read_lines(
        self, ref: TaskRef, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        records, next_cursor = timedlog.read_records(self.root / ref.task_id, cursor, limit, max_bytes)
        self.lines_read += len(records)
        return TimedLines(tuple(timed_line(*record) for record in records), next_cursor)


def _weight(line: TimedLine) -> int:
    return len(line.text.encode())


def _texts(found: list[tuple[Any, Any]]) -> list[str]:
    return [line.text for _at, line in found]


def test_pages_cost_what_they_hold_once_the_index_is_built(tmp_path: Path) -> None:
    files = TimedFiles(tmp_path)
    backend = cast(Backend, files)
    refs = (TaskRef("attempt-1"), TaskRef("attempt-2"))  # a job's two attempts: one stream
    files.write(refs[0], 0, 2 * BATCH + TAIL)
    files.write(refs[1], 2 * BATCH + TAIL, 3 * BATCH)
    total = 5 * BATCH + TAIL

    # Forward from the start, 100 lines a page, as the SDK follows a stream: every line once, in order.
    position, texts, pages = (0, 0), [], 0
    while True:
        before = files.lines_read
        page: list[tuple[Any, Any]] = []
        for at, line in log_reading.forward(backend, refs, position):
            if len(page) == 10:
                break
            page.append((at, line))
        assert files.lines_read - before <= 2 * BATCH + 10  # a batch to reach the position, the page
        if not page:
            break
        texts += _texts(page)
        position = (page[-1][0][0], page[-1][0][1] + 1)
        pages += 1
    assert texts == [f"line {n}" for n in range(total)] and pages == total // 10 + (total % 10 > 0)

    # A time is found by the checkpoints' times and one batch; the end and backward reads are bounded.
    before = files.lines_read
    moment = T0 + timedelta(seconds=4 * BATCH + 7)
    found = log_reading.seek(backend, refs, moment)
    assert files.lines_read - before <= 2 * BATCH
    assert found == (1, 2 * BATCH - TAIL + 7)
    assert next(log_reading.forward(backend, refs, found))[1].time == moment
    before = files.lines_read
    latest = log_reading.backward(backend, refs, log_reading.end(backend, refs), 3, _weight)
    assert _texts(latest) == [f"line {n}" for n in range(total - 3, total)]
    across = log_reading.backward(backend, refs, (1, 2), 4, _weight)  # back over the attempts' seam
    assert _texts(across) == [f"line {n}" for n in range(2 * BATCH + TAIL - 2, 2 * BATCH + TAIL + 2)]
    assert files.lines_read - before <= 6 * BATCH
    assert log_reading.seek(backend, refs, T0 + timedelta(days=1)) == log_reading.end(backend, refs)

    # The stream goes on in its last ref: the end position reads what is written next.
    end = log_reading.end(backend, refs)
    files.write(refs[1], total, 2)
    assert _texts(list(log_reading.forward(backend, refs, end))) == [f"line {total}", f"line {total + 1}"]
    summary = log_reading.summary(backend, refs[0])
    assert summary.lines == 2 * BATCH + TAIL and summary.first_time == T0
    assert summary.stored_bytes == (tmp_path / "attempt-1").stat().st_size - (2 * BATCH + TAIL) * len(
        "0000000000.000000 o "
    )


def test_tokens_cannot_be_forged_altered_or_used_elsewhere() -> None:
    key = log_events.token_key(b"the store's shared key")
    scope = ("111111111111", "/aws/sagemaker/TrainingJobs", "fit/algo-1-1")
    token = log_events.position_token(key, scope, "f", (1, 4242))
    assert log_events.read_position_token(key, scope, token) == ("f", (1, 4242))
    altered = token.replace("/4242/", "/4243/")
    other_stream = ("111111111111", "/aws/sagemaker/TrainingJobs", "fit/algo-2-1")
    other_account = ("222222222222", *scope[1:])
    for bad_key, bad_scope, bad_token in (
        (key, scope, altered),
        (key, other_stream, token),
        (key, other_account, token),
        (log_events.token_key(b"another server's key"), scope, token),
        (key, scope, "f/1/4242"),
        (key, scope, "f/0/" + "9" * 40 + "/" + "0" * 32),
    ):
        with pytest.raises(InvalidParameter):
            log_events.read_position_token(bad_key, bad_scope, bad_token)
    positions = {"fit/algo-1-1": (0, 10), "fit/algo-2-1": (1, 0)}
    group_scope = scope[:2]
    many = log_events.streams_token(key, group_scope, positions)
    assert log_events.read_streams_token(key, group_scope, many) == positions
    for bad in (many[:-1] + ("0" if many[-1] != "0" else "1"), "x" + many, many.replace(".", "")):
        with pytest.raises(InvalidParameter):
            log_events.read_streams_token(key, group_scope, bad)
    with pytest.raises(InvalidParameter):
        log_events.read_streams_token(key, ("222222222222", scope[1]), many)


class CountingBytes(TimedFiles):
    """The same reader, also counting the bytes of text it returns and the most one read returned."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.bytes_read = 0
        self.largest_read = 0

    def write_texts(self, ref: TaskRef, texts: list[str]) -> None:
        with (self.root / ref.task_id).open("ab") as log:
            for number, text in enumerate(texts):
                log.write(timedlog.record(int(T0.timestamp() * 1e6) + number, b"o", text.encode()))

    def read_lines(
        self, ref: TaskRef, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        found = super().read_lines(ref, cursor, limit, max_bytes)
        held = sum(len(line.text.encode()) for line in found.lines)
        self.bytes_read += held
        self.largest_read = max(self.largest_read, held)
        return found


def test_reads_and_pages_are_bounded_in_bytes_whatever_the_lines(tmp_path: Path) -> None:
    """Lines of up to 64 KiB (a timed log's largest record), some of a three-byte character: the back end
    is never asked for more than READ_BYTES and a line at once, checkpoints come at least every
    SPAN_BYTES (so reaching a position costs about a span), and a backward page holds what the bound
    lets it, every line once across the pages."""
    files = CountingBytes(tmp_path)
    backend = cast(Backend, files)
    big = 64 * 1024 - 8
    texts = [
        f"{n:07d} " + ("€" * (big // 3) if n % 3 == 0 else "x" * (big if n % 3 == 1 else 300))
        for n in range(120)
    ]
    refs = (TaskRef("attempt-1"), TaskRef("attempt-2"))
    files.write_texts(refs[0], texts[:70])
    files.write_texts(refs[1], texts[70:])
    # Forward: every line once; no read larger than READ_BYTES and one line.
    assert _texts(list(log_reading.forward(backend, refs, (0, 0)))) == texts
    assert files.largest_read <= log_reading.READ_BYTES + 64 * 1024
    # Checkpoints by bytes, though BATCH (40 here) lines would hold 1.7 MB: a position is reached by
    # reading at most a span (and a read past it).
    before = files.bytes_read
    assert next(log_reading.forward(backend, refs, (0, 63)))[1].text == texts[63]
    assert files.bytes_read - before <= log_reading.SPAN_BYTES + log_reading.READ_BYTES + 2 * 64 * 1024
    # Backward pages of at most 1 MiB by the weight given, from the end to the start, across the refs.
    pages: list[list[str]] = []
    position = log_reading.end(backend, refs)
    while True:
        page = log_reading.backward(backend, refs, position, 10_000, _weight, max_bytes=1 << 20)
        if not page:
            break
        assert sum(_weight(line) for _at, line in page) <= 1 << 20
        # Full: the line before it would not have fitted.
        if page[0][0] != (0, 0):
            earlier = log_reading.backward(backend, refs, page[0][0], 1, _weight)
            assert sum(_weight(line) for _at, line in page) + _weight(earlier[0][1]) > 1 << 20
        pages.append(_texts(page))
        position = page[0][0]
    assert [text for page in reversed(pages) for text in page] == texts
    assert len(pages) > 4
    # A line larger than the bound comes alone, whole: paging moves on.
    alone = log_reading.backward(backend, refs, log_reading.end(backend, refs), 10, _weight, max_bytes=10)
    assert _texts(alone) == texts[-1:]
    # The limit in lines holds too.
    assert _texts(log_reading.backward(backend, refs, (1, 2), 3, _weight)) == texts[69:72]
