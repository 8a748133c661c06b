"""The fleet: each pool with a bar per day of how booked it is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from hyperplan.cli.views.base import TableView

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


@dataclass(frozen=True)
class FleetTable:
    fleet: dict[str, Any]
    days: int

    def __rich__(self) -> TableView:
        start = datetime.fromisoformat(self.fleet["Now"])
        rows = [
            [
                p["InstanceType"],
                p["AvailabilityZone"],
                p["InstanceCount"],
                p["ReservableCount"],
                f"{p['PricePerInstanceHour']} {p['CurrencyCode']}",
                p["BookedNow"],
                f"{100 * p['Utilisation']:.0f}%",
                daily_bars(p, start, self.days),
            ]
            for p in self.fleet["Pools"]
        ]
        return TableView(
            f"Fleet in {self.fleet['Region']} at {self.fleet['Now']} "
            f"(bars: peak booked share per day, next {self.days} days)",
            ["Type", "Zone", "Count", "Reservable", "Price/inst-h", "Booked now", "Booked", "Next days"],
            rows,
        )
