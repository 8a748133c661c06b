"""Native routes for a plan's extension policy: set (PUT), read (GET), remove (DELETE).

docs/API.md documents them. The plan is the caller's, by name or ARN; the rules live in
hyperplan.services.plans.extension_policy (and the choice in core/reclaim_warnings.py).
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.errors import ResourceNotFound
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.plans import extension_policy, payments
from hyperplan.services.plans.extension_policy import PolicyView

PATH = "/api/v1/training-plans/{plan}/extension-policy"


def _policy_json(view: PolicyView) -> dict[str, Any]:
    return {
        "TrainingPlanName": view.plan_name,
        "MaxDays": view.max_days,
        "MaxPrice": str(view.max_price) if view.max_price is not None else None,
        "CurrencyCode": view.currency,
        "DaysBought": view.days_bought,
        "Attempts": [{"At": a.at, "Bought": a.bought, "Message": a.message} for a in view.attempts],
    }


def set_policy(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    max_days = fields.whole(body, "MaxDays", 1, extension_policy.MAX_POLICY_DAYS, required=True)
    assert max_days is not None  # required
    currency = payments.fleet_currency(request.runtime.fleet)
    max_price = fields.money(
        body,
        "MaxPrice",
        maximum=payments.MAX_BUDGET,
        places=payments.currency_places(currency),
        currency=currency,
    )
    view = extension_policy.set_policy(
        request.runtime, request.caller, request.path["plan"], max_days, max_price
    )
    return _policy_json(view)


def get_policy(request: NativeRequest) -> dict[str, Any]:
    plan = request.path["plan"]
    view = extension_policy.get_policy(request.runtime, request.caller, plan)
    if view is None:
        raise ResourceNotFound(f"Training plan {plan} has no extension policy.")
    return _policy_json(view)


def clear_policy(request: NativeRequest) -> dict[str, Any]:
    extension_policy.clear_policy(request.runtime, request.caller, request.path["plan"])
    return {"TrainingPlanName": request.path["plan"], "Deleted": True}


def routes() -> list[Route]:
    return [
        NativeRoute("PUT", PATH, set_policy, body=("MaxDays", "MaxPrice")),
        NativeRoute("GET", PATH, get_policy),
        NativeRoute("DELETE", PATH, clear_policy),
    ]
