"""Property: over random fleets and random sequences of searches, purchases and clock moves, against a
real store (SQLite and PostgreSQL: tests/postgres.py), every offering returned can be bought right after
it is returned, and no pool is ever booked above its reservable count at any instant (checked from the
stored rows by brute force). Concurrent buyers: tests/server/test_concurrency.py and the race below."""

from __future__ import annotations

import contextvars
import os
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, insert, select, text

from hyperplan.app import AppConfig, Application
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ResourceInUse, ResourceLimitExceeded
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans, quotas
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import ReservedCapacity, TrainingPlan
from hyperplan.waits import WouldWait, answering, forbid_waits
from tests.beside import answered_beside
from tests.harness import SERVER_START, unisolated
from tests.instants import at_awkward_instants
from tests.postgres import PostgresServer, Stores

TYPES = ("ml.p5.48xlarge", "ml.p4d.24xlarge")
ZONES = ("us-west-2a", "us-west-2b")
ONE_POOL_OF_FOUR = (
    'region = "us-west-2"\ncurrency = "USD"\n[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
    'subnets = []\n[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\ncount = 4\n'
    'price_per_instance_hour = "10"\n'
)
THE_WHOLE_POOL_FOR_A_DAY = SearchRequest("ml.p5.48xlarge", 4, 24, "training-job", None, None)
"""A search on ONE_POOL_OF_FOUR whose every offering takes the pool whole: any two of them overlapping
in time cannot both be bought."""


@st.composite
def fleet_texts(draw: st.DrawFn) -> str:
    pools = []
    for instance_type in TYPES:
        for zone in draw(st.lists(st.sampled_from(ZONES), min_size=1, max_size=2, unique=True)):
            count = draw(st.integers(1, 12))
            reservable = draw(st.integers(1, count))
            pools.append(
                f'[[pools]]\ninstance_type = "{instance_type}"\nzone = "{zone}"\ncount = {count}\n'
                f'reservable = {reservable}\nprice_per_instance_hour = "{draw(st.integers(1, 90))}.50"\n'
            )
    zones = "".join(
        f'[[zones]]\nname = "{z}"\nzone_id = "usw2-az{i + 1}"\nsubnets = ["subnet-0000000000000000{i}"]\n'
        for i, z in enumerate(ZONES)
    )
    policy = '[policy]\nallowed_counts = "any"\nhorizon = "14d"\n' if draw(st.booleans()) else ""
    return f'region = "us-west-2"\ncurrency = "USD"\n{zones}{"".join(pools)}{policy}'


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("search"),
            st.sampled_from(TYPES),
            st.sampled_from((1, 2, 4, 8)),
            st.integers(1, 24 * 6),
            st.sampled_from(("training-job", "hyperpod-cluster")),
            st.integers(0, 3),  # which offering to buy (beyond the list: buy none)
        ),
        st.tuples(st.just("advance"), st.integers(1, 60 * 30)),
    ),
    min_size=1,
    max_size=14,
)


def _peaks(runtime: ServiceContext) -> dict[tuple[str, str], int]:
    with runtime.db.read() as session:
        rows = session.execute(
            select(
                ReservedCapacity.instance_type,
                ReservedCapacity.availability_zone,
                ReservedCapacity.start,
                ReservedCapacity.end,
                ReservedCapacity.count,
            ).where(ReservedCapacity.holds_capacity.is_(True))
        ).all()
    peaks: dict[tuple[str, str], int] = defaultdict(int)
    for t, zone, start, _, _ in rows:  # the busiest instant of a pool is some segment's start
        held = sum(n for t2, z2, s2, e2, n in rows if (t2, z2) == (t, zone) and s2 <= start < e2)
        peaks[(t, zone)] = max(peaks[(t, zone)], held)
    return peaks


@at_awkward_instants
def test_offerings_can_be_bought_and_pools_are_never_overbooked(
    stores: Stores, start_instant: datetime
) -> None:
    # Eight random fleets and scripts per instant on SQLite; four on PostgreSQL, where the rules of time
    # are the same and the question is the store's (each example gets a database of its own).
    @settings(
        max_examples=4 if stores.is_postgres else 8,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(fleet_text=fleet_texts(), script=steps)
    def examples(fleet_text: str, script: list[tuple]) -> None:
        _run_example(stores, start_instant, fleet_text, script)

    examples()


def _run_example(stores: Stores, start_instant: datetime, fleet_text: str, script: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        fleet_path = Path(tmp) / "fleet.toml"
        fleet_path.write_text(fleet_text)
        config = AppConfig(
            data_dir=Path(tmp) / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=start_instant,
            database_url=stores.url(),
            **unisolated(Path(tmp) / "data"),
        )
        application = Application(config)
        application.start()
        try:
            _play(application.context, script)
        finally:
            application.stop()
        stores.drop_all()


def _play(runtime: ServiceContext, script: list[tuple]) -> None:
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
    caller = Caller(admin.id, admin.name, True, "key")
    reservable = {pool.key: pool.reservable for pool in runtime.fleet.pools}
    for number, step in enumerate(script):
        if step[0] == "advance":
            runtime.advance_clock(runtime.clock.now() + timedelta(minutes=step[1]))
            continue
        _, instance_type, count, hours, target, pick = step
        if count > max((p.reservable for p in runtime.fleet.pools_of_type(instance_type)), default=0):
            continue  # refused as a ValidationError: covered by the search tests
        try:
            found = plans.search(
                runtime, caller, SearchRequest(instance_type, count, hours, target, None, None)
            )
        except Exception as exc:  # only validation refusals are expected here
            assert type(exc).__name__ == "ValidationError", exc
            continue
        if pick < len(found):
            # every offering returned can be bought right after it is returned
            plans.create(runtime, caller, f"plan-{number}", found[pick].offering_id)
        for pool, peak in _peaks(runtime).items():
            assert peak <= reservable[pool], (pool, peak)


def test_a_stale_offering_is_refused_when_its_capacity_is_gone(stores: Stores, tmp_path: Path) -> None:
    application = _started(stores, tmp_path, ONE_POOL_OF_FOUR)
    runtime = application.context
    try:
        caller, request = _administrator(runtime), THE_WHOLE_POOL_FOR_A_DAY
        first, second = plans.search(runtime, caller, request)[0], plans.search(runtime, caller, request)[0]
        with _statements(runtime) as made:
            plans.create(runtime, caller, "first", first.offering_id)
        # A purchase is a handful of statements (services/plans/plan_purchase.py; the bench's purchases/s rest
        # on it): BEGIN, two reads, one write per table, the change counters; both stores add the reads
        # made first on a snapshot, before the write (its refusals). PostgreSQL adds its three locks,
        # and reads the account's facts and holdings in one statement, first and again under the locks.
        assert len(made) <= MAX_PURCHASE_STATEMENTS + 2, made
        # Refused on a snapshot before any lock (Database.refuse_early): answered while a serial writer
        # (this thread) holds the store, which a purchase's write, and its locks, would wait for.
        with runtime.db.write():
            refused = answered_beside(
                lambda: plans.create(runtime, caller, "second", second.offering_id), "the store's writer"
            )
        assert isinstance(refused, ResourceLimitExceeded), "the same capacity was sold twice"
        assert "Search again" in refused.message
        with runtime.db.read() as session:
            assert session.scalar(select(func.count()).select_from(TrainingPlan)) == 1
    finally:
        application.stop()


def _started(stores: Stores, tmp_path: Path, fleet_text: str, database_url: str | None = None) -> Application:
    """An application on `fleet_text`, in the store under test (a new one; `database_url`: that one), on
    the manual clock; the caller stops it."""
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(fleet_text)
    application = Application(
        AppConfig(
            data_dir=tmp_path / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=SERVER_START,
            database_url=database_url or stores.url(),
            **unisolated(tmp_path / "data"),
        )
    )
    application.start()
    return application


MAX_PURCHASE_STATEMENTS = 11


def _administrator(runtime: ServiceContext) -> Caller:
    """The bootstrap's administrator, as a caller."""
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
    return Caller(admin.id, admin.name, True, "key")


@contextmanager
def _statements(runtime: ServiceContext) -> Iterator[list[str]]:
    """The SQL statements the store's engine sends for this thread while the block runs (the
    application's background loops have theirs)."""
    made: list[str] = []
    mine = threading.get_ident()

    def note(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.get_ident() == mine:
            made.append(" ".join(statement.split()[:4]))

    event.listen(runtime.db.engine, "before_cursor_execute", note)
    try:
        yield made
    finally:
        event.remove(runtime.db.engine, "before_cursor_execute", note)


RACE_FLEET = (
    'region = "us-west-2"\ncurrency = "USD"\n'
    '[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\nsubnets = []\n'
    '[[zones]]\nname = "us-west-2b"\nzone_id = "usw2-az2"\nsubnets = []\n'
    '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2a"\ncount = 6\n'
    'price_per_instance_hour = "10"\n'
    '[[pools]]\ninstance_type = "ml.p5.48xlarge"\nzone = "us-west-2b"\ncount = 3\n'
    'price_per_instance_hour = "10"\n'
    '[policy]\nallowed_counts = "any"\n'
)
BUYERS = 8


def test_concurrent_buyers_in_separate_accounts_never_overbook(stores: Stores, tmp_path: Path) -> None:
    """Eight buyers, each in an account of its own (so nothing per account orders them), race for two
    small pools. On PostgreSQL their purchases run as concurrent transactions (Database.write(concurrent=
    True)): only the pools' locks stand between them and an overbooking."""
    application = _started(stores, tmp_path, RACE_FLEET)
    runtime = application.context
    try:
        callers = []
        for n in range(BUYERS):
            with runtime.db.write() as session:
                key = accounts.create_account(
                    session, f"buyer-{n}", box=runtime.secret_box, now=runtime.clock.now()
                )
                callers.append(Caller(key.account_id, f"buyer-{n}", False, key.access_key_id))
        outcomes: dict[str, int] = defaultdict(int)
        start = threading.Barrier(BUYERS)

        def buy(number: int) -> None:
            caller = callers[number]
            start.wait()
            for round_ in range(5):
                request = SearchRequest(
                    "ml.p5.48xlarge", 2 + number % 2, 24 * (1 + round_ % 3), "training-job", None, None
                )
                found = plans.search(runtime, caller, request)
                if not found:
                    outcomes["empty"] += 1
                    continue
                try:
                    plans.create(runtime, caller, f"race-{number}-{round_}", found[0].offering_id)
                    outcomes["bought"] += 1
                except ResourceLimitExceeded:
                    outcomes["refused"] += 1

        threads = [threading.Thread(target=buy, args=(n,)) for n in range(BUYERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert outcomes["bought"] and outcomes["refused"], outcomes  # the race collided, and some won
        reservable = {pool.key: pool.reservable for pool in runtime.fleet.pools}
        for pool, peak in _peaks(runtime).items():
            assert peak <= reservable[pool], (pool, peak, outcomes)
    finally:
        application.stop()


def test_an_accounts_own_hours_quota_weighs_its_plans_of_every_type(stores: Stores, tmp_path: Path) -> None:
    """The fleet sets no instance-hours quota, the account its own: its plans of one type count against
    a purchase of another (on PostgreSQL the first read, of the pools' types only, is read again)."""
    pools = "".join(
        f'[[pools]]\ninstance_type = "{kind}"\nzone = "us-west-2a"\ncount = 8\n'
        'price_per_instance_hour = "10"\n'
        for kind in ("ml.p5.48xlarge", "ml.p4d.24xlarge")
    )
    application = _started(
        stores,
        tmp_path,
        'region = "us-west-2"\ncurrency = "USD"\n[[zones]]\nname = "us-west-2a"\nzone_id = "usw2-az1"\n'
        f'subnets = []\n{pools}[policy]\nallowed_counts = "any"\n',
    )
    runtime = application.context
    try:
        with runtime.db.write() as session:
            key = accounts.create_account(session, "hours", box=runtime.secret_box, now=runtime.clock.now())
            quotas.set_limits(
                session, key.account_id, max_plans=None, max_instances=None, max_instance_hours=100
            )
        caller = Caller(key.account_id, "hours", False, key.access_key_id)

        def first_offering(instance_type: str, count: int) -> str:
            request = SearchRequest(instance_type, count, 24, "training-job", None, None)
            return plans.search(runtime, caller, request)[0].offering_id

        plans.create(runtime, caller, "p5", first_offering("ml.p5.48xlarge", 2))  # 48 instance-hours
        try:
            plans.create(runtime, caller, "p4d", first_offering("ml.p4d.24xlarge", 3))  # 72 more
        except ResourceLimitExceeded as exc:
            assert "reserved-instance-hours-per-30-days is 100" in exc.message, exc.message
        else:
            raise AssertionError("the account's plans of another type were not weighed")
    finally:
        application.stop()


def test_on_sqlite_a_refused_purchase_is_answered_on_the_event_loop_and_one_that_passes_goes_on_in_the_pool(
    tmp_path: Path,
) -> None:
    """server/sagemaker.py tries a purchase on the event loop when the store is SQLite: a refusal read on
    a snapshot is answered there; one that passes is a WouldWait there, with nothing written, then bought
    in the pool (a copy of the loop's context, as anyio's threads run) without its snapshot reads again."""
    application = _started(Stores("sqlite", None), tmp_path, ONE_POOL_OF_FOUR)
    runtime = application.context
    try:
        caller, request = _administrator(runtime), THE_WHOLE_POOL_FOR_A_DAY
        first, stale = plans.search(runtime, caller, request)[0], plans.search(runtime, caller, request)[0]
        plans.create(runtime, caller, "first", first.offering_id)
        later = plans.search(runtime, caller, request)[0]  # the next free day
        with answering():
            with forbid_waits(), pytest.raises(ResourceLimitExceeded, match="Search again"):
                plans.create(runtime, caller, "stale", stale.offering_id)
            with forbid_waits(), pytest.raises(WouldWait):
                plans.create(runtime, caller, "later", later.offering_id)
            with runtime.db.read() as session:
                assert session.scalar(select(func.count()).select_from(TrainingPlan)) == 1

            def in_the_pool() -> tuple[str, list[str]]:
                with _statements(runtime) as made:
                    return plans.create(runtime, caller, "later", later.offering_id), made

            with ThreadPoolExecutor(1) as pool:
                arn, made = pool.submit(contextvars.copy_context().run, in_the_pool).result()
        assert arn.endswith("training-plan/later")
        assert len(made) <= MAX_PURCHASE_STATEMENTS, made  # no snapshot reads: the loop made them
        with runtime.db.read() as session:
            assert session.scalar(select(func.count()).select_from(TrainingPlan)) == 2
    finally:
        application.stop()


MAX_PURCHASE_ROUND_TRIPS = 3
"""A bought purchase's synchronisation points with PostgreSQL: its write (the BEGIN; with it the
writers' lock, the account's and pools' locks and its read, which draws its rows' ids; then every row
deferred, the change counters and the COMMIT, together). Its refusals are not read on a snapshot first:
the live calendar has room for it (CheckedWrite.likely_passes). Before its history, timed events,
ledger entry and status events were deferred: 15; before its refusals were read outside a transaction,
its plan, segments and invoice deferred and its COMMIT sent with the counters: 11; before the writers'
lock went with its read: 5; before the snapshot's read was skipped when the calendar has room: 4."""


@pytest.mark.postgres
def test_on_postgres_a_bought_purchase_waits_for_the_server_no_more_than_it_must(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """Each wait for PostgreSQL's answer costs a purchase more under load than its statement (a thread
    switch to the server and back, the GIL taken again), and the pools' locks are held across those of
    its write: the statements whose results nobody reads (its locks; its rows, whose ids its read
    drew) go with the next one (store/prepared.py `defer`), and the last with the COMMIT. Counted as
    libpq sees them: the server answers each synchronisation point with a ReadyForQuery (psycopg's
    pipeline may send a BEGIN's and the next statement's in one round trip: the count is an upper
    bound of those)."""
    from psycopg import pq  # PostgreSQL's driver: only a PostgreSQL store needs it

    stores = Stores("postgres", postgres_server)
    application = _started(stores, tmp_path, ONE_POOL_OF_FOUR)
    runtime = application.context
    caller = _administrator(runtime)
    request = SearchRequest("ml.p5.48xlarge", 1, 24, "training-job", None, None)
    trace = tmp_path / "libpq-trace"

    def traced(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        dbapi_connection.pgconn.trace(descriptor)
        dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def untraced(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.pgconn.untrace()

    try:
        for n in range(6):  # psycopg prepares a statement on the server once it has run a few times
            plans.create(runtime, caller, f"warm-{n}", plans.search(runtime, caller, request)[0].offering_id)
        offering = plans.search(runtime, caller, request)[0]
        descriptor = os.open(trace, os.O_WRONLY | os.O_CREAT, 0o600)
        event.listen(runtime.db.engine, "checkout", traced)
        event.listen(runtime.db.engine, "checkin", untraced)
        try:
            plans.create(runtime, caller, "traced", offering.offering_id)
        finally:
            event.remove(runtime.db.engine, "checkout", traced)
            event.remove(runtime.db.engine, "checkin", untraced)
            os.close(descriptor)
        messages = trace.read_text().splitlines()
        answers = _waits_of_the_purchase(messages)
        done = [line.split("\t")[-1].strip(' "') for line in messages if "\tCommandComplete\t" in line]
        assert "COMMIT" in done and "INSERT 0 1" in done, "\n".join(messages)  # its write was traced
        assert len(answers) <= MAX_PURCHASE_ROUND_TRIPS, "\n".join(messages)
    finally:
        application.stop()
        stores.drop_all()


def _waits_of_the_purchase(messages: list[str]) -> list[str]:
    """The ReadyForQuery messages of a libpq trace, but those that answer only a statement's
    preparation (a ParseComplete alone): psycopg prepares a statement on the server the fifth time a
    connection runs it, once per connection; which pooled connection a purchase gets, and so whether
    one of its statements is prepared then, is the pool's choice."""
    answers, previous = [], ""
    for line in messages:
        if not line.startswith("B"):
            continue
        kind = line.split("\t")[2].strip()
        if kind == "ReadyForQuery" and previous != "ParseComplete":
            answers.append(line)
        previous = kind
    return answers


@pytest.mark.postgres
def test_on_postgres_a_name_taken_while_a_purchase_commits_is_refused_and_nothing_of_it_is_written(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """A bought plan's rows go to PostgreSQL only with its commit (their ids were drawn in its read):
    a plan of the same name, inserted by a transaction the purchase's checks could not see yet and
    committed while the purchase waits on it, is found by the unique constraint there. The buyer gets
    ResourceInUse, not a 500, and nothing of its purchase is written nor booked."""
    stores = Stores("postgres", postgres_server)
    application = _started(stores, tmp_path, ONE_POOL_OF_FOUR)
    runtime = application.context
    caller = _administrator(runtime)
    try:
        offering = plans.search(runtime, caller, THE_WHOLE_POOL_FOR_A_DAY)[0]
        now = runtime.clock.now()
        racer = runtime.db.engine.connect()
        try:
            racer.execute(  # not committed yet: invisible to the purchase's reads
                insert(TrainingPlan).values(
                    account_id=caller.account_id,
                    name="raced",
                    offering_id="tpo-inserted-by-the-racer",
                    target="training-job",
                    instance_type="ml.p5.48xlarge",
                    status="Pending",
                    status_message="",
                    upfront_fee="0",
                    currency="USD",
                    created_at=now,
                    updated_at=now,
                )
            )
            with ThreadPoolExecutor(1) as pool:
                buying = pool.submit(plans.create, runtime, caller, "raced", offering.offering_id)
                _wait_until_a_statement_waits_for_a_lock(runtime)
                racer.commit()
                with pytest.raises(ResourceInUse, match="'raced'"):
                    buying.result(timeout=60)
        finally:
            racer.close()
        with runtime.db.read() as session:
            assert session.scalars(select(TrainingPlan.offering_id)).all() == ["tpo-inserted-by-the-racer"]
            assert session.scalar(select(func.count()).select_from(ReservedCapacity)) == 0
        # Nothing was booked in memory either: the pool is whole, and the offering still for sale.
        assert plans.search(runtime, caller, THE_WHOLE_POOL_FOR_A_DAY)
        plans.create(runtime, caller, "after-the-race", offering.offering_id)
    finally:
        application.stop()
        stores.drop_all()


@pytest.mark.postgres
def test_on_postgres_a_purchase_the_calendar_has_room_for_is_refused_in_its_write_when_another_server_took_it(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """On PostgreSQL a purchase the live calendar has room for skips the refusals' read on a snapshot
    (CheckedWrite.likely_passes); the check under its locks decides. Here the calendar is behind: a
    second server on the same store bought the whole pool after this one last read the counter. The
    purchase is refused there as the snapshot would have refused it, and nothing of it is written."""
    stores = Stores("postgres", postgres_server)
    shared = stores.url()
    (tmp_path / "here").mkdir()
    here = _started(stores, tmp_path / "here", ONE_POOL_OF_FOUR, shared)
    there: Application | None = None
    try:
        (tmp_path / "there" / "data").mkdir(parents=True)  # the store's secrets are sealed under one key
        shutil.copy(tmp_path / "here" / "data" / "master.key", tmp_path / "there" / "data" / "master.key")
        there = _started(stores, tmp_path / "there", ONE_POOL_OF_FOUR, shared)
        runtime, other = here.context, there.context
        caller = _administrator(runtime)
        offering = plans.search(runtime, caller, THE_WHOLE_POOL_FOR_A_DAY)[0]
        taken_there = plans.search(other, caller, THE_WHOLE_POOL_FOR_A_DAY)[0].offering_id
        plans.create(other, caller, "taken-there", taken_there)
        (segment,) = offering.offering.segments
        assert runtime.calendar.can_book(segment.pool_key, segment.start, segment.end, 4), "not behind"
        refused = pytest.raises(ResourceLimitExceeded, match="taken since the search")
        with _statements(runtime) as made, refused:
            plans.create(runtime, caller, "late-here", offering.offering_id)
        # Its refusals read once, under its pools' locks: not on a snapshot first.
        (read,) = [n for n, statement in enumerate(made) if statement.startswith("SELECT accounts.id,")]
        assert any(statement.startswith("SELECT pg_advisory_xact_lock(") for statement in made[:read]), made
        with runtime.db.read() as session:
            assert session.scalars(select(TrainingPlan.name)).all() == ["taken-there"]
            assert session.scalar(select(func.sum(ReservedCapacity.count))) == 4
        runtime.sync()  # as the next request does: the store's counter read, and the other's purchase seen
        assert not runtime.calendar.can_book(segment.pool_key, segment.start, segment.end, 1)
    finally:
        if there is not None:
            there.stop()
        here.stop()
        stores.drop_all()


def _wait_until_a_statement_waits_for_a_lock(runtime: ServiceContext) -> None:
    """Until some session of the store waits for a lock another holds (pg_locks), within a minute."""
    for _ in range(600):
        with runtime.db.engine.connect() as connection:
            if connection.execute(
                select(func.count()).select_from(text("pg_locks")).where(text("NOT granted"))
            ).scalar():
                return
        time.sleep(0.1)
    raise AssertionError("no statement waited for the racer's uncommitted plan")
