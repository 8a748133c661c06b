"""The native API under /api/v1/: what the SageMaker API has no words for.

JSON in and out, signed with SigV4 like the SageMaker API, errors as {"Error": {"Code", "Message"}}.
docs/API.md documents every route. Handlers here translate; the rules live in hyperplan.services.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hyperplan.core import reclaim_warnings as reclaim_rules
from hyperplan.core.hostlist import compress
from hyperplan.core.instance_types import InstanceType
from hyperplan.core.jsonable import jsonable, zulu_time
from hyperplan.core.rate_limits import MAX_BURST, MAX_RATE, RateLimit, RequestClass, native_class
from hyperplan.errors import AccessDenied, ValidationError
from hyperplan.server import fields
from hyperplan.server.auth import authenticate, require_admin
from hyperplan.server.errors import native_error_response
from hyperplan.server.request_ids import new_request_id
from hyperplan.server.request_metrics import counted_request
from hyperplan.services.accounts import sealed_secrets
from hyperplan.services.accounts.accounts import Caller, NewKey
from hyperplan.services.orchestration import account_views, audit_views
from hyperplan.services.orchestration import clock as clock_service
from hyperplan.services.orchestration.account_views import AccountView, InvoiceView
from hyperplan.services.plans import payments, plans, quotas, reclaim_warnings
from hyperplan.services.runtime import fleet as fleet_service
from hyperplan.services.runtime.context import ServiceContext


@dataclass(frozen=True)
class NativeRequest:
    runtime: ServiceContext
    caller: Caller
    body: Mapping[str, Any]
    path: Mapping[str, str]
    query: Mapping[str, str]


NativeHandler = Callable[[NativeRequest], Any]
"""A handler runs on the threads every request shares; one that is a coroutine function runs on the event
loop and chooses where its parts run (server/native_exec.py: a command waited for on a thread of its own)."""


class NativeRoute(Route):
    """One native route: its handler, whether only administrators may call it, and the body members and
    query parameters it takes (anything else is refused, naming it). Tests enumerate these to fuzz
    every route."""

    def __init__(
        self,
        method: str,
        path: str,
        handler: NativeHandler,
        *,
        admin: bool = False,
        body: Sequence[str] = (),
        query: Sequence[str] = (),
        limited_as: RequestClass | None = None,
    ) -> None:
        self.admin = admin
        self.body_members = tuple(body)
        self.query_keys = tuple(query)
        # The rate limit's class: a read or a write by its method, unless the route says (a search POSTs)
        self.limited_as = limited_as or native_class(method)
        endpoint = _endpoint(
            handler, admin=admin, body=body, query=query, name=f"{method} {path}", limited_as=self.limited_as
        )
        super().__init__(path, endpoint, methods=[method])


def _endpoint(
    handler: NativeHandler,
    *,
    admin: bool = False,
    body: Sequence[str] = (),
    query: Sequence[str] = (),
    name: str = "",
    limited_as: RequestClass = RequestClass.WRITE,
) -> Callable[[Request], Any]:
    on_the_loop = inspect.iscoroutinefunction(handler)  # decided once, not at every request

    async def serve(request: Request) -> Response:
        with counted_request("native", name) as count:
            return count(await answer(request))

    async def answer(request: Request) -> Response:
        request_id = new_request_id()
        runtime: ServiceContext = request.app.state.runtime
        try:
            raw = await request.body()
            caller = await run_in_threadpool(authenticate, runtime, request, raw)
            runtime.rate_limiter.admit(caller, limited_as, runtime.fleet.rate_limits)
            if admin:  # before the body is parsed: others learn nothing of what an admin route takes
                require_admin(caller)
            parsed = fields.json_object(raw)
            fields.only_members(parsed, body)
            params = dict(request.query_params)
            fields.only_members(params, query, "The query string")
            native = NativeRequest(runtime, caller, parsed, dict(request.path_params), params)
            if on_the_loop:
                result = await handler(native)
            else:
                result = await run_in_threadpool(handler, native)
        except Exception as exc:
            return native_error_response(exc, request_id)
        return JSONResponse(jsonable(result, zulu_time), headers={"x-amzn-RequestId": request_id})

    return serve


# -- identity and accounts ------------------------------------------------------------------------


def whoami(request: NativeRequest) -> dict[str, Any]:
    caller = request.caller
    return {
        "AccountId": caller.account_id,
        "AccountName": caller.account_name,
        "Admin": caller.is_admin,
        "AccessKeyId": caller.access_key_id,
        "UserName": caller.user_name,
        "Owner": caller.is_owner,
    }


def list_accounts(request: NativeRequest) -> dict[str, Any]:
    return {"Accounts": [_account_json(account) for account in account_views.list_accounts(request.runtime)]}


def new_key_json(key: NewKey) -> dict[str, Any]:
    """A key just made, its secret shown this once (every route that makes a key answers so)."""
    return {
        "AccountId": key.account_id,
        "AccountName": key.account_name,
        "UserName": key.user_name,
        "AccessKeyId": key.access_key_id,
        "SecretAccessKey": key.secret_access_key,
        "Status": "Active",
    }


def create_account(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    key = account_views.create_account(
        request.runtime,
        fields.required_text(body, "Name", max_length=63),
        is_admin=bool(fields.boolean(body, "Admin")),
        payment_mode=fields.text(body, "PaymentMode", required=False, max_length=16),
        os_user=fields.text(body, "OsUser", required=False, max_length=32),
        caller=request.caller,
    )
    return new_key_json(key)


def delete_account(request: NativeRequest) -> dict[str, Any]:
    account = account_views.delete_account(request.runtime, request.caller, request.path["account"])
    return {"AccountId": account.id, "Name": account.name, "Deleted": True, "OsUser": account.os_user}


def add_key(request: NativeRequest) -> dict[str, Any]:
    return new_key_json(account_views.add_key(request.runtime, request.path["account"], request.caller))


# -- the clock ------------------------------------------------------------------------------------


def rotate_master_key(request: NativeRequest) -> dict[str, Any]:
    runtime = request.runtime
    rotation = sealed_secrets.rotate_master_key(runtime.db, runtime.secret_box)
    detail = {
        "AccessKeysResealed": rotation.access_keys,
        "WebhooksResealed": rotation.webhooks,
        "RegistryCredentialsResealed": rotation.registry_credentials,
    }
    audit_views.record_alone(runtime, request.caller, "master-key.rotate", detail=detail)
    runtime.keys.forget()  # nothing changed for a signer, but no cached entry outlives its sealing
    return detail


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
    duration = fields.required_text(request.body, "Duration")
    return _clock_json(clock_service.advance(request.runtime, duration, request.caller))


def set_clock(request: NativeRequest) -> dict[str, Any]:
    time_text = fields.required_text(request.body, "Time")
    return _clock_json(clock_service.set_time(request.runtime, time_text, request.caller))


# -- the fleet ------------------------------------------------------------------------------------

MAX_REPORT_DAYS = 400


def show_fleet(request: NativeRequest) -> dict[str, Any]:
    days = fields.query_whole(request.query, "days", 1, MAX_REPORT_DAYS)
    reports = fleet_service.report(request.runtime, days)
    runtime = request.runtime
    return {
        "Region": runtime.region,
        "Now": runtime.clock.now(),
        # A HyperPod cluster's VpcConfig.Subnets decide its zone: the ids to copy are here.
        "Zones": [
            {"AvailabilityZone": zone.name, "AvailabilityZoneId": zone.zone_id, "Subnets": list(zone.subnets)}
            for zone in runtime.fleet.zones
        ],
        "Pools": [
            {
                "InstanceType": r.pool.instance_type,
                "AvailabilityZone": r.pool.availability_zone,
                "InstanceCount": r.pool.instance_count,
                "ReservableCount": r.pool.reservable,
                "PricePerInstanceHour": r.pool.price_per_instance_hour,
                "CurrencyCode": r.pool.currency,
                **_instance_type_json(runtime.fleet.instance_type(r.pool.instance_type)),
                "BookedNow": r.booked_at(runtime.clock.now()),
                "PeakBooked": r.peak,
                "Utilisation": round(r.utilisation(), 4),
                "BookedProfile": [{"Start": start, "Booked": count} for start, count in r.booked_profile],
                **(_slurm_pool_json(r) if r.pool.nodes else {}),
            }
            for r in reports
        ],
    }


def _instance_type_json(size: InstanceType) -> dict[str, Any]:
    """A pool's instance type's size (the fleet file's [instance_types], else AWS's figures)."""
    return {
        "VCpus": size.vcpus,
        "MemoryGiB": size.memory_gib,
        "Accelerators": size.accelerators,
        "AcceleratorKind": size.accelerator_kind,
    }


def _slurm_pool_json(report: fleet_service.PoolReport) -> dict[str, Any]:
    """A Slurm pool's nodes, how many of its instances can be booked now, and which nodes are unhealthy."""
    return {
        "Nodes": compress(report.pool.nodes),
        "BookableCount": report.bookable,
        "UnhealthyNodes": [
            {"Node": n.name, "State": n.state, **({"Reason": n.reason} if n.reason else {})}
            for n in report.unhealthy
        ],
    }


# -- payment --------------------------------------------------------------------------------------


def _invoice_json(invoice: InvoiceView) -> dict[str, Any]:
    return {
        "InvoiceId": invoice.id,
        "AccountId": invoice.account_id,
        "AccountName": invoice.account_name,
        "TrainingPlanName": invoice.plan_name,
        "Amount": invoice.amount,
        "CurrencyCode": invoice.currency,
        "Status": invoice.status,
        "CreatedAt": invoice.created_at,
        "DueAt": invoice.due_at,
        "SettledAt": invoice.settled_at,
        "Note": invoice.note,
    }


def list_invoices(request: NativeRequest) -> dict[str, Any]:
    """Administrators see every invoice (or one account's); others see their own."""
    wanted = fields.query_text(request.query, "account")
    if wanted:
        _own_account_or_admin(request.caller, wanted, "list other accounts' invoices")
    account_id = account_views.invoice_scope(request.runtime, request.caller, wanted)
    status = fields.query_text(request.query, "status")
    found = account_views.list_invoices(request.runtime, account_id, status)
    return {"Invoices": [_invoice_json(invoice) for invoice in found]}


def _invoice_id(request: NativeRequest) -> int:
    return fields.row_id(request.path["invoice"], "Invoice id")


def approve_invoice(request: NativeRequest) -> dict[str, Any]:
    return _invoice_json(account_views.approve_invoice(request.runtime, _invoice_id(request), request.caller))


def reject_invoice(request: NativeRequest) -> dict[str, Any]:
    reason = fields.text(request.body, "Reason", required=False) or "rejected"
    view = account_views.reject_invoice(request.runtime, _invoice_id(request), reason, request.caller)
    return _invoice_json(view)


QUOTA_MEMBERS = (
    "MaxActivePlans",
    "MaxReservedInstancesPerType",
    "MaxReservedInstanceHoursPer30Days",
    "MaxOnDemandInstancesPerType",
)


def update_account(request: NativeRequest) -> dict[str, Any]:
    body = request.body
    limits = fields.members(body, "Quotas", QUOTA_MEMBERS)
    max_plans, max_instances = (
        fields.whole(limits, name, 1, quotas.MAX_QUOTA, within="Quotas") for name in QUOTA_MEMBERS[:2]
    )
    max_hours = fields.whole(limits, QUOTA_MEMBERS[2], 1, quotas.MAX_HOURS_QUOTA, within="Quotas")
    max_on_demand = fields.whole(limits, QUOTA_MEMBERS[3], 1, quotas.MAX_QUOTA, within="Quotas")
    budget, add_budget = (_budget(request, body, name) for name in ("Budget", "AddBudget"))
    mode = fields.text(body, "PaymentMode", required=False, max_length=16)
    rate_limits = _rate_limit_changes(body)
    given_leads = body.get(reclaim_rules.LEAD_FIELD)
    leads = None if given_leads is None else reclaim_rules.lead_hours(given_leads)
    account = account_views.update_account(
        request.runtime,
        request.path["account"],
        max_plans=max_plans,
        max_instances=max_instances,
        max_instance_hours=max_hours,
        max_on_demand_instances=max_on_demand,
        mode=mode,
        budget=budget,
        add_budget=add_budget,
        rate_limits=rate_limits,
        caller=request.caller,
    )
    # Checked above with the rest, so a refusal writes nothing; set once the rest is written.
    if leads is not None:
        reclaim_warnings.set_lead_hours(request.runtime, account.id, leads)
    hours = reclaim_warnings.get_lead_hours(request.runtime, account.id)
    return {**_account_json(account), reclaim_rules.LEAD_FIELD: list(hours)}


def _rate_limit_changes(body: Mapping[str, Any]) -> dict[RequestClass, RateLimit | None]:
    """``RateLimits``: a class's ``{"Rate": per second, "Burst": requests}``, or null for the fleet's."""
    given = fields.members(body, "RateLimits", [c.value for c in RequestClass])
    changes: dict[RequestClass, RateLimit | None] = {}
    for name, value in given.items():
        where = f"RateLimits.{name}"
        if value is None:
            changes[RequestClass(name)] = None
            continue
        limit = fields.members(given, name, ("Rate", "Burst"))
        rate = limit.get("Rate")
        if isinstance(rate, bool) or not isinstance(rate, int | Decimal) or not 0 < rate <= MAX_RATE:
            raise ValidationError(
                f"{where}.Rate must be a number of requests per second, more than 0 and at most {MAX_RATE:g}."
            )
        burst = fields.whole(limit, "Burst", 1, MAX_BURST, within=where)
        if burst is None:
            raise ValidationError(f"{where}.Burst is required: the requests an account may make at once.")
        changes[RequestClass(name)] = RateLimit(float(rate), burst)
    return changes


def _budget(request: NativeRequest, body: Mapping[str, Any], name: str) -> Decimal | None:
    currency = payments.fleet_currency(request.runtime.fleet)
    return fields.money(
        body,
        name,
        maximum=payments.MAX_BUDGET,
        places=payments.currency_places(currency),
        currency=currency,
    )


def _account_json(account: AccountView) -> dict[str, Any]:
    return {
        "AccountId": account.id,
        "Name": account.name,
        "Admin": account.is_admin,
        "Quotas": {
            "MaxActivePlans": account.limits.max_active_plans,
            "MaxReservedInstancesPerType": account.limits.max_reserved_instances_per_type,
            "MaxReservedSharePerType": account.limits.max_reserved_share_per_type,
            "MaxReservedInstanceHoursPer30Days": account.limits.max_reserved_instance_hours_per_30_days,
            "MaxOnDemandInstancesPerType": account.limits.max_on_demand_instances_per_type,
            "MaxOnDemandSharePerType": account.limits.max_on_demand_share_per_type,
        },
        "PaymentMode": account.payment_mode,
        "Budget": account.budget,
        "Spend": account.spend,
        "CreatedAt": account.created_at,
        "OsUser": account.os_user,
        # The OS user's uid and gid (the server's pick, from the fleet's [accounts] os_ids, for a user
        # it made): a Slurm site creates the user with these on every node (docs/SLURM.md).
        "OsUid": account.os_ids[0] if account.os_ids else None,
        "OsGid": account.os_ids[1] if account.os_ids else None,
        "RateLimits": {
            request_class.value: {
                "Rate": limit.rate,
                "Burst": limit.burst,
                "Set": "account" if request_class in account.own_rate_limits else "fleet",
            }
            for request_class, limit in account.rate_limits.items()
        },
        "AccessKeys": [
            {
                "AccessKeyId": key.access_key_id,
                "CreatedAt": key.created_at,
                "RevokedAt": key.revoked_at,
                "Status": key.status,
                "UserName": key.user_name,
            }
            for key in account.keys
        ],
    }


def show_ledger(request: NativeRequest) -> dict[str, Any]:
    _own_account_or_admin(request.caller, request.path["account"], "read other accounts' ledgers")
    account_id, lines = account_views.ledger(request.runtime, request.path["account"])
    return {
        "AccountId": account_id,
        "Entries": [
            {
                "At": e.at,
                "Amount": e.amount,
                "BudgetAfter": e.budget_after,
                "InvoiceId": e.invoice_id,
                "Description": e.description,
            }
            for e in lines
        ],
    }


def _own_account_or_admin(caller: Caller, account_ref: str, what: str) -> None:
    """Decided before the name is looked up, so that the answer is the same for an account that exists
    and one that does not: a caller who may see neither learns nothing of which names are taken."""
    if not caller.is_admin and account_ref not in (caller.account_id, caller.account_name):
        raise AccessDenied(f"Only administrators {what}; account {caller.account_name!r} is not one.")


# -- plans (what SageMaker has no words for) -------------------------------------------------------


def cancel_plan(request: NativeRequest) -> dict[str, Any]:
    reason = fields.required_text(request.body, "Reason")
    plan = plans.cancel(
        request.runtime, request.path["account"], request.path["name"], reason, request.caller
    )
    return {"TrainingPlanName": plan.name, "Status": plan.status, "StatusMessage": plan.status_message}


def plan_events(request: NativeRequest) -> dict[str, Any]:
    owner = fields.query_text(request.query, "account")
    if owner:
        _own_account_or_admin(request.caller, owner, "read other accounts' plans")
    start = fields.query_whole(request.query, "cursor", 0, fields.MAX_ROW_ID) or 0
    page = account_views.plan_events(
        request.runtime, request.caller, owner, request.path["name"], start=start
    )
    answer: dict[str, Any] = {
        "TrainingPlanName": page.plan_name,
        "Events": [
            {
                "At": e.at,
                "Kind": e.kind,
                "Status": e.status,
                "Message": e.message,
                "User": {"UserName": e.user_name, "AccountName": e.user_account} if e.user_name else None,
            }
            for e in page.events
        ],
    }
    if page.next_cursor is not None:
        answer["NextCursor"] = str(page.next_cursor)  # a page ends at 1,000 events or 1 MiB of them
    return answer


# -- clusters -------------------------------------------------------------------------------------

# The exec route is server/native_exec.py: it waits on a thread of its own.


# -- training jobs --------------------------------------------------------------------------------


def describe_job(request: NativeRequest) -> dict[str, Any]:
    """What DescribeTrainingJob has no member for: the reference the job's TrainingImage resolved to
    through the fleet's image map (DescribeTrainingJob shows the TrainingImage as sent, as AWS does),
    every plan the job may run on with the one it runs on now (it shows the TrainingPlanArn as sent), and
    for a job that books its own capacity its request, the plan it booked and, while it waits to book,
    why."""
    from hyperplan.services.jobs import job_views

    job = job_views.describe(request.runtime, request.caller, request.path["name"])
    return {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "TrainingJobStatus": job.status,
        "SecondaryStatus": job.secondary_status,
        "TrainingImage": job.request.algorithm.image,
        "ResolvedImage": job.resolved_image,
        "ImageDigest": job.image_digest,
        "TrainingPlans": list(job.plan_arns),
        "RunningOnPlan": job.running_on_plan,
        **(
            {
                "AutoBook": {
                    "Request": job.auto_book.request.to_native(),
                    "BookedPlan": job.auto_book.booked_plan,
                    "Waiting": job.auto_book.waiting,
                }
            }
            if job.auto_book is not None
            else {}
        ),
    }


def job_logs(request: NativeRequest) -> dict[str, Any]:
    """One instance's output across the job's attempts; call again with the answer's cursor to follow."""
    from hyperplan.services.jobs import job_logs

    host = fields.query_text(request.query, "host", max_length=64) or "algo-1"
    stream = fields.query_text(request.query, "stream", max_length=16) or "stdout"
    cursor = fields.query_text(request.query, "cursor")
    timed = fields.query_text(request.query, "timed", max_length=8)
    if timed not in (None, "", "true", "false"):
        raise ValidationError(f"timed must be true or false, not {timed!r}.")
    if timed == "true":
        lines = job_logs.read_timed_logs(
            request.runtime, request.caller, request.path["name"], host, stream, cursor
        )
        return {
            "TrainingJobName": request.path["name"],
            "Host": host,
            "Stream": stream,
            "Attempt": lines.attempt,
            "Lines": [
                {
                    "Time": line.time.isoformat(timespec="microseconds").replace("+00:00", "Z"),
                    "Stream": line.stream.value,
                    "Text": line.text,
                }
                for line in lines.lines
            ],
            "Cursor": lines.cursor,
            "Done": lines.done,
        }
    page = job_logs.read_logs(request.runtime, request.caller, request.path["name"], host, stream, cursor)
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
    account_update = ("PaymentMode", "Budget", "AddBudget", "Quotas", "RateLimits", reclaim_rules.LEAD_FIELD)
    return [
        NativeRoute("GET", "/api/v1/whoami", whoami),
        NativeRoute("GET", "/api/v1/accounts", list_accounts, admin=True),
        NativeRoute(
            "POST",
            "/api/v1/accounts",
            create_account,
            admin=True,
            body=("Name", "Admin", "PaymentMode", "OsUser"),
        ),
        NativeRoute("DELETE", "/api/v1/accounts/{account}", delete_account, admin=True),
        NativeRoute("POST", "/api/v1/accounts/{account}/keys", add_key, admin=True),
        NativeRoute("POST", "/api/v1/master-key/rotate", rotate_master_key, admin=True),
        NativeRoute("GET", "/api/v1/clock", show_clock),
        NativeRoute("POST", "/api/v1/clock/advance", advance_clock, admin=True, body=("Duration",)),
        NativeRoute("POST", "/api/v1/clock/set", set_clock, admin=True, body=("Time",)),
        NativeRoute("GET", "/api/v1/fleet", show_fleet, query=("days",)),
        NativeRoute("PATCH", "/api/v1/accounts/{account}", update_account, admin=True, body=account_update),
        NativeRoute("GET", "/api/v1/accounts/{account}/ledger", show_ledger),
        NativeRoute("GET", "/api/v1/invoices", list_invoices, query=("account", "status")),
        NativeRoute("POST", "/api/v1/invoices/{invoice}/approve", approve_invoice, admin=True),
        NativeRoute(
            "POST", "/api/v1/invoices/{invoice}/reject", reject_invoice, admin=True, body=("Reason",)
        ),
        NativeRoute("GET", "/api/v1/plans/{name}/events", plan_events, query=("account", "cursor")),
        NativeRoute("GET", "/api/v1/training-jobs/{name}", describe_job),
        NativeRoute(
            "GET", "/api/v1/training-jobs/{name}/logs", job_logs, query=("host", "stream", "cursor", "timed")
        ),
        NativeRoute(
            "POST",
            "/api/v1/accounts/{account}/plans/{name}/cancel",
            cancel_plan,
            admin=True,
            body=("Reason",),
        ),
    ]
