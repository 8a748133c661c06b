"""`hyperplan fleet show`: the pools and how booked they are."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    emit,
    json_output,
    native_client,
    print_table,
    reporting_errors,
)
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="The fleet.", no_args_is_help=True)
BARS = " ▁▂▃▄▅▆▇█"


def daily_bars(pool: dict[str, Any], start: datetime, days: int) -> str:
    """One character per day: the day's peak booked share of the pool's reservable instances."""
    reservable = pool["ReservableCount"]
    if not reservable:
        return "(on-demand only)"
    runs = [(datetime.fromisoformat(r["Start"]), r["Booked"]) for r in pool["BookedProfile"]]
    bars = []
    for day in range(days):
        low, high = start + timedelta(days=day), start + timedelta(days=day + 1)
        peak = 0
        for i, (run_start, count) in enumerate(runs):
            run_end = runs[i + 1][0] if i + 1 < len(runs) else high
            if run_start < high and run_end > low:
                peak = max(peak, count)
        bars.append(BARS[min(8, round(8 * peak / reservable))])
    return "".join(bars)


@app.command("show")
def show(
    days: Annotated[int, typer.Option(help="How far ahead to report, in days.")] = 56,
) -> None:
    """Print each pool: size, price, and a bar per day of how booked it is."""
    with reporting_errors():
        fleet = native_client().get("/api/v1/fleet", days=days)

    def render(value: dict[str, Any]) -> None:
        start = datetime.fromisoformat(value["Now"])
        rows = [
            [
                p["InstanceType"],
                p["AvailabilityZone"],
                p["InstanceCount"],
                p["ReservableCount"],
                f"{p['PricePerInstanceHour']} {p['CurrencyCode']}",
                p["BookedNow"],
                f"{100 * p['Utilisation']:.0f}%",
                daily_bars(p, start, days),
            ]
            for p in value["Pools"]
        ]
        print_table(
            f"Fleet in {value['Region']} at {value['Now']} "
            f"(bars: peak booked share per day, next {days} days)",
            ["Type", "Zone", "Count", "Reservable", "Price/inst-h", "Booked now", "Booked", "Next days"],
            rows,
        )

    emit(fleet["Pools"] if json_output() else fleet, render)
