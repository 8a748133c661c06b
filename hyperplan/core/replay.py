"""A workload's requests as searches, the buyers' choices, and the jobs the bound is computed over
(docs/PLANNING.md). Pure: `hyperplan simulate` replays through the real services with these; the bench
also replays straight on a calendar (:func:`replay_on_calendar`), which books the same way without a
store, to measure many calendars quickly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from hyperplan.core.bound import Job
from hyperplan.core.calendar import CapacityCalendar
from hyperplan.core.fleet import Fleet
from hyperplan.core.offerings import Offering
from hyperplan.core.search import search
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.workloads import WorkloadRequest
from hyperplan.errors import HyperplanError

HOUR = timedelta(hours=1)


def hour_zero(start: datetime, fleet: Fleet) -> datetime:
    """The first segment end (11:30 UTC by default) at or after ``start``: the workload's hour 0."""
    boundary = datetime.combine(start.date(), fleet.policy.segment_end, tzinfo=start.tzinfo)
    return boundary if boundary >= start else boundary + timedelta(days=1)


def search_request(request: WorkloadRequest, hour0: datetime) -> SearchRequest:
    def at(hours: float | None) -> datetime | None:
        return None if hours is None else hour0 + hours * HOUR

    return SearchRequest(
        request.instance_type, request.count, request.days * 24, request.target,
        at(request.start_after_h), at(request.end_before_h),
    )  # fmt: skip


def chosen(offerings: list[Offering], choice: str) -> Offering | None:
    """The offering a buyer takes: the first, the cheapest (the first of those), or the earliest to end."""
    if not offerings:
        return None
    if choice == "cheapest":
        return min(offerings, key=lambda o: o.upfront_fee)
    if choice == "earliest":
        return min(offerings, key=lambda o: o.end)
    return offerings[0]


def jobs_of(fleet: Fleet, requests: list[WorkloadRequest]) -> tuple[list[Job], list[int]]:
    """The requests as whole-day jobs (days counted from hour 0) over the fleet's reservable pools, and
    those pools' counts. A job's days are the whole days its plan could hold: from the first boundary at
    or after its soonest start to the last before its end (a plan's partial first day is not counted;
    leaving it out only drops capacity that the bound does not need)."""
    policy = fleet.policy
    pools = [pool for pool in fleet.pools if pool.reservable > 0]
    jobs = []
    lead_h, horizon_h = policy.lead_time / HOUR, policy.horizon / HOUR
    for r in requests:
        soonest = max(r.arrival_h + lead_h, r.start_after_h if r.start_after_h is not None else 0.0)
        end = r.end_before_h if r.end_before_h is not None else r.arrival_h + horizon_h
        end = min(end, r.arrival_h + horizon_h + policy.max_days * 24)
        fits = tuple(
            i
            for i, pool in enumerate(pools)
            if pool.instance_type == r.instance_type and pool.reservable >= r.count
        )
        jobs.append(Job(r.count, r.days, math.ceil(soonest / 24 - 1e-9), math.floor(end / 24 + 1e-9), fits))
    return jobs, [pool.reservable for pool in pools]


@dataclass(frozen=True)
class Booked:
    request: WorkloadRequest
    offering: Offering | None  # None: refused (nothing offered, or the offer could not be bought)


def replay_on_calendar(
    fleet: Fleet, requests: list[WorkloadRequest], hour0: datetime, ranking: str | None = None
) -> tuple[list[Booked], CapacityCalendar]:
    """Each request searched at its arrival and the buyer's choice booked, on a calendar of its own."""
    if ranking is not None:
        fleet = replace(fleet, policy=replace(fleet.policy, ranking=ranking))
    calendar = CapacityCalendar(fleet.pools)
    out = []
    for request in requests:
        now = hour0 + request.arrival_h * HOUR
        try:
            offer = chosen(search(fleet, calendar, search_request(request, hour0), now), request.choice)
        except HyperplanError:
            offer = None
        if offer is not None:
            for segment in offer.segments:
                calendar.book(segment.pool_key, segment.start, segment.end, segment.count)
        out.append(Booked(request, offer))
    return out, calendar
