"""The back end's timed lines as CloudWatch Logs' groups, streams and events, each account its own.

Training jobs write to the group ``/aws/sagemaker/TrainingJobs``, one stream per instance named as
SageMaker names it, ``JOB/algo-N-EPOCH`` (EPOCH: the job's creation, in seconds), and the stream goes on
across the job's attempts: a job resumed in a later segment writes on in the stream the SDK follows.
A cluster's nodes write their lifecycle scripts' output to ``/aws/sagemaker/Clusters/NAME/ID``, one
stream per node, ``LifecycleConfig/GROUP/INSTANCE_ID``. An event is one line of output (stdout and
stderr alike) with the time it was written (``backends/base.py``: ``read_lines``).

Nothing is copied: each read goes to the back end. An account sees only its own jobs and clusters, so
another account's group or stream is not found, as one that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from hyperplan.backends.base import NodeRef, Ref, TaskRef, TimedLine, UnknownResource
from hyperplan.errors import InvalidParameter, ResourceNotFound
from hyperplan.services import cluster_records, job_records
from hyperplan.services.accounts import Caller
from hyperplan.services.context import ServiceContext
from hyperplan.store.schema import ClusterNode, InstanceGroup

JOBS_GROUP = "/aws/sagemaker/TrainingJobs"
CLUSTERS_GROUP = "/aws/sagemaker/Clusters/"
READ_BATCH = 5000
MAX_STREAM_EVENTS = 1_000_000
"""The most events one stream is read to; past them a stream reads as cut (a bound on one request's work)."""


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
    event's times (which takes reading them: the prefix keeps that to the streams asked for)."""
    views: list[LogStreamView] = []
    for source in _sources(runtime, caller, group):
        if not source.name.startswith(prefix):
            continue
        lines = list(_lines(runtime, source))
        views.append(
            LogStreamView(
                source.name,
                source.created_at,
                f"{group_arn(runtime, caller.account_id, group)}:log-stream:{source.name}",
                lines[0].time if lines else None,
                lines[-1].time if lines else None,
                sum(len(line.text.encode()) + 1 for line in lines),
            )
        )
    return sorted(views, key=lambda view: view.name)


def events(runtime: ServiceContext, caller: Caller, group: str, stream: str) -> list[LogEventView]:
    """Every event of one stream, in the order written (across a job's attempts, in order)."""
    for source in _sources(runtime, caller, group):
        if source.name == stream:
            return [LogEventView(stream, line.time, line.text) for line in _lines(runtime, source)]
    raise ResourceNotFound("The specified log stream does not exist.")


def events_of_streams(
    runtime: ServiceContext, caller: Caller, group: str, names: list[str] | None, prefix: str | None
) -> tuple[list[str], list[LogEventView]]:
    """FilterLogEvents' reading: the streams named (each must exist) or those under ``prefix`` (or all),
    and their events merged in time order."""
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
    merged: list[tuple[datetime, int, int, LogEventView]] = []
    for rank, source in enumerate(sorted(sources, key=lambda s: s.name)):
        for index, line in enumerate(_lines(runtime, source)):
            merged.append((line.time, rank, index, LogEventView(source.name, line.time, line.text)))
    merged.sort(key=lambda entry: entry[:3])
    return sorted(source.name for source in sources), [entry[3] for entry in merged]


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


def _lines(runtime: ServiceContext, source: _Source) -> Iterator[TimedLine]:
    """Each ref's timed lines in turn; one the back end has forgotten reads as empty."""
    count = 0
    for ref in source.refs:
        cursor = 0
        while count < MAX_STREAM_EVENTS:
            try:
                found = runtime.backend.read_lines(ref, cursor, READ_BATCH)
            except UnknownResource:
                break
            yield from found.lines
            count += len(found.lines)
            if not found.lines or found.next_cursor == cursor:
                break
            cursor = found.next_cursor
