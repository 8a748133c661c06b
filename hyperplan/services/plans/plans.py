"""Training plans: search, buy, read. The rules are in hyperplan.core; this module adds the store.

Buying is one checked write (store/checked_write.py): verify the offering id, then the refusals (name,
quotas, capacity) on a snapshot, then again under the account's and the pools' locks (store/locks.py),
and the plan, its segments, their timed events and the payment written (services/plans/plan_purchase.py).
Nothing is written when any step refuses. The live calendar is booked after commit. On SQLite, purchases
that arrive together are committed together (store/group_commit.py), each refused or written alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from hyperplan.core import offering_ids
from hyperplan.core.fleet import Pool, PoolKey
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.offering_ids import OfferingClaim, OfferingIdError, OfferingSegment
from hyperplan.core.offerings import Offering
from hyperplan.core.paging import decode_token, encode_token
from hyperplan.core.search_across import check_requests, merged, naming_type
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.spot import LENDING_TAG
from hyperplan.errors import Conflict, HyperplanError, ResourceInUse, ResourceNotFound, ValidationError
from hyperplan.services.accounts import acting, audit
from hyperplan.services.accounts.accounts import Caller, get_account
from hyperplan.services.plans import (
    capacity_claims,
    lending,
    lifecycle,
    payments,
    plan_purchase,
    quotas,
    resale,
)
from hyperplan.services.plans import tags as tag_store
from hyperplan.services.plans.tags import Tag
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.changes import KEYS, PLANS
from hyperplan.store.checked_write import CheckedWrite
from hyperplan.store.schema import ReservedCapacity, TrainingPlan

# -- search -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignedOffering:
    offering_id: str
    offering: Offering
    request: SearchRequest


def compile_ahead(runtime: ServiceContext) -> int:
    """At the server's start: a purchase's statements compiled (plan_purchase.compile_ahead)."""
    return plan_purchase.compile_ahead(runtime)


def search(runtime: ServiceContext, caller: Caller, request: SearchRequest) -> list[SignedOffering]:
    now = runtime.clock.now()
    # What the check reads (the account and its plans) changes only with the keys and plans counters:
    # while they stand still, what it found holds, for any count of the type, without a trip to the store.
    shared = runtime.shared
    versions = shared.versions(PLANS, KEYS) if shared is not None else None
    check = ("search", caller.account_id, request.instance_type)
    allowance = shared.recalled(check, versions) if shared is not None else None
    if not isinstance(allowance, quotas.SearchAllowance):
        with runtime.db.read() as session:
            allowance = quotas.search_allowance(session, runtime, caller.account_id, request.instance_type)
        if shared is not None:
            shared.remember(check, versions, allowance)
    quotas.check_search_count(allowance, request.instance_count)
    offerings = runtime.calendar.search(request, now)
    expires = now + runtime.fleet.policy.offering_validity
    index = {pool.key: i for i, pool in enumerate(runtime.fleet.pools)}
    claims = [_claim(caller, offering, expires, index) for offering in offerings]
    ids = offering_ids.encode_all(claims, key=runtime.offering_key, fleet=runtime.fleet)
    return [SignedOffering(i, offering, request) for i, offering in zip(ids, offerings, strict=True)]


def search_across(
    runtime: ServiceContext, caller: Caller, requests: Sequence[SearchRequest]
) -> list[SignedOffering]:
    """One search across instance types (core/search_across.py): `requests` hold one type each, with
    its own count, and the same duration, target and window. Each type is searched as `search` searches
    it (at most the fleet's max_offerings, its quotas checked), the answers merged into one order; each
    offering's `request` says its type. The first type refused refuses the whole search, naming it."""
    check_requests(requests)
    answers = []
    for request in requests:
        try:
            answers.append(search(runtime, caller, request))
        except HyperplanError as refusal:
            raise naming_type(refusal, request.instance_type) from None
    return merged(answers, lambda signed: signed.offering)


def _claim(caller: Caller, offering: Offering, expires: datetime, index: dict[PoolKey, int]) -> OfferingClaim:
    return OfferingClaim(
        account_id=caller.account_id,
        expires_at=expires,
        target=offering.target,
        count=offering.segments[0].count,
        segments=tuple(
            OfferingSegment(index[s.pool_key], s.start, s.end, s.multiplier) for s in offering.segments
        ),
    )


# -- buy ---------------------------------------------------------------------------------------------


def create(
    runtime: ServiceContext, caller: Caller, name: str, offering_id: str, tags: Sequence[Tag] = ()
) -> str:
    """CreateTrainingPlan: buys the offering, tagged with `tags` (checked by the caller, tags.check) in
    the same transaction; returns the new plan's ARN. A `hyperplan:lending` tag is its lending policy:
    its value is checked before anything is bought."""
    given = {tag.key: tag.value for tag in tags}
    lending.lending_in(runtime, given)  # a bad value refuses the purchase
    now = runtime.clock.now()
    claim = _claim_for(runtime, caller, offering_id, now)  # the offering is one this server signed
    segments = _segments_of(runtime, claim)
    for check in runtime.booking_checks:  # what the back end needs of the account (app.py)
        check(runtime, caller.account_id)
    arn = runtime.arn(caller.account_id, f"training-plan/{name}")
    purchase = plan_purchase.Purchase(runtime, caller, name, offering_id, claim, segments, now)
    resold: list[int] = []  # the new plan's id when it resold returned capacity

    def buy(session: Session) -> None:
        acting.act(session, caller.user_id)
        purchase.write(session)
        if purchase.returned_seen:  # returned capacity in its pools (read with the holdings): resold?
            bought = resale.NewPlan(caller.account_id, name, purchase.booked)
            if (plan_id := resale.credit_for(session, runtime, bought, now)) is not None:
                resold.append(plan_id)
        if tags:
            tag_store.put(session, caller.account_id, arn, tags)
        if LENDING_TAG in given:
            _lend_as_tagged(session, runtime, caller, name, given, now)

    try:
        # Refused on a snapshot if it can be (on PostgreSQL only if the live calendar says it may be);
        # else checked again under the account's and the pools' locks, and written (store/checked_write.py).
        runtime.db.write_checked(
            CheckedWrite(purchase.refusals, purchase.work_out, purchase.check, buy, purchase.likely_passes)
        )
    except IntegrityError:
        # A racing buyer committed the same name or offering between our checks and our insert.
        raise ResourceInUse(f"Training plan {name!r} or its offering was just taken; search again.") from None
    for plan_id in resold:
        resale.settle(runtime, plan_id, now)
    # No wake of the lifecycle loop here: the commit woke it, as it inserted timed events
    # (Database.on_insert).
    return arn


def _lend_as_tagged(
    session: Session, runtime: ServiceContext, caller: Caller, name: str, tags: dict[str, str], now: datetime
) -> None:
    """The new plan's lending policy, from its tag; a plan whose payment failed as it was bought has
    nothing to lend."""
    plan = session.scalar(
        select(TrainingPlan).where(TrainingPlan.account_id == caller.account_id, TrainingPlan.name == name)
    )
    if plan is not None and not PlanStatus(plan.status).is_final:
        lending.apply_tags(session, runtime, plan, tags, now, caller)


def plan_arn(runtime: ServiceContext, plan: TrainingPlan) -> str:
    return runtime.arn(plan.account_id, f"training-plan/{plan.name}")


def _claim_for(runtime: ServiceContext, caller: Caller, offering_id: str, now: datetime) -> OfferingClaim:
    not_found = ResourceNotFound(
        f"Training plan offering {offering_id} does not exist or has expired "
        f"(offerings are valid for {_minutes(runtime.fleet.policy.offering_validity)} minutes, "
        "for the account that searched); search again."
    )
    try:
        claim = offering_ids.decode(offering_id, key=runtime.offering_key, fleet=runtime.fleet)
    except OfferingIdError:
        raise not_found from None
    if claim.account_id != caller.account_id or now > claim.expires_at:
        raise not_found
    return claim


def _segments_of(runtime: ServiceContext, claim: OfferingClaim) -> list[tuple[Pool, OfferingSegment]]:
    return [(runtime.fleet.pools[s.pool_index], s) for s in claim.segments]


# -- reading -----------------------------------------------------------------------------------------


def get(session: Session, runtime: ServiceContext, caller: Caller, name_or_arn: str) -> TrainingPlan:
    name = _name_from_ref(runtime, caller, name_or_arn)
    plan = session.scalar(
        select(TrainingPlan).where(TrainingPlan.account_id == caller.account_id, TrainingPlan.name == name)
    )
    if plan is None:
        raise ResourceNotFound(f"Training plan {name_or_arn} does not exist.")
    return plan


def _name_from_ref(runtime: ServiceContext, caller: Caller, ref: str) -> str:
    if not ref.startswith("arn:"):
        return ref
    prefix = runtime.arn(caller.account_id, "training-plan/")
    if not ref.startswith(prefix):
        raise ResourceNotFound(f"Training plan {ref} does not exist.")
    return ref.removeprefix(prefix)


def get_reserved_capacity(
    session: Session, runtime: ServiceContext, caller: Caller, arn: str
) -> ReservedCapacity:
    prefix = runtime.arn(caller.account_id, "reserved-capacity/")
    name, _, ordinal = arn.removeprefix(prefix).rpartition("-rc")
    missing = ResourceNotFound(f"Reserved capacity {arn} does not exist.")
    if not arn.startswith(prefix) or not ordinal.isdigit():
        raise missing
    rc = session.scalar(
        select(ReservedCapacity)
        .join(TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id)
        .where(
            TrainingPlan.account_id == caller.account_id,
            TrainingPlan.name == name,
            ReservedCapacity.ordinal == int(ordinal),
        )
    )
    if rc is None:
        raise missing
    return rc


@dataclass(frozen=True)
class ListQuery:
    status: str | None = None
    start_after: datetime | None = None
    start_before: datetime | None = None
    sort_by: str = "StartTime"
    sort_order: str = "Ascending"
    max_results: int = 100
    next_token: str | None = None


def list_plans(session: Session, caller: Caller, query: ListQuery) -> tuple[list[TrainingPlan], str | None]:
    start = _plan_start()
    stmt: Select[TrainingPlan] = select(TrainingPlan).where(TrainingPlan.account_id == caller.account_id)
    if query.status:
        stmt = stmt.where(TrainingPlan.status == query.status)
    if query.start_after is not None:
        stmt = stmt.where(start > query.start_after)
    if query.start_before is not None:
        stmt = stmt.where(start < query.start_before)
    key = {"TrainingPlanName": TrainingPlan.name, "StartTime": start, "Status": TrainingPlan.status}[
        query.sort_by
    ]
    order = (
        [key.desc(), TrainingPlan.id.desc()] if query.sort_order == "Descending" else [key, TrainingPlan.id]
    )
    scope = _query_fingerprint(query)
    offset = decode_token(query.next_token, scope) if query.next_token else 0
    rows = list(session.scalars(stmt.order_by(*order).offset(offset).limit(query.max_results + 1)))
    more = len(rows) > query.max_results
    return rows[: query.max_results], (encode_token(offset + query.max_results, scope) if more else None)


def _plan_start() -> Any:
    return (
        select(func.min(ReservedCapacity.start))
        .where(ReservedCapacity.plan_id == TrainingPlan.id)
        .correlate(TrainingPlan)
        .scalar_subquery()
    )


def _query_fingerprint(query: ListQuery) -> str:
    return json.dumps(
        [query.status, str(query.start_after), str(query.start_before), query.sort_by, query.sort_order]
    )


def _minutes(delta: timedelta) -> int:
    return int(delta.total_seconds() // 60)


# -- administrators ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanStatusView:
    """A plan's status after an administrator changed it."""

    name: str
    status: str
    status_message: str


def cancel(
    runtime: ServiceContext, account_ref: str, name: str, reason: str, caller: Caller | None = None
) -> PlanStatusView:
    """An administrator (`caller`) fails a plan, with a recorded reason, and gives its remaining capacity
    back."""
    if not reason.strip():
        raise ValidationError("Reason is required to cancel a plan; it is shown to the plan's owner.")
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id if caller else None)
        account = get_account(session, account_ref)
        plan = session.scalar(
            select(TrainingPlan).where(TrainingPlan.account_id == account.id, TrainingPlan.name == name)
        )
        if plan is None:
            raise ResourceNotFound(f"Account {account.name} has no training plan {name!r}.")
        if PlanStatus(plan.status).is_final:
            raise Conflict(f"Training plan {name!r} is already {plan.status}; there is nothing to cancel.")
        capacity_claims.release_plan(session, plan.id, now)
        payments.fail_pending(session, plan.id, f"the plan was cancelled: {reason.strip()}", now)
        lifecycle.fail(
            session,
            runtime.lifecycle,
            plan,
            f"Cancelled by an administrator: {reason.strip()}",
            "cancelled",
            now,
        )
        audit.record(
            session,
            now,
            caller,
            "plan.cancel",
            account_id=account.id,
            target=plan.name,
            detail={"Reason": reason.strip(), "Status": plan.status},
        )
        return PlanStatusView(plan.name, plan.status, plan.status_message)
