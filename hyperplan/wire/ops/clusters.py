"""SageMaker HyperPod cluster operations: wire names in, service calls, wire names out."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from hyperplan.core.paging import paginate
from hyperplan.core.status import InstanceGroupStatus
from hyperplan.errors import ValidationError
from hyperplan.services.clusters import cluster_views, clusters
from hyperplan.services.clusters.cluster_request import ClusterSpec, ClusterUpdate
from hyperplan.services.clusters.cluster_views import ClusterView, GroupView, NodeView
from hyperplan.wire.operations import RequestContext, operation
from hyperplan.wire.ops.tags import created

# What DescribeCluster echoes of each group's specification, as it was given.
ECHOED = (
    "LifeCycleConfig",
    "ExecutionRole",
    "ThreadsPerCore",
    "InstanceStorageConfigs",
    "OnStartDeepHealthChecks",
    "OverrideVpcConfig",
)
UNSERVED = ("RestrictedInstanceGroups", "TieredStorageConfig", "AutoScaling", "NodeProvisioningMode")


def _refuse_unserved(request: dict[str, Any]) -> None:
    for member in UNSERVED:
        if request.get(member):
            raise ValidationError(f"{member}: this deployment does not serve it.")


@operation("CreateCluster")
def create_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    _refuse_unserved(request)
    spec = ClusterSpec.from_wire(request)
    return {"ClusterArn": created(ctx, request, lambda: clusters.create(ctx.runtime, ctx.caller, spec))}


@operation("UpdateCluster")
def update_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    _refuse_unserved(request)
    return {"ClusterArn": clusters.update(ctx.runtime, ctx.caller, ClusterUpdate.from_wire(request))}


@operation("DeleteCluster")
def delete_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    return {"ClusterArn": clusters.delete(ctx.runtime, ctx.caller, request["ClusterName"])}


@operation("BatchDeleteClusterNodes")
def batch_delete_cluster_nodes(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if request.get("NodeLogicalIds"):
        raise ValidationError("NodeLogicalIds: this deployment names nodes by NodeIds only.")
    done, failed = clusters.delete_nodes(
        ctx.runtime, ctx.caller, request["ClusterName"], request.get("NodeIds", [])
    )
    return {
        "Successful": done,
        "Failed": [{"Code": code, "Message": message, "NodeId": node} for node, code, message in failed],
    }


@operation("DescribeCluster")
def describe_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    cluster = cluster_views.describe(ctx.runtime, ctx.caller, request["ClusterName"])
    settings = cluster.settings.as_given
    result: dict[str, Any] = {
        "ClusterArn": cluster.arn,
        "ClusterName": cluster.name,
        "ClusterStatus": cluster.status,
        "CreationTime": cluster.created_at,
        "InstanceGroups": [_group_view(g) for g in cluster.groups],
        **{k: settings[k] for k in ("VpcConfig", "Orchestrator", "NodeRecovery") if k in settings},
    }
    if cluster.failure_message:
        result["FailureMessage"] = cluster.failure_message
    return result


def _group_view(group: GroupView) -> dict[str, Any]:
    spec = group.spec.as_given
    view: dict[str, Any] = {
        "InstanceGroupName": group.name,
        "InstanceType": group.instance_type,
        "TargetCount": group.target_count,
        "CurrentCount": group.running_count,
        "Status": InstanceGroupStatus.IN_SERVICE,  # no group status is stored (core/status.py)
        "TrainingPlanStatus": "NotApplicable",
        **{k: spec[k] for k in ECHOED if k in spec},
    }
    shown = group.plan_shown()  # the primary's, or the plan serving the group while the primary cannot
    if shown is not None:
        view["TrainingPlanArn"] = shown.arn
        view["TrainingPlanStatus"] = shown.status
    return view


@operation("ListClusters")
def list_clusters(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    summaries = [_summary(c) for c in cluster_views.list_all(ctx.runtime, ctx.caller) if _matches(c, request)]
    if request.get("TrainingPlanArn"):
        summaries = [s for s in summaries if request["TrainingPlanArn"] in s["TrainingPlanArns"]]
    key = "ClusterName" if request.get("SortBy") == "NAME" else "CreationTime"
    summaries.sort(key=lambda s: s[key], reverse=request.get("SortOrder") == "Descending")
    page, token = paginate(
        summaries,
        request.get("MaxResults", 100),
        request.get("NextToken"),
        json.dumps([key, request.get("SortOrder"), request.get("NameContains")]),
    )
    return {"ClusterSummaries": page, **({"NextToken": token} if token else {})}


def _matches(cluster: ClusterView, request: dict[str, Any]) -> bool:
    return (
        request.get("NameContains", "") in cluster.name
        and _after(cluster.created_at, request.get("CreationTimeAfter"))
        and _before(cluster.created_at, request.get("CreationTimeBefore"))
    )


def _after(moment: datetime, bound: datetime | None) -> bool:
    return bound is None or moment > bound


def _before(moment: datetime, bound: datetime | None) -> bool:
    return bound is None or moment < bound


def _summary(cluster: ClusterView) -> dict[str, Any]:
    plan_arns: list[str] = []
    for group in cluster.groups:  # every plan of every group, further plans included
        for plan in group.plans:
            if plan.arn not in plan_arns:
                plan_arns.append(plan.arn)
    return {
        "ClusterArn": cluster.arn,
        "ClusterName": cluster.name,
        "CreationTime": cluster.created_at,
        "ClusterStatus": cluster.status,
        "TrainingPlanArns": plan_arns,
    }


@operation("ListClusterNodes")
def list_cluster_nodes(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    cluster_id, found = cluster_views.nodes(ctx.runtime, ctx.caller, request["ClusterName"])
    summaries = [
        _node_summary(n)
        for n in found
        if request.get("InstanceGroupNameContains", "") in n.group_name
        and _after(n.launched_at, request.get("CreationTimeAfter"))
        and _before(n.launched_at, request.get("CreationTimeBefore"))
    ]
    key = "InstanceId" if request.get("SortBy") == "NAME" else "LaunchTime"
    summaries.sort(key=lambda s: s[key], reverse=request.get("SortOrder") == "Descending")
    page, token = paginate(summaries, request.get("MaxResults", 100), request.get("NextToken"), cluster_id)
    return {"ClusterNodeSummaries": page, **({"NextToken": token} if token else {})}


def _node_summary(node: NodeView) -> dict[str, Any]:
    status: dict[str, Any] = {"Status": node.status}
    if node.message:
        status["Message"] = node.message[:1024]
    return {
        "InstanceGroupName": node.group_name,
        "InstanceId": node.instance_id,
        "InstanceType": node.instance_type,
        "LaunchTime": node.launched_at,
        "InstanceStatus": status,
        "PrivateDnsHostname": node.hostname,
    }


@operation("DescribeClusterNode")
def describe_cluster_node(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if "NodeId" not in request:
        raise ValidationError("NodeId is required: this deployment names nodes by NodeId only.")
    node = cluster_views.node(ctx.runtime, ctx.caller, request["ClusterName"], request["NodeId"])
    spec = node.group_spec.as_given
    zone = ctx.runtime.fleet.zone(node.availability_zone)
    details = {
        **_node_summary(node),
        **{
            k: spec[k]
            for k in ("LifeCycleConfig", "ThreadsPerCore", "InstanceStorageConfigs", "OverrideVpcConfig")
            if k in spec
        },
        "Placement": {
            "AvailabilityZone": node.availability_zone,
            **({"AvailabilityZoneId": zone.zone_id} if zone else {}),
        },
    }
    return {"NodeDetails": details}
