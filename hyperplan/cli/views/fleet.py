"""The fleet: each pool, the size of its instances, and a bar per day of how booked it is; then each zone's
subnets."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView

BARS = " ▁▂▃▄▅▆▇█"
COLUMNS = (
    "Type", "Zone", "Count", "Reservable", "Price/inst-h", "vCPUs", "Memory GiB", "Accelerators",
    "Booked now", "Booked", "Next days",
)  # fmt: skip


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

    def __rich__(self) -> TableView | Group:
        start = datetime.fromisoformat(self.fleet["Now"])
        rows = [
            [
                p["InstanceType"],
                p["AvailabilityZone"],
                p["InstanceCount"],
                p["ReservableCount"],
                f"{p['PricePerInstanceHour']} {p['CurrencyCode']}",
                p.get("VCpus"),
                p.get("MemoryGiB"),
                accelerators(p),
                p["BookedNow"],
                f"{100 * p['Utilisation']:.0f}%",
                daily_bars(p, start, self.days),
            ]
            for p in self.fleet["Pools"]
        ]
        table = TableView(
            f"Fleet in {self.fleet['Region']} at {self.fleet['Now']} "
            f"(bars: peak booked share per day, next {self.days} days)",
            COLUMNS,
            rows,
        )
        parts: list[TableView | Text] = [table]
        zones = self.fleet.get("Zones")  # a server older than the list of zones sends none
        if zones:
            parts.append(zones_table(zones))
        unhealthy = unhealthy_lines(self.fleet["Pools"])
        if unhealthy:
            parts.append(Text("\n".join(unhealthy)))
        return Group(*parts) if len(parts) > 1 else table


def zones_table(zones: list[dict[str, Any]]) -> TableView:
    """Each zone's subnets, one a line: the ids a HyperPod cluster's VpcConfig.Subnets (or a group's
    OverrideVpcConfig) names to put its instance groups in that zone."""
    rows = [
        [zone["AvailabilityZone"], zone["AvailabilityZoneId"], "\n".join(zone["Subnets"]) or "(none)"]
        for zone in zones
    ]
    title = "Zones (a cluster's VpcConfig.Subnets pick its zone)"
    return TableView(title, ("Zone", "Zone id", "Subnets"), rows)


def accelerators(pool: dict[str, Any]) -> str | None:
    """Each instance's accelerators, such as "8 x NVIDIA H100"; "none" for a CPU type, and nothing from a
    server too old to say."""
    count = pool.get("Accelerators")
    if count is None:
        return None
    return f"{count} x {pool.get('AcceleratorKind')}" if count else "none"


def unhealthy_lines(pools: list[dict[str, Any]]) -> list[str]:
    """On a Slurm back end: each pool's nodes Slurm would not run work on, with its state and reason."""
    lines = []
    for pool in pools:
        bad = pool.get("UnhealthyNodes") or []
        if not bad:
            continue
        lines.append(
            f"{pool['InstanceType']} in {pool['AvailabilityZone']}: {pool['BookableCount']} of "
            f"{pool['ReservableCount']} reservable instances bookable; unhealthy nodes:"
        )
        lines += [
            f"  {node['Node']}: {node['State']}" + (f" ({node['Reason']})" if node.get("Reason") else "")
            for node in bad
        ]
    return lines
