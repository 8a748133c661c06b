"""A training job's logs for one host, read from the back end page by page, across its attempts: the
bytes as written (read_logs) or the lines with the times they were written (read_timed_logs).

Both pages are bounded in bytes (core/page_bytes.py): a page of bytes holds LOG_PAGE (64 KiB) as
written, at most three times that once bad bytes are shown as U+FFFD (three bytes each), far under the
1 MiB bound; a page of timed lines stops at LINES_PAGE lines or 1 MiB of them, each weighing its text's
UTF-8 bytes and TIMED_LINE_OVERHEAD, and its cursor goes on from the first line left out."""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass

from hyperplan.backends.base import LogStream, TaskRef, TimedLine, TimedLines, UnknownResource
from hyperplan.core.jobs import BETWEEN_ATTEMPTS, FINAL, Secondary
from hyperplan.core.page_bytes import MAX_PAGE_BYTES, PageBytes, utf8_bytes
from hyperplan.errors import ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.jobs import job_records
from hyperplan.services.runtime.context import ServiceContext

LOG_PAGE = 1 << 16


@dataclass(frozen=True)
class LogPage:
    data: bytes
    cursor: str
    attempt: int
    done: bool


def read_logs(
    runtime: ServiceContext, caller: Caller, name: str, host: str, stream: str, cursor: str | None
) -> LogPage:
    """A job's log for one host, across its attempts in order. The cursor is ``ATTEMPT:OFFSET`` (bytes);
    ``done`` once the job has ended and everything has been read."""
    kind = _stream(stream)
    position = parse_cursor(cursor)
    with runtime.db.read() as session:
        job = job_records.get(session, runtime, caller, name)
        tasks = {i.attempt: i.task_id for i in job_records.instances_of(session, job.id) if i.host == host}
        final = Secondary(job.secondary_status) in FINAL and job.attempt_state in BETWEEN_ATTEMPTS
    _check_host(host, job.instance_count)
    attempts = sorted(tasks)
    attempt, offset = position or (attempts[0] if attempts else 1, 0)
    while attempts:
        data = b""
        if attempt in tasks:
            with contextlib.suppress(UnknownResource):
                data = runtime.backend.read_log(TaskRef(tasks[attempt]), kind, offset, LOG_PAGE).data
            if len(data) == LOG_PAGE and b"\n" in data:
                data = data[: data.rindex(b"\n") + 1]  # whole lines, so no character is cut in two
        if data:
            return LogPage(data, f"{attempt}:{offset + len(data)}", attempt, False)
        later = [a for a in attempts if a > attempt]
        if not later:
            break
        attempt, offset = later[0], 0
    return LogPage(b"", f"{attempt}:{offset}", attempt, final)


LINES_PAGE = 1000
TIMED_LINE_OVERHEAD = 64
"""What a timed line weighs beyond its text: its time, its stream and the answer's names for them."""


@dataclass(frozen=True)
class TimedPage:
    lines: tuple[TimedLine, ...]
    cursor: str
    attempt: int
    done: bool


def read_timed_logs(
    runtime: ServiceContext, caller: Caller, name: str, host: str, stream: str | None, cursor: str | None
) -> TimedPage:
    """A job's timed lines for one host (of one stream, or both), across its attempts in order. The
    cursor is ``ATTEMPT:POSITION`` (the back end's timed-log cursor); ``done`` as in read_logs."""
    kind = _stream(stream) if stream else None
    position = parse_cursor(cursor)
    with runtime.db.read() as session:
        job = job_records.get(session, runtime, caller, name)
        tasks = {i.attempt: i.task_id for i in job_records.instances_of(session, job.id) if i.host == host}
        final = Secondary(job.secondary_status) in FINAL and job.attempt_state in BETWEEN_ATTEMPTS
    _check_host(host, job.instance_count)
    attempts = sorted(tasks)
    attempt, offset = position or (attempts[0] if attempts else 1, 0)
    while attempts:
        if attempt in tasks:
            found = _timed_page(runtime, TaskRef(tasks[attempt]), offset, kind)
            if found.lines or found.next_cursor != offset:
                lines = tuple(line for line in found.lines if kind is None or line.stream is kind)
                return TimedPage(lines, f"{attempt}:{found.next_cursor}", attempt, False)
        later = [a for a in attempts if a > attempt]
        if not later:
            break
        attempt, offset = later[0], 0
    return TimedPage((), f"{attempt}:{offset}", attempt, final)


def _timed_page(runtime: ServiceContext, ref: TaskRef, cursor: int, kind: LogStream | None) -> TimedLines:
    """The lines from `cursor` that one page holds (of them, those of `kind` are shown and weighed) and
    the cursor after them. A read holds at most a page and one line; when the page ends before the read
    does, the lines it holds are read again, to learn the back end's cursor after them (a log is never
    rewritten, so they are the same lines)."""
    try:
        found = runtime.backend.read_lines(ref, cursor, LINES_PAGE, max_bytes=MAX_PAGE_BYTES)
        held = _lines_held(found.lines, kind)
        if held == len(found.lines):
            return found
        del found  # before the second read: never two pages at once
        return runtime.backend.read_lines(ref, cursor, held, max_bytes=MAX_PAGE_BYTES)
    except UnknownResource:
        return TimedLines((), cursor)


def _lines_held(lines: tuple[TimedLine, ...], kind: LogStream | None) -> int:
    """How many of the leading lines one page holds (another stream's lines are passed over, unweighed)."""
    page = PageBytes()
    for count, line in enumerate(lines):
        shown = kind is None or line.stream is kind
        if shown and not page.take(utf8_bytes(line.text) + TIMED_LINE_OVERHEAD):
            return count
    return len(lines)


def _stream(stream: str) -> LogStream:
    try:
        return LogStream(stream)
    except ValueError:
        raise ValidationError("stream must be stdout or stderr.") from None


def _check_host(host: str, instance_count: int) -> None:
    if host not in {f"algo-{n}" for n in range(1, instance_count + 1)}:
        raise ValidationError(f"host must be one of algo-1..algo-{instance_count}.")


MAX_LOG_ATTEMPT = 2**31 - 1


MAX_LOG_OFFSET = 2**40
"""1 TiB: far past any log, and an offset every file system seeks to (ext4 refuses past 16 TiB)."""


_CURSOR = re.compile(r"([0-9]{1,13}):([0-9]{1,13})")


def parse_cursor(cursor: str | None) -> tuple[int, int] | None:
    """``ATTEMPT:OFFSET`` as read_logs gives it (None: from the start), checked before anything is read:
    the attempt from 1 to MAX_LOG_ATTEMPT, the offset from 0 to MAX_LOG_OFFSET."""
    if not cursor:
        return None
    match = _CURSOR.fullmatch(cursor)
    if match is None or not 1 <= int(match[1]) <= MAX_LOG_ATTEMPT or int(match[2]) > MAX_LOG_OFFSET:
        raise ValidationError(
            f"cursor must be ATTEMPT:OFFSET as a previous answer gave it (attempt 1 to {MAX_LOG_ATTEMPT}, "
            f"offset 0 to {MAX_LOG_OFFSET}), not {cursor[:64]!r}."
        )
    return int(match[1]), int(match[2])
