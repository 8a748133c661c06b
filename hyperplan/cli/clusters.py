"""`hyperplan clusters`: list, describe and inspect HyperPod clusters; run a command on a node."""

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

app = ClientTyper(help="HyperPod clusters: list, describe, nodes, exec.", no_args_is_help=True)


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
