"""Purchases committed together (store/group_commit.py) on SQLite, in one process: buyers' threads that
arrive together share one transaction and one durable commit; each is checked against the ones before
it in the batch, a refused one is answered alone with nothing of it written, a failed commit fails the
whole batch cleanly, and no pool is ever booked above its capacity (an independent sweep of the stored
segments). Real SQLite, real threads; tests/batches.py makes the buyers arrive together."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hyperplan.app import AppConfig, Application
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ResourceInUse, ResourceLimitExceeded, ServiceUnavailable
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store import changes
from hyperplan.store.schema import ChangeCounter, ReservedCapacity, TrainingPlan
from tests.batches import fails_at_commit, together
from tests.beside import answered_beside
from tests.harness import SERVER_START, unisolated

POOL = ("ml.p5.48xlarge", "us-west-2a")
RESERVABLE = 4
FLEET = (
    'region = "us-west-2"\ncurrency = "USD"\n[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
    f'subnets = []\n[[pools]]\ninstance_type = "{POOL[0]}"\nzone = "{POOL[1]}"\ncount = {RESERVABLE}\n'
    'price_per_instance_hour = "10"\n[policy]\nallowed_counts = "any"\n'
)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServiceContext]:
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(FLEET)
    application = Application(
        AppConfig(
            data_dir=tmp_path / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=SERVER_START,
            **unisolated(tmp_path / "data"),
        )
    )
    application.start()
    try:
        yield application.context
    finally:
        application.stop()


def buyers(runtime: ServiceContext, count: int) -> list[Caller]:
    callers = []
    for n in range(count):
        with runtime.db.write() as session:
            key = accounts.create_account(
                session, f"buyer-{n}", box=runtime.secret_box, now=runtime.clock.now()
            )
        callers.append(Caller(key.account_id, f"buyer-{n}", False, key.access_key_id))
    return callers


def offering(runtime: ServiceContext, caller: Caller, count: int, hours: int = 24) -> str:
    found = plans.search(runtime, caller, SearchRequest(POOL[0], count, hours, "training-job", None, None))
    assert found, (count, hours)
    return found[0].offering_id


def calendar_counter(session: Session) -> int:
    value = session.scalar(select(ChangeCounter.value).where(ChangeCounter.name == changes.CALENDAR))
    assert value is not None
    return value


def plan_names(runtime: ServiceContext) -> set[str]:
    with runtime.db.read() as session:
        return set(session.scalars(select(TrainingPlan.name)))


def test_buyers_arriving_together_commit_together_and_a_refused_one_is_answered_alone(
    runtime: ServiceContext,
) -> None:
    a, b, c = buyers(runtime, 3)
    # Searched before anyone buys: all three see the pool empty and are offered the same first window.
    offers = [offering(runtime, a, 2), offering(runtime, b, 3), offering(runtime, c, 2)]
    with runtime.db.read() as session:
        before = calendar_counter(session)
    reloads = runtime.calendar.reloads
    outcomes = together(
        runtime.db,
        [
            lambda: plans.create(runtime, a, "first", offers[0]),
            lambda: plans.create(runtime, b, "second", offers[1]),  # 2 + 3 > 4: refused, after the first
            lambda: plans.create(runtime, c, "third", offers[2]),  # 2 + 2 = 4: fits, the second not written
        ],
    )
    assert outcomes[0].endswith("training-plan/first") and outcomes[2].endswith("training-plan/third")
    assert isinstance(outcomes[1], ResourceLimitExceeded), outcomes[1]
    assert (runtime.db.group.batches, runtime.db.group.largest) == (1, 3)
    assert plan_names(runtime) == {"first", "third"}
    with runtime.db.read() as session:
        assert calendar_counter(session) == before + 1  # one transaction
        held = session.scalar(select(func.coalesce(func.sum(ReservedCapacity.count), 0)))
        refused = session.scalar(select(func.count()).where(TrainingPlan.name == "second"))
        start, end = session.execute(select(ReservedCapacity.start, ReservedCapacity.end).limit(1)).one()
    assert (held, refused) == (4, 0)
    # The live calendar booked both at the batch's one version, without a reload from the store.
    assert runtime.calendar.version == before + 1 and runtime.calendar.reloads == reloads
    assert not runtime.calendar.can_book(POOL, start, end, 1)


def test_a_failed_commit_fails_every_purchase_of_its_batch_and_writes_nothing(
    runtime: ServiceContext,
) -> None:
    a, b = buyers(runtime, 2)
    offers = [offering(runtime, a, 1), offering(runtime, b, 1)]
    with runtime.db.read() as session:
        before = calendar_counter(session)

    outcomes = together(
        runtime.db,
        [
            lambda: plans.create(runtime, a, "lost-1", offers[0]),
            lambda: runtime.db.write_grouped(fails_at_commit),
            lambda: plans.create(runtime, b, "lost-2", offers[1]),
        ],
    )
    for outcome in outcomes:
        assert isinstance(outcome, ServiceUnavailable), outcome
    assert plan_names(runtime) == set()
    with runtime.db.read() as session:
        assert calendar_counter(session) == before
        assert session.scalar(select(func.count()).select_from(ReservedCapacity)) == 0
    # Nothing was booked in memory either: the whole pool is still offered, and can be bought.
    plans.create(runtime, a, "after", offering(runtime, a, RESERVABLE))
    assert plan_names(runtime) == {"after"}


def test_a_purchase_the_store_already_refuses_is_answered_without_the_writers_turn(
    runtime: ServiceContext,
) -> None:
    """Refused on a snapshot (Database.refuse_early): while a writer holds the turn (here
    this thread, as another process's writer would), a purchase of a pool already full and one of a
    name already taken get their refusals; nothing of them is queued or written."""
    a, b = buyers(runtime, 2)
    stale = offering(runtime, b, 1)  # searched while the pool was empty
    plans.create(runtime, a, "all", offering(runtime, a, RESERVABLE))
    plans.create(runtime, b, "mine", offering(runtime, b, 1, hours=48))  # another window
    batches = runtime.db.group.batches
    with runtime.db.write():
        full = answered_beside(lambda: plans.create(runtime, b, "late", stale), "the writers' turn")
        taken = answered_beside(lambda: plans.create(runtime, b, "mine", stale), "the writers' turn")
        assert runtime.db.group.waiting == 0
    assert isinstance(full, ResourceLimitExceeded), full
    assert isinstance(taken, ResourceInUse), taken
    assert runtime.db.group.batches == batches
    assert plan_names(runtime) == {"all", "mine"}


def test_batched_buyers_never_overbook(runtime: ServiceContext) -> None:
    """Rounds of eight buyers, each round searched before anyone buys (so that they collide), then
    committed in batches of at most three; the stored segments are swept independently after."""
    callers = buyers(runtime, 8)
    runtime.db.group.max_batch = 3
    outcomes: dict[str, int] = defaultdict(int)
    for round_ in range(3):
        for outcome in together(runtime.db, _round(runtime, callers, round_)):
            if isinstance(outcome, ResourceLimitExceeded):
                outcomes["refused"] += 1
            else:
                assert isinstance(outcome, str), outcome
                outcomes["bought"] += 1
    assert outcomes["bought"] and outcomes["refused"], outcomes  # they collided, and some won
    assert runtime.db.group.largest == 3
    with runtime.db.read() as session:
        rows = session.execute(
            select(ReservedCapacity.start, ReservedCapacity.end, ReservedCapacity.count).where(
                ReservedCapacity.holds_capacity.is_(True)
            )
        ).all()
        assert calendar_counter(session) == runtime.calendar.version
    assert len(plan_names(runtime)) == outcomes["bought"]
    for start, _, _ in rows:  # the busiest instant is some segment's start
        assert sum(n for s, e, n in rows if s <= start < e) <= RESERVABLE


def _round(runtime: ServiceContext, callers: list[Caller], round_: int) -> list[Callable[[], str]]:
    """Each buyer's purchase of what it found, every search made before anyone buys."""
    offers = [
        offering(runtime, caller, 1 + (n + round_) % 3, 24 * (1 + n % 2)) for n, caller in enumerate(callers)
    ]
    return [
        partial(plans.create, runtime, caller, f"r{round_}-{n}", offers[n])
        for n, caller in enumerate(callers)
    ]
