"""The reads a request makes cost what the window and the live plans hold, not the store's past (issue 55):
on a store with years of expired plans for one account and one pool, the purchase's reads (the account's
facts, its refusal check's count of live plans, what its pools and the account hold), the live calendar's
reads and the plan listing use their indexes (SQLite: EXPLAIN QUERY PLAN names them, and no read scans a
table), and on PostgreSQL the rows they examine (EXPLAIN ANALYZE) stay the same when that past grows
tenfold. The holdings read with their bounds are also checked against every row, filtered in Python: the
bounds drop only rows that cannot overlap the window."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql as sql_text
from sqlalchemy import Connection, event, insert
from sqlalchemy.orm import Session

from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.plans import plans, quotas
from hyperplan.services.plans.plan_purchase import _READS
from hyperplan.services.runtime.live_calendar import held
from hyperplan.store import purchase_reads
from hyperplan.store.db import Database
from hyperplan.store.purchase_reads import HoldingsWindow
from hyperplan.store.schema import Account, PlanExtension, ReservedCapacity, TrainingPlan
from tests.postgres import PostgresServer

NOW = datetime(2031, 3, 1, 12, tzinfo=UTC)
BUYER = "000000000001"
OTHER = "000000000002"
POOL = ("ml.p5.48xlarge", "us-east-1a")
OTHER_POOL = ("ml.p5.48xlarge", "us-east-1b")
LIVE = 12  # the buyer's live plans, in the window or ahead of it
WINDOW = HoldingsWindow(
    BUYER,
    [POOL],
    NOW + timedelta(days=2),
    NOW + timedelta(days=9),
    NOW + timedelta(days=2) - quotas.WINDOW,
    NOW + timedelta(days=9) + quotas.WINDOW,
)
HISTORY_TABLES = ("reserved_capacities", "training_plans", "plan_extensions")


# -- the store: years of the buyer's past, and a few live plans ------------------------------------------


class Filler:
    """Bulk inserts of plans with one segment each (and an extension for some), ids counted here."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.next_id = 1
        with db.engine.begin() as connection:
            connection.execute(
                insert(Account),
                [{"id": a, "name": f"account-{a}", "created_at": NOW} for a in (BUYER, OTHER)],
            )

    def add(
        self, rows: Sequence[tuple[str, str, tuple[str, str], datetime, datetime]], *, extended: bool = True
    ) -> None:
        """(account, status, pool, start, end) each: a plan and its segment; every third an extension
        (if `extended`), paid (it holds nothing) in the past, unpaid (it holds its days) in the future."""
        plan_rows, segments, extensions = [], [], []
        for account, status, (instance_type, zone), start, end in rows:
            plan_id, self.next_id = self.next_id, self.next_id + 1
            plan_rows.append(
                {
                    "id": plan_id,
                    "account_id": account,
                    "name": f"plan-{plan_id}",
                    "offering_id": f"offering-{plan_id}",
                    "target": "training-job",
                    "instance_type": instance_type,
                    "status": status,
                    "upfront_fee": 1,
                    "currency": "USD",
                    "created_at": start - timedelta(days=1),
                    "updated_at": end,
                }
            )
            segment = {"plan_id": plan_id, "ordinal": 1, "instance_type": instance_type}
            segment.update(availability_zone=zone, count=1 + plan_id % 3, start=start, end=end, status=status)
            # A live plan cancelled while open holds until released_at: held less long than its end says.
            released = start + (end - start) / 2 if status == "Active" and plan_id % 4 == 0 else None
            segments.append({**segment, "holds_capacity": status != "Failed", "released_at": released})
            if extended and plan_id % 3 == 0:
                extensions.append(_extension(plan_id, instance_type, zone, end, unpaid=end > NOW))
        with self.db.engine.begin() as connection:
            connection.execute(insert(TrainingPlan), plan_rows)
            connection.execute(insert(ReservedCapacity), segments)
            if extensions:
                connection.execute(insert(PlanExtension), extensions)
            if not self.db.is_sqlite:
                connection.exec_driver_sql("ANALYZE")  # as autovacuum would after such a load

    def history(self, years: float, plans_count: int, until: datetime = NOW - timedelta(days=1)) -> None:
        """`plans_count` expired (and a few failed) plans of the buyer, back to back in its pool and
        another, over `years` up to `until`, and one of the other account's for every ten."""
        span = timedelta(days=365 * years)
        step = span / plans_count
        rows = []
        for i in range(plans_count):
            start = until - span + step * i
            pool = POOL if i % 2 else OTHER_POOL
            rows.append((BUYER, "Failed" if i % 17 == 0 else "Expired", pool, start, start + step))
            if i % 10 == 0:
                rows.append((OTHER, "Expired", POOL, start, start + step))
        self.add(rows)

    def live(self) -> None:
        """The buyer's live plans: open now, in the window, ahead of it; one of the other account's."""
        rows = []
        for i in range(LIVE):
            start = NOW - timedelta(days=3) + timedelta(days=2 * i)
            status = "Active" if start <= NOW else "Scheduled"
            rows.append((BUYER, status, POOL if i % 3 else OTHER_POOL, start, start + timedelta(days=5)))
        rows.append((OTHER, "Active", POOL, NOW - timedelta(days=1), NOW + timedelta(days=4)))
        # Ended just before the window's start: held by nothing the window weighs.
        rows.append((BUYER, "Expired", POOL, NOW - timedelta(days=6), WINDOW.low - timedelta(days=3)))
        self.add(rows)


CROWD = [f"{100 + i:012d}" for i in range(40)]  # other accounts that book the buyer's type
AHEAD = WINDOW.account_high + timedelta(days=10)  # later than any read's reach, and its longest segment


def crowd(filler: Filler, *, around: int = 0, past: int = 0, ahead: int = 0, until: datetime = NOW) -> None:
    """The other accounts' plans of the buyer's type, each in the buyer's pool or the type's other:
    `around` live ones over the quotas' span (30 days before the window to 30 days after), `past`
    expired ones over the year up to `until`, `ahead` live ones from AHEAD on (two hours apart). None
    extended: an unpaid extension is a plan's for the days it awaits its payment, a few in a store (the
    holdings read them all from ix_ext_holding, by end from the window's start)."""
    with filler.db.engine.begin() as connection:
        known = set(connection.exec_driver_sql("SELECT id FROM accounts").scalars())
        fresh = [{"id": a, "name": f"account-{a}", "created_at": NOW} for a in CROWD if a not in known]
        if fresh:
            connection.execute(insert(Account), fresh)
    rows = []
    span = WINDOW.account_high - WINDOW.account_low
    for i in range(around):
        rows.append((i, "Scheduled", WINDOW.account_low + span * i / around, timedelta(days=2)))
    step = timedelta(days=365) / max(past, 1)
    for i in range(past):
        rows.append((i, "Expired", until - timedelta(days=365) + step * i, step))
    for i in range(ahead):
        rows.append((i, "Scheduled", AHEAD + timedelta(hours=2 * i), timedelta(days=2)))
    filler.add(
        [
            (CROWD[i % len(CROWD)], status, POOL if i % 2 else OTHER_POOL, start, start + length)
            for i, status, start, length in rows
        ],
        extended=False,
    )


def _extension(
    plan_id: int, instance_type: str, zone: str, after: datetime, *, unpaid: bool
) -> dict[str, Any]:
    return {
        "plan_id": plan_id,
        "offering_id": f"extension-{plan_id}",
        "instance_type": instance_type,
        "availability_zone": zone,
        "count": 1,
        "start": after,
        "end": after + timedelta(days=2),
        "upfront_fee": 1,
        "currency": "USD",
        "payment_status": "Pending" if unpaid else "Paid",
        "extended_at": after - timedelta(days=3),
        "holds_capacity": unpaid,
    }


# -- the reads, as the services send them ------------------------------------------------------------


Statement = tuple[str, Any]


@contextmanager
def statements_of(db: Database) -> Iterator[list[Statement]]:
    """Every statement sent to the store inside the block, with its parameters, as the driver got them."""
    sent: list[Statement] = []

    def grab(_conn: Any, _cursor: Any, sql: str, params: Any, _context: Any, _many: bool) -> None:
        sent.append((sql, params))

    event.listen(db.engine, "before_cursor_execute", grab)
    try:
        yield sent
    finally:
        event.remove(db.engine, "before_cursor_execute", grab)


def _buyer() -> Caller:
    return Caller(account_id=BUYER, account_name="buyer", is_admin=False, access_key_id="AKIDBUYER")


def _purchase_reads(db: Database) -> None:
    """The purchase's reads as each database makes them (plan_purchase.Purchase._refusals)."""
    with db.engine.connect() as connection:
        for every_type in (False, True):
            if db.is_sqlite:
                _READS.read_facts(connection, BUYER, "a-new-plan", "a-new-offering")
                purchase_reads.read_holdings(connection, WINDOW, every_type)
            else:
                _READS.read_facts_and_holdings(connection, "a-new-plan", "a-new-offering", WINDOW, every_type)


def _quota_reads(db: Database) -> None:
    """A search's allowance (the count of live plans) and an extension's quota checks."""
    with db.read() as session:
        session.scalar(quotas.active_plans(BUYER))
        quotas._account_intervals(session, BUYER, POOL[0], WINDOW.low, WINDOW.high)
        quotas._account_intervals(session, BUYER, None, WINDOW.account_low, WINDOW.account_high)


def _calendar_reads(db: Database) -> None:
    """A pool's holdings over a window (an extension's check) and what is held from now on."""
    with db.read() as session:
        held(session, POOL, WINDOW.low, WINDOW.high)
        held(session, ending_after=NOW)


def _listing_reads(db: Database) -> None:
    """ListTrainingPlans' first page of the buyer's active plans by start time, and of all its plans by
    name."""
    with db.read() as session:
        plans.list_plans(session, _buyer(), plans.ListQuery(status="Active", max_results=5))
        plans.list_plans(session, _buyer(), plans.ListQuery(sort_by="TrainingPlanName", max_results=5))


READS: dict[str, Callable[[Database], None]] = {
    "purchase": _purchase_reads,
    "quotas": _quota_reads,
    "calendar": _calendar_reads,
    "listing": _listing_reads,
}


def _store(url: str) -> tuple[Database, Filler]:
    db = Database(url)
    db.migrate()
    return db, Filler(db)


# -- SQLite: the query plans -------------------------------------------------------------------------


def _sqlite_plan(connection: Connection, statement: Statement) -> list[str]:
    sql, params = statement
    return [row[-1] for row in connection.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, params)]


# What each read's plan must name: the indexes of 0031 that bound it.
SQLITE_INDEXES = {
    "purchase": {"ix_rc_type_end", "ix_rc_end", "ix_ext_holding", "ix_plan_account_live"},
    "quotas": {"ix_plan_account_live", "ix_rc_end", "ix_ext_holding"},
    "calendar": {"ix_rc_type_end", "ix_rc_end", "ix_ext_holding"},
    "listing": {"ix_plan_account_status"},
}
# A scan of a whole table, or of a whole index that holds every row of one (a partial index of live rows
# may be scanned: ix_ext_holding holds only the extensions that hold capacity).
FULL_SCAN = re.compile(r"^SCAN (?!.*USING INDEX ix_ext_holding\b)(\w+)")


@pytest.mark.parametrize("read", sorted(READS))
def test_sqlite_reads_search_their_indexes_and_scan_no_history(read: str, tmp_path: Path) -> None:
    db, filler = _store(f"sqlite:///{tmp_path / 'hyperplan.db'}")
    try:
        filler.history(years=3, plans_count=300)
        filler.live()
        with statements_of(db) as sent:
            READS[read](db)
        assert sent
        with db.engine.connect() as connection:
            lines = [line for statement in sent for line in _sqlite_plan(connection, statement)]
        scans = [line for line in lines if (found := FULL_SCAN.match(line)) and found[1] in HISTORY_TABLES]
        assert scans == [], lines
        used = {name for line in lines for name in re.findall(r"INDEX (\w+)", line)}
        assert SQLITE_INDEXES[read] <= used, lines
    finally:
        db.close()


# -- both: the bounds drop nothing that overlaps -----------------------------------------------------


@dataclass(frozen=True)
class Row:
    account: str
    pool: tuple[str, str]
    start: datetime
    end: datetime  # what it holds until: released_at if set
    count: int


def _every_held_row(session: Session) -> list[Row]:
    """Every row that holds capacity, read whole (no bound), for the reads' answers to be checked."""
    rows = []
    found = session.query(ReservedCapacity, TrainingPlan.account_id).join(
        TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id
    )
    for rc, account in found:
        if rc.holds_capacity:
            pool = (rc.instance_type, rc.availability_zone)
            rows.append(Row(account, pool, rc.start, rc.released_at or rc.end, rc.count))
    extensions = session.query(PlanExtension, TrainingPlan.account_id).join(
        TrainingPlan, TrainingPlan.id == PlanExtension.plan_id
    )
    for ext, account in extensions:
        if ext.holds_capacity:
            rows.append(
                Row(account, (ext.instance_type, ext.availability_zone), ext.start, ext.end, ext.count)
            )
    return rows


def _overlapping(rows: list[Row], low: datetime, high: datetime) -> list[Row]:
    return [r for r in rows if r.start < high and r.end > low and r.end > r.start]


def _as_intervals(rows: list[Row]) -> list[tuple[datetime, datetime, int]]:
    return sorted((r.start, r.end, r.count) for r in rows)


@pytest.mark.parametrize("store", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_the_bounded_reads_answer_as_every_row_does(
    store: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if store == "sqlite":
        url = f"sqlite:///{tmp_path / 'hyperplan.db'}"
    else:
        url = request.getfixturevalue("postgres_server").new_database()
    db, filler = _store(url)
    try:
        filler.history(years=2, plans_count=120)
        filler.live()
        # Others' bookings of the type after the window: beyond its reach by the longest segment's
        # length, they bound nothing, and a read's range of ends must not leave out what it needs.
        crowd(filler, around=30, ahead=40)
        with db.read() as session:
            rows = _every_held_row(session)
            in_pool = _overlapping([r for r in rows if r.pool == POOL], WINDOW.low, WINDOW.high)
            mine = [r for r in rows if r.account == BUYER]
            typed = _overlapping([r for r in mine if r.pool[0] == POOL[0]], WINDOW.low, WINDOW.high)
            every = _overlapping(mine, WINDOW.account_low, WINDOW.account_high)
            assert in_pool and typed and len(every) > len(typed)  # the window holds something to find
            assert sorted(
                quotas._account_intervals(session, BUYER, POOL[0], WINDOW.low, WINDOW.high)
            ) == _as_intervals(typed)
            assert sorted(
                quotas._account_intervals(session, BUYER, None, WINDOW.account_low, WINDOW.account_high)
            ) == _as_intervals(every)
            assert sorted((s, e, n) for _, s, e, n in held(session, POOL, WINDOW.low, WINDOW.high)) == (
                _as_intervals(in_pool)
            )
            assert sorted((k, s, e, n) for k, s, e, n in held(session, ending_after=NOW)) == sorted(
                (r.pool, r.start, r.end, r.count) for r in rows if r.end > NOW and r.end > r.start
            )
        with db.engine.connect() as connection:
            found = purchase_reads.read_holdings(connection, WINDOW, every_type=True)
        assert sorted((s, e, n) for *_, s, e, n in found.pools) == [
            (_micros(r.start), _micros(r.end), r.count) for r in sorted(in_pool, key=_key)
        ]
        assert sorted((s, e, n) for *_, s, e, n in found.account) == _as_intervals(every)
    finally:
        db.close()


def _key(row: Row) -> tuple[datetime, datetime, int]:
    return (row.start, row.end, row.count)


def _micros(at: datetime) -> int:
    return round((at - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


# -- PostgreSQL: the rows examined, as history grows tenfold ------------------------------------------


def _examined(plan: dict[str, Any]) -> int:
    """The rows a plan's nodes on the history tables read: those they returned and those their filters
    removed, over every loop."""
    total = 0
    if plan.get("Relation Name") in HISTORY_TABLES:
        read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        read += plan.get("Rows Removed by Index Recheck", 0)
        total += read * plan.get("Actual Loops", 1)
    for child in plan.get("Plans", []):
        total += _examined(child)
    return total


def _postgres_examined(db: Database, read: str, plan_mode: str) -> list[int]:
    """The rows each of `read`'s statements examines, planned as `plan_mode` says: `custom` (for its
    values, as an unprepared statement is) or `generic` (for any values, as PostgreSQL may plan a
    statement psycopg prepared once it ran five times)."""
    with statements_of(db) as sent:
        READS[read](db)
    examined = []
    with db.engine.connect() as connection:
        cursor: Any = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute(f"SET plan_cache_mode = force_{plan_mode}_plan")
        for number, (sql, params) in enumerate(sent):
            sql, values = _numbered(sql, params)
            types = ", ".join("int8" if isinstance(v, int) else "text" for v in values)
            cursor.execute(f"PREPARE read_{number} ({types}) AS {sql}")
            arguments = sql_text.SQL(", ").join(sql_text.Literal(value) for value in values)
            cursor.execute(
                sql_text.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {} ({})").format(
                    sql_text.Identifier(f"read_{number}"), arguments
                )
            )
            (found,) = cursor.fetchone()
            document = found if isinstance(found, list) else json.loads(found)
            examined.append(_examined(document[0]["Plan"]))
        cursor.execute("DEALLOCATE ALL")  # the connection goes back to the pool, to be asked again
        connection.rollback()
    return examined


def _numbered(sql: str, params: Any) -> tuple[str, list[Any]]:
    """A statement as the driver got it (SQLAlchemy's, with psycopg's %(name)s; a prepared one's,
    store/prepared.py, already with $1, $2, ...) with PostgreSQL's $1, $2, ... and its values in their
    order, for PREPARE."""
    if isinstance(params, dict):
        names: list[str] = []

        def number(found: re.Match[str]) -> str:
            if found[1] not in names:
                names.append(found[1])
            return f"${names.index(found[1]) + 1}"

        return re.sub(r"%\((\w+)\)s", number, sql), [params[name] for name in names]
    count = iter(range(1, len(params) + 1))
    return re.sub(r"%s", lambda _: f"${next(count)}", sql), list(params)


def _reach(db: Database) -> int:
    """The rows any of the reads may need: what holds capacity after the furthest-back bound a read
    states (the instance-hours quota's span, 30 days before the window), with each one's plan."""
    with db.read() as session:
        reach = [r for r in _every_held_row(session) if r.end > WINDOW.account_low]
    return 2 * len(reach)


@pytest.mark.postgres
@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
@pytest.mark.parametrize("read", sorted(READS))
def test_postgres_reads_examine_the_rows_in_reach_whatever_the_history(
    read: str, plan_mode: str, postgres_server: PostgresServer
) -> None:
    db, filler = _store(postgres_server.new_database())
    try:
        filler.history(years=1, plans_count=200)
        filler.live()
        reach = _reach(db)
        # Ten times the past, all of it out of every read's reach (it ended before the quota's span).
        filler.history(years=4, plans_count=2000, until=WINDOW.account_low - timedelta(days=1))
        assert _reach(db) == reach
        examined = _postgres_examined(db, read, plan_mode)
        # Each statement examines what is in reach, each row at most twice (by an index, then its
        # plan), and a few more for the counts: none of the 2,000 plans and segments out of reach.
        assert examined and max(examined) <= 2 * reach + 20, (examined, reach)
    finally:
        db.close()


@pytest.mark.postgres
@pytest.mark.parametrize("plan_mode", ["custom", "generic"])
@pytest.mark.parametrize("read", ["purchase", "quotas"])
def test_postgres_purchase_reads_stay_flat_beside_a_busy_type_and_a_long_past(
    read: str, plan_mode: str, postgres_server: PostgresServer
) -> None:
    """An account with years of expired plans, in a store where many other accounts book its type:
    ten times their past, and months of others' bookings after the window, add nothing to what the
    purchase's reads and the quotas' examine. (Before: a custom plan scanned every plan of the store
    to keep the account's, its past and the others'; a generic one read every segment of the type
    booked after the window's start.)"""
    db, filler = _store(postgres_server.new_database())
    try:
        filler.history(years=1, plans_count=200)
        filler.live()
        crowd(filler, around=60, past=200)
        reach = _reach(db)
        before = _postgres_examined(db, read, plan_mode)
        past_end = WINDOW.account_low - timedelta(days=1)
        filler.history(years=4, plans_count=2000, until=past_end)
        crowd(filler, past=2000, until=past_end, ahead=2000)
        after = _postgres_examined(db, read, plan_mode)
        assert max(after) <= 2 * reach + 20, (after, reach)
        # Each examines what it did before (a few rows of slack: a plan may read a bitmap's page where
        # it read an index).
        assert all(a <= b + 20 for a, b in zip(after, before, strict=True)), (before, after)
    finally:
        db.close()
