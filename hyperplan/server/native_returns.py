"""Native routes for returning a plan's capacity: quote a return, then carry the quote out.

docs/API.md documents them. The plan is the caller's, by name or ARN (an administrator's by any
account's ARN); the rules live in hyperplan.services.plans.returns and hyperplan.core.returns. The body
names the scope: nothing (the whole plan), `Segment` (that segment), `Segment` and `Instances` (K of
its instances), `Segment` and `From` (its tail from a boundary, or "next": the first one ahead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from starlette.routing import Route

from hyperplan.clock import parse_instant
from hyperplan.core.cancellation_words import policy_json
from hyperplan.core.returns import Scope, Segment, Window
from hyperplan.errors import ResourceNotFound, ValidationError
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.plans import returns
from hyperplan.services.runtime.context import ServiceContext

QUOTES = "/api/v1/training-plans/{plan}/return-quotes"
RETURN = "/api/v1/return-quotes/{quote}/return"
MAX_QUOTE_ID = 40  # "rq-" and 32 hex digits fit; anything longer names no quote
NEXT_BOUNDARY = "next"


def scope_of(body: Mapping[str, Any]) -> Scope:
    """The scope a body names; a ValidationError names the member that does not fit."""
    segment = fields.whole(body, "Segment", 1, fields.MAX_ROW_ID)
    instances = fields.whole(body, "Instances", 1, fields.MAX_ROW_ID)
    start_text = fields.text(body, "From", required=False, max_length=64)
    if segment is None:
        if instances is not None or start_text is not None:
            raise ValidationError("Segment is required with Instances or From: name the segment they are of.")
        return Scope("plan")
    if instances is not None and start_text is not None:
        raise ValidationError("Give Instances or From, not both: a return is K instances or a tail.")
    if instances is not None:
        return Scope("instances", ordinal=segment, instances=instances)
    if start_text is None:
        return Scope("segment", ordinal=segment)
    if start_text == NEXT_BOUNDARY:
        return Scope("tail", ordinal=segment)
    try:
        start = parse_instant(start_text)
    except ValidationError as refusal:
        raise ValidationError(f'From: {refusal.message} Or "{NEXT_BOUNDARY}": the next boundary.') from None
    return Scope("tail", ordinal=segment, start=start)


def windows_json(windows: Sequence[Window]) -> list[dict[str, Any]]:
    return [
        {
            "InstanceType": w.instance_type,
            "AvailabilityZone": w.availability_zone,
            "StartTime": w.start,
            "EndTime": w.end,
            "InstanceCount": w.count,
        }
        for w in windows
    ]


def segments_json(
    runtime: ServiceContext, account_id: str, plan: str, segments: Sequence[Segment]
) -> list[dict[str, Any]]:
    return [
        {
            "ReservedCapacityArn": runtime.arn(account_id, f"reserved-capacity/{plan}-rc{s.ordinal}"),
            "InstanceType": s.instance_type,
            "AvailabilityZone": s.availability_zone,
            "StartTime": s.start,
            "EndTime": s.end,
            "InstanceCount": s.count,
        }
        for s in segments
    ]


def quote(request: NativeRequest) -> dict[str, Any]:
    scope = scope_of(request.body)
    view = returns.quote(request.runtime, request.caller, request.path["plan"], scope)
    return {
        "QuoteId": view.quote_id,
        "TrainingPlanName": view.plan_name,
        "ValidUntil": view.valid_until,
        "Returned": windows_json(view.returned),
        "Segments": segments_json(request.runtime, view.account_id, view.plan_name, view.segments),
        "Refund": str(view.refund),
        "CurrencyCode": view.currency,
        "Policy": policy_json(view.policy),
    }


def carry_out(request: NativeRequest) -> dict[str, Any]:
    quote_id = request.path["quote"]
    if len(quote_id) > MAX_QUOTE_ID:
        raise ResourceNotFound(f"Return quote {quote_id[:MAX_QUOTE_ID]}... does not exist.")
    view = returns.carry_out(request.runtime, request.caller, quote_id)
    return {
        "QuoteId": view.quote_id,
        "TrainingPlanName": view.plan_name,
        "Status": view.plan_status,
        "Returned": windows_json(view.returned),
        "Segments": segments_json(request.runtime, view.account_id, view.plan_name, view.segments),
        "Refund": str(view.refund),
        "CurrencyCode": view.currency,
        "RefundSettled": view.settled,
    }


def routes() -> list[Route]:
    return [
        NativeRoute("POST", QUOTES, quote, body=("Segment", "Instances", "From")),
        NativeRoute("POST", RETURN, carry_out),
    ]
