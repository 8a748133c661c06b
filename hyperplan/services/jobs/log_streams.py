"""The back end's timed lines as CloudWatch Logs' groups, streams and events, each account its own.

Training jobs write to the group ``/aws/sagemaker/TrainingJobs``, one stream per instance named as
SageMaker names it, ``JOB/algo-N-EPOCH`` (EPOCH: the job's creation, in seconds), and the stream goes on
across the job's attempts: a job resumed in a later segment writes on in the stream the SDK follows.
A cluster's nodes write their lifecycle scripts' output to ``/aws/sagemaker/Clusters/NAME/ID``, one
stream per node, ``LifecycleConfig/GROUP/INSTANCE_ID``. An event is one line of output (stdout and
stderr alike) with the time it was written (``backends/base.py``: ``read_lines``).

Nothing is copied: each read goes to the back end, from a position (services/jobs/log_reading.py), so that
a page costs what it holds, not the stream: GetLogEvents' tokens carry a position, FilterLogEvents' one
per stream, signed (core/log_events.py); a start time is found by the index's times. A page ends at
its limit of events or at 1 MiB of them (core/page_bytes.py; an event weighs its message's UTF-8 bytes
and 26, core/log_events.event_bytes), and its token goes on from the first event left out, forward and
backward alike; a read holds the page and a bounded read of the back end, never the stream. An account sees
only its own jobs and clusters, so another account's group or stream is not found, as one that does not
exist, and a token given for one stream reads no other.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select

from hyperplan.backends.base import NodeRef, Ref, TaskRef, TimedLine
from hyperplan.core import log_events
from hyperplan.core.log_events import FilterPattern, Position
from hyperplan.core.page_bytes import PageBytes
from hyperplan.errors import InvalidParameter, ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_records
from hyperplan.services.jobs import job_records, log_reading
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ClusterNode, InstanceGroup

JOBS_GROUP = "/aws/sagemaker/TrainingJobs"
CLUSTERS_GROUP = "/aws/sagemaker/Clusters/"
MAX_SCANNED = 100_000
"""The most lines one FilterLogEvents call reads: past them it answers what it found and a token."""
MAX_SCANNED_BYTES = 64 << 20
"""The most bytes of lines (by their events' weight) one FilterLogEvents call reads, likewise: 100,000
lines of 64 KiB would be 6.4 GB read for one call."""


@dataclass(frozen=True)
class LogGroupView:
    name: str
    created_at: datetime
    arn: str


@dataclass(frozen=True)
class LogStreamView:
    name: str
    created_at: datetime
    arn: str
    first_event_at: datetime | None
    last_event_at: datetime | None
    stored_bytes: int


@dataclass(frozen=True)
class LogEventView:
    stream: str
    time: datetime
    message: str
    event_id: str = ""


@dataclass(frozen=True)
class EventsPage:
    events: list[LogEventView]
    forward_token: str
    backward_token: str


@dataclass(frozen=True)
class FilteredPage:
    events: list[LogEventView]
    searched: list[tuple[str, bool]]  # (stream, searched completely?)
    next_token: str | None


@dataclass(frozen=True)
class TimeBounds:
    start: datetime | None = None  # inclusive
    end: datetime | None = None  # exclusive

    @classmethod
    def of_millis(cls, start: int | None, end: int | None) -> TimeBounds:
        def moment(millis: int | None) -> datetime | None:
            return None if millis is None else datetime.fromtimestamp(millis / 1000, UTC)

        if start is not None and end is not None and end < start:
            raise InvalidParameter("endTime must not be before startTime.")
        return cls(moment(start), moment(end))

    def before(self, moment: datetime) -> bool:
        return self.start is not None and moment < self.start

    def past(self, moment: datetime) -> bool:
        return self.end is not None and moment >= self.end


@dataclass(frozen=True)
class _Source:
    name: str
    created_at: datetime
    refs: tuple[Ref, ...]


def group_arn(runtime: ServiceContext, account_id: str, name: str) -> str:
    return f"arn:aws:logs:{runtime.region}:{account_id}:log-group:{name}"


def stream_epoch(created_at: datetime) -> int:
    return int(created_at.timestamp())


def log_groups(runtime: ServiceContext, caller: Caller) -> list[LogGroupView]:
    """The caller's groups, by name: the jobs' once it has a job, one per cluster."""
    groups: list[LogGroupView] = []
    with runtime.db.read() as session:
        jobs = job_records.list_jobs(session, caller.account_id)
        if jobs:
            first = min(job.created_at for job in jobs)
            groups.append(LogGroupView(JOBS_GROUP, first, group_arn(runtime, caller.account_id, JOBS_GROUP)))
        for cluster in cluster_records.list_clusters(session, caller.account_id):
            name = f"{CLUSTERS_GROUP}{cluster.name}/{cluster.cluster_id}"
            groups.append(LogGroupView(name, cluster.created_at, group_arn(runtime, caller.account_id, name)))
    return sorted(groups, key=lambda group: group.name)


def group_name(runtime: ServiceContext, caller: Caller, identifier: str) -> str:
    """A group named by its name or its ARN (``logGroupIdentifier``); another account's ARN is not found."""
    prefix = f"arn:aws:logs:{runtime.region}:"
    if not identifier.startswith(prefix):
        return identifier
    account, _, rest = identifier.removeprefix(prefix).partition(":log-group:")
    name = rest.removesuffix(":*")
    if account != caller.account_id or not name:
        raise ResourceNotFound("The specified log group does not exist.")
    return name


def log_streams(runtime: ServiceContext, caller: Caller, group: str, prefix: str = "") -> list[LogStreamView]:
    """The group's streams whose names start with ``prefix``, by name, each with its first and last
    event's times and size (from each ref's index and last batch: services/jobs/log_reading.py)."""
    views: list[LogStreamView] = []
    for source in _sources(runtime, caller, group):
        if not source.name.startswith(prefix):
            continue
        summaries = [log_reading.summary(runtime.backend, ref) for ref in source.refs]
        written = [summary for summary in summaries if summary.lines]
        views.append(
            LogStreamView(
                source.name,
                source.created_at,
                f"{group_arn(runtime, caller.account_id, group)}:log-stream:{source.name}",
                written[0].first_time if written else None,
                written[-1].last_time if written else None,
                sum(summary.stored_bytes for summary in summaries),
            )
        )
    return sorted(views, key=lambda view: view.name)


def _key(runtime: ServiceContext) -> bytes:
    return log_events.token_key(runtime.offering_key)


def get_events(
    runtime: ServiceContext,
    caller: Caller,
    group: str,
    stream: str,
    *,
    token: str | None,
    from_head: bool,
    bounds: TimeBounds,
    limit: int,
) -> EventsPage:
    """GetLogEvents: a page of one stream's events, forward from a token's position (or the start time,
    or the stream's start, with ``startFromHead``), or backward from it (without a token and
    ``startFromHead``: the latest events, before the end time if one is given)."""
    source = next((s for s in _sources(runtime, caller, group) if s.name == stream), None)
    if source is None:
        raise ResourceNotFound("The specified log stream does not exist.")
    backend, refs = runtime.backend, source.refs
    scope = (caller.account_id, group, stream)
    if token:
        direction, position = log_events.read_position_token(_key(runtime), scope, token)
    elif from_head:
        direction = "f"
        position = log_reading.seek(backend, refs, bounds.start) if bounds.start is not None else (0, 0)
    else:
        direction = "b"
        position = (
            log_reading.seek(backend, refs, bounds.end)
            if bounds.end is not None
            else log_reading.end(backend, refs)
        )
    if direction == "f":
        found, after = _forward_page(runtime, refs, position, bounds, limit)
    else:
        read = log_reading.backward(backend, refs, position, limit, _line_bytes)
        found = [
            (at, line) for at, line in read if not bounds.before(line.time) and not bounds.past(line.time)
        ]
        after = (read[-1][0][0], read[-1][0][1] + 1) if read else position
        position = read[0][0] if read else position
    first = found[0][0] if found and direction == "f" else position
    return EventsPage(
        [LogEventView(stream, line.time, line.text) for _at, line in found],
        log_events.position_token(_key(runtime), scope, "f", after),
        log_events.position_token(_key(runtime), scope, "b", first),
    )


def _forward_page(
    runtime: ServiceContext, refs: tuple[Ref, ...], position: Position, bounds: TimeBounds, limit: int
) -> tuple[list[tuple[Position, TimedLine]], Position]:
    """Up to `limit` lines within the bounds from `position`, as many as one page holds, and the position
    after the last one read (a line past the end time, or one the page has no room for, is not read: the
    next page starts there)."""
    found: list[tuple[Position, TimedLine]] = []
    page = PageBytes()
    after = position
    for at, line in log_reading.forward(runtime.backend, refs, position):
        if len(found) >= limit or bounds.past(line.time):
            return found, at
        if not bounds.before(line.time):
            if not page.take(_line_bytes(line)):
                return found, at
            found.append((at, line))
        after = (at[0], at[1] + 1)
    return found, after


def _line_bytes(line: TimedLine) -> int:
    return log_events.event_bytes(line.text)


def filter_events(
    runtime: ServiceContext,
    caller: Caller,
    group: str,
    *,
    names: list[str] | None,
    prefix: str | None,
    token: str | None,
    bounds: TimeBounds,
    pattern: FilterPattern,
    limit: int,
) -> FilteredPage:
    """FilterLogEvents: the streams named (each must exist) or those under ``prefix`` (or all), their
    events that match merged in time order, from each stream's position in the token (or the start
    time, or its start); at most MAX_SCANNED lines read a call."""
    if names is not None and prefix is not None:
        raise InvalidParameter("logStreamNames and logStreamNamePrefix cannot both be given.")
    sources = _sources(runtime, caller, group)
    if names is not None:
        known = {source.name for source in sources}
        missing = [name for name in names if name not in known]
        if missing:
            raise ResourceNotFound(f"The specified log stream does not exist: {missing[0]}.")
        sources = [source for source in sources if source.name in set(names)]
    elif prefix is not None:
        sources = [source for source in sources if source.name.startswith(prefix)]
    sources.sort(key=lambda source: source.name)
    scope = (caller.account_id, group)
    given = log_events.read_streams_token(_key(runtime), scope, token) if token else {}
    merge = _Merge(runtime, sources, given, bounds)
    found: list[LogEventView] = []
    page = PageBytes()
    scanned = scanned_bytes = 0
    while len(found) < limit and scanned < MAX_SCANNED and scanned_bytes < MAX_SCANNED_BYTES:
        head = merge.peek()
        if head is None:
            break
        name, at, line = head
        wanted = not bounds.before(line.time) and pattern.matches(line.text)
        size = _line_bytes(line)
        if wanted and not page.take(size):
            break  # left unread: the token goes on from it
        merge.take()
        scanned += 1
        scanned_bytes += size
        if wanted:
            found.append(LogEventView(name, line.time, line.text, _event_id(name, at)))
    positions = merge.positions()
    more = not merge.finished()
    return FilteredPage(
        found,
        [(source.name, merge.done(source.name)) for source in sources],
        log_events.streams_token(_key(runtime), scope, positions) if more else None,
    )


def _event_id(stream: str, at: Position) -> str:
    return f"{zlib.crc32(stream.encode()):010d}{at[0]:05d}{at[1]:015d}"


class _Merge:
    """The streams' lines merged in time order (ties: by stream name), read lazily, each stream from its
    own position; a stream ends at its end, or at its first line past the end time."""

    def __init__(
        self,
        runtime: ServiceContext,
        sources: list[_Source],
        given: dict[str, Position],
        bounds: TimeBounds,
    ) -> None:
        self.bounds = bounds
        self.heads: list[tuple[datetime, int, Position, TimedLine]] = []
        self.readers: dict[int, Iterator[tuple[Position, TimedLine]]] = {}
        self.next: dict[str, Position] = {}
        self.names = [source.name for source in sources]
        self.ended: set[str] = set()
        for rank, source in enumerate(sources):
            start = given.get(source.name)
            if start is None:
                start = (
                    log_reading.seek(runtime.backend, source.refs, bounds.start)
                    if bounds.start is not None
                    else (0, 0)
                )
            self.next[source.name] = start
            self.readers[rank] = log_reading.forward(runtime.backend, source.refs, start)
            self._advance(rank)

    def _advance(self, rank: int) -> None:
        name = self.names[rank]
        for at, line in self.readers[rank]:
            if self.bounds.past(line.time):
                break  # not read: the stream stops here, this call and the next
            heapq.heappush(self.heads, (line.time, rank, at, line))
            return
        self.ended.add(name)

    def peek(self) -> tuple[str, Position, TimedLine] | None:
        """The next line in time order, left where it is."""
        if not self.heads:
            return None
        _time, rank, at, line = self.heads[0]
        return self.names[rank], at, line

    def take(self) -> tuple[str, Position, TimedLine] | None:
        if not self.heads:
            return None
        _time, rank, at, line = heapq.heappop(self.heads)
        name = self.names[rank]
        self.next[name] = (at[0], at[1] + 1)
        self._advance(rank)
        return name, at, line

    def positions(self) -> dict[str, Position]:
        """Where each stream goes on: its next unread line."""
        found = dict(self.next)
        for _time, rank, at, _line in self.heads:
            found[self.names[rank]] = at
        return found

    def done(self, name: str) -> bool:
        return name in self.ended and all(self.names[rank] != name for _t, rank, _a, _l in self.heads)

    def finished(self) -> bool:
        return not self.heads


def _sources(runtime: ServiceContext, caller: Caller, group: str) -> list[_Source]:
    if group == JOBS_GROUP:
        return _job_sources(runtime, caller)
    if group.startswith(CLUSTERS_GROUP):
        return _cluster_sources(runtime, caller, group.removeprefix(CLUSTERS_GROUP))
    raise ResourceNotFound("The specified log group does not exist.")


def _job_sources(runtime: ServiceContext, caller: Caller) -> list[_Source]:
    sources: list[_Source] = []
    with runtime.db.read() as session:
        jobs = job_records.list_jobs(session, caller.account_id)
        if not jobs:
            raise ResourceNotFound("The specified log group does not exist.")
        for job in jobs:
            hosts: dict[str, list[tuple[int, str]]] = {}
            for instance in job_records.instances_of(session, job.id):
                hosts.setdefault(instance.host, []).append((instance.attempt, instance.task_id))
            epoch = stream_epoch(job.created_at)
            for host, tasks in sorted(hosts.items(), key=lambda item: int(item[0].rpartition("-")[2])):
                refs = tuple(TaskRef(task_id) for _attempt, task_id in sorted(tasks))
                sources.append(_Source(f"{job.name}/{host}-{epoch}", job.created_at, refs))
    return sources


def _cluster_sources(runtime: ServiceContext, caller: Caller, rest: str) -> list[_Source]:
    name, _, cluster_id = rest.rpartition("/")
    with runtime.db.read() as session:
        cluster = next(
            (
                c
                for c in cluster_records.list_clusters(session, caller.account_id)
                if c.cluster_id == cluster_id
            ),
            None,
        )
        if cluster is None or cluster.name != name:
            raise ResourceNotFound("The specified log group does not exist.")
        rows = session.execute(
            select(ClusterNode, InstanceGroup.name)
            .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
            .where(ClusterNode.cluster_id == cluster.id)
            .order_by(ClusterNode.id)
        ).all()
        return [
            _Source(
                f"LifecycleConfig/{group}/{node.instance_id}", node.launched_at, (NodeRef(node.backend_id),)
            )
            for node, group in rows
        ]
