"""The native API under /api/v1/: what the SageMaker API has no words for.

JSON in and out, signed with SigV4 like the SageMaker API, errors as {"Error": {"Code", "Message"}}.
docs/API.md documents every route. Handlers here translate; the rules live in hyperplan.services.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hyperplan.clock import utcnow
from hyperplan.errors import AccessDenied, SerializationError, ValidationError
from hyperplan.runtime import Runtime
from hyperplan.server.auth import authenticate, require_admin
from hyperplan.server.errors import native_error_response
from hyperplan.services import accounts, clusters, payments, plans, quotas
from hyperplan.services import clock as clock_service
from hyperplan.services import fleet as fleet_service
from hyperplan.services.accounts import Caller, NewKey
from hyperplan.store.schema import TrainingPlan


@dataclass(frozen=True)
class NativeRequest:
    runtime: Runtime
    caller: Caller
    body: Mapping[str, Any]
    path: Mapping[str, str]
    query: Mapping[str, str]


NativeHandler = Callable[[NativeRequest], Any]


def endpoint(handler: NativeHandler, *, admin: bool = False) -> Callable[[Request], Any]:
    async def serve(request: Request) -> Response:
        request_id = str(uuid.uuid4())
        runtime: Runtime = request.app.state.runtime
        try:
            raw = await request.body()
            caller = await run_in_threadpool(authenticate, runtime, request, raw)
            if admin:
                require_admin(caller)
            native = NativeRequest(
                runtime, caller, _json_object(raw), dict(request.path_params), dict(request.query_params)
            )
            result = await run_in_threadpool(handler, native)
        except Exception as exc:
            return native_error_response(exc, request_id)
        return JSONResponse(_jsonable(result), headers={"x-amzn-RequestId": request_id})

    return serve


def _json_object(raw: bytes) -> Mapping[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerializationError(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise SerializationError("The request body must be a JSON object.")
    return body


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if hasattr(value, "as_integer_ratio") and not isinstance(value, int | float | bool):
        return str(value)  # Decimal money stays exact
    return value


def field(body: Mapping[str, Any], name: str, kind: type, *, required: bool = True) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise ValidationError(f"{name} is required.")
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValidationError(f"{name} must be a {kind.__name__}.")
    return value


# -- identity and accounts ------------------------------------------------------------------------


def whoami(request: NativeRequest) -> dict[str, Any]:
    caller = request.caller
    return {
        "AccountId": caller.account_id,
        "AccountName": caller.account_name,
        "Admin": caller.is_admin,
        "AccessKeyId": caller.access_key_id,
    }


def _key_json(key: NewKey) -> dict[str, Any]:
    return {
        "AccountId": key.account_id,
        "AccountName": key.account_name,
        "AccessKeyId": key.access_key_id,
        "SecretAccessKey": key.secret_access_key,
    }


def list_accounts(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.read() as session:
        return {
            "Accounts": [
                _account_json(request.runtime, session, account)
                for account in accounts.list_accounts(session)
            ]
        }


def create_account(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    with request.runtime.db.write() as session:
        key = accounts.create_account(
            session,
            field(body, "Name", str),
            now=utcnow(),
            is_admin=bool(field(body, "Admin", bool, required=False)),
            payment_mode=field(body, "PaymentMode", str, required=False)
            or request.runtime.fleet.default_payment_mode,
        )
    return _key_json(key)


def add_key(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.write() as session:
        account = accounts.get_account(session, request.path["account"])
        key = accounts.add_key(session, account.id, now=utcnow())
    return _key_json(key)


def revoke_key(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.write() as session:
        accounts.revoke_key(session, request.path["key"], now=utcnow())
    request.runtime.keys.forget(request.path["key"])  # its next request is refused
    return {"AccessKeyId": request.path["key"], "Revoked": True}


# -- the clock ------------------------------------------------------------------------------------


def _clock_json(state: clock_service.ClockState) -> dict[str, Any]:
    return {
        "Kind": state.kind,
        "Now": state.now,
        "TimeScale": state.time_scale,
        "EventsRun": state.events_run,
    }


def show_clock(request: NativeRequest) -> dict[str, Any]:
    return _clock_json(clock_service.show(request.runtime))


def advance_clock(request: NativeRequest) -> dict[str, Any]:
    return _clock_json(clock_service.advance(request.runtime, field(request.body, "Duration", str)))


def set_clock(request: NativeRequest) -> dict[str, Any]:
    return _clock_json(clock_service.set_time(request.runtime, field(request.body, "Time", str)))


# -- the fleet ------------------------------------------------------------------------------------


def show_fleet(request: NativeRequest) -> dict[str, Any]:
    days = request.query.get("days")
    if days is not None and (not days.isdigit() or not 1 <= int(days) <= 400):
        raise ValidationError("days must be a whole number from 1 to 400.")
    reports = fleet_service.report(request.runtime, int(days) if days else None)
    runtime = request.runtime
    return {
        "Region": runtime.region,
        "Now": runtime.clock.now(),
        "Pools": [
            {
                "InstanceType": r.pool.instance_type,
                "AvailabilityZone": r.pool.availability_zone,
                "InstanceCount": r.pool.instance_count,
                "ReservableCount": r.pool.reservable,
                "PricePerInstanceHour": r.pool.price_per_instance_hour,
                "CurrencyCode": r.pool.currency,
                "BookedNow": r.booked_at(runtime.clock.now()),
                "PeakBooked": r.peak,
                "Utilisation": round(r.utilisation(), 4),
                "BookedProfile": [{"Start": start, "Booked": count} for start, count in r.booked_profile],
            }
            for r in reports
        ],
    }


# -- payment --------------------------------------------------------------------------------------


def _invoice_json(invoice: Any, plan_name: str, account_name: str) -> dict[str, Any]:
    return {
        "InvoiceId": invoice.id,
        "AccountId": invoice.account_id,
        "AccountName": account_name,
        "TrainingPlanName": plan_name,
        "Amount": invoice.amount,
        "CurrencyCode": invoice.currency,
        "Status": invoice.status,
        "CreatedAt": invoice.created_at,
        "DueAt": invoice.due_at,
        "SettledAt": invoice.settled_at,
        "Note": invoice.note,
    }


def _invoice_view(session: Any, invoice: Any) -> dict[str, Any]:
    plan = session.get(TrainingPlan, invoice.plan_id)
    account = accounts.get_account(session, invoice.account_id)
    return _invoice_json(invoice, plan.name if plan else "", account.name)


def list_invoices(request: NativeRequest) -> dict[str, Any]:
    """Administrators see every invoice (or one account's); others see their own."""
    with request.runtime.db.read() as session:
        account_id: str | None = request.caller.account_id
        if request.caller.is_admin:
            wanted = request.query.get("account")
            account_id = accounts.get_account(session, wanted).id if wanted else None
        found = payments.list_invoices(session, account_id=account_id, status=request.query.get("status"))
        return {"Invoices": [_invoice_view(session, invoice) for invoice in found]}


def _invoice_id(request: NativeRequest) -> int:
    text = request.path["invoice"]
    if not text.isdigit():
        raise ValidationError(f"Invoice id must be a number, not {text!r}.")
    return int(text)


def approve_invoice(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.write() as session:
        invoice = payments.approve(
            session, request.runtime.lifecycle, _invoice_id(request), request.runtime.clock.now()
        )
        view = _invoice_view(session, invoice)
    request.runtime.scheduler.wake()
    return view


def reject_invoice(request: NativeRequest) -> dict[str, Any]:
    reason = field(request.body, "Reason", str, required=False) or "rejected"
    with request.runtime.db.write() as session:
        invoice = payments.reject(
            session, request.runtime.lifecycle, _invoice_id(request), reason, request.runtime.clock.now()
        )
        return _invoice_view(session, invoice)


def update_account(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    limits = field(body, "Quotas", dict, required=False) or {}
    unknown = set(limits) - {"MaxActivePlans", "MaxReservedInstancesPerType"}
    if unknown:
        raise ValidationError(f"Quotas: unknown member(s) {', '.join(sorted(unknown))}.")
    with request.runtime.db.write() as session:
        quotas.set_limits(
            session,
            request.path["account"],
            max_plans=limits.get("MaxActivePlans"),
            max_instances=limits.get("MaxReservedInstancesPerType"),
        )
        account = payments.update_account(
            session,
            request.path["account"],
            mode=field(body, "PaymentMode", str, required=False),
            budget=_money_text(body, "Budget"),
            add_budget=_money_text(body, "AddBudget"),
            now=request.runtime.clock.now(),
        )
        return _account_json(request.runtime, session, account)


def _money_text(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(
            f'{name} must be a decimal string such as "2500.00", so that no float rounds it.'
        )
    return value


def _account_json(runtime: Runtime, session: Any, account: Any) -> dict[str, Any]:
    limits = quotas.limits(runtime, account)
    return {
        "AccountId": account.id,
        "Name": account.name,
        "Admin": account.is_admin,
        "Quotas": {
            "MaxActivePlans": limits.max_active_plans,
            "MaxReservedInstancesPerType": limits.max_reserved_instances_per_type,
        },
        "PaymentMode": account.payment_mode,
        "Budget": account.budget,
        "Spend": payments.spend(session, account.id),
        "CreatedAt": account.created_at,
        "AccessKeys": [
            {"AccessKeyId": key.access_key_id, "CreatedAt": key.created_at, "RevokedAt": key.revoked_at}
            for key in accounts.list_keys(session, account.id)
        ],
    }


def show_ledger(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.read() as session:
        account = accounts.get_account(session, request.path["account"])
        if not request.caller.is_admin and account.id != request.caller.account_id:
            raise AccessDenied("Only administrators read other accounts' ledgers.")
        return {
            "AccountId": account.id,
            "Entries": [
                {
                    "At": e.at,
                    "Amount": e.amount,
                    "BudgetAfter": e.budget_after,
                    "InvoiceId": e.invoice_id,
                    "Description": e.description,
                }
                for e in payments.ledger(session, account.id)
            ],
        }


# -- plans (what SageMaker has no words for) -------------------------------------------------------


def cancel_plan(request: NativeRequest) -> dict[str, Any]:
    reason = field(request.body, "Reason", str)
    plan = plans.cancel(request.runtime, request.path["account"], request.path["name"], reason)
    return {"TrainingPlanName": plan.name, "Status": plan.status, "StatusMessage": plan.status_message}


def plan_events(request: NativeRequest) -> dict[str, Any]:
    with request.runtime.db.read() as session:
        caller = request.caller
        owner = request.query.get("account")
        if owner and caller.is_admin:
            account = accounts.get_account(session, owner)
            caller = accounts.Caller(account.id, account.name, False, caller.access_key_id)
        plan = plans.get(session, request.runtime, caller, request.path["name"])
        return {
            "TrainingPlanName": plan.name,
            "Events": [
                {"At": e.at, "Kind": e.kind, "Status": e.status, "Message": e.message}
                for e in plans.history(session, plan.id)
            ],
        }


# -- clusters -------------------------------------------------------------------------------------


def exec_on_node(request: NativeRequest) -> dict[str, Any]:
    command = field(request.body, "Command", list)
    if not command or not all(isinstance(part, str) for part in command):
        raise ValidationError("Command must be a non-empty list of strings.")
    timeout = field(request.body, "TimeoutSeconds", int, required=False) or 300
    if not 1 <= timeout <= 3600:
        raise ValidationError("TimeoutSeconds must be between 1 and 3600.")
    result = clusters.exec_on_node(
        request.runtime,
        request.caller,
        request.path["cluster"],
        request.path["node"],
        command,
        timedelta(seconds=timeout),
    )
    return {
        "ExitCode": result.exit_code,
        "Stdout": result.stdout.decode(errors="replace"),
        "Stderr": result.stderr.decode(errors="replace"),
        "TimedOut": result.timed_out,
    }


# -- training jobs --------------------------------------------------------------------------------


def job_logs(request: NativeRequest) -> dict[str, Any]:
    """One instance's output across the job's attempts; call again with the answer's cursor to follow."""
    from hyperplan.services import job_runner

    host = request.query.get("host", "algo-1")
    stream = request.query.get("stream", "stdout")
    page = job_runner.read_logs(
        request.runtime, request.caller, request.path["name"], host, stream, request.query.get("cursor")
    )
    return {
        "TrainingJobName": request.path["name"],
        "Host": host,
        "Stream": stream,
        "Attempt": page.attempt,
        "Data": page.data.decode(errors="replace"),
        "Cursor": page.cursor,
        "Done": page.done,
    }


def routes() -> list[Route]:
    return [
        Route("/api/v1/whoami", endpoint(whoami), methods=["GET"]),
        Route("/api/v1/accounts", endpoint(list_accounts, admin=True), methods=["GET"]),
        Route("/api/v1/accounts", endpoint(create_account, admin=True), methods=["POST"]),
        Route("/api/v1/accounts/{account}/keys", endpoint(add_key, admin=True), methods=["POST"]),
        Route("/api/v1/keys/{key}", endpoint(revoke_key, admin=True), methods=["DELETE"]),
        Route("/api/v1/clock", endpoint(show_clock), methods=["GET"]),
        Route("/api/v1/clock/advance", endpoint(advance_clock, admin=True), methods=["POST"]),
        Route("/api/v1/clock/set", endpoint(set_clock, admin=True), methods=["POST"]),
        Route("/api/v1/fleet", endpoint(show_fleet), methods=["GET"]),
        Route("/api/v1/accounts/{account}", endpoint(update_account, admin=True), methods=["PATCH"]),
        Route("/api/v1/accounts/{account}/ledger", endpoint(show_ledger), methods=["GET"]),
        Route("/api/v1/invoices", endpoint(list_invoices), methods=["GET"]),
        Route("/api/v1/invoices/{invoice}/approve", endpoint(approve_invoice, admin=True), methods=["POST"]),
        Route("/api/v1/invoices/{invoice}/reject", endpoint(reject_invoice, admin=True), methods=["POST"]),
        Route("/api/v1/plans/{name}/events", endpoint(plan_events), methods=["GET"]),
        Route("/api/v1/clusters/{cluster}/nodes/{node}/exec", endpoint(exec_on_node), methods=["POST"]),
        Route("/api/v1/training-jobs/{name}/logs", endpoint(job_logs), methods=["GET"]),
        Route(
            "/api/v1/accounts/{account}/plans/{name}/cancel",
            endpoint(cancel_plan, admin=True),
            methods=["POST"],
        ),
    ]
