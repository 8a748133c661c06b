"""Views of training plans: offerings, a plan, the list, history and extensions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hyperplan.cli.views.base import TableView, last_part, when


def length(hours: int, minutes: int) -> str:
    """A duration as days, hours and minutes: 1d12h, 6h30m, 0h."""
    days, rest = divmod(hours, 24)
    text = f"{days}d" if days else ""
    text += f"{rest}h" if rest else ""
    text += f"{minutes}m" if minutes else ""
    return text or "0h"


def per_instance_hour(fee: str, count: int, hours: int, minutes: int) -> str:
    instance_hours = Decimal(count) * (Decimal(hours) + Decimal(minutes) / 60)
    return f"{(Decimal(fee) / instance_hours).quantize(Decimal('0.01'))}" if instance_hours else "-"


@dataclass(frozen=True)
class Offerings:
    """Search results: a table of segments per offering, and how to buy it; and the cancellation policy
    a plan bought from it would have, once for all when they share it (nearly always: one fleet's)."""

    offerings: list[dict[str, Any]]

    def __rich__(self) -> RenderableType:
        if not self.offerings:
            return Text("No offering fits. Try a wider window, fewer instances or a shorter duration.")
        words = [policy_words(offering) for offering in self.offerings]
        shared = len(set(words)) == 1
        parts: list[RenderableType] = []
        for number, offering in enumerate(self.offerings, start=1):
            offering_id = offering["TrainingPlanOfferingId"]
            parts.append(_offering_table(number, offering))
            if not shared and words[number - 1]:
                parts.append(Text(f"  returns: {words[number - 1]}"))
            parts.append(Text(f"  buy with: hyperplan plans buy NAME --offering-id {offering_id}\n"))
        if shared and words[0]:
            parts.append(Text(f"Returns: {words[0]}"))
        return Group(*parts)


def policy_words(answer: dict[str, Any]) -> str:
    """The words of the cancellation policy an offering or a plan carries (the native API's
    `CancellationPolicy.Description`); empty when the answer has none."""
    policy = answer.get("CancellationPolicy")
    return str(policy.get("Description", "")) if isinstance(policy, dict) else ""


@dataclass(frozen=True)
class OfferingsAcross:
    """A search across instance types (the native API's answer): the offerings in its order, each
    titled with the type and count it is for."""

    answer: dict[str, Any]

    def __rich__(self) -> RenderableType:
        offerings = [_timed(offering) for offering in self.answer["TrainingPlanOfferings"]]
        shown = Offerings(offerings).__rich__()
        if not self.answer.get("Truncated"):
            return shown
        more = Text("More offerings were found than one answer holds; narrow the search to see the rest.")
        return Group(shown, more)


def _timed(offering: dict[str, Any]) -> dict[str, Any]:
    """An offering of the native API with its segments' times as instants (it writes them ISO 8601)."""
    segments = [
        {**s, "StartTime": _instant(s["StartTime"]), "EndTime": _instant(s["EndTime"])}
        for s in offering["ReservedCapacityOfferings"]
    ]
    return {**offering, "ReservedCapacityOfferings": segments}


def _instant(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _offering_table(number: int, offering: dict[str, Any]) -> TableView:
    segments = offering["ReservedCapacityOfferings"]
    rows = [
        [
            str(i),
            s["AvailabilityZone"],
            f"{s['InstanceCount']} x {s['InstanceType']}",
            when(s["StartTime"]),
            when(s["EndTime"]),
            length(s["DurationHours"], s["DurationMinutes"]),
        ]
        for i, s in enumerate(segments, start=1)
    ]
    currency = offering["CurrencyCode"]
    rate = per_instance_hour(
        offering["UpfrontFee"],
        segments[0]["InstanceCount"],
        offering["DurationHours"],
        offering["DurationMinutes"],
    )
    # An offering of a search across types says which of them it is for.
    kind = f"{offering['InstanceCount']} x {offering['InstanceType']}, " if "InstanceType" in offering else ""
    return TableView(
        f"Offering {number}: {kind}{len(segments)} segment(s), {offering['UpfrontFee']} {currency} "
        f"({rate} {currency} per instance-hour)",
        ["Segment", "Zone", "Instances", "Start", "End", "Length"],
        rows,
    )


@dataclass(frozen=True)
class PlanDetail:
    """One plan: its status, size and fee, then its reserved capacities."""

    plan: dict[str, Any]

    def __rich__(self) -> Group:
        plan = self.plan
        heading = Text.assemble(
            (plan["TrainingPlanName"], "bold"),
            f"  {plan['Status']}: {plan.get('StatusMessage', '')}\n"
            f"  {plan['TrainingPlanArn']}\n"
            f"  target {', '.join(plan['TargetResources'])}; {plan['TotalInstanceCount']} instances "
            f"({plan['InUseInstanceCount']} in use, {plan['AvailableInstanceCount']} available); "
            f"{plan['UpfrontFee']} {plan['CurrencyCode']}",
        )
        words = policy_words(plan)
        if words:
            heading.append(f"\n  returns: {words}")
        rows = [
            [
                last_part(s["ReservedCapacityArn"]),
                s["Status"],
                s.get("AvailabilityZone", ""),
                f"{s['TotalInstanceCount']} x {s['InstanceType']}",
                when(s["StartTime"]),
                when(s["EndTime"]),
            ]
            for s in plan["ReservedCapacitySummaries"]
        ]
        capacities = TableView(
            "Reserved capacities", ["Name", "Status", "Zone", "Instances", "Start", "End"], rows
        )
        return Group(heading, capacities)


@dataclass(frozen=True)
class PlansTable:
    plans: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                p["TrainingPlanName"],
                p["Status"],
                p["TargetResources"][0],
                p["TotalInstanceCount"],
                p["ReservedCapacitySummaries"][0]["InstanceType"],
                len(p["ReservedCapacitySummaries"]),
                when(p["StartTime"]),
                when(p["EndTime"]),
                f"{p['UpfrontFee']} {p['CurrencyCode']}",
            ]
            for p in self.plans
        ]
        return TableView(
            "Training plans",
            ["Name", "Status", "Target", "Count", "Type", "Segments", "Start", "End", "Fee"],
            rows,
        )


@dataclass(frozen=True)
class PlanStatus:
    """One line: a plan's status and why (after a cancellation)."""

    plan: dict[str, Any]

    def __rich__(self) -> Text:
        p = self.plan
        return Text(f"{p['TrainingPlanName']}: {p['Status']}. {p['StatusMessage']}")


@dataclass(frozen=True)
class PlanHistory:
    history: dict[str, Any]

    def __rich__(self) -> TableView:
        rows = [
            [e["At"], e["Kind"], e["Status"], _by(e.get("User")), e["Message"]]
            for e in self.history["Events"]
        ]
        return TableView(
            f"History of {self.history['TrainingPlanName']}",
            ["At (service time)", "Event", "Status", "By", "Message"],
            rows,
        )


def _by(user: dict[str, Any] | None) -> str:
    """Who acted: a user and their account; empty for what the service did by itself."""
    return f"{user['UserName']} ({user['AccountName']})" if user else ""


@dataclass(frozen=True)
class ExtensionOffers:
    """Extension offerings of a plan, each with how to buy it."""

    plan_name: str
    offers: list[dict[str, Any]]

    def __rich__(self) -> RenderableType:
        if not self.offers:
            return Text("No extension fits: the plan's pool is booked after its end.")
        return Group(*(self._offer(offer) for offer in self.offers))

    def _offer(self, offer: dict[str, Any]) -> Text:
        start, end = when(offer["StartDate"]), when(offer["EndDate"])
        return Text(
            f"{offer['AvailabilityZone']}: {start} to {end}, {offer['UpfrontFee']} {offer['CurrencyCode']}\n"
            f"  buy with: hyperplan plans extend {self.plan_name} "
            f"--offering-id {offer['TrainingPlanExtensionOfferingId']}"
        )


@dataclass(frozen=True)
class ExtensionsTable:
    extensions: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                e["StartDate"],
                e["EndDate"],
                e["Status"],
                e["PaymentStatus"],
                f"{e['UpfrontFee']} {e['CurrencyCode']}",
            ]
            for e in self.extensions
        ]
        return TableView("Extensions", ["Start", "End", "Status", "Payment", "Fee"], rows)
