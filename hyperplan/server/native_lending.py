"""Native routes for a plan's lending policy: read (GET), lend idle instances (PUT), lend nothing (DELETE).

docs/API.md documents them. The plan is the caller's, by name or ARN (an administrator's: any account's,
by ARN); the rules live in hyperplan.services.plans.lending and core/spot.py. Every answer is the plan's
lending view; an administrator's also lists the runs, with the borrowers' jobs and accounts.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.server import fields
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.plans import lending
from hyperplan.services.plans.lending import LendingView, LentRun

# {plan:path}: an ARN holds a "/" (training-plan/NAME); an administrator names another account's plan so.
PATH = "/api/v1/training-plans/{plan:path}/lending"
MEMBERS = ("Notice", "MinRun", "StopMargin")
# A whole number of seconds that the store can hold; the policy's own bounds (the fleet's longest notice,
# a week for the others) are the service's, which names the member.
MAX_SECONDS = 2**31 - 1


def _run_json(run: LentRun) -> dict[str, Any]:
    return {
        "TrainingJobName": run.job_name,
        "AccountName": run.account_name,
        "InstanceCount": run.count,
        "StartTime": run.started_at,
        "EndTime": run.ended_at,
        "ReclaimReason": run.reclaim_reason,
        "NoticeSeconds": run.notice_seconds,
        "OwnerHadSeconds": run.owner_had_seconds,
    }


def _view_json(view: LendingView) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "TrainingPlanName": view.plan_name,
        "Mode": view.mode,
        "NoticeSeconds": view.notice_seconds,
        "MinRunSeconds": view.min_run_seconds,
        "StopMarginSeconds": view.stop_margin_seconds,
        "LentNow": view.lent_now,
        "LentInstanceHours": view.lent_instance_hours,
        "Reclaims": view.reclaims,
        "PromisesKept": view.promises_kept,
        "PromisesBroken": view.promises_broken,
        "Credited": str(view.credited),
        "CurrencyCode": view.currency,
    }
    if view.runs is not None:  # an administrator's view
        answer["Runs"] = [_run_json(run) for run in view.runs]
    return answer


def get_lending(request: NativeRequest) -> dict[str, Any]:
    return _view_json(lending.view(request.runtime, request.caller, request.path["plan"]))


def set_lending(request: NativeRequest) -> dict[str, Any]:
    seconds = {name: fields.whole(request.body, name, 0, MAX_SECONDS) for name in MEMBERS}
    view = lending.set_policy(
        request.runtime,
        request.caller,
        request.path["plan"],
        notice=seconds["Notice"],
        min_run=seconds["MinRun"],
        stop_margin=seconds["StopMargin"],
    )
    return _view_json(view)


def clear_lending(request: NativeRequest) -> dict[str, Any]:
    return _view_json(lending.clear_policy(request.runtime, request.caller, request.path["plan"]))


def routes() -> list[Route]:
    return [
        NativeRoute("GET", PATH, get_lending),
        NativeRoute("PUT", PATH, set_lending, body=MEMBERS),
        NativeRoute("DELETE", PATH, clear_lending),
    ]
