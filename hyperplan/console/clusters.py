"""Clusters: the list, a cluster's page (groups, their plans, nodes), creating one, adding a group, a
plan group's further plans added and removed.

A group's "Instance capacity" is on-demand by default; the choice lists only the caller's plans that the
binding rules accept for the group's instance type and the chosen subnets (``console_views.plan_choices``
runs ``core/clusters.check_binding``). The request is checked against the SageMaker model like an API
request, then given to the same service (``services/clusters/clusters.py``), which checks every rule again.
A plan group's plans are read, added and removed through ``services/clusters/group_plans.py``, which the
native API and the CLI call too; the add form offers the plans the same choice would, less the group's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from hyperplan.console.forms import FieldErrors, Fields, Form, place
from hyperplan.console.web import ConsoleRequest, Page, Redirect
from hyperplan.errors import HyperplanError, ResourceNotFound
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import cluster_views, clusters, group_plans
from hyperplan.services.clusters.cluster_request import ClusterSpec, ClusterUpdate
from hyperplan.services.clusters.cluster_views import ClusterView, GroupView
from hyperplan.services.clusters.group_plans import GroupPlansView
from hyperplan.services.orchestration import console_views
from hyperplan.services.orchestration.console_views import PlanChoice
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.wire import model, validate

GROUP_ROWS = 2  # instance groups a new cluster's form offers; more are added from the cluster's page
EXECUTION_ROLE = "arn:aws:iam::000000000000:role/hyperplan-console"  # the model requires one; unused here
NOTICES = {
    "created": "Cluster created.",
    "group-added": "Instance group added.",
    "plan-added": "Training plan added to the instance group.",
    "plan-removed": "Training plan removed from the instance group.",
}
PLAN_ARN_LENGTH = 2048  # the wire's TrainingPlanArn at most; a plan's name is shorter


def clusters_list(request: ConsoleRequest) -> Page:
    return Page("clusters.html", {"clusters": cluster_views.list_all(request.runtime, request.caller)})


def cluster_detail(request: ConsoleRequest, **extra: Any) -> Page:
    runtime, caller = request.runtime, request.caller
    cluster = cluster_views.describe(runtime, caller, request.path["name"])
    _, nodes = cluster_views.nodes(runtime, caller, cluster.name)
    choices = _choices(request, list(cluster.settings.subnets))
    context: dict[str, Any] = {
        "cluster": cluster,
        "nodes": nodes,
        "notice": NOTICES.get(request.query.get("notice", ""), ""),
        "values": {"group_1_type": "", "group_1_capacity": ""},
        "errors": {},
        "rows": [1],
        "plan_offers": _plan_offers(cluster, choices["choices"]),
        "plan_values": {},  # group name -> the plan its add form was given
        "plan_errors": {},  # group name -> why its plans were not changed
        **choices,
    }
    context.update(extra)
    refused = context["errors"] or context["plan_errors"]
    return Page("cluster.html", context, status=400 if refused else 200)


def _choices(request: ConsoleRequest, subnets: list[str]) -> dict[str, Any]:
    fleet = request.runtime.fleet
    return {
        "instance_types": sorted({pool.instance_type for pool in fleet.pools}),
        "zones": fleet.zones,
        "subnet_zones": {subnet: zone.name for zone in fleet.zones for subnet in zone.subnets},
        "choices": console_views.plan_choices(request.runtime, request.caller, subnets),
        "chosen_subnets": subnets,
    }


def new_cluster(request: ConsoleRequest) -> Page:
    return _new_cluster_page(request, {}, {}, [])


def _new_cluster_page(
    request: ConsoleRequest, values: dict[str, str], errors: dict[str, str], subnets: list[str]
) -> Page:
    context = {
        "values": values,
        "errors": errors,
        "rows": range(1, GROUP_ROWS + 1),
        **_choices(request, subnets),
    }
    return Page("cluster_new.html", context, status=400 if errors else 200)


def _groups(form: Form, rows: range, fields: Fields) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The groups the form's rows describe (a row without a name is left out), as the wire has them, and
    which row each came from."""
    groups: list[dict[str, Any]] = []
    row_of: dict[str, int] = {}
    for row in rows:
        name = fields.text(f"group_{row}_name", "Group name", required=False, max_length=63)
        if not name:
            continue
        instance_type = fields.text(f"group_{row}_type", "Instance type", max_length=64)
        count = fields.whole(f"group_{row}_count", "Instance count", 0, 100_000)
        capacity = form.get(f"group_{row}_capacity")
        group: dict[str, Any] = {
            "InstanceGroupName": name,
            "InstanceType": instance_type,
            "InstanceCount": count if count is not None else 0,
            "ExecutionRole": EXECUTION_ROLE,
            "LifeCycleConfig": {
                "SourceS3Uri": form.get("lifecycle_uri").strip() or "s3://none/",
                "OnCreate": form.get("on_create").strip() or "on_create.sh",
            },
        }
        if capacity:
            group["TrainingPlanArn"] = capacity
        row_of[str(len(groups))] = row
        groups.append(group)
    return groups, row_of


def _group_members(row_of: dict[str, int]) -> dict[str, str]:
    """Wire member paths of each group -> the form's fields, for a refusal's place."""
    members: dict[str, str] = {}
    for index, row in row_of.items():
        where = f"InstanceGroups[{index}]"
        members[f"{where}.TrainingPlanArn"] = f"group_{row}_capacity"
        members[f"{where}.InstanceType"] = f"group_{row}_type"
        members[f"{where}.InstanceCount"] = f"group_{row}_count"
        members[f"{where}.InstanceGroupName"] = f"group_{row}_name"
        members[f"{where}:"] = f"group_{row}_count"
    return members


def _lifecycle(groups: list[dict[str, Any]], form: Form) -> None:
    """Without lifecycle scripts a node has nothing to run on creation: the request says so by leaving
    LifeCycleConfig's members out (the model wants them; the service runs no script then)."""
    if not form.get("lifecycle_uri").strip():
        for group in groups:
            group.pop("LifeCycleConfig")


def create_cluster(request: ConsoleRequest) -> Page | Redirect:
    form = request.form
    fields = Fields(form)
    name = fields.text("cluster_name", "Cluster name", max_length=63)
    subnets = form.get_all("subnets")
    groups, row_of = _groups(form, range(1, GROUP_ROWS + 1), fields)
    wire: dict[str, Any] = {"ClusterName": name, "InstanceGroups": groups}
    if subnets:
        wire["VpcConfig"] = {"SecurityGroupIds": ["sg-console"], "Subnets": subnets}
    members = {"ClusterName": "cluster_name", "cluster named": "cluster_name", **_group_members(row_of)}
    try:
        if not groups and "group_1_name" not in fields.errors:
            fields.errors["group_1_name"] = "A cluster needs at least one instance group: name one."
        fields.check()
        validate.parse_request(model.operation_model("CreateCluster"), wire)
        _lifecycle(groups, form)
        clusters.create(request.runtime, request.caller, ClusterSpec.from_wire(wire))
    except FieldErrors as exc:
        return _new_cluster_page(request, form.values(), exc.errors, subnets)
    except HyperplanError as exc:
        return _new_cluster_page(request, form.values(), place(exc, members).errors, subnets)
    return Redirect(f"/clusters/{quote(name, safe='')}?notice=created")


def add_group(request: ConsoleRequest) -> Page | Redirect:
    form = request.form
    fields = Fields(form)
    cluster = cluster_views.describe(request.runtime, request.caller, request.path["name"])
    groups, row_of = _groups(form, range(1, 2), fields)
    wire: dict[str, Any] = {"ClusterName": cluster.name, "InstanceGroups": groups}
    try:
        if not groups and "group_1_name" not in fields.errors:
            fields.errors["group_1_name"] = "Group name is required."
        taken = {g.name for g in cluster.groups} & {g["InstanceGroupName"] for g in groups}
        if taken:  # UpdateCluster would change that group: this form only adds
            fields.errors["group_1_name"] = f"Cluster {cluster.name} already has a group {taken.pop()}."
        fields.check()
        validate.parse_request(model.operation_model("UpdateCluster"), wire)
        _lifecycle(groups, form)
        clusters.update(request.runtime, request.caller, ClusterUpdate.from_wire(wire))
    except FieldErrors as exc:
        return cluster_detail(request, values=form.values(), errors=exc.errors)
    except HyperplanError as exc:
        return cluster_detail(request, values=form.values(), errors=place(exc, _group_members(row_of)).errors)
    return Redirect(f"/clusters/{quote(cluster.name, safe='')}?notice=group-added")


# -- a plan group's further plans -------------------------------------------------------------------------


def _plan_offers(
    cluster: ClusterView, choices: Mapping[str, tuple[PlanChoice, ...]]
) -> dict[str, tuple[PlanChoice, ...]]:
    """For each plan group, the plans its add form offers: those the group's capacity choice would (the
    caller's, for its instance type and the cluster's subnets, by the binding rules), less the group's
    own, and in its primary plan's zone when that plan is among them (a group runs in one zone)."""
    return {group.name: _offers_for(group, choices) for group in cluster.groups if group.plans}


def _offers_for(group: GroupView, choices: Mapping[str, tuple[PlanChoice, ...]]) -> tuple[PlanChoice, ...]:
    candidates = choices.get(group.instance_type, ())
    own = {plan.arn for plan in group.plans}
    primary = next((c for c in candidates if any(p.primary and p.arn == c.arn for p in group.plans)), None)
    zones = set(primary.zones) if primary is not None else None
    return tuple(c for c in candidates if c.arn not in own and (zones is None or zones.intersection(c.zones)))


GroupPlansChange = Callable[[ServiceContext, Caller, str, str, str], GroupPlansView]


def add_group_plan(request: ConsoleRequest) -> Page | Redirect:
    return _change_group_plans(request, group_plans.add_plan, "plan-added")


def remove_group_plan(request: ConsoleRequest) -> Page | Redirect:
    return _change_group_plans(request, group_plans.remove_plan, "plan-removed")


def _change_group_plans(request: ConsoleRequest, change: GroupPlansChange, notice: str) -> Page | Redirect:
    """Add or remove one of a group's plans, then back to the cluster's page (post-redirect-get). A
    refusal is shown beside the group's plans, with what was chosen; the cluster and group are looked up
    first, so that another account's, or a group the cluster lacks, is a 404 page like any other."""
    runtime, caller = request.runtime, request.caller
    cluster = cluster_views.describe(runtime, caller, request.path["name"])
    group = request.path["group"]
    if group not in {g.name for g in cluster.groups}:
        raise ResourceNotFound(f"Cluster {cluster.name} has no instance group {group}.")
    fields = Fields(request.form)
    plan = fields.text("plan", "Training plan", max_length=PLAN_ARN_LENGTH)
    try:
        fields.check()
        change(runtime, caller, cluster.name, group, plan)
    except FieldErrors as exc:
        return _plans_refused(request, group, plan, exc.errors["plan"])
    except HyperplanError as exc:
        return _plans_refused(request, group, plan, exc.message)
    return Redirect(f"/clusters/{quote(cluster.name, safe='')}?notice={notice}#plans-{group}")


def _plans_refused(request: ConsoleRequest, group: str, plan: str, message: str) -> Page:
    return cluster_detail(request, plan_values={group: plan}, plan_errors={group: message})
