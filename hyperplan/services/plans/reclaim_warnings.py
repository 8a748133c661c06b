"""Warnings before a segment's reclaim, with the extensions free then (issue 50; core/reclaim_warnings.py).

One timed event per segment (`RECLAIM_WARNING`, written with the segment's other timed events by
services/plans/lifecycle.py, moved with them by an extension) runs at each of the account's lead times:
it writes the warning as a plan event (so the account's webhooks deliver it), lets the plan's extension
policy try at its last segment's warnings, and schedules itself at the next lead time. A change of the
account's lead times re-plans every pending one (`set_lead_hours`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from hyperplan.core import reclaim_warnings as rules
from hyperplan.core import status_rows
from hyperplan.core.jobs import FINAL as JOB_FINAL
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.errors import HyperplanError
from hyperplan.events.loop import DueEvent, EventHandler
from hyperplan.services.accounts.accounts import Caller, get_account
from hyperplan.services.plans import extension_policy, extensions, lifecycle, plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import (
    Account,
    Cluster,
    InstanceGroup,
    InstanceGroupPlan,
    ReservedCapacity,
    ScheduledEvent,
    TrainingJob,
    TrainingPlan,
)


def lead_hours_of(account: Account) -> tuple[int, ...]:
    if account.reclaim_warning_hours is None:
        return rules.DEFAULT_LEAD_HOURS
    return tuple(json.loads(account.reclaim_warning_hours))


def get_lead_hours(runtime: ServiceContext, account_ref: str) -> tuple[int, ...]:
    with runtime.db.read() as session:
        return lead_hours_of(get_account(session, account_ref))


def set_lead_hours(runtime: ServiceContext, account_ref: str, hours: Sequence[int]) -> tuple[int, ...]:
    """Set the account's lead times (checked: core/reclaim_warnings.lead_hours) and re-plan its pending
    warnings: each runs now, sends nothing (a lead time already past is not sent late) and schedules its
    next by the new lead times."""
    leads = rules.lead_hours(list(hours))
    now = runtime.clock.now()
    with runtime.db.write() as session:
        account = get_account(session, account_ref)
        account.reclaim_warning_hours = json.dumps(list(leads))
        plan_ids = session.scalars(select(TrainingPlan.id).where(TrainingPlan.account_id == account.id))
        pending = session.scalars(
            select(ScheduledEvent).where(
                ScheduledEvent.kind == rules.RECLAIM_WARNING,
                ScheduledEvent.done.is_(False),
                ScheduledEvent.subject.in_([str(i) for i in plan_ids]),
            )
        )
        for event in pending:
            payload = json.loads(event.payload)
            event.due_at, event.payload = now, json.dumps({**payload, "since": now.isoformat()})
    runtime.wakes.lifecycle.notify()
    return leads


def event_handlers(runtime: ServiceContext) -> dict[str, EventHandler]:
    def warning_due(session: Session, event: DueEvent) -> None:
        on_warning_event(session, runtime, event.subject, event.payload, event.due_at)

    return {rules.RECLAIM_WARNING: warning_due}


def on_warning_event(
    session: Session,
    runtime: ServiceContext,
    plan_id: str,
    payload: Mapping[str, Any],
    now: datetime,
) -> None:
    plan = session.get(TrainingPlan, int(plan_id))
    if plan is None or PlanStatus(plan.status).is_final:
        return
    segments = lifecycle.segments_of(session, plan.id)
    ordinal = int(payload["segment"])
    index = next((i for i, rc in enumerate(segments) if rc.ordinal == ordinal), None)
    if index is None:
        return
    rc = segments[index]
    reclaim = rules.reclaim_time(rc.start, rc.end, runtime.lifecycle.policies(plan.target).reclaim_lead)
    leads = lead_hours_of(get_account(session, plan.account_id))
    since = datetime.fromisoformat(str(payload["since"]))
    following = rules.next_check(leads, reclaim, now)
    if following is not None:
        again = {"segment": ordinal, "since": now.isoformat()}
        lifecycle.schedule_event(
            session, status_rows.timed_event(rules.RECLAIM_WARNING, following, plan_id, json.dumps(again))
        )
    lead = rules.due_lead(leads, reclaim, since, now)
    if lead is None or plan.status == PlanStatus.PENDING:  # an unpaid plan is told about its payment
        return
    is_last = index == len(segments) - 1
    warning = _warning(session, runtime, plan, rc, reclaim, lead, None if is_last else segments[index + 1])
    lifecycle.record(session, plan, rules.WARNING_KIND, rules.warning_message(warning), now)
    if is_last:
        extension_policy.on_warning(session, runtime, plan, rc.end, lead, now)


def _warning(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    rc: ReservedCapacity,
    reclaim: datetime,
    lead: int,
    following: ReservedCapacity | None,
) -> rules.Warning:
    arn = plans.plan_arn(runtime, plan)
    prices: list[rules.Price] = []
    why = ""
    if following is None:
        prices, why = _prices(session, runtime, plan, arn)
    return rules.Warning(
        plan.name,
        arn,
        rc.ordinal,
        rc.end,
        reclaim,
        lead,
        _jobs(session, plan.id),
        _groups(session, plan.id),
        following.start if following is not None else None,
        prices,
        why,
    )


def _prices(
    session: Session, runtime: ServiceContext, plan: TrainingPlan, arn: str
) -> tuple[list[rules.Price], str]:
    """The extensions free now, priced by the same search as SearchTrainingPlanOfferings with the ARN."""
    account = get_account(session, plan.account_id)
    caller = Caller(account.id, account.name, account.is_admin, access_key_id="")
    prices: list[rules.Price] = []
    for days in rules.PRICED_DAYS:
        try:
            found = extensions.search(runtime, caller, arn, days * 24)
        except HyperplanError as error:  # too close to the end, a quota: the warning says why
            return prices, str(error).rstrip(".")
        prices += [rules.Price(days, Decimal(str(o.fee)), o.currency) for o in found]
    return prices, ""


def _jobs(session: Session, plan_id: int) -> list[tuple[str, str]]:
    rows = session.execute(
        select(TrainingJob.name, TrainingJob.secondary_status)
        .where(
            or_(TrainingJob.plan_id == plan_id, TrainingJob.attempt_plan_id == plan_id),
            TrainingJob.secondary_status.not_in(list(JOB_FINAL)),
        )
        .order_by(TrainingJob.id)
    )
    return [(name, status) for name, status in rows]


def _groups(session: Session, plan_id: int) -> list[tuple[str, str, int]]:
    further = select(InstanceGroupPlan.group_id).where(InstanceGroupPlan.plan_id == plan_id)
    rows = session.execute(
        select(Cluster.name, InstanceGroup.name, InstanceGroup.target_count)
        .join(Cluster, Cluster.id == InstanceGroup.cluster_id)
        .where(or_(InstanceGroup.plan_id == plan_id, InstanceGroup.id.in_(further)))
        .order_by(InstanceGroup.id)
    )
    return [(cluster, group, count) for cluster, group, count in rows]
