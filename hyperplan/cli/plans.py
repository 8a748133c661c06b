"""`hyperplan plans`: search, buy, list and show training plans, through the SageMaker API."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    console,
    emit,
    json_output,
    native_client,
    plain,
    print_table,
    reporting_errors,
    reporting_sagemaker_errors,
    sagemaker_client,
    when,
)
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Training plans: search, buy, list, show.", no_args_is_help=True)


def _hours(hours: int, minutes: int) -> str:
    days, rest = divmod(hours, 24)
    text = f"{days}d" if days else ""
    text += f"{rest}h" if rest else ""
    text += f"{minutes}m" if minutes else ""
    return text or "0h"


def _per_instance_hour(fee: str, count: int, hours: int, minutes: int) -> str:
    instance_hours = Decimal(count) * (Decimal(hours) + Decimal(minutes) / 60)
    return f"{(Decimal(fee) / instance_hours).quantize(Decimal('0.01'))}" if instance_hours else "-"


def _render_offerings(offerings: list[dict[str, Any]]) -> None:
    if not offerings:
        console.print("No offering fits. Try a wider window, fewer instances or a shorter duration.")
        return
    for number, offering in enumerate(offerings, start=1):
        segments = offering["ReservedCapacityOfferings"]
        count = segments[0]["InstanceCount"]
        rows = [
            [
                str(i),
                s["AvailabilityZone"],
                f"{s['InstanceCount']} x {s['InstanceType']}",
                when(s["StartTime"]),
                when(s["EndTime"]),
                _hours(s["DurationHours"], s["DurationMinutes"]),
            ]
            for i, s in enumerate(segments, start=1)
        ]
        total = f"{offering['UpfrontFee']} {offering['CurrencyCode']}"
        rate = _per_instance_hour(
            offering["UpfrontFee"], count, offering["DurationHours"], offering["DurationMinutes"]
        )
        print_table(
            f"Offering {number}: {len(segments)} segment(s), {total} "
            f"({rate} {offering['CurrencyCode']} per instance-hour)",
            ["Segment", "Zone", "Instances", "Start", "End", "Length"],
            rows,
        )
        console.print(
            f"  buy with: hyperplan plans buy NAME --offering-id {offering['TrainingPlanOfferingId']}\n"
        )


def _instant(text: str) -> Any:
    # The server's own parser, so both ends read a time alike; imported only when a time is given
    # because its module pulls in the runtime.
    from hyperplan.services.clock import parse_instant

    return parse_instant(text)


@app.command("search")
def search(
    instance_type: Annotated[str, typer.Option(help="e.g. ml.p5.48xlarge")],
    count: Annotated[int, typer.Option(help="Instances per segment.")],
    target: Annotated[str, typer.Option(help="training-job or hyperpod-cluster")],
    days: Annotated[int | None, typer.Option(help="Duration in days.")] = None,
    hours: Annotated[int | None, typer.Option(help="Duration in hours (rounded up to whole days).")] = None,
    start_after: Annotated[str | None, typer.Option(help="ISO 8601; default: 30 minutes from now.")] = None,
    end_before: Annotated[str | None, typer.Option(help="ISO 8601; default: 56 days from now.")] = None,
) -> None:
    """Search for offerings: at most three, best first."""
    if (days is None) == (hours is None):
        raise typer.BadParameter("give exactly one of --days or --hours")
    request: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": count,
        "DurationHours": hours if hours is not None else 24 * (days or 0),
        "TargetResources": [target],
    }
    if start_after:
        request["StartTimeAfter"] = _instant(start_after)
    if end_before:
        request["EndTimeBefore"] = _instant(end_before)
    with reporting_sagemaker_errors():
        result = sagemaker_client().search_training_plan_offerings(**request)
    emit(
        plain(result["TrainingPlanOfferings"]) if json_output() else result["TrainingPlanOfferings"],
        _render_offerings,
    )


@app.command("buy")
def buy(
    name: str,
    offering_id: Annotated[str, typer.Option(help="An id from `hyperplan plans search`.")],
) -> None:
    """Buy an offering as a plan named NAME. Purchases are final."""
    with reporting_sagemaker_errors():
        client = sagemaker_client()
        arn = client.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
        plan = client.describe_training_plan(TrainingPlanName=name)
    emit({"TrainingPlanArn": arn["TrainingPlanArn"]} if json_output() else plan, _render_plan)


def _render_plan(plan: dict[str, Any]) -> None:
    console.print(
        f"[bold]{plan['TrainingPlanName']}[/bold]  {plan['Status']}: {plan.get('StatusMessage', '')}\n"
        f"  {plan['TrainingPlanArn']}\n"
        f"  target {', '.join(plan['TargetResources'])}; {plan['TotalInstanceCount']} instances "
        f"({plan['InUseInstanceCount']} in use, {plan['AvailableInstanceCount']} available); "
        f"{plan['UpfrontFee']} {plan['CurrencyCode']}"
    )
    rows = [
        [
            s["ReservedCapacityArn"].rsplit("/", 1)[-1],
            s["Status"],
            s.get("AvailabilityZone", ""),
            f"{s['TotalInstanceCount']} x {s['InstanceType']}",
            when(s["StartTime"]),
            when(s["EndTime"]),
        ]
        for s in plan["ReservedCapacitySummaries"]
    ]
    print_table("Reserved capacities", ["Name", "Status", "Zone", "Instances", "Start", "End"], rows)


@app.command("show")
def show(
    name: str,
) -> None:
    """Show one plan and its reserved capacities."""
    with reporting_sagemaker_errors():
        plan = sagemaker_client().describe_training_plan(TrainingPlanName=name)
    plan.pop("ResponseMetadata", None)
    emit(plain(plan) if json_output() else plan, _render_plan)


@app.command("list")
def list_plans(
    status: Annotated[str | None, typer.Option(help="Only plans in this status.")] = None,
) -> None:
    """List this account's plans, earliest start first."""
    request: dict[str, Any] = {"Filters": [{"Name": "Status", "Value": status}]} if status else {}
    with reporting_sagemaker_errors():
        client = sagemaker_client()
        plans = [
            p
            for page in client.get_paginator("list_training_plans").paginate(**request)
            for p in page["TrainingPlanSummaries"]
        ]

    def render(value: list[dict[str, Any]]) -> None:
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
            for p in value
        ]
        print_table(
            "Training plans",
            ["Name", "Status", "Target", "Count", "Type", "Segments", "Start", "End", "Fee"],
            rows,
        )

    emit(plain(plans) if json_output() else plans, render)


@app.command("cancel")
def cancel(
    name: str,
    account: Annotated[str, typer.Option(help="The plan's account (name or id).")],
    reason: Annotated[str, typer.Option(help="Recorded, and shown to the plan's owner.")],
) -> None:
    """Cancel a plan (administrators): it fails with the reason and its remaining capacity is released."""
    with reporting_errors():
        result = native_client().post(f"/api/v1/accounts/{account}/plans/{name}/cancel", {"Reason": reason})
    emit(
        result,
        lambda r: console.print(f"{r['TrainingPlanName']}: {r['Status']}. {r['StatusMessage']}"),
    )


@app.command("events")
def events(
    name: str,
    account: Annotated[str | None, typer.Option(help="Another account's plan (administrators).")] = None,
) -> None:
    """A plan's history, oldest first."""
    with reporting_errors():
        result = native_client().get(f"/api/v1/plans/{name}/events", account=account)

    def render(value: dict[str, Any]) -> None:
        rows = [[e["At"], e["Kind"], e["Status"], e["Message"]] for e in value["Events"]]
        print_table(
            f"History of {value['TrainingPlanName']}",
            ["At (service time)", "Event", "Status", "Message"],
            rows,
        )

    emit(result, render)


@app.command("extend-search")
def extend_search(
    name: str,
    days: Annotated[int, typer.Option(help="Days to add: 1-14, then whole weeks up to 182.")],
) -> None:
    """Search for an extension of a plan: same zone and count, from its current end."""
    with reporting_sagemaker_errors():
        client = sagemaker_client()
        arn = client.describe_training_plan(TrainingPlanName=name)["TrainingPlanArn"]
        found = client.search_training_plan_offerings(TrainingPlanArn=arn, DurationHours=24 * days)
    offers = found["TrainingPlanExtensionOfferings"]

    def render(value: list[dict[str, Any]]) -> None:
        if not value:
            console.print("No extension fits: the plan's pool is booked after its end.")
        for offer in value:
            start, end = when(offer["StartDate"]), when(offer["EndDate"])
            offering = offer["TrainingPlanExtensionOfferingId"]
            console.print(
                f"{offer['AvailabilityZone']}: {start} to {end}, "
                f"{offer['UpfrontFee']} {offer['CurrencyCode']}\n"
                f"  buy with: hyperplan plans extend {name} --offering-id {offering}"
            )

    emit(plain(offers) if json_output() else offers, render)


@app.command("extend")
def extend(
    name: str,
    offering_id: Annotated[str, typer.Option(help="An id from `hyperplan plans extend-search`.")],
) -> None:
    """Buy an extension. Purchases are final."""
    with reporting_sagemaker_errors():
        result = sagemaker_client().extend_training_plan(TrainingPlanExtensionOfferingId=offering_id)
    emit(plain(result["TrainingPlanExtensions"]), _render_extensions)


@app.command("extensions")
def extensions(
    name: str,
) -> None:
    """A plan's extensions, oldest first."""
    with reporting_sagemaker_errors():
        client = sagemaker_client()
        arn = client.describe_training_plan(TrainingPlanName=name)["TrainingPlanArn"]
        pages = client.get_paginator("describe_training_plan_extension_history").paginate(TrainingPlanArn=arn)
        found = [e for page in pages for e in page["TrainingPlanExtensions"]]
    emit(plain(found), _render_extensions)


def _render_extensions(value: list[dict[str, Any]]) -> None:
    rows = [
        [
            e["StartDate"],
            e["EndDate"],
            e["Status"],
            e["PaymentStatus"],
            f"{e['UpfrontFee']} {e['CurrencyCode']}",
        ]
        for e in value
    ]
    print_table("Extensions", ["Start", "End", "Status", "Payment", "Fee"], rows)
