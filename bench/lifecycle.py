"""Lifecycle timing under the wall clock: how late timed transitions take effect, and how long a restart
takes to catch up on the events it missed.

Lag. A store holds plans whose timed events (start reminder, start, reclaim reminder, reclaim, end) all
fall due within the next minute or two of real time (see :mod:`bench.timed_store`), in two groups, one
after the other:

* spread: plans starting at every second of a stretch, a steady stream of events every second;
* burst: plans that all start at the same second, as every plan of a real fleet starts and ends on the
  11:30 UTC day boundary: each of their five events falls due for all of them at once.

``hyperplan serve --clock wall`` runs them. An event's lag is ``ran_at - due_at`` from
``scheduled_events``: the loop stamps ``ran_at`` with the clock's time just before it commits the event
and its effect, and under the wall clock that is the time the effect happened. A reader polling the
store from the bench process also notes when each event became visible (committed), to show what the
commit adds. Events due before the server answered its health check are left out (there should be none).

Catch-up. Another store, written before the lag phase, holds 1,000 events (200 in a quick run) that fall
due within seconds and are all in the past when a server first starts on it, as after an outage: the
server runs every missed event in order before it serves (``Application.start``), so the time from
starting the process to /healthz answering is the catch-up, next to the start of the lag server, which
had nothing to catch up on. The events' own ``ran_at`` stamps give the loop's rate.
"""

from __future__ import annotations

import cProfile
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import profiling
from bench.report import Figure, Report, heading, line, percentile
from bench.scale import Scale
from bench.server import running_server, unisolated
from bench.timed_store import (
    EVENTS_PER_PLAN,
    LIFECYCLE_FLEET,
    Group,
    RanEvent,
    TimedStore,
    copy_store,
    due_span,
    pending_events,
    ran_events,
    write_store,
)
from hyperplan.app import AppConfig, Application

TARGET_LAG_MS = 1000.0
POLL_SECONDS = 0.02  # how often the reader looks for newly committed events
DRAIN_TIMEOUT = 120.0  # seconds to wait, after the last due time, for the loop to finish
WRITE_SECONDS_PER_PLAN = 0.01  # a generous estimate, to time the plans after the store is ready
SERVER_START_SECONDS = 2.0


@dataclass(frozen=True)
class Sizes:
    spread: Group
    burst: Group
    missed: Group

    @staticmethod
    def of(scale: Scale) -> Sizes:
        if scale is Scale.SMOKE:  # a few seconds of each
            return Sizes(
                spread=Group("spread", 4, offset=2, spread=1, length=2),
                burst=Group("burst", 4, offset=3, spread=0, length=2),
                missed=Group("missed", 8, offset=3, spread=2, length=2),
            )
        if scale is Scale.QUICK:  # 10 s of lag, 3 s of catch-up; the groups' last and first events overlap
            return Sizes(
                spread=Group("spread", 20, offset=2, spread=2, length=3),
                burst=Group("burst", 20, offset=6, spread=0, length=3),
                missed=Group("missed", 40, offset=3, spread=4, length=3),
            )
        return Sizes(
            spread=Group("spread", 500, offset=2, spread=50, length=20),
            burst=Group("burst", 300, offset=76, spread=0, length=20),
            missed=Group("missed", 200, offset=3, spread=8, length=3),
        )


def run(report: Report, workdir: Path, *, scale: Scale, profile: bool) -> None:
    heading("Lifecycle timing: hyperplan serve --clock wall, timed events due within seconds")
    sizes = Sizes.of(scale)
    line(f"a durable commit on this disk alone (WAL, synchronous=FULL, one row): {_commit_ms(workdir)}")
    missed = write_store(workdir / "lifecycle-missed", (sizes.missed,))
    profile_dir = workdir / "lifecycle-missed-profile"
    if profile:
        copy_store(missed.data_dir, profile_dir)  # the same missed events, for an in-process run
    start_seconds = _lag(report, workdir / "lifecycle-lag", sizes)
    _catch_up(report, missed, start_seconds)
    if profile:
        _profile_catch_up(profile_dir)


# -- lag ---------------------------------------------------------------------------------------------


class Watcher:
    """Polls the store from a connection of its own, as any reader would, and notes when each event's
    run became visible (committed). ``ran_at`` grows in commit order: one loop runs events one by one."""

    def __init__(self, db_path: Path) -> None:
        self.seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(db_path,), name="watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self, db_path: Path) -> None:
        connection = sqlite3.connect(db_path, timeout=30)
        last = 0
        try:
            while not self._stop.is_set():
                query = "SELECT id, ran_at FROM scheduled_events WHERE ran_at > ?"
                rows = connection.execute(query, (last,)).fetchall()
                now = time.time()
                for event_id, ran_at in rows:
                    self.seen.setdefault(event_id, now)
                    last = max(last, ran_at)
                self._stop.wait(POLL_SECONDS)
        finally:
            connection.close()


def _lag(report: Report, data_dir: Path, sizes: Sizes) -> float:
    """Run the lag store on a wall-clock server; returns how long that server took to start."""
    groups = (sizes.spread, sizes.burst)
    plans = sum(group.plans for group in groups)
    store = write_store(data_dir, groups, setup_seconds=SERVER_START_SECONDS + plans * WRITE_SECONDS_PER_PLAN)
    line(
        f"lag store: {plans:,} plans bought in-process in {store.write_seconds:.1f} s, "
        f"{plans * EVENTS_PER_PLAN:,} timed events; {_describe(sizes.spread)}; {_describe(sizes.burst)}"
    )
    began = time.monotonic()
    with running_server(store.data_dir, fleet=LIFECYCLE_FLEET, clock="wall") as server:
        start_seconds = time.monotonic() - began
        serving = time.time()
        first_due = store.at(min(group.first_due for group in groups))
        line(
            f"server pid {server.pid} answered /healthz {start_seconds:.2f} s after it was started; "
            f"the first events fall due {first_due - serving:+.1f} s from then"
        )
        with Watcher(store.db_path) as watcher:
            _wait_drained(store)
    events = ran_events(store.db_path)
    for group in groups:
        _report_group(report, store, group, events, watcher.seen, serving)
    return start_seconds


def _describe(group: Group) -> str:
    if group.spread == 0:
        return f"{group.name}: {group.plans} plans of {group.length} s, all starting at the same second"
    return (
        f"{group.name}: {group.plans} plans of {group.length} s starting over {group.spread} s "
        f"({group.plans / group.spread:.0f} a second)"
    )


def _wait_drained(store: TimedStore) -> None:
    _sleep_until(store.last_due + 0.2)
    deadline = time.monotonic() + DRAIN_TIMEOUT
    while (pending := pending_events(store.db_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pending:
        line(f"!! {pending:,} events still pending {DRAIN_TIMEOUT:.0f} s after the last was due")


def _sleep_until(epoch: float) -> None:
    time.sleep(max(0.0, epoch - time.time()))


def _report_group(
    report: Report,
    store: TimedStore,
    group: Group,
    events: Sequence[RanEvent],
    seen: dict[int, float],
    serving: float,
) -> None:
    mine = [e for e in events if store.group_of.get(e.subject) == group.name]
    early = [e for e in mine if e.due < serving]
    timed = [e for e in mine if e.due >= serving]
    if early:
        line(f"!! {len(early):,} {group.name} events were due before the server answered; left out")
    lags = [(e.ran - e.due) * 1000 for e in timed]
    visible = [(seen[e.id] - e.due) * 1000 for e in timed if e.id in seen]
    line(f"{group.name}: {len(timed):,} events run of {group.plans * EVENTS_PER_PLAN:,} expected")
    _print_kinds(timed)
    if group.spread == 0:
        _print_instants(store, timed)
    p50, p99 = percentile(lags, 50), percentile(lags, 99)
    label = "lifecycle lag, burst at one instant" if group.spread == 0 else "lifecycle lag, spread over time"
    note = (
        f"{len(lags):,} events of {group.plans:,} plans, max {max(lags, default=float('nan')):.0f} ms; "
        f"committed and seen by a reader: p50 {percentile(visible, 50):.0f} / "
        f"p99 {percentile(visible, 99):.0f} ms (polled every {POLL_SECONDS * 1000:.0f} ms)"
    )
    value = f"p50 {p50:.0f} / p99 {p99:.0f} ms"
    report.add(Figure(label, value, f"p99 <= {TARGET_LAG_MS:g} ms", p99 <= TARGET_LAG_MS, note))


def _print_kinds(events: Sequence[RanEvent]) -> None:
    by_kind: dict[str, list[float]] = defaultdict(list)
    for event in events:
        by_kind[event.kind].append((event.ran - event.due) * 1000)
    for kind, lags in sorted(by_kind.items()):
        line(
            f"  {kind:<17} {len(lags):>5,}: lag p50 {percentile(lags, 50):6.0f} / p99 "
            f"{percentile(lags, 99):6.0f} / max {max(lags):6.0f} ms"
        )


def _print_instants(store: TimedStore, events: Sequence[RanEvent]) -> None:
    """For each second at which a burst falls due: how long until the last of its events had run."""
    by_due: dict[float, list[RanEvent]] = defaultdict(list)
    for event in events:
        by_due[event.due].append(event)
    for due, group in sorted(by_due.items()):
        last = max(e.ran for e in group) - due
        kinds = ", ".join(sorted({e.kind for e in group}))
        line(
            f"  due at +{due - store.base.timestamp():.0f} s: {len(group):,} events ({kinds}); the last ran "
            f"{last * 1000:.0f} ms late = {len(group) / last:,.0f} events/s"
        )


# -- catch-up ------------------------------------------------------------------------------------------


def _catch_up(report: Report, missed: TimedStore, start_seconds: float) -> None:
    pending = pending_events(missed.db_path)
    first, last = due_span(missed.db_path)
    _sleep_until(last + 0.2)
    line(
        f"catch-up store: {missed.plans:,} plans, {pending:,} pending events, due from "
        f"{time.time() - first:.0f} s to {time.time() - last:.1f} s ago; no server ran while they fell due"
    )
    began = time.monotonic()
    with running_server(missed.data_dir, fleet=LIFECYCLE_FLEET, clock="wall") as server:
        ready = time.monotonic() - began
        serving = time.time()
        line(f"server pid {server.pid} answered /healthz {ready:.2f} s after it was started")
    events = ran_events(missed.db_path)
    caught = [e for e in events if e.ran <= serving]
    span = max(e.ran for e in caught) - min(e.ran for e in caught) if caught else float("nan")
    rate = len(caught) / span if span else float("nan")
    line(
        f"{len(caught):,} of the {pending:,} missed events ran before /healthz answered, "
        f"over {span:.2f} s of ran_at = {rate:,.0f} events/s "
        f"({span / max(len(caught), 1) * 1000:.1f} ms each); {pending_events(missed.db_path):,} left pending"
    )
    note = (
        f"{len(caught):,} missed events; process start to /healthz, vs {start_seconds:.2f} s for the lag "
        f"server with nothing to catch up on"
    )
    report.add(Figure("restart catch-up of missed events", f"{ready:.2f} s, {rate:,.0f} events/s", note=note))


def _profile_catch_up(data_dir: Path) -> None:
    """The same catch-up in-process under cProfile, on a copy of the missed store taken before it ran."""
    application = Application(
        AppConfig(data_dir=data_dir, fleet_path=LIFECYCLE_FLEET, clock="wall", **unisolated(data_dir))
    )
    try:
        application.bootstrap()
        runtime = application.context
        runtime.calendar.load(runtime.db)
        profiler = cProfile.Profile()
        began = time.perf_counter()
        with profiler:
            ran = application.workers.events.run_due(runtime.clock.now())
        seconds = time.perf_counter() - began
    finally:
        application.stop()
    line(f"cProfile of the catch-up, in-process: {ran:,} events in {seconds:.2f} s under the profiler")
    profiling.print_summary(profiler)


# -- the disk --------------------------------------------------------------------------------------------


def _commit_ms(workdir: Path, commits: int = 50) -> str:
    """What one durable commit of a tiny transaction costs here: the floor under every event the loop runs."""
    path = workdir / "commit-probe.db"
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("CREATE TABLE t (v INTEGER)")
        times = []
        for value in range(commits):
            began = time.perf_counter()
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO t VALUES (?)", (value,))
            connection.execute("COMMIT")
            times.append((time.perf_counter() - began) * 1000)
    finally:
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"p50 {percentile(times, 50):.2f} / p99 {percentile(times, 99):.2f} ms over {commits}"
