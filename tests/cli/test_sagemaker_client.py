"""The CLI's own SageMaker client answers as botocore does, and its table is botocore's model."""

from __future__ import annotations

from typing import Any

import botocore.session
import pytest
from botocore import xform_name
from botocore.model import Shape

from hyperplan.cli.client import ApiError
from hyperplan.cli.sagemaker import SageMakerClient
from hyperplan.cli.sagemaker_shapes import OUTPUT_TIMESTAMPS, PAGES
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"


def _timestamp_paths(shape: Shape | None, prefix: tuple[str, ...] = (), seen: frozenset[str] = frozenset()):
    if shape is None:
        return
    if shape.type_name == "timestamp":
        yield ".".join(prefix)
    elif shape.type_name == "structure" and shape.name not in seen:
        for name, member in shape.members.items():  # type: ignore[attr-defined]
            yield from _timestamp_paths(member, (*prefix, name), seen | {shape.name})
    elif shape.type_name == "list":
        yield from _timestamp_paths(shape.member, (*prefix, "[]"), seen)  # type: ignore[attr-defined]


def test_the_table_is_what_botocore_s_model_says() -> None:
    session = botocore.session.Session()
    model = session.get_service_model("sagemaker")
    expected = {
        operation: tuple(_timestamp_paths(model.operation_model(operation).output_shape))
        for operation in OUTPUT_TIMESTAMPS
    }
    assert expected == OUTPUT_TIMESTAMPS, f"hyperplan/cli/sagemaker_shapes.py should say: {expected!r}"
    paginators = session.get_paginator_model("sagemaker")
    for operation, member in PAGES.items():
        config = paginators.get_paginator(operation)
        assert (config["input_token"], config["output_token"]) == ("NextToken", "NextToken"), operation
        assert config["result_key"] == member, operation


def test_every_operation_the_cli_calls_is_in_the_table() -> None:
    import re
    from pathlib import Path

    import hyperplan.cli

    called = set()
    for module in Path(hyperplan.cli.__file__).parent.glob("*.py"):
        called |= set(re.findall(r'\.(?:call|items)\(\s*"([A-Z][a-z]\w+)"', module.read_text()))
    assert called and called <= set(OUTPUT_TIMESTAMPS), called - set(OUTPUT_TIMESTAMPS)


def _buy(boto: Any, name: str) -> None:
    offering = boto.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    offering_id = offering["TrainingPlanOfferingId"]
    boto.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering_id)


def test_answers_are_botocore_s_and_pages_follow_next_token(fast_server: InProcessServer) -> None:
    boto = fast_server.sagemaker()
    ours = SageMakerClient(fast_server.native())
    for name in ("first", "second", "third"):
        _buy(boto, name)

    def theirs(operation: str, **params: Any) -> dict[str, Any]:
        answer = getattr(boto, xform_name(operation))(**params)
        answer.pop("ResponseMetadata")
        return answer

    shown = ours.call("DescribeTrainingPlan", TrainingPlanName="second")
    assert shown == theirs("DescribeTrainingPlan", TrainingPlanName="second")
    assert shown["StartTime"].tzinfo is not None and shown["ReservedCapacitySummaries"][0]["EndTime"]
    search = dict(InstanceType=P5, InstanceCount=2, DurationHours=48, TargetResources=["training-job"])
    ours_found = ours.call("SearchTrainingPlanOfferings", **search)["TrainingPlanOfferings"]
    theirs_found = theirs("SearchTrainingPlanOfferings", **search)["TrainingPlanOfferings"]
    # Offering ids are signed afresh per search; everything else is the same offering.
    for offering in (*ours_found, *theirs_found):
        offering.pop("TrainingPlanOfferingId")
    assert ours_found == theirs_found
    pages = list(ours.pages("ListTrainingPlans", MaxResults=1))
    assert len(pages) == 3 and all(len(p["TrainingPlanSummaries"]) == 1 for p in pages)
    everything = ours.items("ListTrainingPlans")
    assert everything == theirs("ListTrainingPlans")["TrainingPlanSummaries"]
    assert [p["TrainingPlanName"] for p in everything] == [
        p["TrainingPlanSummaries"][0]["TrainingPlanName"] for p in pages
    ]


def test_an_error_carries_the_wire_s_code_and_message(fast_server: InProcessServer) -> None:
    ours = SageMakerClient(fast_server.native())
    with pytest.raises(ApiError) as raised:
        ours.call("DescribeTrainingPlan", TrainingPlanName="nowhere")
    assert raised.value.status == 400 and raised.value.code == "ResourceNotFound"
    assert "nowhere" in raised.value.message
    with pytest.raises(ApiError) as invalid:
        ours.call("ListTrainingPlans", MaxResults=0)
    assert invalid.value.code == "ValidationException" and "MaxResults" in invalid.value.message
