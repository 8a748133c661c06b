"""What the web console shows beyond the API's views: each function owns its transaction and returns
frozen values, so that the console's routes and templates hold no rule and touch no store.

- the key that signs console sessions, kept in the store so that every server accepts every session;
- an offering read back from its signed id (the review page: what the buyer is about to pay);
- a plan's next transition (the soonest start or end of one of its segments);
- the pools' capacity, day by day, over the coming weeks (reserved and free instances);
- the plans an instance group may run on, by the binding rules of ``core/clusters.py``;
- a job's stored artefacts: its checkpoints and its model.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select

from hyperplan.core.clusters import TARGET, GroupFacts, check_binding
from hyperplan.core.fleet import Pool
from hyperplan.core.offerings import Offering, Segment
from hyperplan.core.pricing import segment_price
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.status import NodeStatus
from hyperplan.errors import HyperplanError, ValidationError
from hyperplan.objects.uris import StorageError, StoredObject
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_groups
from hyperplan.services.jobs import job_views
from hyperplan.services.plans import lifecycle, plan_views, plans, quotas
from hyperplan.services.plans.plan_views import PlanView
from hyperplan.services.runtime import fleet
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store import settings
from hyperplan.store.schema import ClusterNode, InstanceGroup, TrainingPlan

SESSION_KEY = "console.session_key"


def session_key(runtime: ServiceContext) -> bytes:
    """The key that signs console session cookies: made on first use, then shared through the store."""
    with runtime.db.write() as session:
        key = settings.get(session, SESSION_KEY)
        if key is None:
            key = secrets.token_hex(32)
            settings.put(session, SESSION_KEY, key)
    return bytes.fromhex(key)


# -- offerings ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PricedSegment:
    segment: Segment
    price: Decimal
    price_per_instance_hour: Decimal


@dataclass(frozen=True)
class OfferingView:
    offering_id: str
    target: str
    instance_type: str
    instance_count: int
    segments: tuple[PricedSegment, ...]
    upfront_fee: Decimal
    currency: str
    price_per_instance_hour: Decimal  # the fee over the instance-hours it buys
    valid_until: datetime


def offering_view(
    runtime: ServiceContext, offering_id: str, offering: Offering, valid_until: datetime
) -> OfferingView:
    priced = []
    for segment in offering.segments:
        pool = runtime.fleet.pool(segment.pool_key)
        price = segment_price(pool, segment.start, segment.end, segment.count, segment.multiplier)
        # What an instance-hour of this segment costs: the list price times its multiplier.
        priced.append(PricedSegment(segment, price, pool.price_per_instance_hour * segment.multiplier))
    hours = sum((s.end - s.start for s in offering.segments), timedelta()) / timedelta(hours=1)
    per_hour = offering.upfront_fee / Decimal(str(hours * offering.instance_count)) if hours else Decimal(0)
    return OfferingView(
        offering_id=offering_id,
        target=offering.target,
        instance_type=offering.instance_type,
        instance_count=offering.instance_count,
        segments=tuple(priced),
        upfront_fee=offering.upfront_fee,
        currency=offering.currency,
        price_per_instance_hour=per_hour.quantize(Decimal("0.01")),
        valid_until=valid_until,
    )


def search(runtime: ServiceContext, caller: Caller, request: SearchRequest) -> list[OfferingView]:
    """SearchTrainingPlanOfferings, with each offering's prices and how long it stays valid."""
    found = plans.search(runtime, caller, request)
    valid_until = runtime.clock.now() + runtime.fleet.policy.offering_validity
    return [offering_view(runtime, s.offering_id, s.offering, valid_until) for s in found]


def read_offering(runtime: ServiceContext, caller: Caller, offering_id: str) -> OfferingView:
    """The offering a signed id carries, as its buyer is about to buy it (ResourceNotFound when the id is
    not the caller's, is forged or has expired: the same answer CreateTrainingPlan would give)."""
    claim = plans._claim_for(runtime, caller, offering_id, runtime.clock.now())
    segments = []
    fee = Decimal(0)
    for pool, part in plans._segments_of(runtime, claim):
        segments.append(Segment(pool.key, part.start, part.end, claim.count, part.multiplier))
        fee += segment_price(pool, part.start, part.end, claim.count, part.multiplier)
    currency = runtime.fleet.pools[claim.segments[0].pool_index].currency
    offering = Offering(claim.target, tuple(segments), fee, currency)
    return offering_view(runtime, offering_id, offering, claim.expires_at)


# -- plans ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transition:
    at: datetime
    what: str


def next_transition(plan: PlanView, now: datetime) -> Transition | None:
    """The soonest start or end of one of the plan's segments after `now` (None when it has ended)."""
    if plan.status in ("Expired", "Failed"):
        return None
    moments = []
    for index, segment in enumerate(plan.segments, 1):
        if segment.start > now:
            moments.append(Transition(segment.start, f"segment {index} starts"))
        if segment.end > now:
            moments.append(Transition(segment.end, f"segment {index} ends"))
    return min(moments, key=lambda t: t.at, default=None)


PLANS_PAGE = 100  # plans a console page lists


def plans_page(
    runtime: ServiceContext, caller: Caller, token: str | None
) -> tuple[list[PlanView], str | None]:
    """A page of the caller's plans, latest start first (a year of history is pages away, not read), and
    the token of the next; a token that is not one the list gave is a ValidationError."""
    query = plans.ListQuery(sort_order="Descending", max_results=PLANS_PAGE, next_token=token or None)
    return plan_views.list_plans(runtime, caller, query)


def live_plans(runtime: ServiceContext, caller: Caller) -> list[PlanView]:
    """The caller's plans that are neither Expired nor Failed: what the capacity page marks."""
    return plan_views.live_plans(runtime, caller)


# -- capacity ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Day:
    start: datetime
    end: datetime
    reserved: int  # the most instances booked at any time of the day

    def free(self, reservable: int) -> int:
        return max(reservable - self.reserved, 0)


@dataclass(frozen=True)
class PoolTimeline:
    pool: Pool
    days: tuple[Day, ...]
    booked_now: int
    utilisation: float  # of the reservable instance-hours over the timeline

    @property
    def start(self) -> datetime:
        return self.days[0].start

    @property
    def end(self) -> datetime:
        return self.days[-1].end


def capacity(runtime: ServiceContext, weeks: int = 8) -> list[PoolTimeline]:
    """Each pool's booking days (11:30 UTC to 11:30 UTC) from the current one, for `weeks` weeks."""
    now = runtime.clock.now()
    boundary = runtime.fleet.policy.segment_end
    first = now.astimezone(UTC).replace(hour=boundary.hour, minute=boundary.minute, second=0, microsecond=0)
    if first > now:
        first -= timedelta(days=1)
    starts = [first + timedelta(days=d) for d in range(weeks * 7)]
    end = starts[-1] + timedelta(days=1)
    timelines = []
    for report in fleet.report(runtime, days=weeks * 7 + 1):
        profile = runtime.calendar.profile(report.pool.key, first, end)
        days = tuple(Day(start, start + timedelta(days=1), _peak(profile, start)) for start in starts)
        timelines.append(PoolTimeline(report.pool, days, report.booked_at(now), report.utilisation()))
    return timelines


def _peak(profile: Sequence[tuple[datetime, int]], start: datetime) -> int:
    """The most booked in [start, start + 1 day) of a profile of runs (from each time on, this many)."""
    end = start + timedelta(days=1)
    peak, current = 0, 0
    for at, count in profile:
        if at <= start:
            current = count
            continue
        if at >= end:
            break
        peak = max(peak, count)
    return max(peak, current)


def pool_nodes(runtime: ServiceContext) -> Mapping[tuple[str, str], Mapping[str, int]]:
    """Per pool, how many cluster nodes (of every account) are in each state, the terminated left out:
    the pools' health as the administrators see it."""
    found: dict[tuple[str, str], dict[str, int]] = {}
    with runtime.db.read() as session:
        rows = session.execute(
            select(
                InstanceGroup.instance_type, ClusterNode.availability_zone, ClusterNode.status, func.count()
            )
            .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
            .where(ClusterNode.status != NodeStatus.TERMINATED)
            .group_by(InstanceGroup.instance_type, ClusterNode.availability_zone, ClusterNode.status)
        )
        for instance_type, zone, status, count in rows:
            found.setdefault((instance_type, zone), {})[status] = count
    return found


# -- clusters ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanChoice:
    arn: str
    name: str
    status: str
    instance_type: str
    zones: tuple[str, ...]
    start: datetime
    end: datetime
    count: int


def plan_choices(
    runtime: ServiceContext, caller: Caller, subnets: Sequence[str]
) -> Mapping[str, tuple[PlanChoice, ...]]:
    """For each instance type of the fleet, the caller's plans a group of that type on these subnets may
    run on: exactly those the binding rules (core/clusters.check_binding) accept."""
    zones = frozenset(z.name for z in (runtime.fleet.zone_of_subnet(s) for s in subnets) if z is not None)
    types = sorted({pool.instance_type for pool in runtime.fleet.pools})
    choices: dict[str, list[PlanChoice]] = {t: [] for t in types}
    with runtime.db.read() as session:
        # Only plans that still hold capacity can take a group: the live ones (never the account's past).
        owned = session.scalars(
            select(TrainingPlan)
            .where(*quotas.live_plan_filter(caller.account_id), TrainingPlan.target == TARGET)
            .order_by(TrainingPlan.id)
        )
        for plan in owned:
            facts = cluster_groups._plan_facts(session, runtime, plan)
            segments = lifecycle.segments_of(session, plan.id)
            for instance_type in types:
                group = GroupFacts("InstanceGroups", "group", instance_type, zones)
                with contextlib.suppress(ValidationError):
                    check_binding(group, facts, facts.arn)
                    choices[instance_type].append(
                        PlanChoice(
                            facts.arn,
                            plan.name,
                            plan.status,
                            plan.instance_type,
                            tuple(sorted(facts.zones)),
                            segments[0].start,
                            segments[-1].end,
                            max(s.count for s in segments),
                        )
                    )
    return {t: tuple(c) for t, c in choices.items()}


# -- training jobs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artefacts:
    checkpoint_uri: str | None
    checkpoints: tuple[StoredObject, ...]
    model_uri: str
    model: StoredObject | None
    note: str  # why a listing is missing, if it is


def job_artefacts(runtime: ServiceContext, caller: Caller, name: str) -> Artefacts:
    """The job's checkpoints and model as its account may read them (the job found as the caller's)."""
    job = job_views.describe(runtime, caller, name)
    storage = bucket_rights.storage_for(runtime, caller.account_id)
    checkpoint_uri = job.request.checkpoint_uri
    checkpoints: list[StoredObject] = []
    model = None
    note = ""
    try:
        if checkpoint_uri:
            checkpoints = storage.list(checkpoint_uri.rstrip("/"))
        folder, _, _ = job.model_uri.rpartition("/")
        model = next((o for o in storage.list(folder) if o.uri == job.model_uri), None)
    except (StorageError, HyperplanError) as exc:
        note = str(exc)
    return Artefacts(checkpoint_uri, tuple(checkpoints), job.model_uri, model, note)
