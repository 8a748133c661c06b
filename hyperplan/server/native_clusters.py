"""Native routes for an instance group's plans: its primary plan (the wire's TrainingPlanArn) and the
further plans it may run on beside it, listed, added and removed.

docs/API.md documents the routes. Handlers translate; the rules live in
hyperplan.services.clusters.group_plans. A plan is named by its name or its ARN; an ARN holds a "/", so
the last path parameter takes the rest of the path.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.clusters import group_plans
from hyperplan.services.clusters.group_plans import GroupPlansView, GroupPlanView

GROUP = "/api/v1/clusters/{cluster}/instance-groups/{group}/plans"


def _plan_json(view: GroupPlanView) -> dict[str, Any]:
    return {
        "TrainingPlanArn": view.arn,
        "TrainingPlanName": view.name,
        "Primary": view.primary,
        "Status": view.status,
        "ActiveNow": view.active_now,
        "CapacityNow": view.capacity_now,
        "Serving": view.serving,
    }


def plans_json(view: GroupPlansView) -> dict[str, Any]:
    return {
        "ClusterName": view.cluster_name,
        "InstanceGroupName": view.group_name,
        "InstanceType": view.instance_type,
        "TargetCount": view.target_count,
        "CurrentCount": view.running_count,
        "Plans": [_plan_json(plan) for plan in view.plans],
    }


def list_plans(request: NativeRequest) -> dict[str, Any]:
    path = request.path
    return plans_json(group_plans.list_plans(request.runtime, request.caller, path["cluster"], path["group"]))


def add_plan(request: NativeRequest) -> dict[str, Any]:
    path = request.path
    view = group_plans.add_plan(request.runtime, request.caller, path["cluster"], path["group"], path["plan"])
    return plans_json(view)


def remove_plan(request: NativeRequest) -> dict[str, Any]:
    path = request.path
    view = group_plans.remove_plan(
        request.runtime, request.caller, path["cluster"], path["group"], path["plan"]
    )
    return plans_json(view)


def routes() -> list[Route]:
    return [
        NativeRoute("GET", GROUP, list_plans),
        NativeRoute("PUT", GROUP + "/{plan:path}", add_plan),
        NativeRoute("DELETE", GROUP + "/{plan:path}", remove_plan),
    ]
