"""SageMaker training-plan operations: wire names in, service calls, wire names out."""

from __future__ import annotations

from typing import Any

from hyperplan.core.offerings import Offering, Segment
from hyperplan.core.paging import paginate
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ValidationError
from hyperplan.services.plans import extensions, plan_views, plans, tags
from hyperplan.services.plans.plan_views import ExtensionView, PlanView, SegmentView
from hyperplan.services.plans.plans import ListQuery, SignedOffering
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire.operations import RequestContext, operation
from hyperplan.wire.ops.tags import tags_of


@operation("SearchTrainingPlanOfferings")
def search_training_plan_offerings(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    _refuse_unserved_modes(request)
    if "TrainingPlanArn" in request:
        return _search_extensions(ctx, request)
    for member in ("InstanceType", "InstanceCount", "DurationHours", "TargetResources"):
        if member not in request:
            raise ValidationError(f"{member} is required to search for a new training plan.")
    targets = request["TargetResources"]
    if len(targets) != 1:
        raise ValidationError(f"TargetResources must hold exactly one target; it holds {len(targets)}.")
    search = SearchRequest(
        instance_type=request["InstanceType"],
        instance_count=request["InstanceCount"],
        duration_hours=request["DurationHours"],
        target=targets[0],
        start_after=request.get("StartTimeAfter"),
        end_before=request.get("EndTimeBefore"),
    )
    found = plans.search(ctx.runtime, ctx.caller, search)
    return {"TrainingPlanOfferings": [offering_json(ctx.runtime, signed) for signed in found]}


def _refuse_unserved_modes(request: dict[str, Any]) -> None:
    if "UltraServerType" in request or "UltraServerCount" in request:
        raise ValidationError("UltraServerType/UltraServerCount: this fleet declares no UltraServers.")


def _search_extensions(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if "DurationHours" not in request:
        raise ValidationError("DurationHours is required to search for extension offerings.")
    for member in ("InstanceType", "InstanceCount", "TargetResources", "StartTimeAfter", "EndTimeBefore"):
        if member in request:
            raise ValidationError(
                f"{member}: an extension keeps the plan's instance type, count, target and zone and starts "
                "at"
                " its end; send only TrainingPlanArn and DurationHours."
            )
    found = extensions.search(ctx.runtime, ctx.caller, request["TrainingPlanArn"], request["DurationHours"])
    return {
        "TrainingPlanOfferings": [],
        "TrainingPlanExtensionOfferings": [
            {
                "TrainingPlanExtensionOfferingId": offer.offering_id,
                "AvailabilityZone": offer.availability_zone,
                "StartDate": offer.start,
                "EndDate": offer.end,
                "DurationHours": offer.duration_hours,
                "UpfrontFee": str(offer.fee),
                "CurrencyCode": offer.currency,
            }
            for offer in found
        ],
    }


@operation("ExtendTrainingPlan")
def extend_training_plan(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    arn = extensions.extend(ctx.runtime, ctx.caller, request["TrainingPlanExtensionOfferingId"])
    _, found = plan_views.extension_history(ctx.runtime, ctx.caller, arn)
    return {"TrainingPlanExtensions": _extension_views(ctx, found)}


@operation("DescribeTrainingPlanExtensionHistory")
def describe_training_plan_extension_history(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    name, found = plan_views.extension_history(ctx.runtime, ctx.caller, request["TrainingPlanArn"])
    views = _extension_views(ctx, found)
    page, token = paginate(views, request.get("MaxResults", 100), request.get("NextToken"), name)
    result: dict[str, Any] = {"TrainingPlanExtensions": page}
    if token:
        result["NextToken"] = token
    return result


def _extension_views(ctx: RequestContext, found: list[ExtensionView]) -> list[dict[str, Any]]:
    views = []
    for extension in found:
        zone = ctx.runtime.fleet.zone(extension.availability_zone)
        views.append(
            {
                "TrainingPlanExtensionOfferingId": extension.offering_id,
                "ExtendedAt": extension.extended_at,
                "StartDate": extension.start,
                "EndDate": extension.end,
                "Status": extension.status,
                "PaymentStatus": extension.payment_status,
                "AvailabilityZone": extension.availability_zone,
                "AvailabilityZoneId": zone.zone_id if zone else None,
                "DurationHours": int((extension.end - extension.start).total_seconds() // 3600),
                "UpfrontFee": str(extension.upfront_fee),
                "CurrencyCode": extension.currency,
            }
        )
    return views


def offering_json(runtime: ServiceContext, signed: SignedOffering) -> dict[str, Any]:
    offering: Offering = signed.offering
    hours, minutes = offering.duration_hours_minutes
    result: dict[str, Any] = {
        "TrainingPlanOfferingId": signed.offering_id,
        "TargetResources": [offering.target],
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "UpfrontFee": str(offering.upfront_fee),
        "CurrencyCode": offering.currency,
        "ReservedCapacityOfferings": [_segment(segment) for segment in offering.segments],
    }
    if signed.request.start_after is not None:
        result["RequestedStartTimeAfter"] = signed.request.start_after
    if signed.request.end_before is not None:
        result["RequestedEndTimeBefore"] = signed.request.end_before
    return result


def _segment(segment: Segment) -> dict[str, Any]:
    hours, minutes = segment.duration_hours_minutes
    instance_type, zone = segment.pool_key
    return {
        "ReservedCapacityType": "Instance",
        "InstanceType": instance_type,
        "InstanceCount": segment.count,
        "AvailabilityZone": zone,
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "StartTime": segment.start,
        "EndTime": segment.end,
    }


@operation("CreateTrainingPlan")
def create_training_plan(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    name, offering = request["TrainingPlanName"], request["TrainingPlanOfferingId"]
    given = tags_of(request)
    tags.check(given)
    # The tags are written in the purchase's own transaction: a plan is never bought untagged.
    return {"TrainingPlanArn": plans.create(ctx.runtime, ctx.caller, name, offering, given)}


@operation("DescribeTrainingPlan")
def describe_training_plan(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    plan = plan_views.describe(ctx.runtime, ctx.caller, request["TrainingPlanName"])
    view = plan_view(ctx.runtime, plan)
    view["UnhealthyInstanceCount"] = plan.counters.unhealthy
    return view


@operation("ListTrainingPlans")
def list_training_plans(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    statuses = [f["Value"] for f in request.get("Filters", []) if f["Name"] == "Status"]
    if len(set(statuses)) > 1:
        raise ValidationError("Filters: give at most one Status value.")
    query = ListQuery(
        status=statuses[0] if statuses else None,
        start_after=request.get("StartTimeAfter"),
        start_before=request.get("StartTimeBefore"),
        sort_by=request.get("SortBy", "StartTime"),
        sort_order=request.get("SortOrder", "Ascending"),
        max_results=request.get("MaxResults", 100),
        next_token=request.get("NextToken"),
    )
    rows, token = plan_views.list_plans(ctx.runtime, ctx.caller, query)
    summaries = [plan_view(ctx.runtime, plan) for plan in rows]
    result: dict[str, Any] = {"TrainingPlanSummaries": summaries}
    if token:
        result["NextToken"] = token
    return result


@operation("DescribeReservedCapacity")
def describe_reserved_capacity(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    rc, used = plan_views.reserved_capacity(ctx.runtime, ctx.caller, request["ReservedCapacityArn"])
    view = rc_view(ctx.runtime, rc)
    view.pop("AvailabilityZoneId", None)  # not a member of DescribeReservedCapacity's output
    view["InUseInstanceCount"] = used
    view["AvailableInstanceCount"] = max(rc.count - used, 0) if rc.holds_capacity else 0
    return view


# -- views --------------------------------------------------------------------------------------------


def _hours_minutes(total_seconds: float) -> tuple[int, int]:
    minutes = int(total_seconds // 60)
    return minutes // 60, minutes % 60


def rc_view(runtime: ServiceContext, rc: SegmentView) -> dict[str, Any]:
    hours, minutes = _hours_minutes((rc.end - rc.start).total_seconds())
    zone = runtime.fleet.zone(rc.availability_zone)
    return {
        "ReservedCapacityArn": rc.arn,
        "ReservedCapacityType": "Instance",
        "InstanceType": rc.instance_type,
        "TotalInstanceCount": rc.count,
        "Status": rc.status,
        "AvailabilityZone": rc.availability_zone,
        "AvailabilityZoneId": zone.zone_id if zone else None,
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "StartTime": rc.start,
        "EndTime": rc.end,
    }


def plan_view(runtime: ServiceContext, plan: PlanView) -> dict[str, Any]:
    rcs = plan.segments
    hours, minutes = _hours_minutes(sum((rc.end - rc.start).total_seconds() for rc in rcs))
    counters = plan.counters
    return {
        "TrainingPlanArn": plan.arn,
        "TrainingPlanName": plan.name,
        "Status": plan.status,
        "StatusMessage": plan.status_message,
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "StartTime": rcs[0].start,
        "EndTime": rcs[-1].end,
        "UpfrontFee": str(plan.upfront_fee),
        "CurrencyCode": plan.currency,
        "TotalInstanceCount": counters.total,
        "AvailableInstanceCount": counters.available,
        "InUseInstanceCount": counters.in_use,
        "TargetResources": [plan.target],
        "ReservedCapacitySummaries": [rc_view(runtime, rc) for rc in rcs],
    }
