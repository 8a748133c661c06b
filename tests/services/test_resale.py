"""Resale of returned capacity (services/plans/resale.py) on a real store: a purchase that needs instances
a return gave back (the pool had none free of its own) resells them, and the returning account is
credited its share of what it paid for them, once; nothing when the pool had room; never more than the
returning plan paid less its refund. A purchase with no returned window around costs one statement more.

The return itself is the returns service's (services/plans/returns.py): here the seller's plan gives its
capacity back as an administrator's cancel does (the calendar and the rows see it free), and the return's
rows (quote, return, window) are inserted as a return writes them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from hyperplan.core.search_request import SearchRequest
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import (
    Account,
    LedgerEntry,
    PlanReturn,
    Resale,
    ReservedCapacity,
    ReturnedWindow,
    ReturnQuote,
    TrainingPlan,
)
from tests.harness import wait_until
from tests.postgres import Stores
from tests.services.running import P5, ZONE, application, new_account, one_pool_fleet

HOURS = 48
SHARE = Decimal("0.5")


@dataclass(frozen=True)
class Market:
    """The running service; the seller (who returned 2 instances), the holder (whose plan stays) and
    two buyers; the returned window's times."""

    runtime: ServiceContext
    seller: Caller
    holder: Caller
    buyer: Caller
    other_buyer: Caller
    start: datetime
    end: datetime
    window_id: int
    fee: Decimal  # what the seller paid for its returned plan


def _account(runtime: ServiceContext, name: str) -> Caller:
    return new_account(runtime, name, "budget", Decimal("100000"))


def _buy(
    runtime: ServiceContext, caller: Caller, name: str, count: int, within: tuple[datetime, datetime] | None
) -> None:
    low, high = within if within is not None else (None, None)
    offerings = plans.search(runtime, caller, SearchRequest(P5, count, HOURS, "training-job", low, high))
    plans.create(runtime, caller, name, offerings[0].offering_id)


def _plan(runtime: ServiceContext, name: str) -> tuple[TrainingPlan, ReservedCapacity]:
    with runtime.db.read() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == name)).one()
        segment = session.scalars(select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id)).one()
    return plan, segment


def _return(runtime: ServiceContext, seller: Caller, name: str, refund: Decimal) -> int:
    """The seller's plan given back whole, before it starts: its capacity freed (as a cancel frees it)
    and the return's rows written; the window's id."""
    plan, segment = _plan(runtime, name)
    plans.cancel(runtime, seller.account_id, name, "returned (the returns service's part)")
    now = runtime.clock.now()
    hours = Decimal(segment.count * int((segment.end - segment.start).total_seconds())) / 3600
    with runtime.db.write() as session:
        session.add(
            ReturnQuote(
                id=f"rq-{plan.id}",
                plan_id=plan.id,
                account_id=seller.account_id,
                scope='{"Kind": "plan"}',
                windows="[]",
                refund=refund,
                currency="USD",
                fingerprint="0" * 64,
                created_at=now,
                valid_until=now + timedelta(minutes=10),
                used_at=now,
            )
        )
        session.flush()  # the quote before the return that names it
        done = PlanReturn(
            plan_id=plan.id,
            account_id=seller.account_id,
            quote_id=f"rq-{plan.id}",
            at=now,
            scope='{"Kind": "plan"}',
            instance_hours=float(hours),
            refund=refund,
            currency="USD",
            settled="ledger",
        )
        session.add(done)
        session.flush()
        window = ReturnedWindow(
            return_id=done.id,
            plan_id=plan.id,
            account_id=seller.account_id,
            instance_type=P5,
            availability_zone=ZONE,
            start=segment.start,
            end=segment.end,
            count=segment.count,
            price_per_instance_hour=plan.upfront_fee / hours,
            resale_share=SHARE,
        )
        session.add(window)
        session.flush()
        return window.id


@contextmanager
def _market(tmp_path: Path, reservable: int, stores: Stores | None = None) -> Iterator[Market]:
    """A pool of `reservable`: the holder keeps 2 instances, the seller returned 2 over the same 48 hours."""
    url = None if stores is None else stores.url()
    with application(tmp_path, one_pool_fleet(reservable), database_url=url) as app:
        runtime = app.context
        seller, holder = _account(runtime, "vision"), _account(runtime, "speech")
        buyer, other_buyer = _account(runtime, "audio"), _account(runtime, "robotics")
        _buy(runtime, seller, "returned-plan", 2, None)
        returned, segment = _plan(runtime, "returned-plan")
        _buy(runtime, holder, "kept-plan", 2, (segment.start, segment.end))
        window_id = _return(runtime, seller, "returned-plan", Decimal(0))
        yield Market(
            runtime,
            seller,
            holder,
            buyer,
            other_buyer,
            segment.start,
            segment.end,
            window_id,
            returned.upfront_fee,
        )


@pytest.fixture
def full_pool(tmp_path: Path, stores: Stores) -> Iterator[Market]:
    """4 reservable: with the holder's 2, only the returned 2 are free over the window (on each store:
    on PostgreSQL the returning account's row is locked and its rows read past the purchase's deferred
    ones)."""
    with _market(tmp_path, 4, stores) as market:
        yield market


def _resales(market: Market) -> list[tuple[str, datetime, datetime, int, Decimal]]:
    with market.runtime.db.read() as session:
        rows = session.execute(
            select(TrainingPlan.name, Resale.start, Resale.end, Resale.count, Resale.credited)
            .join(TrainingPlan, TrainingPlan.id == Resale.buyer_plan_id)
            .order_by(Resale.id)
        )
        return [tuple(row) for row in rows]  # type: ignore[misc]


def _settled(market: Market) -> bool:
    """Whether the lifecycle loop has credited every resale (a purchase leaves it a timed event)."""
    with market.runtime.db.read() as session:
        return session.scalar(select(Resale.id).where(Resale.settled.is_(False)).limit(1)) is None


def _credits(market: Market, caller: Caller) -> tuple[list[Decimal], Decimal]:
    """The account's resale ledger lines and its budget, once every resale is credited."""
    assert wait_until(lambda: _settled(market), timeout=30), "the resale credits were never settled"
    with market.runtime.db.read() as session:
        lines = session.scalars(
            select(LedgerEntry.amount).where(
                LedgerEntry.account_id == caller.account_id, LedgerEntry.description.like("Resale credit%")
            )
        )
        account = session.get(Account, caller.account_id)
        assert account is not None
        return list(lines), account.budget


def test_a_booking_that_needed_the_returned_capacity_credits_the_seller_its_share(full_pool: Market) -> None:
    market = full_pool
    _, budget_before = _credits(market, market.seller)
    _buy(market.runtime, market.buyer, "bought-again", 2, (market.start, market.end))

    share = market.fee * SHARE  # all of the returned instance-hours, at what the seller paid
    assert _resales(market) == [("bought-again", market.start, market.end, 2, share)]
    lines, budget = _credits(market, market.seller)
    assert lines == [share]
    assert budget == budget_before + share
    # The buyer pays its fee and earns nothing; the holder is not touched.
    assert _credits(market, market.buyer)[0] == []
    assert _credits(market, market.holder)[0] == []


def test_two_bookings_on_one_window_are_credited_once_in_all(full_pool: Market) -> None:
    market = full_pool
    _buy(market.runtime, market.buyer, "first-half", 1, (market.start, market.end))
    _buy(market.runtime, market.other_buyer, "second-half", 1, (market.start, market.end))

    half = market.fee * SHARE / 2
    assert _resales(market) == [
        ("first-half", market.start, market.end, 1, half),
        ("second-half", market.start, market.end, 1, half),
    ]
    lines, _ = _credits(market, market.seller)
    assert lines == [half, half]
    assert sum(lines) == market.fee * SHARE


def test_nothing_is_resold_where_the_pool_had_room_of_its_own(tmp_path: Path) -> None:
    """6 reservable: besides the returned 2, 2 more were free; a booking of 2 needed none of the
    returned ones, a later booking of 2 more needs them all."""
    with _market(tmp_path, 6) as market:
        _buy(market.runtime, market.buyer, "had-room", 2, (market.start, market.end))
        assert _resales(market) == []
        assert _credits(market, market.seller)[0] == []

        _buy(market.runtime, market.other_buyer, "needed-it", 2, (market.start, market.end))
        share = market.fee * SHARE
        assert _resales(market) == [("needed-it", market.start, market.end, 2, share)]
        assert _credits(market, market.seller)[0] == [share]


def test_refund_and_credit_never_add_up_to_more_than_was_paid(tmp_path: Path) -> None:
    """The seller was refunded 90% of its fee: of its 50% share only the last 10% can be credited."""
    with _market(tmp_path, 4) as market:
        with market.runtime.db.write() as session:
            returned = session.scalars(select(PlanReturn)).one()
            returned.refund = market.fee * Decimal("0.9")
        _buy(market.runtime, market.buyer, "bought-again", 2, (market.start, market.end))
        assert _credits(market, market.seller)[0] == [market.fee * Decimal("0.1")]


def test_a_purchase_with_no_returned_window_asks_only_within_its_holdings_read(tmp_path: Path) -> None:
    with _market(tmp_path, 8) as market:
        statements: list[str] = []

        mine = threading.get_ident()  # the application's background loops have statements of their own

        def seen(_conn: Any, _cursor: Any, sql: str, *_rest: Any) -> None:
            if threading.get_ident() == mine:
                statements.append(sql)

        # Not over the returned window: the probe finds nothing there.
        later = (market.end + timedelta(days=7), market.end + timedelta(days=14))
        engine = market.runtime.db.engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            _buy(market.runtime, market.buyer, "elsewhere", 2, later)
        finally:
            event.remove(engine, "before_cursor_execute", seen)
        # The windows are asked for only in the purchase's holdings read (one statement it makes anyway,
        # on SQLite once on a snapshot and once in the write): no statement of its own, no resale read.
        touching = [s for s in statements if "returned_windows" in s or "resales" in s]
        assert touching and all("reserved_capacities" in s for s in touching)
        assert not any("resales" in s for s in touching)
        assert _resales(market) == []
