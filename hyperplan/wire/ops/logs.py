"""CloudWatch Logs operations (``Logs_20140328.*``): the part the tools use to read a job's output.

Wire names in, ``services/jobs/log_streams`` calls, wire names out; times on this wire are epoch
milliseconds. Paging and filter patterns follow ``core/log_events``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from hyperplan.core import log_events
from hyperplan.errors import InvalidParameter
from hyperplan.services.jobs import log_streams
from hyperplan.services.jobs.log_streams import TimeBounds
from hyperplan.wire.operations import RequestContext, operation

DESCRIBE_LIMIT = 50


def millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _group(ctx: RequestContext, request: dict[str, Any]) -> str:
    name, identifier = request.get("logGroupName"), request.get("logGroupIdentifier")
    if (name is None) == (identifier is None):
        raise InvalidParameter("Exactly one of logGroupName and logGroupIdentifier must be given.")
    if name is not None:
        return str(name)
    return log_streams.group_name(ctx.runtime, ctx.caller, str(identifier))


@operation("DescribeLogGroups", service="logs")
def describe_log_groups(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    prefix, pattern = request.get("logGroupNamePrefix"), request.get("logGroupNamePattern")
    if prefix is not None and pattern is not None:
        raise InvalidParameter("logGroupNamePrefix and logGroupNamePattern cannot both be given.")
    groups = log_streams.log_groups(ctx.runtime, ctx.caller)
    if prefix is not None:
        groups = [group for group in groups if group.name.startswith(prefix)]
    if pattern is not None:
        groups = [group for group in groups if pattern.lower() in group.name.lower()]
    if request.get("logGroupIdentifiers"):
        wanted = {log_streams.group_name(ctx.runtime, ctx.caller, i) for i in request["logGroupIdentifiers"]}
        groups = [group for group in groups if group.name in wanted]
    found, token = log_events.slice_with_token(
        groups, request.get("nextToken"), request.get("limit", DESCRIBE_LIMIT)
    )
    answer: dict[str, Any] = {
        "logGroups": [
            {
                "logGroupName": group.name,
                "creationTime": millis(group.created_at),
                "metricFilterCount": 0,
                "arn": f"{group.arn}:*",
                "logGroupArn": group.arn,
                "storedBytes": 0,
                "logGroupClass": "STANDARD",
            }
            for group in found
        ]
    }
    if token is not None:
        answer["nextToken"] = token
    return answer


@operation("DescribeLogStreams", service="logs")
def describe_log_streams(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = _group(ctx, request)
    prefix = request.get("logStreamNamePrefix")
    by_time = request.get("orderBy") == "LastEventTime"
    if by_time and prefix is not None:
        raise InvalidParameter("Cannot order by LastEventTime with a logStreamNamePrefix.")
    streams = log_streams.log_streams(ctx.runtime, ctx.caller, group, prefix or "")
    if by_time:
        streams.sort(key=lambda stream: (stream.last_event_at or stream.created_at, stream.name))
    if request.get("descending"):
        streams.reverse()
    found, token = log_events.slice_with_token(
        streams, request.get("nextToken"), request.get("limit", DESCRIBE_LIMIT)
    )
    views = []
    for stream in found:
        view: dict[str, Any] = {
            "logStreamName": stream.name,
            "creationTime": millis(stream.created_at),
            "arn": stream.arn,
            "storedBytes": stream.stored_bytes,
        }
        if stream.first_event_at is not None and stream.last_event_at is not None:
            view["firstEventTimestamp"] = millis(stream.first_event_at)
            view["lastEventTimestamp"] = millis(stream.last_event_at)
            view["lastIngestionTime"] = millis(stream.last_event_at)
        views.append(view)
    answer: dict[str, Any] = {"logStreams": views}
    if token is not None:
        answer["nextToken"] = token
    return answer


@operation("GetLogEvents", service="logs")
def get_log_events(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = _group(ctx, request)
    page = log_streams.get_events(
        ctx.runtime,
        ctx.caller,
        group,
        request["logStreamName"],
        token=request.get("nextToken"),
        from_head=request.get("startFromHead", False),
        bounds=TimeBounds.of_millis(request.get("startTime"), request.get("endTime")),
        limit=request.get("limit", log_events.MAX_EVENTS),
    )
    return {
        "events": [
            {"timestamp": millis(event.time), "message": event.message, "ingestionTime": millis(event.time)}
            for event in page.events
        ],
        "nextForwardToken": page.forward_token,
        "nextBackwardToken": page.backward_token,
    }


@operation("FilterLogEvents", service="logs")
def filter_log_events(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    group = _group(ctx, request)
    page = log_streams.filter_events(
        ctx.runtime,
        ctx.caller,
        group,
        names=request.get("logStreamNames"),
        prefix=request.get("logStreamNamePrefix"),
        token=request.get("nextToken"),
        bounds=TimeBounds.of_millis(request.get("startTime"), request.get("endTime")),
        pattern=log_events.filter_pattern(request.get("filterPattern")),
        limit=request.get("limit", log_events.MAX_EVENTS),
    )
    answer: dict[str, Any] = {
        "events": [
            {
                "logStreamName": event.stream,
                "timestamp": millis(event.time),
                "message": event.message,
                "ingestionTime": millis(event.time),
                "eventId": event.event_id,
            }
            for event in page.events
        ],
        "searchedLogStreams": [
            {"logStreamName": name, "searchedCompletely": complete} for name, complete in page.searched
        ],
    }
    if page.next_token is not None:
        answer["nextToken"] = page.next_token
    return answer
