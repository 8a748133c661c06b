"""The rules of time hold whatever the hour or date: each test runs a real runtime (SQLite store, manual
clock) whose service clock starts at every instant of tests.instants, and checks what a buyer would see:
where the soonest offering starts and ends, what it costs, how long its id lives, when the plan turns
Active and Expired, and how far ahead a plan can start."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select

from hyperplan.app import AppConfig, Application
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ResourceNotFound, ValidationError
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import extensions, plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ReservedCapacity, TrainingPlan
from tests.harness import unisolated
from tests.instants import at_awkward_instants

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"
BOUNDARY = time(11, 30)


@pytest.fixture
def runtime(tmp_path: Path, start_instant: datetime) -> Iterator[ServiceContext]:
    application = Application(
        AppConfig(
            data_dir=tmp_path / "data",
            fleet_path=SMALL_FLEET,
            clock="manual",
            clock_start=start_instant,
            **unisolated(tmp_path / "data"),
        )
    )
    application.start()
    try:
        yield application.context
    finally:
        application.stop()


def admin(runtime: ServiceContext) -> Caller:
    with runtime.db.read() as session:
        account = accounts.list_accounts(session)[0]
    return Caller(account.id, account.name, True, "key")


def first_boundary_after(moment: datetime) -> datetime:
    """Worked out here from the rule (segments end at 11:30 UTC), not from the code under test."""
    day = moment.astimezone(UTC).date()
    for offset in range(2):
        candidate = datetime.combine(day + timedelta(days=offset), BOUNDARY, tzinfo=UTC)
        if candidate >= moment:
            return candidate
    raise AssertionError("unreachable: a boundary comes within a day")


def soonest_start(now: datetime) -> datetime:
    start = now + timedelta(minutes=30)
    return start if start.second == start.microsecond == 0 else start.replace(second=0) + timedelta(minutes=1)


def status_at(runtime: ServiceContext, name: str, when: datetime) -> str:
    runtime.advance_clock(when)
    with runtime.db.read() as session:
        return session.scalars(select(TrainingPlan.status).where(TrainingPlan.name == name)).one()


@at_awkward_instants
def test_the_soonest_offering_and_its_plans_life(runtime: ServiceContext, start_instant: datetime) -> None:
    assert runtime.clock.now() == start_instant
    caller = admin(runtime)
    offers = plans.search(runtime, caller, SearchRequest(P5, 2, 24, "training-job", None, None))
    start = soonest_start(start_instant)
    end = first_boundary_after(start) + timedelta(days=1)  # the partial day to 11:30, then a whole day
    assert offers[0].offering.end == end  # nothing finishes earlier
    (soonest,) = [offer for offer in offers if offer.offering.start == start]
    (segment,) = soonest.offering.segments
    assert segment.end == end and end.time() == BOUNDARY
    minutes = (end - start) // timedelta(minutes=1)
    assert segment.duration_hours_minutes == divmod(minutes, 60)
    price = runtime.fleet.pool(segment.pool_key).price_per_instance_hour
    assert soonest.offering.upfront_fee == (2 * minutes * price / 60).quantize(Decimal("0.01"))

    plans.create(runtime, caller, "soonest", soonest.offering_id)
    with runtime.db.read() as session:
        bought = session.scalar(select(TrainingPlan.status).where(TrainingPlan.name == "soonest"))
    assert bought == "Scheduled"  # paid at once (auto), not started yet
    assert status_at(runtime, "soonest", start - timedelta(minutes=1)) == "Scheduled"
    assert status_at(runtime, "soonest", start) == "Active"
    assert status_at(runtime, "soonest", end - timedelta(minutes=1)) == "Active"
    assert status_at(runtime, "soonest", end) == "Expired"


@at_awkward_instants
def test_an_offering_id_lives_thirty_minutes_of_service_time(
    runtime: ServiceContext, start_instant: datetime
) -> None:
    caller = admin(runtime)
    request = SearchRequest(P5, 1, 48, "hyperpod-cluster", start_instant + timedelta(days=3), None)
    kept, expired = plans.search(runtime, caller, request)[:2]
    runtime.advance_clock(start_instant + timedelta(minutes=30))
    plans.create(runtime, caller, "in-time", kept.offering_id)
    runtime.advance_clock(start_instant + timedelta(minutes=30, seconds=1))
    with pytest.raises(ResourceNotFound, match="expired"):
        plans.create(runtime, caller, "too-late", expired.offering_id)


@at_awkward_instants
def test_plans_start_at_most_56_days_ahead(runtime: ServiceContext, start_instant: datetime) -> None:
    caller = admin(runtime)
    horizon = start_instant + timedelta(days=56)
    late = SearchRequest(P5, 1, 24, "training-job", horizon - timedelta(days=1), horizon + timedelta(days=5))
    offers = plans.search(runtime, caller, late)
    assert offers and all(offer.offering.start <= horizon for offer in offers)
    assert max(offer.offering.start for offer in offers) > horizon - timedelta(days=1)
    too_late = SearchRequest(
        P5, 1, 24, "training-job", horizon + timedelta(minutes=1), horizon + timedelta(days=5)
    )
    with pytest.raises(ValidationError, match="StartTimeAfter"):
        plans.search(runtime, caller, too_late)


@at_awkward_instants
def test_an_extension_continues_from_the_plans_end(runtime: ServiceContext, start_instant: datetime) -> None:
    caller = admin(runtime)
    first = plans.search(runtime, caller, SearchRequest(P5, 1, 24, "training-job", None, None))[0]
    plans.create(runtime, caller, "extended", first.offering_id)
    end = first.offering.end
    (offer,) = extensions.search(runtime, caller, "extended", 48)
    assert (offer.start, offer.end) == (end, end + timedelta(days=2))
    extensions.extend(runtime, caller, offer.offering_id)
    with runtime.db.read() as session:
        plan_id = session.scalar(select(TrainingPlan.id).where(TrainingPlan.name == "extended"))
        ends = session.scalars(select(ReservedCapacity.end).where(ReservedCapacity.plan_id == plan_id)).all()
    assert max(ends) == end + timedelta(days=2) and max(ends).time() == BOUNDARY
