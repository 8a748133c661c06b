"""Load-based prices through the services (issue 54, point 3): an offering's price is fixed when the
search makes it, signed into its id, and a purchase charges exactly that, even after other bookings
changed how loaded its days are; the invoice and the plan show the same amount."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import select

from hyperplan.core.search_request import SearchRequest
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Invoice, TrainingPlan
from tests.harness import boundary_after
from tests.services.running import P5, application, new_account, one_pool_fleet

PRICE = Decimal("40.00")
FLEET = one_pool_fleet(
    8, more="[pricing]\nload_based = true\nlow = 0.5\nhigh = 1.5\n", policy="max_segments = 1"
)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServiceContext]:
    with application(tmp_path, FLEET) as app:
        yield app.context


def test_a_plan_costs_what_its_offering_said_though_the_days_got_busier_since(
    runtime: ServiceContext,
) -> None:
    team, other = new_account(runtime, "team"), new_account(runtime, "other")
    start = boundary_after(runtime.clock.now() + timedelta(days=2))
    window = (start, start + timedelta(days=1))
    quiet = plans.search(runtime, team, SearchRequest(P5, 2, 24, "training-job", *window))[0]
    assert quiet.offering.segments[0].multiplier == Decimal("0.5")  # nothing booked that day yet
    assert quiet.offering.upfront_fee == 2 * 24 * PRICE / 2

    # Another team books 6 of the 8 that day: a search now prices it higher ...
    busy = plans.search(runtime, other, SearchRequest(P5, 6, 24, "training-job", *window))[0]
    plans.create(runtime, other, "busy", busy.offering_id)
    again = plans.search(runtime, team, SearchRequest(P5, 2, 24, "training-job", *window))[0]
    assert again.offering.segments[0].multiplier == Decimal("1.25")  # 0.5 + 6/8

    # ... but the offering found before costs what it said.
    plans.create(runtime, team, "early-bird", quiet.offering_id)
    with runtime.db.read() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "early-bird")).one()
        invoice = session.scalars(select(Invoice).where(Invoice.plan_id == plan.id)).one()
    assert plan.upfront_fee == invoice.amount == quiet.offering.upfront_fee
