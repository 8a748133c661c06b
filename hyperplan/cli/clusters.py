"""`hyperplan clusters`: list, describe and inspect HyperPod clusters; run a command on a node; an
instance group's plans (`hyperplan clusters plans list|add|remove`)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hyperplan.cli.common import (
    emit,
    json_output,
    native_client,
    plain,
    print_json,
    reporting_errors,
    sagemaker_client,
)
from hyperplan.cli.options import ClientTyper

app = ClientTyper(
    help="HyperPod clusters: list, describe, nodes, exec, a group's plans.", no_args_is_help=True
)
plans_app = ClientTyper(
    help="An instance group's plans: its primary plan (TrainingPlanArn) and the further plans it may run on "
    "beside it, up to its target across all of them.",
    no_args_is_help=True,
)
app.add_typer(plans_app, name="plans")


@app.command("list")
def list_clusters() -> None:
    """This account's clusters."""
    from hyperplan.cli.views.clusters import ClustersTable

    with reporting_errors():
        found = sagemaker_client().items("ListClusters")
    emit(plain(found) if json_output() else found, ClustersTable)


@app.command("describe")
def describe(name: str) -> None:
    """A cluster and its instance groups: target and current counts, plan and its status."""
    from hyperplan.cli.views.clusters import ClusterDetail

    with reporting_errors():
        cluster = sagemaker_client().call("DescribeCluster", ClusterName=name)
    emit(plain(cluster), ClusterDetail)


@app.command("nodes")
def nodes(name: str) -> None:
    """A cluster's nodes and their status."""
    from hyperplan.cli.views.clusters import NodesTable

    with reporting_errors():
        found = sagemaker_client().items("ListClusterNodes", ClusterName=name)
    emit(plain(found) if json_output() else found, lambda n: NodesTable(name, n))


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_command(
    ctx: typer.Context,
    cluster: str,
    node: Annotated[str, typer.Argument(help="Instance id or host name.")],
    timeout: Annotated[int, typer.Option(help="Seconds before the command is killed.")] = 300,
) -> None:
    """Run a command on a node: `hyperplan clusters exec CLUSTER NODE -- CMD ARGS...`."""
    command = list(ctx.args)
    if not command:
        raise typer.BadParameter("give the command after --, e.g. -- hostname")
    with reporting_errors():
        result = native_client().post(
            f"/api/v1/clusters/{cluster}/nodes/{node}/exec", {"Command": command, "TimeoutSeconds": timeout}
        )
    if json_output():
        print_json(result)
        return
    sys.stdout.write(result["Stdout"])
    sys.stderr.write(result["Stderr"])
    for stream in ("Stdout", "Stderr"):
        if result.get(f"{stream}Truncated"):
            sys.stderr.write(f"\n(hyperplan: {stream.lower()} cut short at the server's exec output limit)\n")
    raise typer.Exit(result["ExitCode"] if result["ExitCode"] is not None else 1)


ClusterArg = Annotated[str, typer.Argument(help="The cluster's name.")]
GroupArg = Annotated[str, typer.Argument(help="The instance group's name.")]
PlanArg = Annotated[str, typer.Argument(help="The training plan's name or ARN.")]


def _plans_path(cluster: str, group: str, plan: str | None = None) -> str:
    from urllib.parse import quote

    # Names are encoded whole; a plan's ARN keeps its ":" and "/" (the route takes the rest of the path).
    path = f"/api/v1/clusters/{quote(cluster, safe='')}/instance-groups/{quote(group, safe='')}/plans"
    return path if plan is None else f"{path}/{quote(plan, safe=':/')}"


@plans_app.command("list")
def list_plans(cluster: ClusterArg, group: GroupArg) -> None:
    """The group's plans: the primary first, then the further ones in the order added, with each one's
    status, whether it serves now, the instances the group holds of it and the nodes running on it."""
    from hyperplan.cli.views.clusters import GroupPlansTable

    with reporting_errors():
        result = native_client().get(_plans_path(cluster, group))
    emit(result, GroupPlansTable)


@plans_app.command("add")
def add_plan(cluster: ClusterArg, group: GroupArg, plan: PlanArg) -> None:
    """Add a further plan to a plan group: a hyperpod-cluster plan of this account for the group's instance
    type and zone. The group may then run up to its target across its plans; adding it again is no change."""
    from hyperplan.cli.views.clusters import GroupPlansTable

    with reporting_errors():
        result = native_client().call("PUT", _plans_path(cluster, group, plan))
    emit(result, GroupPlansTable)


@plans_app.command("remove")
def remove_plan(cluster: ClusterArg, group: GroupArg, plan: PlanArg) -> None:
    """Remove a further plan from a group: its nodes on it carry over to the other plans' room, or are
    taken back. The primary plan is changed with UpdateCluster."""
    from hyperplan.cli.views.clusters import GroupPlansTable

    with reporting_errors():
        result = native_client().delete(_plans_path(cluster, group, plan))
    emit(result, GroupPlansTable)
