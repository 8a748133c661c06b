"""What a plan lends now: its lending policy and the spot runs that hold its instances (reads only).

A plan's instances are lent to managed spot training jobs of other accounts (services/jobs/spot.py
places them and takes them back); every consumer of a plan that counts its free instances subtracts
what is lent, so that lent instances are never given twice, and asks for them back when it needs them
(``ServiceContext.reclaim_lent``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.core.fleet import SpotPolicy
from hyperplan.core.spot import Lending, lending_from
from hyperplan.store import tx_facts
from hyperplan.store.schema import LendingPolicy, SpotRun


def lent(session: Session, plan_id: int, segment_id: int | None = None) -> int:
    """Instances of the plan (of one of its segments) that open spot runs hold now."""
    statement = select(func.coalesce(func.sum(SpotRun.count), 0)).where(
        SpotRun.plan_id == plan_id, SpotRun.ended_at.is_(None)
    )
    if segment_id is not None:
        statement = statement.where(SpotRun.reserved_capacity_id == segment_id)
    return int(session.scalar(statement) or 0)


def plans_with_open_runs(session: Session) -> frozenset[int]:
    """Every plan with an open spot run. Read once a transaction while it writes no spot run
    (store/tx_facts.py): a lifecycle batch's plan events each ask."""
    return tx_facts.fact(
        session, "plans with open spot runs", frozenset({"spot_runs"}), _read_plans_with_open_runs
    )


def _read_plans_with_open_runs(session: Session) -> frozenset[int]:
    open_ = select(SpotRun.plan_id).where(SpotRun.ended_at.is_(None), SpotRun.plan_id.is_not(None))
    return frozenset(session.scalars(open_.distinct()))


def open_runs(session: Session, plan_id: int) -> list[SpotRun]:
    """The plan's open spot runs, oldest first."""
    return list(
        session.scalars(
            select(SpotRun).where(SpotRun.plan_id == plan_id, SpotRun.ended_at.is_(None)).order_by(SpotRun.id)
        )
    )


def policy_of(session: Session, plan_id: int) -> Lending | None:
    """The plan's lending policy; None when it lends nothing (mode none)."""
    row = session.get(LendingPolicy, plan_id)
    if row is None:
        return None
    return Lending(
        notice=timedelta(seconds=row.notice_seconds),
        min_run=timedelta(seconds=row.min_run_seconds),
        stop_margin=timedelta(seconds=row.stop_margin_seconds),
    )


def policy_or_default(session: Session, spot: SpotPolicy, plan_id: int) -> Lending:
    """The plan's policy, or the fleet's defaults when it stopped lending while runs are still open (they
    are taken back with the fleet's notice)."""
    return policy_of(session, plan_id) or lending_from(spot)


def latest_deadline(session: Session, plan_id: int) -> datetime | None:
    """The latest deadline of the plan's open runs being taken back: when its owner has them all again."""
    return session.scalar(
        select(func.max(SpotRun.reclaim_deadline)).where(
            SpotRun.plan_id == plan_id, SpotRun.ended_at.is_(None), SpotRun.reclaim_deadline.is_not(None)
        )
    )
