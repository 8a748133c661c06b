"""Response and error serialization, checked by botocore's own parser and by a real boto3 client.

The end-to-end tests run a throwaway HTTP server on 127.0.0.1 that wires decode_body -> parse_request ->
a tiny handler -> serialize_response / serialize_error, and talk to it with boto3 (signing is not
checked here; that is the SigV4 module's job).
"""

from __future__ import annotations

import enum
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.model import OperationModel, ServiceModel
from botocore.parsers import create_parser
from botocore.serialize import create_serializer
from hypothesis import given
from hypothesis import strategies as st

from hyperplan.errors import HyperplanError, InternalFailure, ResourceNotFound, ValidationError
from hyperplan.wire.model import operation_model
from hyperplan.wire.serialize import epoch_seconds, serialize_error, serialize_response
from hyperplan.wire.validate import decode_body, parse_request

PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan"
RC_ARN = "arn:aws:sagemaker:us-east-1:123456789012:reserved-capacity/rc-1"
START = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
END = datetime(2026, 3, 31, 8, 0, 0, 123456, tzinfo=UTC)


def botocore_parse(op: OperationModel, body: Mapping[str, Any], status: int = 200) -> dict[str, Any]:
    """Parse a serialized body exactly as boto3 would, after a trip through real JSON text."""
    response = {
        "body": json.dumps(body).encode(),
        "headers": {},
        "status_code": status,
        "context": {"operation_name": op.name},
    }
    parsed: dict[str, Any] = create_parser("json").parse(response, op.output_shape)
    parsed.pop("ResponseMetadata", None)
    return parsed


def plan(**overrides: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "TrainingPlanArn": PLAN_ARN,
        "TrainingPlanName": "my-plan",
        "Status": "Scheduled",
        "StatusMessage": None,  # omitted, not sent as null
        "DurationHours": 720,
        "DurationMinutes": 0,
        "StartTime": START,
        "EndTime": END,
        "UpfrontFee": Decimal("1234.50"),
        "CurrencyCode": "USD",
        "TotalInstanceCount": 4,
        "AvailableInstanceCount": 4,
        "InUseInstanceCount": 0,
        "TargetResources": ["training-job", "hyperpod-cluster"],
        "ReservedCapacitySummaries": [
            {
                "ReservedCapacityArn": RC_ARN,
                "InstanceType": "ml.p5.48xlarge",
                "TotalInstanceCount": 4,
                "Status": "Scheduled",
                "AvailabilityZone": "us-east-1a",
                "DurationHours": 720,
                "DurationMinutes": 0,
                "StartTime": START,
                "EndTime": END,
            }
        ],
    }
    result.update(overrides)
    return result


# ---------------------------------------------------------------------------------- round trips


def test_describe_training_plan_round_trips_through_botocore() -> None:
    op = operation_model("DescribeTrainingPlan")
    body = serialize_response(op, plan())
    assert "StatusMessage" not in body
    assert body["StartTime"] == 1772352000 and isinstance(body["StartTime"], int)
    assert body["EndTime"] == 1774944000.123456
    parsed = botocore_parse(op, body)
    assert parsed["StartTime"] == START and parsed["EndTime"] == END
    assert parsed["ReservedCapacitySummaries"][0]["EndTime"] == END
    assert parsed["UpfrontFee"] == "1234.50"  # a string shape: the Decimal keeps its exact digits
    assert parsed["TotalInstanceCount"] == 4 and parsed["TargetResources"] == [
        "training-job",
        "hyperpod-cluster",
    ]
    expected = {k: v for k, v in plan().items() if v is not None}
    expected["UpfrontFee"] = "1234.50"
    assert parsed == expected


def test_two_threads_answering_with_a_shape_new_to_both_get_the_same_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first two requests of a process answering the same operation at once: the second waits for
    the first's compile of the shape, and never calls a part of it not yet made (an IndexError: a 500)."""
    import botocore.session

    from hyperplan.wire import serialize

    # A model of our own: its shapes are new to the compiled cache, whatever ran before in this process.
    fresh = ServiceModel(botocore.session.get_session().get_service_data("sagemaker"), "sagemaker")
    op = fresh.operation_model("DescribeTrainingPlan")
    compiling, go = threading.Event(), threading.Event()
    compile_structure = serialize._COMPILERS["structure"]

    def slow_for_the_output(shape: Any) -> Any:
        if shape is op.output_shape:  # the first thread stops here, mid-compile, until told to go on
            compiling.set()
            assert go.wait(30)
        return compile_structure(shape)

    monkeypatch.setitem(serialize._COMPILERS, "structure", slow_for_the_output)
    bodies: list[Any] = [None, None]

    def answer(i: int) -> None:
        try:
            bodies[i] = serialize_response(op, plan())
        except BaseException as exc:  # what the request would have answered with
            bodies[i] = exc

    first = threading.Thread(target=answer, args=(0,))
    first.start()
    assert compiling.wait(30)
    second = threading.Thread(target=answer, args=(1,))
    second.start()
    second.join(0.3)  # it must not get a half-made function meanwhile (it waits, or it has its body)
    go.set()
    first.join(30)
    second.join(30)
    expected = serialize_response(operation_model("DescribeTrainingPlan"), plan())
    assert bodies == [expected, expected]


def test_search_offerings_round_trip_with_nested_lists() -> None:
    op = operation_model("SearchTrainingPlanOfferings")
    offering = {
        "TrainingPlanOfferingId": "tpo-abc",
        "TargetResources": ["training-job"],
        "RequestedStartTimeAfter": START,
        "DurationHours": 48,
        "DurationMinutes": 0,
        "UpfrontFee": Decimal("98.304E+2"),
        "CurrencyCode": "USD",
        "ReservedCapacityOfferings": [
            {"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "StartTime": START, "EndTime": END}
        ],
    }
    parsed = botocore_parse(op, serialize_response(op, {"TrainingPlanOfferings": [offering, offering]}))
    assert len(parsed["TrainingPlanOfferings"]) == 2
    first = parsed["TrainingPlanOfferings"][0]
    assert first["UpfrontFee"] == "9830.4"  # plain notation, never 9.8304E+3
    assert first["ReservedCapacityOfferings"][0]["EndTime"] == END
    assert serialize_response(op, {"TrainingPlanOfferings": []}) == {"TrainingPlanOfferings": []}


def test_list_and_create_round_trip() -> None:
    listed = operation_model("ListTrainingPlans")
    summary = {k: plan()[k] for k in ("TrainingPlanArn", "TrainingPlanName", "Status", "StartTime")}
    parsed = botocore_parse(
        listed, serialize_response(listed, {"TrainingPlanSummaries": [summary], "NextToken": "t"})
    )
    assert parsed == {"TrainingPlanSummaries": [summary], "NextToken": "t"}
    created = operation_model("CreateTrainingPlan")
    assert botocore_parse(created, serialize_response(created, {"TrainingPlanArn": PLAN_ARN})) == {
        "TrainingPlanArn": PLAN_ARN
    }


class Status(enum.Enum):
    ACTIVE = "Active"


def test_enum_members_serialize_as_their_values() -> None:
    op = operation_model("DescribeTrainingPlan")
    assert serialize_response(op, plan(Status=Status.ACTIVE))["Status"] == "Active"


def test_integral_decimals_are_integers() -> None:
    op = operation_model("DescribeTrainingPlan")
    body = serialize_response(op, plan(TotalInstanceCount=Decimal("4")))
    assert body["TotalInstanceCount"] == 4 and type(body["TotalInstanceCount"]) is int


# ----------------------------------------------------------------------------------- timestamps


def test_epoch_seconds_whole_and_fractional() -> None:
    assert epoch_seconds(datetime(1970, 1, 1, tzinfo=UTC)) == 0
    assert epoch_seconds(datetime(2026, 1, 1, tzinfo=UTC)) == 1767225600
    assert epoch_seconds(datetime(1970, 1, 1, 0, 0, 1, 3691, tzinfo=UTC)) == 1.003691
    assert epoch_seconds(datetime(1970, 1, 1, 2, tzinfo=timezone(timedelta(hours=2)))) == 0


def test_a_time_in_another_zone_is_the_same_instant_as_in_utc() -> None:
    op = operation_model("DescribeTrainingPlan")
    pst = datetime(2026, 1, 1, 3, 30, tzinfo=timezone(timedelta(hours=-8)))
    for moment in (pst, pst.astimezone(UTC), pst.astimezone(timezone(timedelta(0)))):
        assert serialize_response(op, plan(StartTime=moment))["StartTime"] == 1767267000


@given(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)))
def test_epoch_seconds_match_botocore_and_parse_back_exactly(moment: datetime) -> None:
    op = operation_model("ListTrainingPlans")
    # botocore's own request serializer is the reference for how the JSON protocol writes timestamps.
    sent = json.loads(create_serializer("json").serialize_to_request({"StartTimeAfter": moment}, op)["body"])
    assert epoch_seconds(moment) == sent["StartTimeAfter"]
    assert type(epoch_seconds(moment)) is type(sent["StartTimeAfter"])
    summary = {"TrainingPlanArn": PLAN_ARN, "TrainingPlanName": "p", "Status": "Active", "StartTime": moment}
    parsed = botocore_parse(op, serialize_response(op, {"TrainingPlanSummaries": [summary]}))
    assert parsed["TrainingPlanSummaries"][0]["StartTime"] == moment


# ------------------------------------------------------------------------------ handler bugs


@pytest.mark.parametrize(
    ("result", "path", "problem"),
    [
        (plan(Bogus=1), "'Bogus'", "has no member 'Bogus'"),
        (plan(TrainingPlanName=None), "DescribeTrainingPlan response:", "TrainingPlanName of"),
        (plan(TotalInstanceCount="4"), "'TotalInstanceCount'", "expected an int"),
        (plan(TotalInstanceCount=True), "'TotalInstanceCount'", "expected an int"),
        (plan(TotalInstanceCount=4.0), "'TotalInstanceCount'", "expected an int"),
        (plan(TotalInstanceCount=Decimal("4.5")), "'TotalInstanceCount'", "expected an int"),
        (plan(StartTime=datetime(2026, 1, 1)), "'StartTime'", "naive datetime"),
        (plan(StartTime=1767225600), "'StartTime'", "expected a datetime"),
        (plan(Status="ACTIVE"), "'Status'", "not in the TrainingPlanStatus enum"),
        (plan(CurrencyCode=7), "'CurrencyCode'", "expected a string"),
        (plan(UpfrontFee=Decimal("NaN")), "'UpfrontFee'", "must be finite"),
        (plan(TargetResources="training-job"), "'TargetResources'", "expected a list"),
        (plan(TargetResources=["training-job", None]), "'TargetResources[1]'", "must not be None"),
        (plan(ReservedCapacitySummaries={}), "'ReservedCapacitySummaries'", "expected a list"),
        (
            plan(ReservedCapacitySummaries=[{**plan()["ReservedCapacitySummaries"][0], "Extra": 1}]),
            "'ReservedCapacitySummaries[0].Extra'",
            "ReservedCapacitySummary has no member 'Extra'",
        ),
        (
            plan(ReservedCapacitySummaries=[{"ReservedCapacityArn": RC_ARN}]),
            "'ReservedCapacitySummaries[0]'",
            "required member(s) InstanceType, TotalInstanceCount, Status of ReservedCapacitySummary missing",
        ),
    ],
)
def test_handler_bugs_are_internal_failures_naming_the_path(
    result: dict[str, Any], path: str, problem: str
) -> None:
    with pytest.raises(InternalFailure) as info:
        serialize_response(operation_model("DescribeTrainingPlan"), result)
    assert path in info.value.message and problem in info.value.message, info.value.message
    assert info.value.message.startswith("Bad DescribeTrainingPlan response")


def test_missing_result_for_an_output_with_required_members() -> None:
    with pytest.raises(InternalFailure, match="TrainingPlanArn"):
        serialize_response(operation_model("CreateTrainingPlan"), None)


def test_operation_without_output() -> None:
    op = operation_model("DeleteApp")
    assert op.output_shape is None
    assert serialize_response(op, None) == {} and serialize_response(op, {}) == {}
    with pytest.raises(InternalFailure, match="has no output"):
        serialize_response(op, {"Anything": 1})


def tiny_operation() -> OperationModel:
    """One operation whose output has the shape types SageMaker's training-plan outputs lack."""
    model = ServiceModel(
        {
            "metadata": {"protocol": "json", "jsonVersion": "1.1", "targetPrefix": "Tiny"},
            "operations": {"Op": {"name": "Op", "output": {"shape": "Out"}}},
            "shapes": {
                "Out": {
                    "type": "structure",
                    "members": {
                        "Data": {"shape": "Data"},
                        "Ratio": {"shape": "Ratio"},
                        "Flags": {"shape": "Flags"},
                        "Ok": {"shape": "Ok"},
                    },
                },
                "Data": {"type": "blob"},
                "Ratio": {"type": "double"},
                "Flags": {"type": "map", "key": {"shape": "Key"}, "value": {"shape": "Ok"}},
                "Key": {"type": "string"},
                "Ok": {"type": "boolean"},
            },
        }
    )
    return model.operation_model("Op")


def test_blobs_doubles_maps_and_booleans_round_trip() -> None:
    op = tiny_operation()
    result = {"Data": b"\x00\xff", "Ratio": Decimal("0.25"), "Flags": {"a.b/c": True}, "Ok": False}
    parsed = botocore_parse(op, serialize_response(op, result))
    assert parsed == {"Data": b"\x00\xff", "Ratio": 0.25, "Flags": {"a.b/c": True}, "Ok": False}
    bad_results: list[tuple[dict[str, Any], str]] = [
        ({"Ok": 1}, "'Ok'"),
        ({"Data": "text"}, "'Data'"),
        ({"Ratio": float("inf")}, "'Ratio'"),
        ({"Flags": {"k": "yes"}}, "'Flags[\"k\"]'"),
        ({"Flags": {"k": None}}, "'Flags[\"k\"]'"),
        ({"Flags": {1: True}}, "'Flags[\"1\"]'"),
    ]
    for bad, path in bad_results:
        with pytest.raises(InternalFailure) as info:
            serialize_response(op, bad)
        assert path in info.value.message, info.value.message


# --------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "error",
    [ResourceNotFound("Training plan 'x' does not exist"), ValidationError("1 validation error detected: x")],
)
def test_errors_parse_as_botocore_reads_them(error: HyperplanError) -> None:
    body = serialize_error(error)
    assert body == {"__type": error.code, "message": error.message}
    parsed = botocore_parse(operation_model("DescribeTrainingPlan"), body, status=error.status)
    assert parsed["Error"] == {"Code": error.code, "Message": error.message}


# ----------------------------------------------------------------------------- through boto3

Handler = Callable[[dict[str, Any]], Mapping[str, Any] | None]


def describe(params: dict[str, Any]) -> Mapping[str, Any]:
    if params["TrainingPlanName"] == "missing":
        raise ResourceNotFound("Training plan 'missing' does not exist")
    return plan(TrainingPlanName=params["TrainingPlanName"])


def search(params: dict[str, Any]) -> Mapping[str, Any]:
    # Echo the request's timestamp back so a full request/response trip is checked.
    offering = {
        "TrainingPlanOfferingId": "tpo-1",
        "TargetResources": params["TargetResources"],
        "RequestedStartTimeAfter": params["StartTimeAfter"],
        "UpfrontFee": Decimal("10.00"),
    }
    return {"TrainingPlanOfferings": [offering]}


HANDLERS: dict[str, Handler] = {"DescribeTrainingPlan": describe, "SearchTrainingPlanOfferings": search}


class WireHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        target = self.headers.get("X-Amz-Target", "")
        try:
            op = operation_model(target.removeprefix("SageMaker."))
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            params = parse_request(op, decode_body(raw))
            status, body = 200, serialize_response(op, HANDLERS[op.name](params))
        except HyperplanError as exc:
            status, body = exc.status, serialize_error(exc)
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), WireHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield boto3.client(
            "sagemaker",
            endpoint_url=f"http://127.0.0.1:{server.server_address[1]}",
            region_name="us-east-1",
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="secret",
            config=Config(retries={"total_max_attempts": 1}),
        )
    finally:
        server.shutdown()
        server.server_close()


def test_boto3_reads_a_serialized_response(client: Any) -> None:
    response = client.describe_training_plan(TrainingPlanName="my-plan")
    assert response["StartTime"] == START and response["EndTime"] == END
    assert response["UpfrontFee"] == "1234.50"
    assert response["ReservedCapacitySummaries"][0]["InstanceType"] == "ml.p5.48xlarge"


def test_boto3_request_timestamps_survive_the_round_trip(client: Any) -> None:
    moment = datetime(2026, 5, 17, 12, 30, 45, 678901, tzinfo=UTC)
    response = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge",
        InstanceCount=1,
        StartTimeAfter=moment,
        TargetResources=["training-job"],
    )
    assert response["TrainingPlanOfferings"][0]["RequestedStartTimeAfter"] == moment


def test_boto3_raises_the_modelled_exception_with_our_message(client: Any) -> None:
    with pytest.raises(client.exceptions.ResourceNotFound) as info:
        client.describe_training_plan(TrainingPlanName="missing")
    assert info.value.response["Error"]["Message"] == "Training plan 'missing' does not exist"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_boto3_sees_validation_errors(client: Any) -> None:
    # botocore checks length but not patterns client-side, so this reaches the server.
    with pytest.raises(ClientError) as info:
        client.describe_training_plan(TrainingPlanName="not a valid name!")
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert (
        "at 'TrainingPlanName' failed to satisfy constraint: Member must satisfy regular expression"
        in (error["Message"])
    )
