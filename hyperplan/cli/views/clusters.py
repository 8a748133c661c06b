"""Views of HyperPod clusters and their nodes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView, last_part, when


@dataclass(frozen=True)
class ClustersTable:
    clusters: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                c["ClusterName"],
                c["ClusterStatus"],
                when(c["CreationTime"]),
                ", ".join(last_part(a) for a in c.get("TrainingPlanArns", [])),
            ]
            for c in self.clusters
        ]
        return TableView("Clusters", ["Name", "Status", "Created", "Training plans"], rows)


@dataclass(frozen=True)
class ClusterDetail:
    """A cluster and its instance groups: counts, and the plan each runs on."""

    cluster: dict[str, Any]

    def __rich__(self) -> Group:
        c = self.cluster
        heading = Text.assemble((c["ClusterName"], "bold"), f"  {c['ClusterStatus']}  {c['ClusterArn']}")
        rows = [
            [
                g["InstanceGroupName"],
                g["InstanceType"],
                g["CurrentCount"],
                g["TargetCount"],
                g["Status"],
                last_part(g.get("TrainingPlanArn", "on-demand")),
                g.get("TrainingPlanStatus", ""),
            ]
            for g in c["InstanceGroups"]
        ]
        groups = TableView(
            "Instance groups", ["Group", "Type", "Current", "Target", "Status", "Plan", "Plan status"], rows
        )
        return Group(heading, groups)


@dataclass(frozen=True)
class NodesTable:
    cluster_name: str
    nodes: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                n["InstanceGroupName"],
                n["InstanceId"],
                n.get("PrivateDnsHostname", ""),
                n["InstanceType"],
                n["InstanceStatus"]["Status"],
                when(n["LaunchTime"]),
                n["InstanceStatus"].get("Message", ""),
            ]
            for n in self.nodes
        ]
        return TableView(
            f"Nodes of {self.cluster_name}",
            ["Group", "Instance", "Host", "Type", "Status", "Launched", "Message"],
            rows,
        )


@dataclass(frozen=True)
class GroupPlansTable:
    """An instance group's plans (the primary first, then the further ones as added): each plan's status,
    whether it can serve now, the instances the group holds of it and its nodes running on it."""

    answer: dict[str, Any]

    def __rich__(self) -> TableView:
        a = self.answer
        rows = [
            [
                p["TrainingPlanName"],
                "primary" if p["Primary"] else "further",
                p["Status"],
                "yes" if p["ActiveNow"] else "no",
                p["CapacityNow"],
                p["Serving"],
            ]
            for p in a["Plans"]
        ]
        title = (
            f"Plans of group {a['InstanceGroupName']} of {a['ClusterName']} ({a['InstanceType']}, "
            f"{a['CurrentCount']} of {a['TargetCount']} running)"
        )
        columns = ["Plan", "Role", "Status", "Serves now", "Capacity now", "Running on it"]
        return TableView(title, columns, rows)
