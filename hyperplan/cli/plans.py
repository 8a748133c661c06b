"""`hyperplan plans`: search, buy, list and show training plans, through the SageMaker API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer

from hyperplan.cli.common import (
    emit,
    json_output,
    native_client,
    plain,
    reporting_errors,
    sagemaker_client,
)
from hyperplan.cli.options import TIME_HELP, ClientTyper

app = ClientTyper(help="Training plans: search, buy, list, show.", no_args_is_help=True)


@app.command("search")
def search(
    instance_type: Annotated[
        list[str],
        typer.Option(
            help="e.g. ml.p5.48xlarge, or TYPE:COUNT (ml.p4d.24xlarge:16) for a count of its own. Repeat it "
            "to search several types at once."
        ),
    ],
    target: Annotated[str, typer.Option(help="training-job or hyperpod-cluster")],
    count: Annotated[
        int | None, typer.Option(help="Instances per segment, of every type given without :COUNT.")
    ] = None,
    days: Annotated[int | None, typer.Option(help="Duration in days.")] = None,
    hours: Annotated[int | None, typer.Option(help="Duration in hours (rounded up to whole days).")] = None,
    start_after: Annotated[
        str | None, typer.Option(help="The earliest start; default: 30 minutes from now. " + TIME_HELP)
    ] = None,
    end_before: Annotated[
        str | None, typer.Option(help="The latest end; default: 56 days from now. " + TIME_HELP)
    ] = None,
) -> None:
    """Search for offerings: at most three a type, best first (several types: fewest segments, then each
    type's own ranking, the earliest finish, the lowest price)."""
    from hyperplan.cli.times import instants

    if (days is None) == (hours is None):
        raise typer.BadParameter("give exactly one of --days or --hours")
    types = _types_and_counts(instance_type, count)
    window = instants({"--start-after": start_after, "--end-before": end_before})
    request: dict[str, Any] = {
        "DurationHours": hours if hours is not None else 24 * (days or 0),
        "TargetResources": [target],
    }
    if window["--start-after"] is not None:
        request["StartTimeAfter"] = window["--start-after"]
    if window["--end-before"] is not None:
        request["EndTimeBefore"] = window["--end-before"]
    if len(types) == 1:  # one type: SearchTrainingPlanOfferings, as any SageMaker client asks
        _search_one_type(*types[0], request)
    else:
        _search_types(types, request)


def _types_and_counts(given: list[str], count: int | None) -> list[tuple[str, int]]:
    """Each --instance-type as (type, count): its own `:COUNT`, else --count. A value that is not TYPE or
    TYPE:COUNT, a type given twice, or a type without a count is refused naming it, before any request."""
    found: list[tuple[str, int]] = []
    for value in given:
        instance_type, own = _type_and_count(value)
        if any(instance_type == seen for seen, _ in found):
            raise typer.BadParameter(f"{instance_type} is given twice", param_hint="--instance-type")
        chosen = own if own is not None else count
        if chosen is None:
            raise typer.BadParameter(
                f"{instance_type} has no count: give --count, or the type as {instance_type}:COUNT",
                param_hint="--count",
            )
        found.append((instance_type, chosen))
    return found


def _type_and_count(value: str) -> tuple[str, int | None]:
    """TYPE (None: no count of its own) or TYPE:COUNT."""
    if ":" not in value:
        return value, None
    instance_type, _, own = value.rpartition(":")
    if not instance_type or not (own.isascii() and own.isdigit() and int(own) >= 1):
        raise typer.BadParameter(
            f"{value!r} is not TYPE or TYPE:COUNT (COUNT a whole number of at least 1), such as "
            "ml.p4d.24xlarge:16",
            param_hint="--instance-type",
        )
    return instance_type, int(own)


def _search_one_type(instance_type: str, count: int, request: dict[str, Any]) -> None:
    from hyperplan.cli.views.plans import Offerings

    with reporting_errors():
        result = sagemaker_client().call(
            "SearchTrainingPlanOfferings", InstanceType=instance_type, InstanceCount=count, **request
        )
        offerings = _with_policies(result["TrainingPlanOfferings"])
    emit(plain(offerings) if json_output() else offerings, Offerings)


def _with_policies(offerings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each offering with the cancellation policy of its (first segment's) pool, as the native search
    gives it: SageMaker's answer has no member for it, so the fleet's policies are asked for once."""
    if not offerings:
        return offerings
    fleet = native_client().get("/api/v1/cancellation-policies")
    by_pool = {(p["InstanceType"], p["AvailabilityZone"]): p["CancellationPolicy"] for p in fleet["Pools"]}
    found = []
    for offering in offerings:
        first = offering["ReservedCapacityOfferings"][0]
        policy = by_pool.get((first["InstanceType"], first["AvailabilityZone"]), fleet["Default"])
        found.append({**offering, "CancellationPolicy": policy})
    return found


def _with_plan_policy(plan: dict[str, Any]) -> dict[str, Any]:
    """DescribeTrainingPlan's answer with the plan's cancellation policy (the native plan's)."""
    native = native_client().get(f"/api/v1/training-plans/{plan['TrainingPlanName']}")
    return {**plan, "CancellationPolicy": native["CancellationPolicy"]}


def _search_types(types: list[tuple[str, int]], request: dict[str, Any]) -> None:
    """Several types in one search: the native API's (docs/API.md), each offering saying its type."""
    from hyperplan.cli.times import iso
    from hyperplan.cli.views.plans import OfferingsAcross

    body = {
        "InstanceTypes": [{"InstanceType": kind, "InstanceCount": count} for kind, count in types],
        **{key: iso(value) if isinstance(value, datetime) else value for key, value in request.items()},
    }
    with reporting_errors():
        result = native_client().post("/api/v1/training-plan-offerings/search", body)
    emit(result, OfferingsAcross)


@app.command("buy")
def buy(
    name: str,
    offering_id: Annotated[str, typer.Option(help="An id from `hyperplan plans search`.")],
) -> None:
    """Buy an offering as a plan named NAME. It can be returned only as the fleet's cancellation policy
    allows (shown with the offering; under strict, the default, purchases are final)."""
    from hyperplan.cli.views.plans import PlanDetail

    with reporting_errors():
        client = sagemaker_client()
        arn = client.call("CreateTrainingPlan", TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
        plan = _with_plan_policy(client.call("DescribeTrainingPlan", TrainingPlanName=name))
    emit({"TrainingPlanArn": arn["TrainingPlanArn"]} if json_output() else plan, PlanDetail)


@app.command("show")
def show(name: str) -> None:
    """Show one plan, its reserved capacities and its cancellation policy."""
    from hyperplan.cli.views.plans import PlanDetail

    with reporting_errors():
        plan = _with_plan_policy(sagemaker_client().call("DescribeTrainingPlan", TrainingPlanName=name))
    emit(plain(plan) if json_output() else plan, PlanDetail)


@app.command("list")
def list_plans(
    status: Annotated[str | None, typer.Option(help="Only plans in this status.")] = None,
) -> None:
    """List this account's plans, earliest start first."""
    from hyperplan.cli.views.plans import PlansTable

    request: dict[str, Any] = {"Filters": [{"Name": "Status", "Value": status}]} if status else {}
    with reporting_errors():
        plans = sagemaker_client().items("ListTrainingPlans", **request)
    emit(plain(plans) if json_output() else plans, PlansTable)


@app.command("cancel")
def cancel(
    name: str,
    account: Annotated[str, typer.Option(help="The plan's account (name or id).")],
    reason: Annotated[str, typer.Option(help="Recorded, and shown to the plan's owner.")],
) -> None:
    """Cancel a plan (administrators): it fails with the reason and its remaining capacity is released."""
    from hyperplan.cli.views.plans import PlanStatus

    with reporting_errors():
        result = native_client().post(f"/api/v1/accounts/{account}/plans/{name}/cancel", {"Reason": reason})
    emit(result, PlanStatus)


@app.command("events")
def events(
    name: str,
    account: Annotated[str | None, typer.Option(help="Another account's plan (administrators).")] = None,
) -> None:
    """A plan's history, oldest first."""
    from hyperplan.cli.views.plans import PlanHistory

    with reporting_errors():
        client, path = native_client(), f"/api/v1/plans/{name}/events"
        result = client.get(path, account=account)
        while "NextCursor" in result:  # the server answers a page at a time: every page, in order
            page = client.get(path, account=account, cursor=result.pop("NextCursor"))
            result["Events"] += page["Events"]
            if "NextCursor" in page:
                result["NextCursor"] = page["NextCursor"]
    emit(result, PlanHistory)


@app.command("extend-search")
def extend_search(
    name: str,
    days: Annotated[int, typer.Option(help="Days to add: 1-14, then whole weeks up to 182.")],
) -> None:
    """Search for an extension of a plan: same zone and count, from its current end."""
    from hyperplan.cli.views.plans import ExtensionOffers

    with reporting_errors():
        client = sagemaker_client()
        arn = client.call("DescribeTrainingPlan", TrainingPlanName=name)["TrainingPlanArn"]
        found = client.call("SearchTrainingPlanOfferings", TrainingPlanArn=arn, DurationHours=24 * days)
    offers = found["TrainingPlanExtensionOfferings"]
    emit(plain(offers) if json_output() else offers, lambda o: ExtensionOffers(name, o))


@app.command("extend")
def extend(
    name: str,
    offering_id: Annotated[str, typer.Option(help="An id from `hyperplan plans extend-search`.")],
) -> None:
    """Buy an extension: part of the plan from then on, returned as its cancellation policy allows."""
    from hyperplan.cli.views.plans import ExtensionsTable

    with reporting_errors():
        result = sagemaker_client().call("ExtendTrainingPlan", TrainingPlanExtensionOfferingId=offering_id)
    emit(plain(result["TrainingPlanExtensions"]), ExtensionsTable)


@app.command("extensions")
def extensions(name: str) -> None:
    """A plan's extensions, oldest first."""
    from hyperplan.cli.views.plans import ExtensionsTable

    with reporting_errors():
        client = sagemaker_client()
        arn = client.call("DescribeTrainingPlan", TrainingPlanName=name)["TrainingPlanArn"]
        found = client.items("DescribeTrainingPlanExtensionHistory", TrainingPlanArn=arn)
    emit(plain(found), ExtensionsTable)


@app.command("auto-extend")
def auto_extend(
    name: str,
    max_days: Annotated[
        int | None, typer.Option(help="Days the policy may add in all (1-182), at the reclaim warnings.")
    ] = None,
    max_price: Annotated[
        str | None, typer.Option(help="The most one extension may cost, e.g. 5000.00.")
    ] = None,
    off: Annotated[bool, typer.Option("--off", help="Remove the plan's extension policy.")] = False,
) -> None:
    """Extend a plan by itself at its last segment's reclaim warnings (the longest extension within
    --max-price and the budget), or show its policy and attempts (no option), or remove it (--off)."""
    path = f"/api/v1/training-plans/{name}/extension-policy"
    with reporting_errors():
        client = native_client()
        if off:
            result = client.delete(path)
        elif max_days is None and max_price is None:
            result = client.get(path)
        else:
            body: dict[str, Any] = {"MaxDays": max_days}
            if max_price is not None:
                body["MaxPrice"] = max_price
            result = client.call("PUT", path, body=body)
    emit(result, _policy_lines)


def _policy_lines(result: dict[str, Any]) -> str:
    if result.get("Deleted"):
        return f"Extension policy of {result['TrainingPlanName']} removed."
    price = f", each at most {result['MaxPrice']} {result['CurrencyCode']}" if result.get("MaxPrice") else ""
    lines = [
        f"{result['TrainingPlanName']}: up to {result['MaxDays']} days in all{price}; "
        f"{result['DaysBought']} bought so far."
    ]
    lines += [f"  {a['At']}  {a['Message']}" for a in result.get("Attempts", [])]
    return "\n".join(lines)


@app.command("lending")
def lending(
    name: str,
    idle: Annotated[bool, typer.Option("--idle", help="Lend the plan's idle instances.")] = False,
    none: Annotated[bool, typer.Option("--none", help="Lend nothing (the default).")] = False,
    notice: Annotated[
        int | None,
        typer.Option(help="With --idle: seconds of notice a borrower gets."),
    ] = None,
    min_run: Annotated[
        int | None,
        typer.Option(help="With --idle: seconds a borrower runs before a younger one is reclaimed first."),
    ] = None,
    margin: Annotated[
        int | None,
        typer.Option(help="With --idle: seconds before a segment's reclaim time when lending stops."),
    ] = None,
) -> None:
    """A plan's lending of its idle instances to other accounts' managed spot training jobs: show it (no
    option; an administrator also sees each borrower's run), lend (--idle, each value left out the
    fleet's default) or stop (--none)."""
    from hyperplan.cli.views.lending import LendingDetail

    values = {"Notice": notice, "MinRun": min_run, "StopMargin": margin}
    given = {member: value for member, value in values.items() if value is not None}
    if idle and none:
        raise typer.BadParameter("give --idle or --none, not both")
    if given and not idle:
        raise typer.BadParameter("--notice, --min-run and --margin go with --idle")
    path = f"/api/v1/training-plans/{name}/lending"
    with reporting_errors():
        client = native_client()
        if none:
            result = client.delete(path)
        elif idle:
            result = client.call("PUT", path, body=given)
        else:
            result = client.get(path)
    emit(result, LendingDetail)


@app.command("quote-return")
def quote_return(
    name: str,
    segment: Annotated[
        int | None, typer.Option(help="Return this segment (its number: rc1 is 1); none: the whole plan.")
    ] = None,
    instances: Annotated[
        int | None, typer.Option(help="With --segment: return this many of its instances.")
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="With --segment: return its tail from this 11:30 UTC boundary, or `next` (the first "
            "boundary ahead). " + TIME_HELP,
        ),
    ] = None,
) -> None:
    """Ask what returning part of a plan (or all of it) would give back and refund now, under its
    cancellation policy; carry it out with `hyperplan plans return --quote ID` while the quote is valid."""
    if segment is None and (instances is not None or from_ is not None):
        raise typer.BadParameter("--instances and --from go with --segment")
    if instances is not None and from_ is not None:
        raise typer.BadParameter("give --instances or --from, not both")
    body: dict[str, Any] = {}
    if segment is not None:
        body["Segment"] = segment
    if instances is not None:
        body["Instances"] = instances
    if from_ is not None:
        body["From"] = from_ if from_ == "next" else _boundary(from_)
    with reporting_errors():
        result = native_client().post(f"/api/v1/training-plans/{name}/return-quotes", body)
    emit(result, _quote_lines)


def _boundary(text: str) -> str:
    from hyperplan.cli.times import iso_instants

    when = iso_instants({"--from": text})["--from"]
    assert when is not None  # given
    return when


@app.command("return")
def return_plan(
    quote: Annotated[str, typer.Option(help="A quote's id, from `hyperplan plans quote-return`.")],
) -> None:
    """Carry out a return quote: the capacity goes back to the fleet and the refund is paid as quoted;
    refused when the quote expired, was used, or the plan changed since (ask for a new one)."""
    with reporting_errors():
        result = native_client().post(f"/api/v1/return-quotes/{quote}/return", {})
    emit(result, _return_lines)


def _quote_lines(result: dict[str, Any]) -> str:
    lines = [
        f"Quote {result['QuoteId']} for {result['TrainingPlanName']}, valid until {result['ValidUntil']}:",
        *_returned_lines(result),
        f"  refund: {result['Refund']} {result['CurrencyCode']}",
        f"  policy: {result['Policy']['Description']}",
        f"Carry it out with: hyperplan plans return --quote {result['QuoteId']}",
    ]
    return "\n".join(lines)


def _return_lines(result: dict[str, Any]) -> str:
    lines = [
        f"{result['TrainingPlanName']} ({result['Status']}): returned as quoted in {result['QuoteId']}.",
        *_returned_lines(result),
        f"  refund: {result['Refund']} {result['CurrencyCode']} ({result['RefundSettled']})",
    ]
    return "\n".join(lines)


def _returned_lines(result: dict[str, Any]) -> list[str]:
    lines = ["  returned:"]
    lines += [
        f"    {w['InstanceCount']} x {w['InstanceType']} in {w['AvailabilityZone']}, "
        f"{w['StartTime']} to {w['EndTime']}"
        for w in result["Returned"]
    ]
    lines.append("  segments after:" if result["Segments"] else "  segments after: none")
    lines += [
        f"    {s['ReservedCapacityArn'].rpartition('-')[2]}: {s['InstanceCount']} x {s['InstanceType']} in "
        f"{s['AvailabilityZone']}, {s['StartTime']} to {s['EndTime']}"
        for s in result["Segments"]
    ]
    return lines
