"""Costs against history (issue 55): stores with a year of bookings at 1x, 10x and 100x the demo, on
SQLite and on PostgreSQL, and what a request costs on each: whether the figures stay flat as the
history grows.

For each store and size (bench/history_build.py builds the history, bench/history_fleet.py the fleet):
in-process search p99 (the live calendar as loaded from the store); a purchase's statements and what its
refusal check's reads cost the database (its reads run again alone: on PostgreSQL under EXPLAIN ANALYZE,
with the rows they read); a server's start-up (process start to the first healthy answer) and RSS;
HTTP search and purchase throughput and p99 with 8 client processes (bench/loadgen.py, as the `http`
section); ListTrainingPlans of the lister's plans (first and last page, signed) and the console's plans
list (signed in with a session); and the lifecycle loop's lag p99 with 10,000 timed events due within
one minute of real time, on the same store (a server with the wall clock; plans of seconds written in
bulk beside the history, as bench/timed_store.py writes them through purchases).

A store's sizes are built first, then measured in turns (`_turns`): each round runs every size's share
of the in-process searches, then of the HTTP phases (a server per size running), so that the host's
drift during a section, which is larger than most growth with history, falls on every size alike. The
purchases' statement costs and the lag stay one size after another.

With 100x among the sizes, a control is measured in the same turns: the 100x fleet holding only the
100x history's live plans (those in the window ahead), without its past (`control_spec`). The 100x
fleet does more work than the demo's whatever its past (40 pools, a quarter of its window ahead booked,
against under 1% at 1x and 10x), so a figure's growth from 1x is that work and its history together; its
ratio to the control is what the history alone costs.

Each figure is printed beside its ratio to the size below and to 1x; the 100x figures beside the
issue's targets, and beside the control. Nothing is asserted: the bench prints.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx
from sqlalchemy import create_engine, event, make_url, select, text

from bench import history_slurm, mix
from bench.fill import Booking, window_start
from bench.history_build import (
    History,
    HistorySpec,
    PlacedPlan,
    Segment,
    build,
    finish_bulk,
    write_plans,
)
from bench.history_fleet import fleet_file
from bench.loadgen import CREATE, SEARCH, Client, ClientJob, run_phase
from bench.report import Figure, Report, heading, line, percentile
from bench.scale import Scale
from bench.server import (
    ServerProcess,
    cpu_seconds,
    memory_kib,
    offering_for,
    open_application,
    running_server,
    section_postgres,
)
from hyperplan.core.status_rows import (
    RECLAIM_REMINDER,
    SEGMENT_END,
    SEGMENT_RECLAIM,
    SEGMENT_START,
    START_REMINDER,
)
from hyperplan.errors import HyperplanError
from hyperplan.services.accounts.accounts import Caller, NewKey
from hyperplan.services.plans import plans
from hyperplan.store.schema import ScheduledEvent

SPECS = {
    1: HistorySpec(plans=500, accounts=10, lister_plans=5_000),
    10: HistorySpec(plans=5_000, accounts=100, lister_plans=5_000),
    100: HistorySpec(plans=50_000, accounts=1_000, lister_plans=5_000),
}
SMOKE_SPEC = HistorySpec(plans=40, accounts=3, lister_plans=30)
CONTROL_OF = 100  # the size measured beside a control of its live plans alone
CONTROL = "control"  # its key among the databases
PAGE = 100  # ListTrainingPlans' MaxResults
T = TypeVar("T")

# The targets at 100x: (comparison, limit); each figure also within 1.5x of its 1x value.
TARGETS: dict[str, tuple[str, float]] = {
    "search p99, in-process (ms)": ("<=", 7.5),
    "HTTP search p99 (ms)": ("<=", 50.0),
    "HTTP purchase p99 (ms)": ("<=", 100.0),
    "lifecycle lag p99 (ms)": ("<=", 1000.0),
    "ListTrainingPlans, first page (ms)": ("<=", 300.0),
    "ListTrainingPlans, last page (ms)": ("<=", 300.0),
    "console plans list (ms)": ("<=", 300.0),
    "start-up to healthy (s)": ("<=", 10.0),
    "RSS after the load (MiB)": ("<=", 1024.0),
}
WITHIN = 1.5  # of the 1x figure
LAG_WRITE_SECONDS_PER_PLAN = 0.005  # a generous estimate of writing a lag plan in bulk, index upkeep included
LAG_START_REMINDER = timedelta(seconds=2)  # a lag plan's first event: its start reminder, before its start


@dataclass(frozen=True)
class Sizes:
    multiples: tuple[int, ...]
    clients: int
    seconds: float  # per HTTP phase
    searches: int  # in-process
    purchases: int  # in-process, for the statement costs
    offerings: int  # per client, in the HTTP purchase phase
    lag_plans: int  # 5 timed events each
    lag_spread: int  # seconds over which their starts are spread
    lag_length: int  # seconds each plan lasts
    pages: int  # repeats of each list request, in each round
    rounds: int  # of the timed figures of every size in turns (searches, offerings and seconds are shared)

    @staticmethod
    def of(scale: Scale) -> Sizes:
        if scale is Scale.SMOKE:
            return Sizes((1,), 2, 0.5, 30, 3, 3, 10, 2, 3, 2, 1)
        lag = (2_000, 50, 8)  # 10,000 events, all due within one minute
        if scale is Scale.QUICK:
            return Sizes((1, 10), 8, 3, 300, 20, 21, *lag, 1, 3)
        return Sizes((1, 10, 100), 8, 10, 2_000, 50, 60, *lag, 2, 4)  # four in turns: the control too


def control_spec(spec: HistorySpec) -> HistorySpec:
    """`spec`'s live plans alone: as many plans as it has in the window ahead, all of them there, over
    as many accounts: the same fleet's work without its history. The lister keeps its expired plans,
    which its lists read: beside them, the store holds nothing else of the past."""
    return replace(spec, plans=round(spec.plans * spec.live_share), live_share=1.0)


@dataclass
class Figures:
    """One store's figures, per size: name -> value (nan: not measured); `control`: those of the
    control (`control_spec` of CONTROL_OF), when measured."""

    store: str
    by_size: dict[int, dict[str, float]] = field(default_factory=dict)
    notes: dict[int, list[str]] = field(default_factory=dict)
    control: dict[str, float] = field(default_factory=dict)


def run(report: Report, workdir: Path, *, scale: Scale) -> None:
    heading("History: costs against a year of bookings at 1x, 10x and 100x (SQLite, PostgreSQL)")
    sizes = Sizes.of(scale)
    sqlite = Figures("SQLite")
    _measure_store(sqlite, workdir, scale, sizes, {m: None for m in [*sizes.multiples, CONTROL]})
    _print_table(report, sqlite, sizes)
    # The Slurm reconciler at 200 and 2,000 nodes, from recorded sinfo/scontrol output (this machine
    # cannot run 2,000 slurmd): its own table, beside the stores' history.
    history_slurm.run(report, workdir, scale=scale)
    cluster = section_postgres(workdir, scale)
    if cluster is None:
        return
    url, stop_postgres = cluster
    try:
        postgres = Figures("PostgreSQL")
        databases: dict[int | str, str | None] = {
            m: _new_database(url, f"history_{m}x") for m in sizes.multiples
        }
        databases[CONTROL] = _new_database(url, "history_control")
        _measure_store(postgres, workdir, scale, sizes, databases)
        _print_table(report, postgres, sizes)
    finally:
        stop_postgres()


def _new_database(url: str, name: str) -> str:
    """A new, empty database on the development cluster of ``url``; its URL."""
    engine = create_engine(
        url.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
    )
    try:
        with engine.connect() as connection:
            connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
            connection.execute(text(f"CREATE DATABASE {name}"))
    finally:
        engine.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


# -- one size of one store ---------------------------------------------------------------------------


@dataclass
class _Size:
    """One size of one store while it is measured: its history, fleet file and server options, and the
    figures taken so far."""

    multiple: int
    history: History
    fleet_path: Path
    extra: tuple[str, ...]
    values: dict[str, float]
    control: bool = False  # the control of CONTROL_OF (control_spec), not a size of its own

    @property
    def name(self) -> str:
        return f"{self.multiple}x control" if self.control else f"{self.multiple}x"


def _measure_store(
    figures: Figures, workdir: Path, scale: Scale, sizes: Sizes, databases: Mapping[int | str, str | None]
) -> None:
    """Every size of one store: built one after another, then measured in turns (`_turns`), so that
    a host that slows down during the section slows every size alike; the lifecycle lag (a minute of
    real time each) last, one size after another."""
    built: list[_Size] = []
    try:
        for multiple in sizes.multiples:
            built.append(_build(figures, workdir, multiple, scale, sizes, databases[multiple]))
            figures.by_size[multiple] = built[-1].values
        if CONTROL_OF in sizes.multiples and scale is not Scale.SMOKE:
            built.append(_build(figures, workdir, CONTROL_OF, scale, sizes, databases[CONTROL], control=True))
            figures.control = built[-1].values
        _in_process_in_turns(built, sizes)
        for size in built:
            if not size.control:
                size.values.update(_purchase_costs(size.history, sizes))
    finally:
        for size in built:
            size.history.close()
    with ExitStack() as servers:
        started = []
        for size in built:
            began = time.monotonic()
            server = servers.enter_context(
                running_server(size.history.data_dir, fleet=size.fleet_path, extra=size.extra, timeout=600)
            )
            size.values["start-up to healthy (s)"] = time.monotonic() - began
            started.append((size, server))
        _over_http_in_turns(started, sizes)
        for size, server in started:
            size.values["RSS after the load (MiB)"] = memory_kib(server.pid)["VmRSS"] / 1024
    for size in built:
        if not size.control:
            size.values["lifecycle lag p99 (ms)"] = _lag(
                size.history, size.fleet_path, size.extra, sizes, size.values["start-up to healthy (s)"]
            )
        line(f"{figures.store} {size.name}: " + "; ".join(f"{k} {_shown(v)}" for k, v in size.values.items()))


def _build(
    figures: Figures,
    workdir: Path,
    multiple: int,
    scale: Scale,
    sizes: Sizes,
    database_url: str | None,
    *,
    control: bool = False,
) -> _Size:
    spec = SMOKE_SPEC if scale is Scale.SMOKE else SPECS[multiple]
    spec = control_spec(spec) if control else spec
    kind = "pg" if database_url else "sqlite"
    fleet_path = fleet_file(multiple, workdir)
    name = f"{multiple}x control" if control else f"{multiple}x"
    line(
        f"{figures.store} {name}: building {spec.plans:,} plans over {spec.accounts:,} accounts, "
        f"and the lister's {spec.lister_plans:,}" + (", the others ahead" if control else "")
    )
    directory = workdir / (f"history-{kind}-{multiple}x" + ("-control" if control else ""))
    history = build(directory, fleet_path, spec, database_url)
    _describe(history, fleet_path)
    extra = ("--database-url", database_url) if database_url else ()
    return _Size(multiple, history, fleet_path, extra, {}, control)


def _turns(built: list[T], rounds: int) -> Iterator[tuple[int, T]]:
    """(round, size) for `rounds` rounds over the sizes, each round starting one size further on, so
    that no size is always measured first or last."""
    for round_number in range(rounds):
        shift = round_number % len(built)
        for size in built[shift:] + built[:shift]:
            yield round_number, size


def _describe(history: History, fleet_path: Path) -> None:
    fleet = history.fleet
    nodes = sum(pool.instance_count for pool in fleet.pools)
    zones = len({pool.availability_zone for pool in fleet.pools})
    rows = ", ".join(f"{name} {count:,}" for name, count in history.rows.items())
    line(
        f"  fleet {fleet_path.name}: {len(fleet.pools)} pools, {nodes:,} nodes, {zones} zones; built in "
        f"{history.build_seconds:.1f} s: {history.plans:,} plans, {history.segments:,} segments "
        f"({history.missed} plans found no room), {history.booked:.1%} of the 120-day window ahead booked"
    )
    line(f"  rows: {rows}")
    heaviest = history.plans_of[:3]
    line(f"  plans of the heaviest accounts (the load clients'): {heaviest}...")


def _shown(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.2f}"


# -- in-process: search, and a purchase's statements -------------------------------------------------


def _in_process_in_turns(built: list[_Size], sizes: Sizes) -> None:
    """In-process search p99 of every size: `sizes.searches` each, in `sizes.rounds` turns."""
    samples: dict[str, list[float]] = {size.name: [] for size in built}
    requests = {size.name: _search_requests(size.history, sizes.searches) for size in built}
    share = math.ceil(sizes.searches / sizes.rounds)
    for round_number, size in _turns(built, sizes.rounds):
        mine = requests[size.name][round_number * share : (round_number + 1) * share]
        samples[size.name] += _searches_timed(size.history, mine)
    for size in built:
        size.values["search p99, in-process (ms)"] = percentile(samples[size.name], 99) * 1000


def _search_requests(history: History, count: int) -> list[Any]:
    context = mix.MixContext.of(history.fleet, history.runtime.clock.now())
    rng = random.Random(11)
    return [mix.search_request(rng, context) for _ in range(count)]


def _searches_timed(history: History, requests: list[Any]) -> list[float]:
    """Seconds each search took, after the first 20 searched again untimed (a warm-up: the sizes take
    turns, and each turn's first searches find another size's objects in the caches)."""
    now = history.runtime.clock.now()
    for request in requests[:20]:
        _search_once(history, request, now)
    return [_search_once(history, request, now) for request in requests]


def _search_once(history: History, request: Any, now: datetime) -> float:
    began = time.perf_counter()
    with suppress(HyperplanError):  # a refused search is timed as any other
        history.runtime.calendar.search(request, now)
    return time.perf_counter() - began


Statement = tuple[str, Any]


@contextmanager
def _statements(history: History) -> Iterator[list[Statement]]:
    """Every statement the store's engine runs inside the block, with its parameters as the driver got
    them (store/prepared.py announces its own to the same listeners)."""
    seen: list[Statement] = []

    def note(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        if not many:
            seen.append((statement, parameters))

    engine = history.runtime.db.engine
    event.listen(engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", note)


def _is_refusal_read(statement: str) -> bool:
    """A read of the refusal check: the account's facts and the holdings (plans and segments)."""
    head = statement.lstrip().upper()
    reads = head.startswith(("SELECT", "WITH"))
    return reads and ("reserved_capacities" in statement or "training_plans" in statement)


def _purchase_costs(history: History, sizes: Sizes) -> dict[str, float]:
    """Purchases by the heaviest account (its plans are those the refusal check visits), in-process:
    statements per purchase and their wall time; then each refusal read run again alone, timed (on
    PostgreSQL under EXPLAIN ANALYZE: the database's execution time and the rows its plan nodes read)."""
    runtime, key = history.runtime, history.keys[0]
    caller = Caller(key.account_id, key.account_name, False, key.access_key_id)
    bookings = _free_bookings(history, sizes.purchases)
    statements: list[int] = []
    walls: list[float] = []
    reads: list[Statement] = []
    for number, booking in enumerate(bookings):
        offering = offering_for(runtime, caller, booking, 10_000 + number)
        with _statements(history) as seen:
            began = time.perf_counter()
            plans.create(runtime, caller, f"costs-{number}", offering)
            walls.append(time.perf_counter() - began)
        statements.append(len(seen))
        reads += [(sql, params) for sql, params in seen if _is_refusal_read(sql)]
    db_ms, rows = _rerun(history, reads)
    per = max(len(bookings), 1)
    line(
        f"  purchases in-process by the heaviest account ({history.plans_of[0]:,} plans): {len(bookings)}, "
        f"{statistics.mean(statements or [0]):.1f} statements each, "
        f"wall p50 {percentile(walls, 50) * 1000:.2f} ms; "
        f"refusal reads {len(reads) / per:.1f} a purchase: {db_ms / per:.3f} ms of the database"
        + ("" if math.isnan(rows) else f", {rows / per:,.0f} rows read")
    )
    return {
        "purchase statements": statistics.mean(statements or [math.nan]),
        "purchase wall p50, in-process (ms)": percentile(walls, 50) * 1000,
        "refusal reads, DB time per purchase (ms)": db_ms / per,
        "refusal reads, rows per purchase (PostgreSQL)": rows / per,
    }


def _free_bookings(history: History, count: int) -> list[Booking]:
    """One-instance, one-day bookings with room, spread over the window ahead."""
    fleet, calendar = history.fleet, history.runtime.calendar
    start = window_start(fleet, history.runtime.clock.now())
    found: list[Booking] = []
    rng = random.Random(3)
    pools = [i for i, pool in enumerate(fleet.pools) if pool.reservable > 0]
    while len(found) < count:
        index = rng.choice(pools)
        first = start + timedelta(days=rng.randrange(100))
        if calendar.can_book(fleet.pools[index].key, first, first + timedelta(days=1), 1):
            found.append(Booking(index, first, first + timedelta(days=1), 1))
    return found


def _rerun(history: History, reads: list[Statement]) -> tuple[float, float]:
    """The reads run again, alone, in a transaction rolled back: (milliseconds in all, rows in all; nan
    on SQLite, which does not count them)."""
    engine = history.runtime.db.engine
    postgres = engine.dialect.name == "postgresql"
    total_ms, total_rows = 0.0, 0.0
    with engine.connect() as connection:
        driver: Any = connection.connection.dbapi_connection
        assert driver is not None
        cursor = driver.cursor()
        try:
            for sql, params in reads:
                if postgres:
                    # A prepared statement's SQL has PostgreSQL's own $1, $2 (store/prepared.py): psycopg's
                    # raw cursor sends it as it is; SQLAlchemy's own has %(name)s, for the ordinary one.
                    from psycopg import RawCursor

                    raw = isinstance(params, tuple | list)
                    explain = RawCursor(driver) if raw else cursor
                    explain.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
                    [plan] = explain.fetchone()[0]  # EXPLAIN returns its one row
                    total_ms += float(plan["Execution Time"])
                    total_rows += _rows_read(plan["Plan"])
                else:
                    began = time.perf_counter()
                    cursor.execute(sql, params)
                    cursor.fetchall()
                    total_ms += (time.perf_counter() - began) * 1000
        finally:
            cursor.close()
            driver.rollback()
    return total_ms, (total_rows if postgres else math.nan)


def _rows_read(node: dict[str, Any]) -> float:
    """Rows the scans of a plan read (actual rows x loops of each scan node, and those its filters
    removed)."""
    own = 0.0
    if "Scan" in node.get("Node Type", ""):
        loops = node.get("Actual Loops", 1)
        own = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


# -- over HTTP ---------------------------------------------------------------------------------------


def _endpoint(history: History, server: ServerProcess, key: NewKey) -> Any:
    return server.endpoint(key, history.fleet.region)


@dataclass
class _Taken:
    """One size's HTTP samples over its turns."""

    first_page: list[float] = field(default_factory=list)
    last_page: list[float] = field(default_factory=list)
    console: list[float] = field(default_factory=list)
    search: list[float] = field(default_factory=list)
    searched: int = 0
    searching: float = 0.0  # seconds of the search phases
    purchase: list[float] = field(default_factory=list)
    bought: int = 0
    buying: float = 0.0
    failed: int = 0
    last_token: str | None = None
    pages: int = 0


def _over_http_in_turns(started: list[tuple[_Size, ServerProcess]], sizes: Sizes) -> None:
    """The lists, then the search phase, then the buy phase of each size, the sizes in turns over
    `sizes.rounds` rounds (each phase a round's share of the seconds and offerings); the figures of
    all rounds together."""
    taken = {size.name: _Taken() for size, _ in started}
    for round_number, (size, server) in _turns(started, sizes.rounds):
        mine = taken[size.name]
        _lists(size.history, server, sizes, mine)
        _http(size.history, server, sizes, mine, f"r{round_number}")
    for size, _ in started:
        mine = taken[size.name]
        got = {
            "ListTrainingPlans, first page (ms)": statistics.median(mine.first_page),
            "ListTrainingPlans, last page (ms)": statistics.median(mine.last_page),
            "console plans list (ms)": statistics.median(mine.console),
            "HTTP searches/s": mine.searched / mine.searching,
            "HTTP search p99 (ms)": percentile(mine.search, 99) * 1000,
            "HTTP purchases/s": mine.bought / mine.buying,
            "HTTP purchase p99 (ms)": percentile(mine.purchase, 99) * 1000,
        }
        size.values.update(got)
        pages, tries = f"{mine.pages} pages of {PAGE}", len(mine.console)
        line(
            f"  {size.name} over {sizes.rounds} turns: lists of the lister ({pages}): first page "
            f"{got['ListTrainingPlans, first page (ms)']:.1f} ms, last page "
            f"{got['ListTrainingPlans, last page (ms)']:.1f} ms, console "
            f"{got['console plans list (ms)']:.1f} ms (medians of {tries}); HTTP, {sizes.clients} "
            f"clients: searches {got['HTTP searches/s']:,.0f}/s, p99 {got['HTTP search p99 (ms)']:.1f} "
            f"ms; purchases (buy only) {got['HTTP purchases/s']:,.0f}/s ({mine.bought:,} completed), p99 "
            f"{got['HTTP purchase p99 (ms)']:.1f} ms"
            + (f"; !! {mine.failed} calls failed unexpectedly" if mine.failed else "")
        )


def _http(history: History, server: ServerProcess, sizes: Sizes, taken: _Taken, round_tag: str) -> None:
    """One round's search phase, then its buy phase (8 client processes each); `round_tag` names the
    round's plans apart from the other rounds'."""
    context = mix.MixContext.of(history.fleet, history.runtime.clock.now())
    clients = min(sizes.clients, len(history.keys))
    seconds = sizes.seconds / sizes.rounds
    searching = [
        ClientJob(
            "search", i, _endpoint(history, server, history.keys[i]), context, seconds, tag=f"hs{round_tag}"
        )
        for i in range(clients)
    ]
    searched = run_phase(searching, server_cpu=lambda: cpu_seconds(server.pid))
    buying = [
        ClientJob(
            "buy",
            i,
            _endpoint(history, server, history.keys[i]),
            context,
            seconds,
            offerings=max(1, sizes.offerings // sizes.rounds),
            tag=f"hb{round_tag}",
        )
        for i in range(clients)
    ]
    bought = run_phase(buying, server_cpu=lambda: cpu_seconds(server.pid))
    taken.failed += searched.failed(SEARCH) + bought.failed(CREATE)
    taken.search += searched.latencies.get(SEARCH, [])
    taken.searched += searched.completed(SEARCH)
    taken.searching += searched.wall
    taken.purchase += bought.latencies.get(CREATE, [])
    taken.bought += bought.completed(CREATE)
    taken.buying += bought.wall


def _lists(history: History, server: ServerProcess, sizes: Sizes, taken: _Taken) -> None:
    """ListTrainingPlans of the lister's plans, signed: its first page, and its last (its token found
    by walking the pages once); then the console's plans list, signed in with the lister's key."""
    client = Client(_endpoint(history, server, history.lister))
    try:
        taken.first_page += _timed_calls(client, {"MaxResults": PAGE}, sizes.pages)
        if not taken.pages:
            taken.last_token, taken.pages = _last_page_token(client)
        last = {"MaxResults": PAGE, **({"NextToken": taken.last_token} if taken.last_token else {})}
        taken.last_page += _timed_calls(client, last, sizes.pages)
    finally:
        client.close()
    taken.console += _console_list(history, server, sizes.pages)


def _last_page_token(client: Client) -> tuple[str | None, int]:
    """The token that reaches the lister's last page (None: one page), and how many pages there are."""
    token, last_token, pages = None, None, 0
    while True:
        outcome, found = client.call(
            "ListTrainingPlans", {"MaxResults": PAGE, **({"NextToken": token} if token else {})}
        )
        if outcome != "ok":
            raise RuntimeError(f"ListTrainingPlans: {outcome}")
        pages += 1
        if "NextToken" not in found:
            return last_token, pages
        last_token, token = token, found["NextToken"]


def _timed_calls(client: Client, payload: dict[str, Any], repeats: int) -> list[float]:
    """Milliseconds each of ``repeats`` calls took (each signed before it is timed)."""
    took = []
    for _ in range(repeats):
        prepared = client.prepare("ListTrainingPlans", payload)
        began = time.perf_counter()
        outcome, _ = client.send(prepared)
        took.append((time.perf_counter() - began) * 1000)
        if outcome != "ok":
            raise RuntimeError(f"ListTrainingPlans: {outcome}")
    return took


def _console_list(history: History, server: ServerProcess, repeats: int) -> list[float]:
    """GET /console/plans, signed in as a browser is (the sign-in form, its CSRF token, the cookie):
    milliseconds each of ``repeats`` took."""
    with httpx.Client(
        base_url=f"http://127.0.0.1:{server.port}", follow_redirects=False, timeout=120
    ) as http:
        form = http.get("/console/sign-in").text
        token = form.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        key = history.lister
        fields = {
            "access_key_id": key.access_key_id,
            "secret_access_key": key.secret_access_key,
            "csrf_token": token,
        }
        signed_in = http.post("/console/sign-in", data=fields)
        if signed_in.status_code >= 400:
            raise RuntimeError(f"console sign-in: HTTP {signed_in.status_code}")
        took = []
        for _ in range(repeats):
            began = time.perf_counter()
            page = http.get("/console/plans")
            took.append((time.perf_counter() - began) * 1000)
            if page.status_code != 200:
                raise RuntimeError(f"console plans list: HTTP {page.status_code}")
    return took


# -- the lifecycle loop's lag -------------------------------------------------------------------------


def _lag(
    history: History, fleet_path: Path, extra: tuple[str, ...], sizes: Sizes, start_seconds: float
) -> float:
    """Plans of seconds written beside the history (their five timed events each, all due within a
    minute of real time), then a server with the wall clock on the store: the p99 of ran_at - due_at
    over their events.

    The due times are fixed once the store is open, after its (slow) opening, with room for writing the
    plans and for the server's start: none should fall due before the server answers, so that the loop
    starts on time and the figure is the loop's, not its start-up's. Any that did are counted and
    printed, and left out (as bench/lifecycle.py does); they may still delay those after them."""
    reopened = open_application(history.data_dir, fleet_path, _url_of(extra))
    try:
        runtime = reopened.context
        setup = LAG_WRITE_SECONDS_PER_PLAN * sizes.lag_plans + start_seconds * 1.5 + 10
        base = datetime.fromtimestamp(math.ceil(time.time() + setup), UTC)
        placed = _lag_plans(history, sizes, base)
        write_plans(runtime, placed, [*history.keys, history.lister], datetime.now(UTC))
        finish_bulk(runtime)
        url = runtime.db.url
    finally:
        reopened.stop()
    first_due = base - LAG_START_REMINDER
    last_due = base + timedelta(seconds=sizes.lag_spread + sizes.lag_length)
    with running_server(history.data_dir, fleet=fleet_path, clock="wall", extra=extra, timeout=600):
        serving = time.time()
        _wait_drained(url, first_due, last_due)
    lags, early = _lags(url, first_due, last_due, serving)
    if early:
        line(f"  !! {early:,} lag events fell due before the server answered; left out")
    ahead = first_due.timestamp() - serving
    line(
        f"  lifecycle lag: {len(placed):,} plans, {len(lags):,} of {len(placed) * 5:,} events timed "
        f"(due within {sizes.lag_spread + sizes.lag_length} s, the first {ahead:+.1f} s after the server "
        f"answered), p50 {percentile(lags, 50):.0f} / p99 {percentile(lags, 99):.0f} ms"
    )
    return percentile(lags, 99)


def _url_of(extra: tuple[str, ...]) -> str | None:
    return extra[1] if extra else None


def _lag_plans(history: History, sizes: Sizes, base: datetime) -> list[PlacedPlan]:
    pools = [i for i, pool in enumerate(history.fleet.pools) if pool.reservable > 0]
    placed = []
    second = timedelta(seconds=1)
    for i in range(sizes.lag_plans):
        start = base + timedelta(seconds=i * sizes.lag_spread / sizes.lag_plans)
        end = start + sizes.lag_length * second
        reclaim = end - 2 * second
        timed = (
            (START_REMINDER, start - LAG_START_REMINDER, '{"segment": 1}'),
            (SEGMENT_START, start, '{"segment": 1}'),
            (
                RECLAIM_REMINDER,
                reclaim - 2 * second,
                f'{{"segment": 1, "reclaim_at": "{reclaim.isoformat()}"}}',
            ),
            (SEGMENT_RECLAIM, reclaim, '{"segment": 1}'),
            (SEGMENT_END, end, '{"segment": 1}'),
        )
        segment = Segment(pools[i % len(pools)], start, end, 1)
        placed.append(PlacedPlan(i % len(history.keys), (segment,), start - 60 * second, timed))
    return placed


def _events_engine(url: str) -> Any:
    return create_engine(url)


def _wait_drained(url: str, first_due: datetime, last_due: datetime) -> None:
    time.sleep(max(0.0, last_due.timestamp() - time.time()) + 0.2)
    engine = _events_engine(url)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with engine.connect() as connection:
                pending = connection.execute(
                    select(ScheduledEvent.id)
                    .where(
                        ScheduledEvent.done.is_(False),
                        ScheduledEvent.due_at >= first_due,
                        ScheduledEvent.due_at <= last_due,
                    )
                    .limit(1)
                ).first()
            if pending is None:
                return
            time.sleep(0.2)
        line("  !! lag events still pending 120 s after the last was due")
    finally:
        engine.dispose()


def _lags(url: str, first_due: datetime, last_due: datetime, serving: float) -> tuple[list[float], int]:
    """The lag (ms) of each lag event that ran and fell due once the server answered; and how many fell
    due before it answered (left out)."""
    engine = _events_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(ScheduledEvent.due_at, ScheduledEvent.ran_at).where(
                    ScheduledEvent.due_at >= first_due,
                    ScheduledEvent.due_at <= last_due,
                    ScheduledEvent.ran_at.is_not(None),
                )
            ).all()
    finally:
        engine.dispose()
    timed = [(ran - due).total_seconds() * 1000 for due, ran in rows if due.timestamp() >= serving]
    return timed, len(rows) - len(timed)


# -- the table ------------------------------------------------------------------------------------------


def _print_table(report: Report, figures: Figures, sizes: Sizes) -> None:
    multiples = [m for m in sizes.multiples if m in figures.by_size]
    if not multiples:
        return
    heading(f"History table, {figures.store}: each size beside its growth from the size below")
    line(
        f"HTTP figures with {sizes.clients} client processes, {sizes.seconds:g} s of searches and "
        f"{sizes.offerings} offerings a client, over {sizes.rounds} rounds in turns with the other sizes"
    )
    control = figures.control if multiples[-1] == CONTROL_OF else {}
    if control:
        line(
            f"control: the {CONTROL_OF}x fleet with the {CONTROL_OF}x history's live plans alone; "
            f"x of control: what the history itself adds at {CONTROL_OF}x"
        )
    names = list(figures.by_size[multiples[0]])
    width = max(len(name) for name in names) + 2
    header = "".join(f"{f'{m}x':>22}" for m in multiples)
    header += f"{'control':>12}{'x of control':>14}" if control else ""
    summary: list[tuple[str, tuple[str, float], float, float, float]] = []
    line(f"{'':<{width}}{header}   x of 1x    target at {multiples[-1]}x")
    for name in names:
        values = [figures.by_size[m].get(name, math.nan) for m in multiples]
        cells = [
            _with_growth(value, below) for value, below in zip(values, [math.nan, *values], strict=False)
        ]
        overall = _ratio(values[-1], values[0])
        of_control = _ratio(values[-1], control.get(name, math.nan))
        beside = f"{_shown(control.get(name, math.nan)):>12}{_shown(of_control):>14}" if control else ""
        target = TARGETS.get(name)
        shown_target = f"{target[0]} {target[1]:g}, within {WITHIN}x" if target else ""
        row = "".join(f"{cell:>22}" for cell in cells)
        line(f"{name:<{width}}{row}{beside}   {_shown(overall):>7}   {shown_target}")
        if target:
            summary.append((name, target, values[-1], overall, of_control))
    for name, target, largest, overall, of_control in summary:
        report.add(
            Figure(
                f"history {figures.store}: {name} at {multiples[-1]}x",
                _shown(largest),
                f"{target[0]} {target[1]:g}",
                _met(target, largest, overall, of_control),
                note=f"{_shown(overall)} x its 1x value"
                + ("" if math.isnan(of_control) else f", {_shown(of_control)} x the control")
                + f" (target within {WITHIN}x of 1x, or of the control where the fleet's own work grows)",
            )
        )


def _with_growth(value: float, below: float) -> str:
    """A table cell: the value, and its growth from the size below when both are known."""
    growth = _ratio(value, below)
    return f"{_shown(value):>12}" + (" " * 9 if math.isnan(growth) else f" ({growth:5.2f}x)")


def _met(target: tuple[str, float], largest: float, overall: float, of_control: float) -> bool | None:
    """Whether a figure at the largest size meets its target: its limit, and within WITHIN of its 1x
    value or, where the larger fleet's own work makes it grow, of the control's (None: not measured)."""
    if math.isnan(largest):
        return None
    within = math.isnan(overall) or overall <= WITHIN or (not math.isnan(of_control) and of_control <= WITHIN)
    return largest <= target[1] and within


def _ratio(value: float, base: float) -> float:
    """value / base; nan when either is missing or the base is 0."""
    if math.isnan(value) or math.isnan(base) or base == 0:
        return math.nan
    return value / base
