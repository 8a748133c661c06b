"""Plans' segment events run in batches (events/loop.py, services/plans/lifecycle.py's one read of a
batch's plans and segments) leave the same plans, segments and histories as the same events run one by
one, each at its own instant (the manual clock's move)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from hyperplan.app import AppConfig, Application
from hyperplan.core.offering_ids import OfferingClaim, OfferingSegment, encode
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import PlanEvent, ReservedCapacity, ScheduledEvent, TrainingPlan
from tests.harness import unisolated

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
START = datetime(2031, 5, 4, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)
OFFERING_ID = re.compile(r"tpo-[a-z0-9]+")


@pytest.fixture
def two_stores(tmp_path: Path) -> Iterator[tuple[Application, Application]]:
    made = [_application(tmp_path / name) for name in ("one-by-one", "batched")]
    try:
        yield made[0], made[1]
    finally:
        for application in made:
            application.stop()


def _application(data_dir: Path) -> Application:
    config = AppConfig(
        data_dir=data_dir, fleet_path=SMALL_FLEET, clock="manual", clock_start=START, **unisolated(data_dir)
    )
    application = Application(config)
    application.bootstrap()
    return application


def _buy_plans(runtime: ServiceContext) -> None:
    """Eight plans of one and two segments whose starts, reclaims and ends fall on the same instants (the
    day boundary), over four days: batches of events of many plans, several of one plan."""
    now = runtime.clock.now()
    with runtime.db.write() as session:
        key = accounts.create_account(session, "batches", box=runtime.secret_box, now=now)
    caller = Caller(key.account_id, key.account_name, False, key.access_key_id)
    boundary = datetime.combine((now + 2 * DAY).date(), runtime.fleet.policy.segment_end, tzinfo=UTC)
    for number in range(8):
        first = boundary + (number % 2) * DAY
        segments = [OfferingSegment(number % 2, first, first + DAY)]
        if number % 3 == 0:
            segments.append(OfferingSegment(number % 2, first + DAY, first + 2 * DAY))
        claim = OfferingClaim(
            account_id=caller.account_id,
            expires_at=now + timedelta(hours=1, seconds=number),
            target="training-job",
            count=1,
            segments=tuple(segments),
        )
        plans.create(
            runtime, caller, f"p-{number}", encode(claim, key=runtime.offering_key, fleet=runtime.fleet)
        )


def _same_words(message: str, account_id: str) -> str:
    """A history message with what differs between two stores by construction (the account's id in
    ARNs, the offering's signed id) taken out."""
    return OFFERING_ID.sub("tpo-...", message.replace(account_id, "ACCOUNT"))


def _outcome(runtime: ServiceContext) -> tuple[list[tuple[object, ...]], ...]:
    with runtime.db.read() as session:
        account_id = session.scalars(select(TrainingPlan.account_id)).first() or ""
        plan_rows = session.execute(
            select(TrainingPlan.name, TrainingPlan.status, TrainingPlan.status_message).order_by(
                TrainingPlan.name
            )
        ).all()
        segment_rows = session.execute(
            select(ReservedCapacity.plan_id, ReservedCapacity.ordinal, ReservedCapacity.status).order_by(
                ReservedCapacity.plan_id, ReservedCapacity.ordinal
            )
        ).all()
        history = session.execute(
            select(
                PlanEvent.plan_id, PlanEvent.at, PlanEvent.kind, PlanEvent.status, PlanEvent.message
            ).order_by(PlanEvent.plan_id, PlanEvent.id)
        ).all()
        pending = session.execute(select(ScheduledEvent.id).where(ScheduledEvent.done.is_(False))).all()
    entries: list[tuple[object, ...]] = [(*row[:4], _same_words(row[4], account_id)) for row in history]
    return (
        [tuple(r) for r in plan_rows],
        [tuple(r) for r in segment_rows],
        entries,
        [tuple(r) for r in pending],
    )


def test_batched_segment_events_leave_what_one_by_one_leaves(
    two_stores: tuple[Application, Application],
) -> None:
    one_by_one, batched = two_stores
    target = START + 10 * DAY
    for application in two_stores:
        _buy_plans(application.context)
    one_by_one.workers.events.advance_to(target)  # each event alone, the clock at its due time
    ran = batched.workers.events.run_due(target)  # in batches, the clock where it stands
    plan_rows, segment_rows, history, pending = _outcome(batched.context)
    assert ran > 40  # the plans' events, with the payments' and warnings'
    assert {status for _, status, _ in plan_rows} == {"Expired"}
    assert pending == []
    assert (plan_rows, segment_rows, history, pending) == _outcome(one_by_one.context)
