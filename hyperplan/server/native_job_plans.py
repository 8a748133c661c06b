"""Native routes for a training job's plans: beside the plan it names (the wire's single TrainingPlanArn) a
job may be given further plans of its account, and runs on whichever has room first.

docs/API.md documents the routes. Handlers translate; the rules live in hyperplan.services.jobs
(jobs.add_plan and jobs.remove_plan, job_views.plans). A plan is named by its name or its ARN, which holds
a "/": the route takes the rest of the path as the plan.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.errors import ValidationError
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.jobs import job_views, jobs
from hyperplan.services.jobs.job_views import JobPlansView

MAX_PLAN_REF = 2048  # the longest ARN the SageMaker model takes


def _plans_json(view: JobPlansView) -> dict[str, Any]:
    return {
        "TrainingJobName": view.job_name,
        "Plans": [
            {
                "TrainingPlanArn": plan.arn,
                "TrainingPlanName": plan.name,
                "Primary": plan.primary,
                "Status": plan.status,
                "RunningOnIt": plan.running_on_it,
            }
            for plan in view.plans
        ],
    }


def _plan_ref(request: NativeRequest) -> str:
    ref = request.path["plan"]
    if not ref or len(ref) > MAX_PLAN_REF:
        raise ValidationError(
            f"The plan must be a training plan's name or ARN, of 1 to {MAX_PLAN_REF} characters."
        )
    return ref


def list_plans(request: NativeRequest) -> dict[str, Any]:
    return _plans_json(job_views.plans(request.runtime, request.caller, request.path["name"]))


def add_plan(request: NativeRequest) -> dict[str, Any]:
    plan = _plan_ref(request)
    return _plans_json(jobs.add_plan(request.runtime, request.caller, request.path["name"], plan))


def remove_plan(request: NativeRequest) -> dict[str, Any]:
    plan = _plan_ref(request)
    return _plans_json(jobs.remove_plan(request.runtime, request.caller, request.path["name"], plan))


def routes() -> list[Route]:
    return [
        NativeRoute("GET", "/api/v1/training-jobs/{name}/plans", list_plans),
        NativeRoute("PUT", "/api/v1/training-jobs/{name}/plans/{plan:path}", add_plan),
        NativeRoute("DELETE", "/api/v1/training-jobs/{name}/plans/{plan:path}", remove_plan),
    ]
