"""Native routes for operating the fleet (docs/OPERATIONS.md): the audit trail (read only: nothing in
the API changes a record), drain and resume, and usage (per account, pool and day, or per account and
month: the monthly books)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from starlette.routing import Route

from hyperplan.clock import parse_instant
from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.accounts.audit import AuditView
from hyperplan.services.orchestration import audit_views, drain
from hyperplan.services.plans import usage
from hyperplan.services.plans.payments import fleet_currency
from hyperplan.services.runtime.drain_state import DrainState


def _audit_json(view: AuditView) -> dict[str, Any]:
    return {
        "Id": view.id,
        "At": view.at,
        "WallTime": view.wall_at,
        "Action": view.action,
        "Actor": {
            "AccountName": view.actor_account_name,
            "UserName": view.actor_user_name,
            "AccessKeyId": view.access_key_id,
        }
        if view.actor_account_name
        else None,
        "RemoteAddress": view.remote_address,
        "AccountId": view.account_id,
        "AccountName": view.account_name,
        "Target": view.target,
        "Detail": dict(view.detail),
    }


def list_audit(request: NativeRequest) -> dict[str, Any]:
    since_text = fields.query_text(request.query, "since", max_length=64)
    since = parse_instant(since_text) if since_text else None
    account = fields.query_text(request.query, "account", max_length=64)
    before = fields.query_whole(request.query, "before", 1, fields.MAX_ROW_ID)
    page = audit_views.list_events(request.runtime, since, account or None, before)
    return {"Events": [_audit_json(view) for view in page.events], "Truncated": page.truncated}


def _drain_json(state: DrainState) -> dict[str, Any]:
    return {
        "Draining": state.draining,
        "Since": state.since,
        "StopRunning": state.stop_running,
        "By": state.by,
    }


def show_drain(request: NativeRequest) -> dict[str, Any]:
    return _drain_json(drain.show(request.runtime))


def start_drain(request: NativeRequest) -> dict[str, Any]:
    stop_running = bool(fields.boolean(request.body, "StopRunning"))
    return _drain_json(drain.drain(request.runtime, request.caller, stop_running=stop_running))


def resume(request: NativeRequest) -> dict[str, Any]:
    return _drain_json(drain.resume(request.runtime, request.caller))


def _usage_window(request: NativeRequest) -> dict[str, datetime | None]:
    """The report's `from` and `to` query values, as instants (None: the report's default)."""
    instants = {}
    for name in ("from", "to"):
        text = fields.query_text(request.query, name, max_length=64)
        instants[name] = parse_instant(text) if text else None
    return instants


def show_usage(request: NativeRequest) -> dict[str, Any]:
    query = request.query
    instants = _usage_window(request)
    rows = usage.usage(
        request.runtime,
        request.caller,
        account_ref=fields.query_text(query, "account", max_length=64) or None,
        start=instants["from"],
        end=instants["to"],
        tag_key=fields.query_text(query, "tag", max_length=128) or None,
    )
    return {
        "Usage": [
            {
                "Account": row.account,
                **({"TagValue": row.tag_value} if row.tag_value is not None else {}),
                "InstanceType": row.instance_type,
                "AvailabilityZone": row.zone,
                "Day": row.day.isoformat(),
                "ReservedInstanceHours": row.reserved_instance_hours,
                "PlanUsedInstanceHours": row.plan_used_instance_hours,
                "OnDemandInstanceHours": row.on_demand_instance_hours,
                "UsedInstanceHours": row.used_instance_hours,
                "LentInstanceHours": row.lent_instance_hours,
                "SpotInstanceHours": row.spot_instance_hours,
                "SpotCharged": str(row.spot_charged),  # money as a decimal string, never a float
                "LendingCredited": str(row.lending_credited),
                "ReturnedInstanceHours": row.returned_instance_hours,
                "Refunded": str(row.refunded),
                "ResaleCredited": str(row.resale_credited),
            }
            for row in rows
        ]
    }


def show_monthly_usage(request: NativeRequest) -> dict[str, Any]:
    """The monthly books: per account and calendar month, the same scoping as /api/v1/usage."""
    instants = _usage_window(request)
    rows = usage.monthly_usage(
        request.runtime,
        request.caller,
        account_ref=fields.query_text(request.query, "account", max_length=64) or None,
        start=instants["from"],
        end=instants["to"],
    )
    return {
        "Currency": fleet_currency(request.runtime.fleet),
        "Months": [
            {
                "Account": row.account,
                "Month": row.month,
                "ReservedInstanceHours": row.reserved_instance_hours,
                "PlanUsedInstanceHours": row.plan_used_instance_hours,
                "IdleInstanceHours": row.idle_instance_hours,
                "LentInstanceHours": row.lent_instance_hours,
                "ReturnedInstanceHours": row.returned_instance_hours,
                "Paid": str(row.paid),  # money as a decimal string, never a float
                "Refunded": str(row.refunded),
                "Credited": str(row.credited),
                "NetCost": str(row.net_cost),
            }
            for row in rows
        ],
    }


def routes() -> list[Route]:
    return [
        NativeRoute("GET", "/api/v1/audit", list_audit, admin=True, query=("since", "account", "before")),
        NativeRoute("GET", "/api/v1/drain", show_drain, admin=True),
        NativeRoute("POST", "/api/v1/drain", start_drain, admin=True, body=("StopRunning",)),
        NativeRoute("POST", "/api/v1/resume", resume, admin=True),
        NativeRoute("GET", "/api/v1/usage", show_usage, query=("account", "from", "to", "tag")),
        NativeRoute("GET", "/api/v1/usage/monthly", show_monthly_usage, query=("account", "from", "to")),
    ]
