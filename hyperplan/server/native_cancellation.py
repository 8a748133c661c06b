"""Native routes that show cancellation policies (docs/RETURNS.md): the fleet's, pool by pool, and a
plan as DescribeTrainingPlan answers it with the policy that governs its return.

SageMaker's answers cannot carry a policy (their members are botocore's), so the native API does: the
CLI reads the fleet's policies to print one beside each offering of a one-type search (which asks
SageMaker's SearchTrainingPlanOfferings), and a plan's to print it with the plan. The words are
core/cancellation_words.py's; the rules, core/returns.py's.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import Route

from hyperplan.core.cancellation_words import policy_for, policy_json
from hyperplan.core.jsonable import jsonable, zulu_time
from hyperplan.server.native import NativeRequest, NativeRoute
from hyperplan.services.plans import plan_views
from hyperplan.wire.ops.plans import plan_view

POLICIES_PATH = "/api/v1/cancellation-policies"
# {plan:path}: an ARN holds a "/" (training-plan/NAME). It matches every longer path too, so this route
# is registered after every other GET under /api/v1/training-plans/ (server/app.py).
PLAN_PATH = "/api/v1/training-plans/{plan:path}"


def show_policies(request: NativeRequest) -> dict[str, Any]:
    """The fleet's policy (`Default`: a pool without one of its own) and each pool's."""
    fleet = request.runtime.fleet
    return {
        "Default": policy_json(fleet.cancellation),
        "Pools": [
            {
                "InstanceType": pool.instance_type,
                "AvailabilityZone": pool.availability_zone,
                "CancellationPolicy": policy_json(policy_for(fleet, pool.key)),
            }
            for pool in fleet.pools
        ],
    }


def show_plan(request: NativeRequest) -> dict[str, Any]:
    """The caller's plan (an administrator's: any, by ARN) as DescribeTrainingPlan answers it, times
    written as the native API writes them; each reserved capacity with its pool's policy, and the plan's
    (`CancellationPolicy`: its first segment's pool's, the one its offering showed)."""
    runtime = request.runtime
    plan = plan_views.describe(runtime, request.caller, request.path["plan"])
    answer = plan_view(runtime, plan)
    answer["UnhealthyInstanceCount"] = plan.counters.unhealthy
    policies = [
        policy_json(policy_for(runtime.fleet, (s.instance_type, s.availability_zone))) for s in plan.segments
    ]
    for summary, policy in zip(answer["ReservedCapacitySummaries"], policies, strict=True):
        summary["CancellationPolicy"] = policy
    answer["CancellationPolicy"] = policies[0]
    result: dict[str, Any] = jsonable(answer, zulu_time)
    return result


def routes() -> list[Route]:
    return [
        NativeRoute("GET", POLICIES_PATH, show_policies),
        NativeRoute("GET", PLAN_PATH, show_plan),
    ]
