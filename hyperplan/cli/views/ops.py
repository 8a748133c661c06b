"""Operating the fleet: the audit trail, the drain state, usage per account (per day, and the monthly
books)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from rich.text import Text

from hyperplan.cli.views.base import TableView


@dataclass(frozen=True)
class AuditTable:
    events: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = []
        for e in self.events:
            actor = e.get("Actor")
            who = f"{actor['AccountName']}/{actor['UserName']}" if actor else "(service)"
            detail = json.dumps(e["Detail"], sort_keys=True, separators=(",", ":"))
            rows.append(
                [e["At"], e["Action"], who, e["RemoteAddress"], e["AccountName"], e["Target"], detail]
            )
        return TableView("Audit trail", ["At", "Action", "Who", "From", "Account", "Target", "Detail"], rows)


@dataclass(frozen=True)
class DrainLine:
    state: dict[str, Any]

    def __rich__(self) -> Text:
        s = self.state
        if not s["Draining"]:
            return Text("The fleet is open: new work is accepted.")
        stopped = " Running work was stopped." if s["StopRunning"] else ""
        return Text(f"The fleet is drained since {s['Since']} (by {s['By'] or 'the service'}).{stopped}")


@dataclass(frozen=True)
class UsageTable:
    """Per account, pool and day: what the plans reserved, how much of it their clusters and jobs used
    (never more), and on-demand work apart, so that a plan's use is never mistaken for work on no plan;
    then managed spot training: the plans' instances lent, the account's spot jobs' hours, and the money
    of each (what the spot runs were charged, what lending was credited); then returns: the hours the
    plans gave back, their refunds and the credits for their resales. The spot and the returns columns
    are shown only when a row has some: a fleet without either keeps its table as narrow as it was."""

    rows: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        tagged = any("TagValue" in r for r in self.rows)
        spot = any(_has_spot(r) for r in self.rows)
        returns = any(_has_returns(r) for r in self.rows)
        columns = [
            "Account",
            *(["Tag"] if tagged else []),
            "Instance type",
            "Zone",
            "Day",
            "Reserved h",
            "Plan used h",
            "On-demand h",
            *(["Lent h", "Spot h", "Spot charged", "Lending credited"] if spot else []),
            *(["Returned h", "Refunded", "Resale credited"] if returns else []),
        ]
        body = [
            [
                r["Account"],
                *([r["TagValue"]] if tagged else []),
                r["InstanceType"],
                r["AvailabilityZone"],
                r["Day"],
                f"{r['ReservedInstanceHours']:g}",
                f"{r['PlanUsedInstanceHours']:g}",
                f"{r['OnDemandInstanceHours']:g}",
                *(_spot_cells(r) if spot else []),
                *(_returns_cells(r) if returns else []),
            ]
            for r in self.rows
        ]
        return TableView("Usage (instance-hours)", columns, body)


def _has_spot(row: dict[str, Any]) -> bool:
    """Whether a usage row has any managed spot training: hours lent or run, money charged or credited."""
    return bool(
        row["LentInstanceHours"]
        or row["SpotInstanceHours"]
        or Decimal(row["SpotCharged"])
        or Decimal(row["LendingCredited"])
    )


def _spot_cells(row: dict[str, Any]) -> list[str]:
    return [
        f"{row['LentInstanceHours']:g}",
        f"{row['SpotInstanceHours']:g}",
        row["SpotCharged"],
        row["LendingCredited"],
    ]


def _has_returns(row: dict[str, Any]) -> bool:
    """Whether a usage row has any return: hours given back, a refund, a resale's credit (a row of a
    server from before returns has none of the members)."""
    return bool(
        row.get("ReturnedInstanceHours")
        or Decimal(row.get("Refunded", "0"))
        or Decimal(row.get("ResaleCredited", "0"))
    )


def _returns_cells(row: dict[str, Any]) -> list[str]:
    return [f"{row['ReturnedInstanceHours']:g}", row["Refunded"], row["ResaleCredited"]]


@dataclass(frozen=True)
class MonthlyUsageTable:
    """The monthly books, per account and calendar month: the plans' hours (reserved, used of them,
    idle: neither used nor lent, lent to spot jobs, returned), then the money (paid, refunded, credited
    for resales and lending) and the net cost that follows from it, in the fleet's currency."""

    books: dict[str, Any]

    def __rich__(self) -> TableView:
        columns = [
            "Account",
            "Month",
            "Reserved h",
            "Used h",
            "Idle h",
            "Lent h",
            "Returned h",
            "Paid",
            "Refunded",
            "Credited",
            "Net cost",
        ]
        body = [
            [
                m["Account"],
                m["Month"],
                *(
                    f"{m[member]:g}"
                    for member in (
                        "ReservedInstanceHours",
                        "PlanUsedInstanceHours",
                        "IdleInstanceHours",
                        "LentInstanceHours",
                        "ReturnedInstanceHours",
                    )
                ),
                *(m[member] for member in ("Paid", "Refunded", "Credited", "NetCost")),
            ]
            for m in self.books["Months"]
        ]
        return TableView(
            f"Usage per month (instance-hours; money in {self.books['Currency']})", columns, body
        )
