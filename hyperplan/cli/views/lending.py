"""The view of a plan's lending policy (`hyperplan plans lending`): its mode and terms, what it lent,
and for an administrator each borrower's run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView


@dataclass(frozen=True)
class LendingDetail:
    lending: dict[str, Any]

    def __rich__(self) -> Group:
        view = self.lending
        parts: list[Any] = [Text.assemble((view["TrainingPlanName"], "bold"), f"  lending: {_terms(view)}")]
        parts.append(
            TableView(
                "Lent",
                ["Now", "Instance-hours", "Reclaims", "Promises kept", "Promises broken", "Credited"],
                [
                    [
                        view["LentNow"],
                        f"{view['LentInstanceHours']:.2f}",
                        view["Reclaims"],
                        view["PromisesKept"],
                        view["PromisesBroken"],
                        f"{view['Credited']} {view['CurrencyCode']}",
                    ]
                ],
            )
        )
        if "Runs" in view:  # an administrator's view
            parts.append(_runs(view["Runs"]))
        return Group(*parts)


def _terms(view: dict[str, Any]) -> str:
    if view["Mode"] != "idle":
        return "none (the plan lends nothing)"
    return (
        f"idle, notice {view['NoticeSeconds']} s, minimum run {view['MinRunSeconds']} s, "
        f"stop-lending margin {view['StopMarginSeconds']} s"
    )


def _runs(runs: list[dict[str, Any]]) -> TableView:
    rows = [
        [
            run["TrainingJobName"],
            run["AccountName"],
            run["InstanceCount"],
            run["StartTime"],
            run["EndTime"],
            run["ReclaimReason"],
            run["NoticeSeconds"],
            run["OwnerHadSeconds"],
        ]
        for run in runs
    ]
    columns = ["Job", "Account", "Instances", "Start", "End", "Reclaim", "Notice s", "Owner had it s"]
    return TableView("Runs (newest first)", columns, rows)
