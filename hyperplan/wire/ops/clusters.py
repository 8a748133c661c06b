"""SageMaker HyperPod cluster operations: wire names in, service calls, wire names out."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from hyperplan.core.paging import paginate
from hyperplan.core.status import InstanceGroupStatus
from hyperplan.errors import ValidationError
from hyperplan.services import clusters
from hyperplan.services.context import ServiceContext
from hyperplan.store.schema import Cluster, ClusterNode, InstanceGroup, TrainingPlan
from hyperplan.wire.operations import RequestContext, operation

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
    cluster = clusters.create(ctx.runtime, ctx.caller, request)
    return {"ClusterArn": cluster_arn(ctx.runtime, cluster)}


@operation("UpdateCluster")
def update_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    _refuse_unserved(request)
    cluster = clusters.update(ctx.runtime, ctx.caller, request)
    return {"ClusterArn": cluster_arn(ctx.runtime, cluster)}


@operation("DeleteCluster")
def delete_cluster(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    cluster = clusters.delete(ctx.runtime, ctx.caller, request["ClusterName"])
    return {"ClusterArn": cluster_arn(ctx.runtime, cluster)}


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
    with ctx.runtime.db.read() as session:
        cluster = clusters.get(session, ctx.runtime, ctx.caller, request["ClusterName"])
        settings = json.loads(cluster.settings)
        result: dict[str, Any] = {
            "ClusterArn": cluster_arn(ctx.runtime, cluster),
            "ClusterName": cluster.name,
            "ClusterStatus": cluster.status,
            "CreationTime": cluster.created_at,
            "InstanceGroups": [
                _group_view(ctx.runtime, session, g) for g in clusters.groups_of(session, cluster)
            ],
            **{k: settings[k] for k in ("VpcConfig", "Orchestrator", "NodeRecovery") if k in settings},
        }
    if cluster.failure_message:
        result["FailureMessage"] = cluster.failure_message
    return result


def _group_view(runtime: ServiceContext, session: Session, group: InstanceGroup) -> dict[str, Any]:
    spec = json.loads(group.spec)
    view: dict[str, Any] = {
        "InstanceGroupName": group.name,
        "InstanceType": group.instance_type,
        "TargetCount": group.target_count,
        "CurrentCount": clusters.running_count(session, group),
        "Status": InstanceGroupStatus.IN_SERVICE,  # no group status is stored (core/status.py)
        "TrainingPlanStatus": "NotApplicable",
        **{k: spec[k] for k in ECHOED if k in spec},
    }
    if group.plan_id is not None:
        plan = session.get(TrainingPlan, group.plan_id)
        assert plan is not None
        view["TrainingPlanArn"] = runtime.arn(plan.account_id, f"training-plan/{plan.name}")
        view["TrainingPlanStatus"] = plan.status
    return view


@operation("ListClusters")
def list_clusters(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    with ctx.runtime.db.read() as session:
        rows = clusters.list_clusters(session, ctx.caller.account_id)
        summaries = [_summary(ctx.runtime, session, c) for c in rows if _matches(c, request)]
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


def _matches(cluster: Cluster, request: dict[str, Any]) -> bool:
    return (
        request.get("NameContains", "") in cluster.name
        and _after(cluster.created_at, request.get("CreationTimeAfter"))
        and _before(cluster.created_at, request.get("CreationTimeBefore"))
    )


def _after(moment: datetime, bound: datetime | None) -> bool:
    return bound is None or moment > bound


def _before(moment: datetime, bound: datetime | None) -> bool:
    return bound is None or moment < bound


def _summary(runtime: ServiceContext, session: Session, cluster: Cluster) -> dict[str, Any]:
    plan_arns = []
    for group in clusters.groups_of(session, cluster):
        if group.plan_id is not None:
            plan = session.get(TrainingPlan, group.plan_id)
            assert plan is not None
            arn = runtime.arn(plan.account_id, f"training-plan/{plan.name}")
            if arn not in plan_arns:
                plan_arns.append(arn)
    return {
        "ClusterArn": cluster_arn(runtime, cluster),
        "ClusterName": cluster.name,
        "CreationTime": cluster.created_at,
        "ClusterStatus": cluster.status,
        "TrainingPlanArns": plan_arns,
    }


@operation("ListClusterNodes")
def list_cluster_nodes(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    with ctx.runtime.db.read() as session:
        cluster = clusters.get(session, ctx.runtime, ctx.caller, request["ClusterName"])
        groups = {g.id: g for g in clusters.groups_of(session, cluster)}
        nodes = [
            n
            for n in clusters.nodes_of(session, cluster)
            if request.get("InstanceGroupNameContains", "") in groups[n.group_id].name
            and _after(n.launched_at, request.get("CreationTimeAfter"))
            and _before(n.launched_at, request.get("CreationTimeBefore"))
        ]
        summaries = [_node_summary(n, groups[n.group_id]) for n in nodes]
    key = "InstanceId" if request.get("SortBy") == "NAME" else "LaunchTime"
    summaries.sort(key=lambda s: s[key], reverse=request.get("SortOrder") == "Descending")
    page, token = paginate(
        summaries, request.get("MaxResults", 100), request.get("NextToken"), cluster.cluster_id
    )
    return {"ClusterNodeSummaries": page, **({"NextToken": token} if token else {})}


def _node_summary(node: ClusterNode, group: InstanceGroup) -> dict[str, Any]:
    status: dict[str, Any] = {"Status": node.status}
    if node.message:
        status["Message"] = node.message[:1024]
    return {
        "InstanceGroupName": group.name,
        "InstanceId": node.instance_id,
        "InstanceType": group.instance_type,
        "LaunchTime": node.launched_at,
        "InstanceStatus": status,
        "PrivateDnsHostname": node.hostname,
    }


@operation("DescribeClusterNode")
def describe_cluster_node(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    if "NodeId" not in request:
        raise ValidationError("NodeId is required: this deployment names nodes by NodeId only.")
    with ctx.runtime.db.read() as session:
        cluster = clusters.get(session, ctx.runtime, ctx.caller, request["ClusterName"])
        node = next(
            (n for n in clusters.nodes_of(session, cluster) if n.instance_id == request["NodeId"]), None
        )
        if node is None:
            from hyperplan.errors import ResourceNotFound

            raise ResourceNotFound(f"Cluster {cluster.name} has no node {request['NodeId']}.")
        group = session.get(InstanceGroup, node.group_id)
        assert group is not None
        spec = json.loads(group.spec)
        zone = ctx.runtime.fleet.zone(node.availability_zone)
        details = {
            **_node_summary(node, group),
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


def cluster_arn(runtime: ServiceContext, cluster: Cluster) -> str:
    return runtime.arn(cluster.account_id, f"cluster/{cluster.cluster_id}")
