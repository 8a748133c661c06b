"""The native route of one search across instance types (docs/API.md, "Searching several instance
types"): SearchTrainingPlanOfferings' search for up to eight types at once, each with its own count.

Each offering is answered as SearchTrainingPlanOfferings answers it, plus the type and count it is
for and the cancellation policy of its pool (`CancellationPolicy`: docs/RETURNS.md); its id is the same
signed id CreateTrainingPlan takes. Handlers translate; the order and the
rules live in hyperplan/core/search_across.py and hyperplan.services.plans.plans.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from starlette.routing import Route

from hyperplan.clock import parse_instant
from hyperplan.core.cancellation_words import policy_for, policy_json
from hyperplan.core.jsonable import jsonable, zulu_time
from hyperplan.core.page_bytes import fitting, utf8_bytes
from hyperplan.core.rate_limits import RequestClass
from hyperplan.core.search_across import MAX_TYPES
from hyperplan.core.search_request import SearchRequest
from hyperplan.errors import ValidationError
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.plans import plans
from hyperplan.services.plans.plans import SignedOffering
from hyperplan.wire.ops.plans import offering_json as wire_offering

BODY = (
    "InstanceTypes",
    "InstanceCount",
    "DurationHours",
    "TargetResources",
    "StartTimeAfter",
    "EndTimeBefore",
)
MAX_TYPE_LENGTH = 64  # instance type names are ~20 characters; AWS's longest is under 30
MAX_COUNT = 1_000_000  # the fleet's own rules (allowed counts, pool sizes) refuse far less, by name
MAX_DURATION_HOURS = 87_600  # the wire model's bound for DurationHours; the fleet's is checked after
# Epoch seconds from 1970 to the last second of the year 9999, the range of an ISO 8601 time.
LAST_EPOCH_SECOND = 253_402_300_799


def search_offerings(request: NativeRequest) -> dict[str, Any]:
    found = plans.search_across(request.runtime, request.caller, search_requests(request.body))
    answered = [_offering_json(request, signed) for signed in found]
    kept = fitting(utf8_bytes(json.dumps(item)) for item in answered)
    return {"TrainingPlanOfferings": answered[:kept], "Truncated": kept < len(answered)}


def _offering_json(request: NativeRequest, signed: SignedOffering) -> dict[str, Any]:
    """One offering as SearchTrainingPlanOfferings answers it (its times as the native API writes
    them), plus the type and count it was searched for, each segment's price multiplier (of the pool's
    list price: load-based prices and resale discounts, core/pricing.py) and what a return of it would
    refund: the policy of its (first segment's) pool, which a plan bought from it keeps."""
    searched = {"InstanceType": signed.request.instance_type, "InstanceCount": signed.request.instance_count}
    policy = policy_for(request.runtime.fleet, signed.offering.segments[0].pool_key)
    multipliers = [format(segment.multiplier.normalize(), "f") for segment in signed.offering.segments]
    added = {**searched, "PriceMultipliers": multipliers, "CancellationPolicy": policy_json(policy)}
    result: dict[str, Any] = jsonable({**wire_offering(request.runtime, signed), **added}, zulu_time)
    return result


# -- the request ---------------------------------------------------------------------------------------


def search_requests(body: Mapping[str, Any]) -> list[SearchRequest]:
    """One SearchRequest per type asked for, in the order given; each refusal names the member."""
    default_count = fields.whole(body, "InstanceCount", 1, MAX_COUNT)
    duration = fields.whole(body, "DurationHours", 1, MAX_DURATION_HOURS, required=True)
    assert duration is not None
    target = _target(body)
    start_after = _instant(body, "StartTimeAfter")
    end_before = _instant(body, "EndTimeBefore")
    return [
        SearchRequest(instance_type, count, duration, target, start_after, end_before)
        for instance_type, count in _types(body, default_count)
    ]


def _types(body: Mapping[str, Any], default_count: int | None) -> list[tuple[str, int]]:
    given = body.get("InstanceTypes")
    rule = (
        f'InstanceTypes must be a list of 1 to {MAX_TYPES} objects {{"InstanceType", "InstanceCount"?}}, '
        "each type given once"
    )
    if not isinstance(given, list) or not 1 <= len(given) <= MAX_TYPES:
        held = f"; it holds {len(given)}" if isinstance(given, list) else ""
        raise ValidationError(f"{rule}{held}.")
    found: list[tuple[str, int]] = []
    for index, item in enumerate(given):
        where = f"InstanceTypes[{index}]"
        if not isinstance(item, dict):
            raise ValidationError(f"{rule}; {where} is not an object.")
        fields.only_members(item, ("InstanceType", "InstanceCount"), where)
        instance_type = _instance_type(item, where)
        if any(instance_type == seen for seen, _ in found):
            raise ValidationError(
                f"{where}.InstanceType: {instance_type} is given twice; give each type once."
            )
        found.append((instance_type, _count(item, where, default_count)))
    return found


def _instance_type(item: Mapping[str, Any], where: str) -> str:
    value = item.get("InstanceType")
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_TYPE_LENGTH:
        raise ValidationError(
            f"{where}.InstanceType is required: a string of 1 to {MAX_TYPE_LENGTH} characters."
        )
    return value


def _count(item: Mapping[str, Any], where: str, default_count: int | None) -> int:
    count = fields.whole(item, "InstanceCount", 1, MAX_COUNT, within=where)
    if count is not None:
        return count
    if default_count is None:
        raise ValidationError(
            f"{where}.InstanceCount is required when the body has no InstanceCount for every type."
        )
    return default_count


def _target(body: Mapping[str, Any]) -> str:
    targets = body.get("TargetResources")
    rule = 'TargetResources must be a list of one target, ["training-job"] or ["hyperpod-cluster"]'
    if not isinstance(targets, list):
        raise ValidationError(f"{rule}.")
    if len(targets) != 1:
        raise ValidationError(f"{rule}; it holds {len(targets)}.")
    if not isinstance(targets[0], str) or not 1 <= len(targets[0]) <= MAX_TYPE_LENGTH:
        raise ValidationError(f"{rule}; TargetResources[0] is not a target's name.")
    return targets[0]


def _instant(body: Mapping[str, Any], name: str) -> datetime | None:
    """An ISO 8601 time with a zone, or epoch seconds (what boto3 sends on the wire)."""
    value = body.get(name)
    if value is None:
        return None
    rule = (
        f"{name} must be an ISO 8601 time with a zone (2026-12-01T11:30:00Z) or seconds since the epoch "
        f"from 0 to {LAST_EPOCH_SECOND}"
    )
    if isinstance(value, str) and len(value) <= fields.MAX_TEXT_LENGTH:
        try:
            return parse_instant(value)
        except ValidationError as refusal:
            raise ValidationError(f"{name}: {refusal.message}") from None
    if isinstance(value, int | Decimal) and not isinstance(value, bool) and 0 <= value <= LAST_EPOCH_SECOND:
        return datetime.fromtimestamp(float(value), UTC)
    raise ValidationError(f"{rule}, not {_shown(value)}.")


def _shown(value: Any) -> str:
    """A refused value as the message shows it: short (a long string is said by its length)."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    shown = str(value) if isinstance(value, Decimal) else json.dumps(value, default=str)
    return shown if len(shown) <= 64 else shown[:61] + "..."


def routes() -> list[Route]:
    return [
        NativeRoute(
            "POST",
            "/api/v1/training-plan-offerings/search",
            search_offerings,
            body=BODY,
            limited_as=RequestClass.SEARCH,  # as SearchTrainingPlanOfferings is, however many types
        ),
    ]
