"""SageMaker training-job operations: wire names in, service calls, wire names out."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from hyperplan.core.paging import paginate
from hyperplan.services.jobs import job_records, job_views, jobs
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.jobs.job_views import JobSummary
from hyperplan.wire.operations import RequestContext, operation
from hyperplan.wire.ops.tags import created

# What DescribeTrainingJob echoes of the request, as it was given.
ECHOED = (
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "CheckpointConfig",
    "Environment",
    "DebugHookConfig",
    "ExperimentConfig",
    "ProfilerConfig",
)
FLAGS = ("EnableNetworkIsolation", "EnableInterContainerTrafficEncryption", "EnableManagedSpotTraining")


@operation("CreateTrainingJob")
def create_training_job(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    runtime = ctx.runtime
    spec = TrainingJobSpec.from_wire(
        request, runs_images=runtime.images is not None, across_nodes=runtime.slurm is not None
    )
    return {"TrainingJobArn": created(ctx, request, lambda: jobs.create(ctx.runtime, ctx.caller, spec))}


@operation("StopTrainingJob")
def stop_training_job(ctx: RequestContext, request: dict[str, Any]) -> None:
    jobs.stop(ctx.runtime, ctx.caller, request["TrainingJobName"])


@operation("DescribeTrainingJob")
def describe_training_job(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    job = job_views.describe(ctx.runtime, ctx.caller, request["TrainingJobName"])
    given = job.request.as_given
    result: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        # Required by the model at every status; until the model is stored it names where it will be.
        "ModelArtifacts": {"S3ModelArtifacts": job.model_uri},
        "TrainingJobStatus": job.status,
        "SecondaryStatus": job.secondary_status,
        **{member: given[member] for member in ECHOED if member in given},
        "StoppingCondition": job.request.stopping_condition_echo(),
        "CreationTime": job.created_at,
        "LastModifiedTime": job.updated_at,
        "SecondaryStatusTransitions": [
            _transition(t.status, t.started_at, t.ended_at, t.message) for t in job.transitions
        ],
        **{flag: bool(given.get(flag, False)) for flag in FLAGS},
    }
    if job.failure_reason:
        result["FailureReason"] = job.failure_reason[: job_records.FAILURE_REASON_MAX]
    if job.training_start_at is not None:
        result["TrainingStartTime"] = job.training_start_at
    if job.training_end_at is not None:
        result["TrainingEndTime"] = job.training_end_at
    # On a plan or on demand: running time only (from instances given to instances given back), across
    # segments; the plan's fee is paid up front, so billable time is the same wall-clock figure. A managed
    # spot job: from its first start to its end, and the seconds it held instances (services/jobs/spot.py).
    if job.training_seconds >= 1:
        result["TrainingTimeInSeconds"] = job.training_seconds
    if job.billable_seconds >= 1:
        result["BillableTimeInSeconds"] = job.billable_seconds
    return result


def _transition(status: str, start: datetime, end: datetime | None, message: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"Status": status, "StartTime": start, "StatusMessage": message}
    if end is not None:
        entry["EndTime"] = end
    return entry


@operation("ListTrainingJobs")
def list_training_jobs(ctx: RequestContext, request: dict[str, Any]) -> dict[str, Any]:
    summaries = [
        _summary(job) for job in job_views.summaries(ctx.runtime, ctx.caller) if _matches(job, request)
    ]
    key = {"Name": "TrainingJobName", "Status": "TrainingJobStatus"}.get(
        request.get("SortBy", "CreationTime"), "CreationTime"
    )
    summaries.sort(key=lambda s: s[key], reverse=request.get("SortOrder") == "Descending")
    scope = json.dumps(
        [key, request.get("SortOrder"), request.get("NameContains"), request.get("StatusEquals")],
        default=str,
    )
    page, token = paginate(summaries, request.get("MaxResults", 10), request.get("NextToken"), scope)
    return {"TrainingJobSummaries": page, **({"NextToken": token} if token else {})}


def _matches(job: JobSummary, request: dict[str, Any]) -> bool:
    wanted_plan = request.get("TrainingPlanArnEquals")
    return (
        request.get("NameContains", "") in job.name
        and request.get("StatusEquals", job.status) == job.status
        and (wanted_plan is None or job.plan_arn == wanted_plan)
        # No warm pools here: a job never has a warm pool status to match.
        and "WarmPoolStatusEquals" not in request
        and _between(job.created_at, request.get("CreationTimeAfter"), request.get("CreationTimeBefore"))
        and _between(
            job.updated_at, request.get("LastModifiedTimeAfter"), request.get("LastModifiedTimeBefore")
        )
    )


def _between(moment: datetime, after: datetime | None, before: datetime | None) -> bool:
    return (after is None or moment > after) and (before is None or moment < before)


def _summary(job: JobSummary) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "TrainingJobName": job.name,
        "TrainingJobArn": job.arn,
        "CreationTime": job.created_at,
        "LastModifiedTime": job.updated_at,
        "TrainingJobStatus": job.status,
        "SecondaryStatus": job.secondary_status,
    }
    if job.training_end_at is not None:
        summary["TrainingEndTime"] = job.training_end_at
    if job.plan_arn is not None:
        summary["TrainingPlanArn"] = job.plan_arn
    return summary
