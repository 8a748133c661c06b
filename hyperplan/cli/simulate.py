"""`hyperplan simulate`: a workload replayed through the real search and booking code, once per ranking,
and what each booked against the LP upper bound (docs/PLANNING.md).

Each replay is a whole application in this process (the composition root `hyperplan serve` uses) over a
SQLite store in a temporary directory, under the manual clock: the clock is moved to each request's
arrival (running the timed events on the way), the request is searched as its buyer's account, and the
offering the buyer chooses is bought with CreateTrainingPlan's service. Nothing listens on a port.

With spot jobs (``--spot``), or busy intervals in the workload, what each ranking booked is then replayed
as lenders (core/borrowing.py): the owners' busy hours, the idle hours, what spot jobs borrowed, the
reclaims and the money.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hyperplan.cli.common import console, read_text

if TYPE_CHECKING:  # imported where used: every other command starts without numpy and HiGHS
    from hyperplan.core.borrowing import BorrowingOutcome
    from hyperplan.core.fleet import Fleet, PoolKey
    from hyperplan.core.offerings import Offering
    from hyperplan.core.workloads import SpotJob, WorkloadRequest

    Bought = tuple[WorkloadRequest, Offering]

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


@dataclass(frozen=True)
class Outcome:
    """What one ranking booked from the workload."""

    ranking: str
    requests: int
    accepted: int
    instance_days: int  # of the accepted requests, as asked (count x days; a partial first day aside)
    utilisation: dict[str, float]  # per pool (type/zone): booked instance-hours / reservable, over the span
    revenue: Decimal
    bound: float  # the LP upper bound, instance-days
    daily: list[float]  # booked share of all reservable instances, day by day over the span
    # What the booked plans lent (with spot jobs or busy intervals given; None otherwise).
    borrowing: BorrowingOutcome | None = None

    @property
    def ratio(self) -> float:
        return self.instance_days / self.bound if self.bound else 1.0

    def as_json(self) -> dict[str, Any]:
        row = {
            "Ranking": self.ranking,
            "Requests": self.requests,
            "Accepted": self.accepted,
            "InstanceDays": self.instance_days,
            "Utilisation": {pool: round(share, 4) for pool, share in self.utilisation.items()},
            "Revenue": str(self.revenue),
            "LpBound": round(self.bound, 2),
            "RatioToBound": round(self.ratio, 4),
        }
        if self.borrowing is not None:
            row["Borrowing"] = _borrowing_json(self.borrowing)
        return row


def _borrowing_json(outcome: BorrowingOutcome) -> dict[str, Any]:
    def hours(instance_time: timedelta) -> float:
        return round(instance_time / HOUR, 2)

    return {
        "ReservedInstanceHours": hours(outcome.reserved),
        "BusyInstanceHours": hours(outcome.busy),
        "IdleInstanceHours": hours(outcome.idle),
        "LentInstanceHours": hours(outcome.lent),
        "LostAtReclaimsInstanceHours": hours(outcome.lost),
        "Reclaims": outcome.reclaims,
        "PromisesKept": outcome.promises_kept,
        "SpotJobs": outcome.jobs,
        "SpotJobsCompleted": outcome.completed,
        "SpotJobsDropped": outcome.dropped,
        "SpotRevenue": str(outcome.revenue),
        "OwnerCredits": str(outcome.credits),
    }


def run(
    fleet: Fleet,
    requests: list[WorkloadRequest],
    start: datetime,
    rankings: list[str],
    spot_jobs: list[SpotJob] | None = None,
) -> list[Outcome]:
    """The workload replayed once per ranking, each on a store of its own; with spot jobs (``[]`` is
    some: none) or busy intervals in the requests, each ranking's plans then replayed as lenders."""
    from hyperplan.core.bound import lp_bound
    from hyperplan.core.replay import hour_zero, jobs_of

    quiet_highs()
    hour0 = hour_zero(start, fleet)
    jobs, capacity = jobs_of(fleet, requests)
    bound = lp_bound(jobs, capacity)
    span_days = max([job.stop for job in jobs] + [1])
    outcomes = []
    for ranking in rankings:
        ranked = replace(fleet, policy=replace(fleet.policy, ranking=ranking))
        bought = _replay(ranked, requests, start, hour0)
        outcome = _outcome(ranked, ranking, requests, bought, bound, hour0, span_days)
        if spot_jobs is not None or any(request.busy_h for request in requests):
            outcome = replace(outcome, borrowing=_lent(ranked, bought, spot_jobs or [], hour0))
        outcomes.append(outcome)
    return outcomes


def _lent(fleet: Fleet, bought: list[Bought], spot_jobs: list[SpotJob], hour0: datetime) -> BorrowingOutcome:
    """What the plans bought would have lent to the spot jobs, each plan lending while its owner is not
    busy (docs/PLANNING.md, "Borrowing")."""
    from hyperplan.core.borrowing import borrowers, lending_segments, simulate_borrowing
    from hyperplan.services.plans.payments import currency_places, fleet_currency

    segments = [
        segment
        for number, (request, offer) in enumerate(bought, start=1)
        for segment in lending_segments(number, offer, request.busy_h, fleet)
    ]
    places = currency_places(fleet_currency(fleet))
    return simulate_borrowing(segments, borrowers(spot_jobs, hour0), fleet, places)


def _replay(fleet: Fleet, requests: list[WorkloadRequest], start: datetime, hour0: datetime) -> list[Bought]:
    from hyperplan.core.replay import chosen, search_request
    from hyperplan.errors import HyperplanError
    from hyperplan.services.accounts import accounts
    from hyperplan.services.accounts.accounts import Caller
    from hyperplan.services.plans import plans

    bought = []
    with _application(fleet, start) as runtime:
        with runtime.db.read() as session:
            admin = accounts.list_accounts(session)[0]
        caller = Caller(admin.id, admin.name, True, "simulate")
        for index, request in enumerate(requests):
            runtime.advance_clock(hour0 + request.arrival_h * HOUR)
            try:
                offers = plans.search(runtime, caller, search_request(request, hour0))
                offer = chosen([o.offering for o in offers], request.choice)
                if offer is None:
                    continue
                signed = next(o for o in offers if o.offering is offer)
                plans.create(runtime, caller, f"simulated-{index + 1}", signed.offering_id)
            except HyperplanError:
                continue  # refused: a bad request, or an offering that could not be bought
            bought.append((request, offer))
    return bought


def quiet_highs() -> None:
    """HiGHS prints a banner on stdout (the C library's, past Python's sys.stdout) when the process makes
    its first solver: made here once with stdout sent to /dev/null, so that --json stays JSON."""
    import highspy

    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def _application(fleet: Fleet, start: datetime) -> Iterator[Any]:
    import logging  # here, as the runtime is: other commands start without it (tests/cli/test_startup.py)

    from hyperplan.app import AppConfig, Application

    quiet = logging.getLogger("hyperplan")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "not isolated" and the like: nothing runs here
    try:
        with tempfile.TemporaryDirectory(prefix="hyperplan-simulate-") as scratch:
            data_dir = Path(scratch) / "data"
            application = Application(
                AppConfig(
                    data_dir=data_dir, fleet=fleet, clock="manual", clock_start=start, isolation="none",
                    work_dir=Path(scratch) / "work",
                )
            )  # fmt: skip
            application.start()
            try:
                yield application.context
            finally:
                application.stop()
    finally:
        quiet.setLevel(level)


def _outcome(
    fleet: Fleet, ranking: str, requests: list[WorkloadRequest], bought: list[Bought], bound: float,
    hour0: datetime, span_days: int,
) -> Outcome:  # fmt: skip
    pools = [pool for pool in fleet.pools if pool.reservable > 0]
    end = hour0 + span_days * DAY
    held: dict[PoolKey, float] = {pool.key: 0.0 for pool in pools}
    daily = [0.0] * span_days
    for _, offer in bought:
        for segment in offer.segments:
            lo, hi = max(segment.start, hour0), min(segment.end, end)
            if lo < hi:
                held[segment.pool_key] += segment.count * (hi - lo) / HOUR
            for day in range(span_days):
                day_lo, day_hi = max(lo, hour0 + day * DAY), min(hi, hour0 + (day + 1) * DAY)
                if day_lo < day_hi:
                    daily[day] += segment.count * ((day_hi - day_lo) / DAY)
    total = sum(pool.reservable for pool in pools)
    return Outcome(
        ranking=ranking,
        requests=len(requests),
        accepted=len(bought),
        instance_days=sum(request.instance_days for request, _ in bought),
        utilisation={
            f"{pool.instance_type}/{pool.availability_zone}": held[pool.key]
            / (pool.reservable * span_days * 24)
            for pool in pools
        },
        revenue=sum((offer.upfront_fee for _, offer in bought), Decimal("0.00")),
        bound=bound,
        daily=[booked / total for booked in daily],
    )


# -- the command -------------------------------------------------------------------------------------


def simulate(
    fleet: Annotated[Path, typer.Option(help="Fleet file (TOML).", exists=True, dir_okay=False)],
    workload: Annotated[
        Path,
        typer.Option(
            help="Workload CSV: arrival_h,instance_type,count,days,start_after_h,end_before_h,target,choice"
            "[,busy_h].",
            exists=True,
            dir_okay=False,
        ),
    ],
    spot: Annotated[
        Path | None,
        typer.Option(
            help="Spot jobs CSV (arrival_h,instance_type,count,run_h,max_wait_h,checkpoint_h), borrowing the "
            "plans' idle instances.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    ranking: Annotated[
        list[str] | None,
        typer.Option(help="A ranking to replay under (packing, earliest); repeat it; default: all."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Draw utilisation over time into this PNG (needs matplotlib).")
    ] = None,
    compare_prices: Annotated[
        bool,
        typer.Option(
            "--compare-prices",
            help="Replay each ranking twice: at list prices and at load-based prices (the fleet's [pricing] "
            "bounds, or 0.8-1.5), side by side; a buyer whose choice is 'cheapest' then takes quieter days.",
        ),
    ] = False,
    start: Annotated[
        str | None,
        typer.Option(
            help="The simulation's first instant: a date (2026-12-07: midnight UTC) or a date and time "
            "(2026-12-07T10:00, UTC unless a zone such as Z or +02:00 follows); hour 0 is the first "
            "11:30 UTC at or after it. Default: now."
        ),
    ] = None,
) -> None:
    """Replay a workload through the real search and booking code under each ranking, in this process
    (manual clock, a temporary store), and compare what each booked with the LP upper bound; with spot
    jobs, what the plans lent them while their owners were not busy."""
    from hyperplan.cli.times import absolute
    from hyperplan.core.fleet import RANKINGS
    from hyperplan.core.fleet_file import parse_fleet
    from hyperplan.core.workloads import read_csv, read_spot_csv

    rankings = list(dict.fromkeys(ranking)) if ranking else list(RANKINGS)
    unknown = [r for r in rankings if r not in RANKINGS]
    if unknown:
        raise typer.BadParameter(
            f"{unknown[0]!r} is not a ranking; one of {', '.join(RANKINGS)}", param_hint="--ranking"
        )
    if plot is not None:
        _check_matplotlib()
    first = absolute("--start", start) if start is not None else datetime.now(UTC)
    # A refusal (our error tree: a bad fleet file, workload or time) is printed as one line, exit code 2
    # (hyperplan/cli/root.py).
    fleet_value = parse_fleet(read_text(fleet, "--fleet"))
    requests = read_csv(read_text(workload, "--workload"))
    spot_jobs = read_spot_csv(read_text(spot, "--spot")) if spot is not None else None
    if compare_prices:
        listed = replace(fleet_value, pricing=replace(fleet_value.pricing, load_based=False))
        loaded = replace(fleet_value, pricing=replace(fleet_value.pricing, load_based=True))
        outcomes = [
            *run(listed, requests, first, rankings, spot_jobs),
            *(
                replace(o, ranking=f"{o.ranking}, load prices")
                for o in run(loaded, requests, first, rankings, spot_jobs)
            ),
        ]
    else:
        outcomes = run(fleet_value, requests, first, rankings, spot_jobs)
    if as_json:
        print(json.dumps({"Rankings": [o.as_json() for o in outcomes]}, indent=2))
    else:
        console.print(_table(outcomes, with_spot=spot_jobs is not None))
    if plot is not None:
        _plot(outcomes, plot)
        if not as_json:
            console.print(f"Utilisation over time drawn in {plot}", highlight=False, markup=False)


def _table(outcomes: list[Outcome], with_spot: bool = False) -> Any:
    from rich.table import Table

    table = Table(title="Simulated bookings per ranking")
    table.add_column("")
    for outcome in outcomes:
        table.add_column(outcome.ranking, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("requests accepted", [f"{o.accepted} / {o.requests}" for o in outcomes]),
        ("instance-days booked", [str(o.instance_days) for o in outcomes]),
    ]
    for pool in outcomes[0].utilisation if outcomes else {}:
        rows.append((f"utilisation {pool}", [f"{o.utilisation[pool]:.1%}" for o in outcomes]))
    rows.append(("revenue", [f"{o.revenue:,.2f}" for o in outcomes]))
    rows.append(("LP upper bound (instance-days)", [f"{o.bound:.1f}" for o in outcomes]))
    rows.append(("ratio to the bound", [f"{o.ratio:.1%}" for o in outcomes]))
    lent = [o.borrowing for o in outcomes if o.borrowing is not None]
    if lent and len(lent) == len(outcomes):  # each ranking's, or none
        rows.extend(_borrowing_rows(lent, with_spot))
    for name, cells in rows:
        table.add_row(name, *cells)
    return table


def _borrowing_rows(lent: list[BorrowingOutcome], with_spot: bool) -> list[tuple[str, list[str]]]:
    """The plans' instance-hours (reserved = busy + idle + lent) and, with spot jobs, what they borrowed."""

    def hours(instance_time: timedelta) -> str:
        return f"{instance_time / HOUR:,.1f}"

    rows = [
        ("reserved instance-hours", [hours(b.reserved) for b in lent]),
        ("  owners' busy", [hours(b.busy) for b in lent]),
        ("  idle", [hours(b.idle) for b in lent]),
    ]
    if not with_spot:
        return rows
    return [
        *rows,
        ("  lent to spot jobs", [hours(b.lent) for b in lent]),
        ("    of it, work lost at reclaims", [hours(b.lost) for b in lent]),
        ("reclaims (promises kept)", [f"{b.reclaims} ({b.promises_kept} kept)" for b in lent]),
        ("spot jobs completed", [f"{b.completed} / {b.jobs}" for b in lent]),
        ("spot jobs dropped", [str(b.dropped) for b in lent]),
        ("spot revenue", [f"{b.revenue:,.2f}" for b in lent]),
        ("owners' credits", [f"{b.credits:,.2f}" for b in lent]),
    ]


def _check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise typer.BadParameter(
            "drawing needs matplotlib: pip install 'hyperplan[plot]'", param_hint="--plot"
        ) from None


def _plot(outcomes: list[Outcome], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4))
    for outcome in outcomes:
        axes.plot(range(len(outcome.daily)), [100 * share for share in outcome.daily], label=outcome.ranking)
    axes.set_xlabel("day (from hour 0)")
    axes.set_ylabel("reservable instances booked (%)")
    axes.set_ylim(0, 105)
    axes.set_title("Utilisation over time")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
