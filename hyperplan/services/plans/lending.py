"""A plan's lending policy: whether its idle instances are lent to other accounts' managed spot training
jobs, and on what terms (issue 51; the rules in core/spot.py).

Set, read and cleared by the plan's account, or by an administrator on any plan named by its ARN (native
API, CLI, console), or by the plan's tag ``hyperplan:lending`` (CreateTrainingPlan's Tags, AddTags,
DeleteTags: :func:`apply_tags`). A plan with a ``LendingPolicy`` row lends (mode ``idle``); without one
it lends nothing (mode ``none``, the default). Each change is a plan event and an audit record, in the
change's transaction, and the plan's consumers are told the plan changed (`LifecycleContext.plan_changed`)
so that the spot scheduler places waiting borrowers on what it now lends, or reclaims what it no longer
does: services/plans may not import services/jobs, where that scheduler lives, so the hook the jobs
already follow plans through is the way in.

The view counts what the plan lent from its spot runs (`SpotRun`, written by services/jobs/spot.py):
instances lent now, lent instance-hours, reclaims and whether each kept its promise, and the owner's
credits. The owner sees counts only; an administrator also sees each run with the borrower's job and
account, which accounts never see of each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.fleet import SERVED_TARGETS
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.spot import LENDING_TAG, Lending, lending_from, parse_lending_tag, promise_kept
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import acting, audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import lifecycle, payments
from hyperplan.services.plans.plan_refs import plan_named
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, LendingPolicy, SpotRun, TrainingJob, TrainingPlan

POLICY_KIND = "lending.policy"  # the plan event of a change of policy
IDLE, NONE = "idle", "none"
SHOWN_RUNS = 100  # the newest runs an administrator sees; the figures count every run
# The policy's values as the native API names them: what a refusal of a bad value names.
FIELD_NAMES = {"notice": "Notice", "min_run": "MinRun", "stop_margin": "StopMargin"}


@dataclass(frozen=True)
class LentRun:
    """One borrower's run on the plan's instances, as an administrator sees it."""

    job_name: str
    account_name: str
    count: int
    started_at: datetime
    ended_at: datetime | None  # None while it holds the instances
    reclaim_reason: str  # "" when it was not reclaimed
    notice_seconds: int | None  # the notice it was given (deadline less request); None: no reclaim
    owner_had_seconds: int | None  # from the request to the run's end; None: no reclaim, or not yet over


@dataclass(frozen=True)
class LendingView:
    plan_name: str
    mode: str  # IDLE or NONE
    notice_seconds: int | None  # None in mode NONE
    min_run_seconds: int | None
    stop_margin_seconds: int | None
    lent_now: int  # instances open runs hold
    lent_instance_hours: float  # every run's count x the hours it held them (an open one until now)
    reclaims: int
    promises_kept: int
    promises_broken: int  # an open run past its deadline plus the kill's grace counts as broken
    credited: Decimal  # the owner's credits for the plan's runs
    currency: str
    runs: tuple[LentRun, ...] | None  # newest first; None unless the caller is an administrator


# -- entry points (native API, CLI, console) -----------------------------------------------------------


def view(runtime: ServiceContext, caller: Caller, plan_ref: str) -> LendingView:
    """The plan's policy and what it lent (plan_ref: its name, or its ARN)."""
    with runtime.db.read() as session:
        plan = plan_named(session, runtime, caller, plan_ref)
        return _view(session, runtime, caller, plan, runtime.clock.now())


def set_policy(
    runtime: ServiceContext,
    caller: Caller,
    plan_ref: str,
    notice: int | None = None,
    min_run: int | None = None,
    stop_margin: int | None = None,
) -> LendingView:
    """Lend the plan's idle instances (mode idle) with these seconds, each None the fleet's default;
    a policy in force is replaced whole."""
    lending = lending_from(runtime.fleet.spot, notice, min_run, stop_margin, names=FIELD_NAMES)
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        plan = plan_named(session, runtime, caller, plan_ref)
        _write(session, runtime, caller, plan, lending, now)
        return _view(session, runtime, caller, plan, now)


def clear_policy(runtime: ServiceContext, caller: Caller, plan_ref: str) -> LendingView:
    """Lend nothing (mode none); a plan that lent nothing is left as it is."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        acting.act(session, caller.user_id)
        plan = plan_named(session, runtime, caller, plan_ref)
        _write(session, runtime, caller, plan, None, now)
        return _view(session, runtime, caller, plan, now)


# -- the tag -------------------------------------------------------------------------------------------


def lending_in(runtime: ServiceContext, tags: Mapping[str, str]) -> Lending | None:
    """The policy a plan's tags say, checked: a bad ``hyperplan:lending`` value is a ValidationError
    naming the tag (CreateTrainingPlan checks it before it buys). None for ``none`` or no such tag."""
    value = tags.get(LENDING_TAG)
    return None if value is None else parse_lending_tag(value, runtime.fleet.spot)


def apply_tags(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    tags: Mapping[str, str],
    now: datetime,
    caller: Caller | None = None,
) -> None:
    """Tags being written on a plan (at CreateTrainingPlan, or by AddTags), in their transaction: a
    ``hyperplan:lending`` tag sets or clears its policy. The value is read before anything is written,
    so a bad one refuses the whole change."""
    if LENDING_TAG not in tags:
        return
    lending = lending_in(runtime, tags)
    _write(session, runtime, caller, plan, lending, now)


def untag(
    session: Session,
    runtime: ServiceContext,
    plan: TrainingPlan,
    keys: Sequence[str],
    now: datetime,
    caller: Caller | None = None,
) -> None:
    """DeleteTags on a plan, in its transaction: removing ``hyperplan:lending`` stops the lending."""
    if LENDING_TAG in keys:
        _write(session, runtime, caller, plan, None, now)


# -- writing -------------------------------------------------------------------------------------------


def _write(
    session: Session,
    runtime: ServiceContext,
    caller: Caller | None,
    plan: TrainingPlan,
    lending: Lending | None,
    now: datetime,
) -> None:
    """Set (lending) or clear (None) the plan's policy; when that changed anything: the plan event, the
    audit record, and the plan's consumers told."""
    row = session.get(LendingPolicy, plan.id)
    detail: dict[str, str | int] = {"Mode": NONE if lending is None else IDLE}
    if lending is None:
        if row is None:
            return
        session.delete(row)
        message = "Lending stopped: the plan lends nothing."
    else:
        _check_lends(plan)
        seconds = _seconds(lending)
        if row is None:
            session.add(LendingPolicy(plan_id=plan.id, updated_at=now, **seconds))
        elif _row_seconds(row) == seconds:
            return  # the same policy again: nothing changed, nothing to record
        else:
            row.notice_seconds = seconds["notice_seconds"]
            row.min_run_seconds = seconds["min_run_seconds"]
            row.stop_margin_seconds = seconds["stop_margin_seconds"]
            row.updated_at = now
        message = _set_message(lending)
        detail.update(_detail(lending))
    session.flush()
    lifecycle.record(session, plan, POLICY_KIND, message, now)
    action = "plan.lending-set" if lending is not None else "plan.lending-clear"
    audit.record(session, now, caller, action, account_id=plan.account_id, target=plan.name, detail=detail)
    _tell_consumers(session, runtime, plan, now)


def _tell_consumers(session: Session, runtime: ServiceContext, plan: TrainingPlan, now: datetime) -> None:
    """The plan's consumers follow its new policy, in this transaction: the spot scheduler places
    waiting borrowers on what it now lends (services/jobs/spot.py, installed as a consumer by app.py).
    services/plans may not import services/jobs (tests/test_layers.py), so the hook every plan change
    already goes through is the way in."""
    runtime.lifecycle.plan_changed(session, plan.id, now)


def _check_lends(plan: TrainingPlan) -> None:
    if plan.target not in SERVED_TARGETS:
        raise ValidationError(
            f"Training plan {plan.name} serves {plan.target}; only plans for "
            f"{' or '.join(SERVED_TARGETS)} lend their idle instances."
        )
    if PlanStatus(plan.status).is_final:
        raise ValidationError(f"Training plan {plan.name} is {plan.status}: it has nothing left to lend.")


def _seconds(lending: Lending) -> dict[str, int]:
    return {
        "notice_seconds": int(lending.notice.total_seconds()),
        "min_run_seconds": int(lending.min_run.total_seconds()),
        "stop_margin_seconds": int(lending.stop_margin.total_seconds()),
    }


def _row_seconds(row: LendingPolicy) -> dict[str, int]:
    return {
        "notice_seconds": row.notice_seconds,
        "min_run_seconds": row.min_run_seconds,
        "stop_margin_seconds": row.stop_margin_seconds,
    }


def _set_message(lending: Lending) -> str:
    seconds = _seconds(lending)
    return (
        f"Lending idle instances: a borrower gets {seconds['notice_seconds']} s of notice, runs at least "
        f"{seconds['min_run_seconds']} s before a younger one is reclaimed first, and no loan runs within "
        f"{seconds['stop_margin_seconds']} s of a segment's reclaim time."
    )


def _detail(lending: Lending) -> dict[str, int]:
    seconds = _seconds(lending)
    return {
        "NoticeSeconds": seconds["notice_seconds"],
        "MinRunSeconds": seconds["min_run_seconds"],
        "StopMarginSeconds": seconds["stop_margin_seconds"],
    }


# -- reading -------------------------------------------------------------------------------------------


def _view(
    session: Session, runtime: ServiceContext, caller: Caller, plan: TrainingPlan, now: datetime
) -> LendingView:
    policy = session.get(LendingPolicy, plan.id)
    runs = list(session.scalars(select(SpotRun).where(SpotRun.plan_id == plan.id).order_by(SpotRun.id)))
    grace = runtime.fleet.spot.kill_grace
    kept = sum(1 for run in runs if _promise(run, now, grace) is True)
    broken = sum(1 for run in runs if _promise(run, now, grace) is False)
    held = sum((run.count * ((run.ended_at or now) - run.started_at) for run in runs), timedelta(0))
    currency = payments.fleet_currency(runtime.fleet)
    return LendingView(
        plan_name=plan.name,
        mode=IDLE if policy is not None else NONE,
        notice_seconds=policy.notice_seconds if policy else None,
        min_run_seconds=policy.min_run_seconds if policy else None,
        stop_margin_seconds=policy.stop_margin_seconds if policy else None,
        lent_now=sum(run.count for run in runs if run.ended_at is None),
        lent_instance_hours=round(max(held, timedelta(0)).total_seconds() / 3600, 4),
        reclaims=sum(1 for run in runs if run.reclaim_requested_at is not None),
        promises_kept=kept,
        promises_broken=broken,
        credited=_credited(runs, currency),
        currency=currency,
        runs=_runs(session, runs) if caller.is_admin else None,
    )


def _credited(runs: list[SpotRun], currency: str) -> Decimal:
    """The owner's credits, in the currency's minor unit (0.00 before any): each is already rounded."""
    unit = Decimal(1).scaleb(-payments.currency_places(currency))
    return sum((run.credited for run in runs), Decimal(0)).quantize(unit)


def _promise(run: SpotRun, now: datetime, grace: timedelta) -> bool | None:
    """Whether a reclaimed run kept its promise; None when it was not reclaimed, or when it still holds
    its instances within its deadline and the kill's grace (not yet judged)."""
    asked, deadline = run.reclaim_requested_at, run.reclaim_deadline
    if asked is None or deadline is None:
        return None
    if run.ended_at is not None:
        return promise_kept(asked, run.ended_at, deadline, grace)
    return False if now > deadline + grace else None


def _runs(session: Session, runs: list[SpotRun]) -> tuple[LentRun, ...]:
    """The newest runs with their borrowers' job and account names (an administrator's view)."""
    newest = runs[::-1][:SHOWN_RUNS]
    job_ids = {run.job_id for run in newest}
    account_ids = {run.account_id for run in newest}
    jobs = {
        job_id: name
        for job_id, name in session.execute(
            select(TrainingJob.id, TrainingJob.name).where(TrainingJob.id.in_(job_ids))
        )
    }
    names = {
        account_id: name
        for account_id, name in session.execute(
            select(Account.id, Account.name).where(Account.id.in_(account_ids))
        )
    }
    return tuple(
        LentRun(
            job_name=jobs.get(run.job_id, ""),
            account_name=names.get(run.account_id, ""),
            count=run.count,
            started_at=run.started_at,
            ended_at=run.ended_at,
            reclaim_reason=run.reclaim_reason,
            notice_seconds=_between(run.reclaim_requested_at, run.reclaim_deadline),
            owner_had_seconds=_between(run.reclaim_requested_at, run.ended_at),
        )
        for run in newest
    )


def _between(start: datetime | None, end: datetime | None) -> int | None:
    return None if start is None or end is None else int((end - start).total_seconds())
