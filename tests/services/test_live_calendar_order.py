"""The live calendar follows this process's own commits without reading the store again
(services/runtime/live_calendar.py): writers commit one after another but apply their changes in any
order after it, so a change that overtakes the one below it waits for it; a read behind the store's
counter only by this process's own commits waits for them, and one behind by another process's change
reloads, once for all the readers that came meanwhile.

Real stores (SQLite, then PostgreSQL for the threads), real threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from hyperplan.core.calendar import slot_of, slot_start
from hyperplan.core.search_request import SearchRequest
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import LiveCalendar, held
from hyperplan.store import changes
from hyperplan.store.db import after_commit, committed_change
from hyperplan.store.schema import ChangeCounter, ReservedCapacity, TrainingPlan
from tests.batches import fails_at_commit
from tests.harness import SERVER_START
from tests.postgres import Stores
from tests.services.running import application

P5 = "ml.p5.48xlarge"
POOL = (P5, "us-west-2a")
RESERVABLE = 64
FLEET = (
    'region = "us-west-2"\ncurrency = "USD"\n[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
    f'subnets = []\n[[pools]]\ninstance_type = "{P5}"\nzone = "{POOL[1]}"\ncount = {RESERVABLE}\n'
    'price_per_instance_hour = "10"\n[policy]\nallowed_counts = "any"\n'
)
BUYERS = 8
PLANS_EACH = 5
WAIT = 60.0  # seconds a thread here is given to finish: far beyond what any step takes
CATCH_UP = 600.0  # seconds a read of `_calendar_of` waits for its own commits: a read that should not
# wait, and does, outlives its join


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[ServiceContext]:
    with application(tmp_path, FLEET) as started:
        yield started.context


def _buyer(runtime: ServiceContext, name: str) -> Caller:
    with runtime.db.write() as session:
        key = accounts.create_account(session, name, box=runtime.secret_box, now=runtime.clock.now())
    return Caller(key.account_id, name, False, key.access_key_id)


def _bought(runtime: ServiceContext) -> Caller:
    """An account that has bought plan "bought" (one instance for a day, the first offering)."""
    caller = _buyer(runtime, "team")
    offering = plans.search(runtime, caller, SearchRequest(P5, 1, 24, "training-job", None, None))[0]
    plans.create(runtime, caller, "bought", offering.offering_id)
    return caller


def _counter(runtime: ServiceContext) -> int:
    with runtime.db.read() as session:
        value = session.scalar(select(ChangeCounter.value).where(ChangeCounter.name == changes.CALENDAR))
    assert value is not None
    return value


def _disagreements(runtime: ServiceContext, calendar: LiveCalendar) -> list[str]:
    """Each slot of the next two weeks where `calendar`'s booked count is not what the store holds;
    read from the calendar as it is (its own profile would first bring it up to date)."""
    now = runtime.clock.now()
    first, stop = slot_of(now), slot_of(now + timedelta(days=14))
    with runtime.db.read() as session:
        stored = [(s, e, n) for pool, s, e, n in held(session) if pool == POOL]
    with calendar._lock:
        profile = calendar._calendar.booked_profile(POOL, slot_start(first), slot_start(stop))
    broken = []
    for slot in range(first, stop):
        moment = slot_start(slot)
        booked = next((count for start, count in reversed(profile) if start <= moment), 0)
        holds = sum(n for s, e, n in stored if s <= moment < e)
        if booked != holds:
            broken.append(f"the calendar books {booked} at {moment}, the store holds {holds}")
    return broken[:3]


def _in_threads(work: list[Callable[[], object]]) -> list[object]:
    """Each callable in a thread of its own, all started together; their results (or what they raised)."""
    results: list[object] = [None] * len(work)
    start = threading.Barrier(len(work))

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = work[index]()
        except Exception as exc:  # reported by the caller's asserts
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads)
    return results


def test_buyers_in_threads_keep_the_calendar_in_step_without_a_reload(stores: Stores, tmp_path: Path) -> None:
    """Eight buyers search and buy at once, each request reading the counters first as the server does:
    however their changes reach the calendar, it follows every one of them in the counter's order and
    never reads the store again."""
    with application(tmp_path, FLEET, database_url=stores.url()) as started:
        runtime = started.context
        callers = [_buyer(runtime, f"buyer-{n}") for n in range(BUYERS)]
        reloads = runtime.calendar.reloads

        def buy(caller: Caller) -> int:
            for number in range(PLANS_EACH):
                runtime.sync()  # what every signed request does first (server/auth.py)
                request = SearchRequest(P5, 1 + number % 2, 24 * (1 + number % 3), "training-job", None, None)
                offering = plans.search(runtime, caller, request)[0].offering_id
                runtime.sync()
                plans.create(runtime, caller, f"{caller.account_name}-{number}", offering)
            return PLANS_EACH

        outcomes = _in_threads([lambda caller=caller: buy(caller) for caller in callers])
        assert outcomes == [PLANS_EACH] * BUYERS, outcomes
        runtime.sync()
        plans.search(runtime, callers[0], SearchRequest(P5, 1, 24, "training-job", None, None))
        assert runtime.calendar.reloads == reloads
        assert runtime.calendar.version == _counter(runtime)
        assert not _disagreements(runtime, runtime.calendar)


def _calendar_of(runtime: ServiceContext) -> LiveCalendar:
    """A calendar of the runtime's store whose reads wait up to CATCH_UP for its own commits: a test
    that sees one wait and then go on has not met a timeout."""
    calendar = LiveCalendar(runtime.fleet, runtime.clock.now, catch_up=CATCH_UP)
    calendar.load(runtime.db)
    runtime.db.on_bump(changes.CALENDAR, calendar)
    return calendar


def _window() -> tuple[datetime, datetime]:
    start = slot_start(slot_of(SERVER_START + timedelta(days=2)))
    return start, start + timedelta(days=1)


def test_a_read_behind_only_by_this_processs_commit_waits_for_it_and_reads_it(
    runtime: ServiceContext,
) -> None:
    calendar = _calendar_of(runtime)
    version = calendar.version
    assert version is not None
    start, end = _window()
    calendar.committing()  # as the store tells a commit of this process (Database.on_bump)
    calendar.expect(version + 1)  # committed: the counter has moved, the change is on its way
    calendar.sync(runtime.db, version + 1)
    reader = threading.Thread(target=lambda: found.append(calendar.can_book(POOL, start, end, RESERVABLE)))
    found: list[bool] = []
    reader.start()
    calendar.book([(POOL, start, end, 1)], version + 1)
    reader.join(WAIT)
    assert not reader.is_alive()
    assert found == [False]  # it read the booking, which only the change carried (the store has none)
    assert (calendar.version, calendar.reloads) == (version + 1, 1)  # its first load only


def test_changes_that_overtake_each_other_are_applied_in_the_counters_order(runtime: ServiceContext) -> None:
    calendar = _calendar_of(runtime)
    start, end = _window()
    runtime.db.bump(changes.CALENDAR)  # another process's change, which a reload reads
    calendar.load(runtime.db)
    version = calendar.version
    assert version == _counter(runtime)
    calendar.book([(POOL, start, end, 5)], version)  # a change the reload read: not counted twice
    assert calendar.can_book(POOL, start, end, RESERVABLE)

    calendar.book([(POOL, start, end, 2)], version + 2)  # the later commit's change comes first
    assert calendar.version == version and calendar.can_book(POOL, start, end, RESERVABLE)
    calendar.release([(POOL, start, end, 2)], version + 2)  # the same transaction's second change
    calendar.book([(POOL, start, end, 3)], version + 1)
    assert calendar.version == version + 2
    assert not calendar.can_book(POOL, start, end, RESERVABLE - 2)
    assert calendar.can_book(POOL, start, end, RESERVABLE - 3)
    assert calendar.reloads == 2  # the first load and the one above: none for the changes


def test_a_commit_that_tells_the_calendar_nothing_is_read_from_the_store(runtime: ServiceContext) -> None:
    """A commit that moved the counter without a change for the calendar (capacity written past it; the
    demo load, written in bulk) may still have changed what is held: the next read reloads from the
    store, at once, and sees it."""
    calendar = runtime.calendar
    _bought(runtime)
    reloads = calendar.reloads
    start, end = _window()
    with runtime.db.write() as session:  # capacity held behind the calendar's back, and a plan's status
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "bought")).one()
        plan.status_message = "looked at"
        session.add(_held(plan.id, start, end, RESERVABLE))
    runtime.sync()
    assert not calendar.can_book(POOL, start, end, 1)
    assert calendar.version == _counter(runtime)
    assert calendar.reloads == reloads + 1
    assert not _disagreements(runtime, calendar)


def test_a_plan_and_its_segment_starting_move_the_plans_counter_not_the_calendars(
    runtime: ServiceContext,
) -> None:
    """Statuses hold no capacity (app.count_changes, live_calendar.HELD_COLUMNS): the lifecycle steps of
    a segment's start change its plan's status and its own, which used to move the calendar's counter
    and so have every process read all that is held again at its next request (about 1 s on the
    bench's 100x fleet). They move the plans counter, which the search's check of the account follows."""
    calendar = runtime.calendar
    _bought(runtime)
    with runtime.db.read() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "bought")).one()
        (segment,) = session.scalars(select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id))
        assert (plan.status, segment.status) == ("Scheduled", "Scheduled")
    before, reloads = runtime.db.counters(), calendar.reloads
    runtime.advance_clock(segment.start + timedelta(minutes=1))
    with runtime.db.read() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "bought")).one()
        assert (plan.status, session.get(ReservedCapacity, segment.id).status) == ("Active", "Active")
    after = runtime.db.counters()
    assert after[changes.CALENDAR] == before[changes.CALENDAR]
    assert after[changes.PLANS] > before[changes.PLANS]
    runtime.sync()
    assert not calendar.can_book(POOL, segment.start + timedelta(minutes=1), segment.end, RESERVABLE)
    assert calendar.reloads == reloads
    assert not _disagreements(runtime, calendar)


def test_readers_behind_another_processs_change_share_one_reload(runtime: ServiceContext) -> None:
    calendar = _calendar_of(runtime)
    runtime.db.bump(changes.CALENDAR)  # another process's change: nothing here announced it
    calendar.sync(runtime.db, _counter(runtime))
    start, end = _window()
    calendar._reloading.acquire()  # the first reader's reload under way: the others come meanwhile
    readers = [threading.Thread(target=calendar.can_book, args=(POOL, start, end, 1)) for _ in range(6)]
    for reader in readers:
        reader.start()
    calendar._reloading.release()
    for reader in readers:
        reader.join(WAIT)
    assert not any(reader.is_alive() for reader in readers)  # none waited for a commit of its own
    assert calendar.version == _counter(runtime)
    assert calendar.reloads == 2  # its first load, and one for all six readers


def test_a_callback_of_the_committing_thread_reads_the_calendar_at_its_commit_without_waiting(
    runtime: ServiceContext,
) -> None:
    """What runs after a commit (an auto-booking's search, actions on nodes) may read the calendar in the
    committing thread, with the counter already read past it: the calendar's own callbacks run first,
    whenever they were registered, so the read neither waits for the thread's own change nor reloads."""
    calendar = runtime.calendar
    _bought(runtime)
    reloads = calendar.reloads
    start, end = _window()
    read: list[tuple[int | None, bool]] = []

    def read_after_commit() -> None:
        runtime.sync()  # the counter as committed, past what the calendar held before the commit
        read.append((calendar.version, calendar.can_book(POOL, start, end, RESERVABLE)))

    with runtime.db.write() as session:
        after_commit(session, read_after_commit)
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "bought")).one()
        session.add(_held(plan.id, start, end))
        # As the services book: in memory once committed, registered after the read above.
        after_commit(
            session,
            lambda: calendar.book([(POOL, start, end, 1)], committed_change(session, changes.CALENDAR)),
            early=True,
        )
    assert read == [(_counter(runtime), False)]
    assert calendar.reloads == reloads


def _held(plan_id: int, start: datetime, end: datetime, count: int = 1) -> ReservedCapacity:
    """A segment of `plan_id` holding `count` instances of the pool over [start, end)."""
    return ReservedCapacity(
        plan_id=plan_id,
        ordinal=99,
        instance_type=P5,
        availability_zone=POOL[1],
        start=start,
        end=end,
        count=count,
        status="Scheduled",
        holds_capacity=True,
    )


def test_a_commit_that_fails_after_its_counter_moved_leaves_nothing_to_wait_for(
    runtime: ServiceContext,
) -> None:
    """SQLite moves the counter just before the COMMIT, which may still fail: the version announced
    never comes, the counter is as it was, and the next commit of that version is applied as usual."""
    calendar = runtime.calendar
    caller = _bought(runtime)
    version, reloads = calendar.version, calendar.reloads
    with pytest.raises(IntegrityError), runtime.db.write() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == "bought")).one()
        plan.status_message = "never stored"
        fails_at_commit(session)
    assert _counter(runtime) == version == calendar.version
    runtime.sync()
    assert calendar.can_book(*_room(runtime))  # not behind: nothing to wait for
    second = plans.search(runtime, caller, SearchRequest(P5, 1, 24, "training-job", None, None))[0]
    plans.create(runtime, caller, "second", second.offering_id)  # the version the failed one announced
    runtime.sync()
    assert calendar.version == _counter(runtime) == version + 1
    assert not _disagreements(runtime, calendar)
    assert calendar.reloads == reloads


def _room(runtime: ServiceContext) -> tuple[tuple[str, str], datetime, datetime, int]:
    start, end = _window()
    return POOL, start, end, 1
