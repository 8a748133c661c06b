"""A search's request (:class:`SearchRequest`) and its validation into a :class:`_Query`, its window cut
into days: the rules of core/search.py's docstring (docs/DECISIONS.md, "Booking policy"). A
ValidationError names the request member that is wrong."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hyperplan.core.fleet import SERVED_TARGETS, BookingPolicy, Fleet, Pool
from hyperplan.core.served_types import check_reservable
from hyperplan.errors import ValidationError

DAY = timedelta(days=1)
UNSERVED_TARGETS = ("endpoint", "studio-apps")


@dataclass(frozen=True)
class SearchRequest:
    instance_type: str
    instance_count: int
    duration_hours: int
    target: str
    start_after: datetime | None = None
    end_before: datetime | None = None


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
    days_ahead: int = 0  # whole days from the search to day 0, rounded up (the packing ranking reads it)

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
        days_ahead=-((now - first_boundary) // DAY),
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


def _too_short(
    policy: BookingPolicy, start_after: datetime | None, end: datetime, start: datetime, now: datetime
) -> str:
    """Why a window holds no day, as a person would put it: it is (partly) in the past, or too short."""
    short = f"EndTimeBefore: {_show(end)} must be at least 24 hours after the earliest start, {_show(start)}"
    past_start = start_after is not None and start_after < now
    service_time = f"the service's time is {_show(now)}"
    lead = f"plans start at the soonest {_spoken(policy.lead_time)} after the service's time"
    if end > now and not past_start:
        return f"{short}."
    if end > now:  # StartTimeAfter alone is in the past: the window starts at the soonest start
        given = _show(start_after or start)
        return f"{short}: StartTimeAfter, {given}, is in the past ({service_time}), and {lead}."
    also = f" (and StartTimeAfter, {_show(start_after or start)}, too)" if past_start else ""
    why = "StartTimeAfter" if start == start_after else lead
    return (
        f"EndTimeBefore: {_show(end)} is in the past: {service_time}{also}. A window must end at least 24 "
        f"hours after the earliest start, {_show(start)} ({why}): at {_show(start + DAY)} or later. Or "
        "leave EndTimeBefore out to search all the time plans may be booked in."
    )


def _spoken(span: timedelta) -> str:
    """A duration as a person says it: "30 minutes", "1 hour 30 minutes", "2 days"."""
    minutes, seconds = divmod(int(span.total_seconds()), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    parts = [(days, "day"), (hours, "hour"), (minutes, "minute"), (seconds, "second")]
    said = [f"{amount} {unit}{'' if amount == 1 else 's'}" for amount, unit in parts if amount]
    return " ".join(said) or "no time"


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
