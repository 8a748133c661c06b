"""Every SageMaker operation that takes a time or a duration, at the edges of what the wire can carry.

The model lets a timestamp be anything from the year 1 to the year 9999 (epoch seconds or ISO 8601 with
any offset) and a duration anything up to its model maximum. None of that may reach date arithmetic
unchecked: each answer is a result or a ValidationException, never a 500.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness import Server, signed_post

LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z
FIRST_SECOND = -62135596800  # 0001-01-01T00:00:00Z
EXTREMES: list[Any] = [
    LAST_SECOND,
    FIRST_SECOND,
    LAST_SECOND - 30,
    "9999-12-31T23:00:00-05:00",  # in range as written, out of range in UTC
    "0001-01-01T00:00:00+01:00",
    1e300,
]
P5 = "ml.p5.48xlarge"
SEARCH = {"InstanceType": P5, "InstanceCount": 1, "DurationHours": 24, "TargetResources": ["training-job"]}


@pytest.fixture(scope="module")
def plan_arn(fast_shared_server: Server) -> str:
    """A plan, so that the listings below have something to compare the times with."""
    client = fast_shared_server.sagemaker()
    offering = client.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"][0]
    return str(
        client.create_training_plan(
            TrainingPlanName="edges", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )["TrainingPlanArn"]
    )


def _call(server: Server, operation: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = signed_post(server, f"SageMaker.{operation}", json.dumps(body).encode())
    return response.status_code, response.json()


def _answered(server: Server, operation: str, body: dict[str, Any]) -> None:
    status, answer = _call(server, operation, body)
    assert status == 200 or (status == 400 and answer["__type"] == "ValidationException"), (
        operation,
        body,
        status,
        answer,
    )


TIMED_MEMBERS = [
    ("SearchTrainingPlanOfferings", SEARCH, "StartTimeAfter"),
    ("SearchTrainingPlanOfferings", SEARCH, "EndTimeBefore"),
    ("ListTrainingPlans", {}, "StartTimeAfter"),
    ("ListTrainingPlans", {}, "StartTimeBefore"),
    ("ListClusters", {}, "CreationTimeAfter"),
    ("ListClusters", {}, "CreationTimeBefore"),
    ("ListTrainingJobs", {}, "CreationTimeAfter"),
    ("ListTrainingJobs", {}, "CreationTimeBefore"),
    ("ListTrainingJobs", {}, "LastModifiedTimeAfter"),
    ("ListTrainingJobs", {}, "LastModifiedTimeBefore"),
]


@pytest.mark.parametrize(("operation", "base", "member"), TIMED_MEMBERS)
def test_extreme_times_are_answered_never_a_500(
    fast_shared_server: Server, plan_arn: str, operation: str, base: dict[str, Any], member: str
) -> None:
    for value in EXTREMES:
        _answered(fast_shared_server, operation, {**base, member: value})


def test_a_search_starting_at_the_last_second_is_refused_by_name(fast_shared_server: Server) -> None:
    for end in (None, LAST_SECOND):
        body = {**SEARCH, "StartTimeAfter": LAST_SECOND, **({"EndTimeBefore": end} if end else {})}
        status, answer = _call(fast_shared_server, "SearchTrainingPlanOfferings", body)
        assert (status, answer["__type"]) == (400, "ValidationException")
        assert answer["message"].startswith("StartTimeAfter: 9999-12-31T23:59:59Z is too late")


def test_durations_at_their_model_maximum_are_answered_never_a_500(
    fast_shared_server: Server, plan_arn: str
) -> None:
    _answered(fast_shared_server, "SearchTrainingPlanOfferings", {**SEARCH, "DurationHours": 87600})
    _answered(
        fast_shared_server,
        "SearchTrainingPlanOfferings",
        {"TrainingPlanArn": plan_arn, "DurationHours": 87600},
    )
    job = {
        "TrainingJobName": "longest",
        "RoleArn": "arn:aws:iam::111122223333:role/hyperplan",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "local/python:3",
            "ContainerEntrypoint": ["python", "-c", "pass"],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {
            "InstanceType": P5,
            "InstanceCount": 1,
            "VolumeSizeInGB": 10,
            "TrainingPlanArn": plan_arn,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 2**31 - 1, "MaxPendingTimeInSeconds": 2419200},
    }
    _answered(fast_shared_server, "CreateTrainingJob", job)  # queued on a plan that has not started
    status, described = _call(fast_shared_server, "DescribeTrainingJob", {"TrainingJobName": "longest"})
    assert status == 200 and described["StoppingCondition"]["MaxRuntimeInSeconds"] == 2**31 - 1
    _answered(fast_shared_server, "StopTrainingJob", {"TrainingJobName": "longest"})
