"""Purchases over HTTP with durable commits (SQLite WAL, synchronous=FULL: the server's own settings).

Each phase has a server of its own on a copy of the ~80%-booked store; every client process buys on
its own account over its own connection:

* search + buy: each client searches (the purchase mix) and buys the first offering, again and again.
  purchases/s = completed CreateTrainingPlan calls / the phase's wall time, the searches included.
* buy only: each client first searches for its offerings (untimed, all before anyone buys), then buys
  them back to back. purchases/s = completed CreateTrainingPlan calls / the wall time of the buying.
* buy only with one client, as a diagnostic: the same purchases without contention for the write lock.

A purchase refused with ResourceLimitExceeded (another client took the capacity since the search) is a
completed request and counts; the refusals are also shown on their own, and the successful rate apart.
"""

from __future__ import annotations

from pathlib import Path

from bench import scaleout
from bench.loadgen import CREATE, SEARCH, ClientJob, PhaseResult
from bench.phases import Sizes, describe_phase, run_measured
from bench.report import Figure, Report, at_least, line
from bench.server import Store, running_server

TARGET_PURCHASES = 300.0
PHASES = ("search-buy", "buy-all", "buy-one")


def run(report: Report, store: Store, copies: dict[str, Path], sizes: Sizes) -> None:
    _search_and_buy(report, store, copies["search-buy"], sizes)
    _buy_only(report, store, copies["buy-all"], sizes, clients=sizes.clients)
    _buy_only(report, store, copies["buy-one"], sizes, clients=1)


def _run(
    store: Store, data_dir: Path, sizes: Sizes, kind: str, clients: int, offerings: int = 0
) -> PhaseResult:
    with running_server(data_dir) as server:
        context = sizes.context(store)
        endpoints = [server.endpoint(key, store.fleet.region) for key in store.keys[:clients]]
        jobs = [
            ClientJob(kind, i, endpoint, context, sizes.seconds, offerings=offerings)
            for i, endpoint in enumerate(endpoints)
        ]
        return run_measured(server, jobs)


def _search_and_buy(report: Report, store: Store, data_dir: Path, sizes: Sizes) -> None:
    line(
        f"search + buy: {sizes.clients} client processes, {sizes.seconds:g} s, each: search, "
        "then buy the first offering"
    )
    result = _run(store, data_dir, sizes, "search_buy", sizes.clients)
    describe_phase(result, (SEARCH, CREATE))
    label = f"HTTP purchases/s (search+buy pairs, {sizes.clients} clients)"
    note = f"wall time includes each purchase's search; {_successful(result)}"
    report.add(at_least(result.rate(CREATE), TARGET_PURCHASES, "/s", label, note=note))


def _buy_only(report: Report, store: Store, data_dir: Path, sizes: Sizes, clients: int) -> None:
    line(
        f"buy only: {clients} client process{'es' * (clients > 1)}, each buying the first offering of "
        f"{sizes.offerings} searches made beforehand (untimed)"
    )
    result = _run(store, data_dir, sizes, "buy", clients, offerings=sizes.offerings)
    describe_phase(result, (CREATE,))
    label = f"HTTP purchases/s (buy only, {clients} client{'s' * (clients > 1)})"
    if clients == sizes.clients:
        note = f"wall time of the CreateTrainingPlan calls alone; {_successful(result)}"
        report.add(at_least(result.rate(CREATE), TARGET_PURCHASES, "/s", label, note=note))
        scaleout.purchase_cells(report, scaleout.ONE_PROCESS, result)
    else:
        report.add(Figure(label, f"{result.rate(CREATE):,.0f} /s", note="diagnostic: no lock contention"))


def _successful(result: PhaseResult) -> str:
    ok = result.outcomes[(CREATE, "ok")]
    return f"{ok / result.wall:,.0f}/s bought, the rest refused (capacity taken)"
