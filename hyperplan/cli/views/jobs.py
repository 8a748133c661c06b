"""Views of training jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from hyperplan.cli.views.base import TableView, last_part, when


@dataclass(frozen=True)
class JobsTable:
    jobs: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                j["TrainingJobName"],
                j["TrainingJobStatus"],
                j.get("SecondaryStatus", ""),
                when(j["CreationTime"], seconds=True),
                last_part(j.get("TrainingPlanArn", "on-demand")),
            ]
            for j in self.jobs
        ]
        return TableView("Training jobs", ["Name", "Status", "Secondary", "Created", "Plan"], rows)


@dataclass(frozen=True)
class JobDetail:
    """A job's status, where it runs, why it failed, and every status it has had."""

    job: dict[str, Any]

    def __rich__(self) -> Group:
        job = self.job
        resources = job.get("ResourceConfig", {})
        plan = last_part(resources.get("TrainingPlanArn", "on-demand"))
        size = f"{resources.get('InstanceCount', '?')} x {resources.get('InstanceType', '?')}"
        status = f"{job['TrainingJobStatus']} / {job['SecondaryStatus']}"
        parts: list[RenderableType] = [
            Text.assemble((job["TrainingJobName"], "bold"), f"  {status}  {size} on {plan}")
        ]
        if job.get("FailureReason"):
            parts.append(Text(job["FailureReason"], style="red"))
        parts.append(Text(f"Model: {job['ModelArtifacts']['S3ModelArtifacts']}"))
        if job.get("TrainingPlans"):
            parts.append(Text(f"Plans: {', '.join(last_part(arn) for arn in job['TrainingPlans'])}"))
        if job.get("RunningOnPlan"):
            parts.append(Text(f"Running on plan {last_part(job['RunningOnPlan'])}"))
        image = job.get("AlgorithmSpecification", {}).get("TrainingImage")
        if image:
            resolved = job.get("ResolvedImage")
            shown = f" (resolves to {resolved})" if resolved and resolved != image else ""
            digest = f", ran {job['ImageDigest']}" if job.get("ImageDigest") else ""
            parts.append(Text(f"Image: {image}{shown}{digest}"))
        rows = [
            [
                t["Status"],
                when(t["StartTime"], seconds=True),
                when(t.get("EndTime"), seconds=True),
                t.get("StatusMessage", ""),
            ]
            for t in job.get("SecondaryStatusTransitions", [])
        ]
        parts.append(TableView("Transitions", ["Status", "Start", "End", "Message"], rows))
        return Group(*parts)


@dataclass(frozen=True)
class JobStatus:
    """One line: a job's status and secondary status."""

    job: dict[str, Any]

    def __rich__(self) -> Text:
        return Text(
            f"{self.job['TrainingJobName']}: {self.job['TrainingJobStatus']} / {self.job['SecondaryStatus']}"
        )


@dataclass(frozen=True)
class JobPlansTable:
    """The plans a job may run on (`jobs plans list|add|remove`): the one it names first."""

    answer: dict[str, Any]

    def __rich__(self) -> TableView:
        rows = [
            [
                p["TrainingPlanName"],
                "named" if p["Primary"] else "further",
                p["Status"],
                "yes" if p["RunningOnIt"] else "",
                p["TrainingPlanArn"],
            ]
            for p in self.answer["Plans"]
        ]
        return TableView(
            f"Plans of training job {self.answer['TrainingJobName']}",
            ["Plan", "Role", "Status", "Running on it", "ARN"],
            rows,
        )
