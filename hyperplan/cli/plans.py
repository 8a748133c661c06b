"""`hyperplan plans`: search, buy, list and show training plans, through the SageMaker API."""

from __future__ import annotations

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
    instance_type: Annotated[str, typer.Option(help="e.g. ml.p5.48xlarge")],
    count: Annotated[int, typer.Option(help="Instances per segment.")],
    target: Annotated[str, typer.Option(help="training-job or hyperpod-cluster")],
    days: Annotated[int | None, typer.Option(help="Duration in days.")] = None,
    hours: Annotated[int | None, typer.Option(help="Duration in hours (rounded up to whole days).")] = None,
    start_after: Annotated[
        str | None, typer.Option(help="The earliest start; default: 30 minutes from now. " + TIME_HELP)
    ] = None,
    end_before: Annotated[
        str | None, typer.Option(help="The latest end; default: 56 days from now. " + TIME_HELP)
    ] = None,
) -> None:
    """Search for offerings: at most three, best first."""
    from hyperplan.cli.times import instants
    from hyperplan.cli.views.plans import Offerings

    if (days is None) == (hours is None):
        raise typer.BadParameter("give exactly one of --days or --hours")
    window = instants({"--start-after": start_after, "--end-before": end_before})
    request: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": count,
        "DurationHours": hours if hours is not None else 24 * (days or 0),
        "TargetResources": [target],
    }
    if window["--start-after"] is not None:
        request["StartTimeAfter"] = window["--start-after"]
    if window["--end-before"] is not None:
        request["EndTimeBefore"] = window["--end-before"]
    with reporting_errors():
        result = sagemaker_client().call("SearchTrainingPlanOfferings", **request)
    emit(
        plain(result["TrainingPlanOfferings"]) if json_output() else result["TrainingPlanOfferings"],
        Offerings,
    )


@app.command("buy")
def buy(
    name: str,
    offering_id: Annotated[str, typer.Option(help="An id from `hyperplan plans search`.")],
) -> None:
    """Buy an offering as a plan named NAME. Purchases are final."""
    from hyperplan.cli.views.plans import PlanDetail

    with reporting_errors():
        client = sagemaker_client()
        arn = client.call("CreateTrainingPlan", TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
        plan = client.call("DescribeTrainingPlan", TrainingPlanName=name)
    emit({"TrainingPlanArn": arn["TrainingPlanArn"]} if json_output() else plan, PlanDetail)


@app.command("show")
def show(name: str) -> None:
    """Show one plan and its reserved capacities."""
    from hyperplan.cli.views.plans import PlanDetail

    with reporting_errors():
        plan = sagemaker_client().call("DescribeTrainingPlan", TrainingPlanName=name)
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
    """Buy an extension. Purchases are final."""
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
