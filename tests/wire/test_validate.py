"""Request validation against botocore's real SageMaker model.

Valid bodies are written by hand for several operations (and produced by botocore's own serializer);
invalid ones are derived from them by ``tests.wire.badinput`` so every member of every body is attacked.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from botocore.model import OperationModel, ServiceModel
from botocore.serialize import create_serializer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyperplan.errors import SerializationError, UnknownOperation, ValidationError
from hyperplan.wire import validate
from hyperplan.wire.java_regex import (
    UNENFORCED_PATTERNS,
    PatternTranslationError,
    compiled_pattern,
    java_to_python,
)
from hyperplan.wire.model import operation_model, service_model
from hyperplan.wire.validate import decode_body, parse_request
from tests.wire.badinput import bad_inputs, pattern_violation

ROLE = "arn:aws:iam::123456789012:role/HyperPodRole"
PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan"

VALID: dict[str, dict[str, Any]] = {
    "SearchTrainingPlanOfferings": {
        "InstanceType": "ml.p5.48xlarge",
        "InstanceCount": 4,
        "UltraServerType": "ml.u-p6e-gb200x72",
        "UltraServerCount": 1,
        "StartTimeAfter": 1767225600.25,
        "EndTimeBefore": "2026-02-01T00:00:00Z",
        "DurationHours": 720,
        "TargetResources": ["training-job", "hyperpod-cluster"],
        "TrainingPlanArn": PLAN_ARN,
    },
    "CreateTrainingPlan": {
        "TrainingPlanName": "my-plan",
        "TrainingPlanOfferingId": "tpo-0123456789abcdef",
        "SpareInstanceCountPerUltraServer": 0,
        "Tags": [{"Key": "team", "Value": "ml research"}, {"Key": "équipe", "Value": ""}],
    },
    "ListTrainingPlans": {
        "NextToken": "opaque-token",
        "MaxResults": 10,
        "StartTimeAfter": 1700000000,
        "StartTimeBefore": 1800000000.5,
        "SortBy": "StartTime",
        "SortOrder": "Descending",
        "Filters": [{"Name": "Status", "Value": "Active"}],
    },
    "DescribeTrainingPlan": {"TrainingPlanName": "my-plan"},
    "CreateCluster": {
        "ClusterName": "research-cluster",
        "InstanceGroups": [
            {
                "InstanceCount": 2,
                "InstanceGroupName": "workers",
                "InstanceType": "ml.p5.48xlarge",
                "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lifecycle/", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "InstanceStorageConfigs": [{"EbsVolumeConfig": {"VolumeSizeInGB": 500, "RootVolume": False}}],
                "OnStartDeepHealthChecks": ["InstanceStress"],
                "TrainingPlanArn": PLAN_ARN,
                "KubernetesConfig": {
                    "Labels": {"team": "ml", "sagemaker.amazonaws.com/node": "gpu"},
                    "Taints": [{"Key": "gpu", "Value": "true", "Effect": "NoSchedule"}],
                },
                "ScheduledUpdateConfig": {
                    "ScheduleExpression": "cron(0 3 ? * SUN *)",
                    "DeploymentConfig": {
                        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "INSTANCE_COUNT", "Value": 1}},
                        "WaitIntervalInSeconds": 60,
                    },
                },
            }
        ],
        "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": ["subnet-0123456789abcdef0"]},
        "Tags": [{"Key": "team", "Value": "ml"}],
    },
    "CreateTrainingJob": {
        "TrainingJobName": "llama-finetune-1",
        "HyperParameters": {"epochs": "3", "lr": "0.0001"},
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest",
            "TrainingInputMode": "File",
            "EnableSageMakerMetricsTimeSeries": True,
        },
        "RoleArn": ROLE,
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/train/"}},
                "CompressionType": "None",
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output/"},
        "ResourceConfig": {
            "InstanceType": "ml.p5.48xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 100,
            "TrainingPlanArn": PLAN_ARN,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": {"NCCL_DEBUG": "INFO"},
        "RetryStrategy": {"MaximumRetryAttempts": 2},
    },
}

# What each kind of generated mutation must be called in the message.
RULE_WORDS = {
    "required member removed": "is required and must not be null",
    "given": "Member must be",
    "shorter": "must have length greater than or equal to",
    "smaller": "must have length greater than or equal to",
    "longer": "must have length less than or equal to",
    "larger": "must have length less than or equal to",
    "below the minimum": "must have value greater than or equal to",
    "above the maximum": "must have value less than or equal to",
    "not in the enum": "must satisfy enum value set",
    "violating pattern": "must satisfy regular expression pattern",
    "unknown member": "Unknown member",
}


def rule_word(description: str) -> str:
    return next(words for key, words in RULE_WORDS.items() if key in description)


def refusal(op: OperationModel, body: object) -> str:
    with pytest.raises(ValidationError) as info:
        parse_request(op, body)
    return info.value.message


# ------------------------------------------------------------------------------------------ valid


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_body_passes_unchanged_and_is_not_mutated(name: str) -> None:
    body = VALID[name]
    before = copy.deepcopy(body)
    result = parse_request(operation_model(name), body)
    assert body == before
    assert set(result) == set(body)
    assert result is not body


def test_timestamps_become_aware_utc_datetimes() -> None:
    result = parse_request(
        operation_model("SearchTrainingPlanOfferings"), VALID["SearchTrainingPlanOfferings"]
    )
    assert result["StartTimeAfter"] == datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)
    assert result["EndTimeBefore"] == datetime(2026, 2, 1, tzinfo=UTC)
    assert result["StartTimeAfter"].tzinfo is UTC and result["EndTimeBefore"].tzinfo is UTC
    listed = parse_request(operation_model("ListTrainingPlans"), VALID["ListTrainingPlans"])
    assert listed["StartTimeAfter"] == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    offset = parse_request(
        operation_model("ListTrainingPlans"), {"StartTimeAfter": "2026-01-01T02:00:00+02:00"}
    )
    assert offset["StartTimeAfter"] == datetime(2026, 1, 1, tzinfo=UTC)
    assert offset["StartTimeAfter"].utcoffset().total_seconds() == 0


def test_what_botocore_serializes_is_accepted_with_exact_timestamps() -> None:
    """The body boto3 would send for Python values parses back to the same values."""
    op = operation_model("SearchTrainingPlanOfferings")
    start = datetime(2026, 3, 1, 8, 30, 15, 123456, tzinfo=UTC)
    end = datetime(2026, 4, 1, tzinfo=UTC)
    params = {
        "InstanceType": "ml.p5.48xlarge",
        "InstanceCount": 8,
        "StartTimeAfter": start,
        "EndTimeBefore": end,
        "DurationHours": 48,
        "TargetResources": ["training-job"],
    }
    request = create_serializer("json").serialize_to_request(params, op)
    result = parse_request(op, decode_body(request["body"]))
    assert result == params


def test_integral_floats_are_integers_and_booleans_are_not_numbers() -> None:
    op = operation_model("SearchTrainingPlanOfferings")
    assert parse_request(op, {"InstanceCount": 3.0})["InstanceCount"] == 3
    assert type(parse_request(op, {"InstanceCount": 3.0})["InstanceCount"]) is int
    assert "must be an integer, got boolean" in refusal(op, {"InstanceCount": True})
    assert "must be an integer, got a non-integral number" in refusal(op, {"InstanceCount": 2.5})


def test_null_members_count_as_absent() -> None:
    op = operation_model("CreateTrainingPlan")
    assert parse_request(op, {**VALID["CreateTrainingPlan"], "Tags": None}).get("Tags", "absent") == "absent"
    message = refusal(op, {"TrainingPlanName": None, "TrainingPlanOfferingId": "tpo-1"})
    assert "Value null at 'TrainingPlanName' failed to satisfy constraint: Member is required" in message


# -------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_generated_bad_input_is_refused_naming_its_path_and_rule(name: str) -> None:
    op = operation_model(name)
    cases = list(bad_inputs(op, VALID[name]))
    # Even one-member DescribeTrainingPlan yields removal, 3 wrong types, 2 lengths, pattern, unknown.
    assert len(cases) >= 8
    for description, body, path in cases:
        with pytest.raises(ValidationError) as info:
            parse_request(op, body)
        message = info.value.message
        assert f"'{path}'" in message, (description, message)
        assert rule_word(description) in message, (description, message)
        # One rule broken at one place gives exactly one error.
        assert message.startswith("1 validation error detected: "), (description, message)


def test_generator_covers_every_rule_on_a_deep_body() -> None:
    descriptions = [d for d, _, _ in bad_inputs(operation_model("CreateCluster"), VALID["CreateCluster"])]
    for key in set(RULE_WORDS) - {"smaller"}:  # the body's only map has no minimum size
        assert any(key in d for d in descriptions), key
    paths = {p for _, _, p in bad_inputs(operation_model("CreateCluster"), VALID["CreateCluster"])}
    assert (
        "InstanceGroups[0].ScheduledUpdateConfig.DeploymentConfig.RollingUpdatePolicy.MaximumBatchSize.Value"
        in paths
    )
    assert 'InstanceGroups[0].KubernetesConfig.Labels["sagemaker.amazonaws.com/node"]' in paths


def test_generated_pattern_violations_keep_a_legal_length() -> None:
    shape = operation_model("CreateTrainingPlan").input_shape.members["TrainingPlanName"]
    violation = pattern_violation(shape, "my-plan")
    assert violation is not None
    assert 1 <= len(violation) <= 64
    compiled = compiled_pattern(shape.metadata["pattern"])
    assert compiled is not None and compiled.fullmatch(violation) is None


# ------------------------------------------------------------------------------------ the message


def test_message_names_path_value_and_rule_in_aws_style() -> None:
    body = copy.deepcopy(VALID["CreateCluster"])
    body["InstanceGroups"][0]["ThreadsPerCore"] = 0
    assert refusal(operation_model("CreateCluster"), body) == (
        "1 validation error detected: Value '0' at 'InstanceGroups[0].ThreadsPerCore' failed to satisfy "
        "constraint: Member must have value greater than or equal to 1"
    )


def test_unknown_member_message() -> None:
    op = operation_model("SearchTrainingPlanOfferings")
    assert "Unknown member 'Foo' in SearchTrainingPlanOfferingsRequest" in refusal(op, {"Foo": 1})


def test_all_errors_are_counted_and_the_first_ten_shown() -> None:
    op = operation_model("ListTrainingPlans")
    filters = [{"Name": "Nope", "Value": "x"}] * 5  # five enum errors
    body = {
        "MaxResults": 0,
        "SortBy": "x",
        "SortOrder": "x",
        "Filters": filters,
        "A": 1,
        "B": 2,
        "C": 3,
        "D": 4,
    }
    message = refusal(op, body)
    assert message.startswith("12 validation errors detected (showing the first 10): ")
    assert message.count("; ") == 9


def test_map_values_and_keys_are_named_distinctly() -> None:
    op = operation_model("CreateCluster")
    body = copy.deepcopy(VALID["CreateCluster"])
    body["InstanceGroups"][0]["KubernetesConfig"]["Labels"] = {"ok": "-bad-", "bad key!": "v"}
    message = refusal(op, body)
    assert "at 'InstanceGroups[0].KubernetesConfig.Labels[\"ok\"]' failed" in message
    assert "Value 'bad key!' at 'InstanceGroups[0].KubernetesConfig.Labels' failed" in message
    assert "Map key must satisfy regular expression pattern" in message


def test_union_needs_exactly_one_member() -> None:
    op = operation_model("CreateCluster")
    body = copy.deepcopy(VALID["CreateCluster"])
    storage = body["InstanceGroups"][0]["InstanceStorageConfigs"][0]
    storage["FsxLustreConfig"] = {
        "DnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        "MountName": "m",
    }
    message = refusal(op, body)
    assert "at 'InstanceGroups[0].InstanceStorageConfigs[0]'" in message
    assert "Union must have exactly one member set, got 2" in message


def test_sensitive_values_are_not_echoed() -> None:
    op = operation_model("CreateModelCard")
    body = {"ModelCardName": "card", "Content": "secret\n" * 2, "ModelCardStatus": "Draft"}
    message = refusal(op, body)
    assert "secret" not in message and "Value '***' at 'Content'" in message


def test_implicit_int32_bounds_apply_without_a_model_maximum() -> None:
    op = operation_model("CreateTrainingPlan")
    body = {**VALID["CreateTrainingPlan"], "SpareInstanceCountPerUltraServer": 2**31}
    assert "must have value less than or equal to 2147483647" in refusal(op, body)


def test_deep_nesting_is_refused_not_a_crash() -> None:
    expression: dict[str, Any] = {}
    for _ in range(200):
        expression = {"SubExpressions": [expression]}
    message = refusal(operation_model("Search"), {"Resource": "TrainingJob", "SearchExpression": expression})
    assert "nested more than" in message


def test_long_values_are_truncated_in_messages() -> None:
    op = operation_model("DescribeTrainingPlan")
    message = refusal(op, {"TrainingPlanName": "x" * 5000})
    assert len(message) < 300 and "..." in message


# --------------------------------------------------------------------------------- body decoding


def test_decode_body() -> None:
    assert decode_body(b"") == {}
    assert decode_body(b"  \n") == {}
    assert decode_body(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for raw in (b"{", b"\xff\xfe{}", b'{"a": NaN}', b'{"a": Infinity}', b"[" * 100_000):
        with pytest.raises(SerializationError):
            decode_body(raw)


@pytest.mark.parametrize("body", [[], "x", 3, None, True])
def test_body_must_be_an_object(body: object) -> None:
    with pytest.raises(SerializationError, match="request body must be a JSON object"):
        parse_request(operation_model("ListTrainingPlans"), body)


def test_unknown_operation() -> None:
    with pytest.raises(UnknownOperation, match="Unknown operation 'Nope'"):
        operation_model("Nope")
    assert operation_model("CreateTrainingPlan") is operation_model("CreateTrainingPlan")


# ----------------------------------------------------------------------------------- robustness

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(member=st.sampled_from(sorted(VALID["CreateCluster"]["InstanceGroups"][0])), value=json_values)
def test_any_json_in_any_member_is_accepted_or_refused_cleanly(member: str, value: object) -> None:
    body = copy.deepcopy(VALID["CreateCluster"])
    body["InstanceGroups"][0][member] = value
    try:
        parse_request(operation_model("CreateCluster"), body)
    except ValidationError as exc:
        assert "InstanceGroups[0]" in exc.message


# ------------------------------------------------------------------------------------- patterns


def model_patterns() -> set[str]:
    model = service_model()
    shapes = (model.shape_for(name) for name in model.shape_names)
    return {shape.metadata["pattern"] for shape in shapes if "pattern" in shape.metadata}


def test_every_model_pattern_is_enforced_after_translation() -> None:
    patterns = model_patterns()
    raw_failures = set()
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error:
            raw_failures.add(pattern)
    # Python's re cannot compile these as written (\p{..}, surrogate pairs, a quantified $) ...
    assert raw_failures, "botocore's model changed: no Java-only pattern left"
    # ... and every one of them, like every other pattern, compiles after translation.
    assert all(compiled_pattern(p) is not None for p in patterns)
    assert not (patterns & set(UNENFORCED_PATTERNS))


@pytest.mark.parametrize(
    ("pattern", "accepted", "refused"),
    [
        (
            r"([\p{L}\p{Z}\p{N}_.:/=+\-@]*)",
            ["team", "équipe 2", "日本語", "a b\u3000c"],
            ["a*b", "x!", "tab\t"],
        ),
        (r"[\p{L}\p{M}\p{S}\p{N}\p{P}]+", ["group-1", "€uro", "(a)"], ["a b", "\x00"]),
        (r"([\p{L}\p{Z}\p{N}_.:\/=+\-@]*)${1,128}", ["abc", "a/b"], ["a*b"]),
        (
            r"[\u0020-\uD7FF\uE000-\uFFFD\uD800\uDC00-\uDBFF\uDFFF\t]*",
            ["table 1\t", "😀", ""],
            ["\x01", "\n"],
        ),
        (
            r"arn:[\p{Alnum}\-]+:lambda:[\p{Alnum}\-]+:[0-9]{12}:function:.*",
            ["arn:aws:lambda:us-east-1:123456789012:function:f"],
            ["arn:awsé:lambda:x:123456789012:function:f"],
        ),
        (r"\P{L}+", ["123 !"], ["a"]),
        (r".*", ["any text"], ["line\nbreak", "carriage\rreturn", "\u2028"]),
        (r"\d+", ["123"], ["١٢٣"]),  # Java's \d is ASCII-only
        (r"(?<year>\d{4})", ["2026"], ["26"]),
    ],
)
def test_java_patterns_mean_what_java_means(pattern: str, accepted: list[str], refused: list[str]) -> None:
    compiled = compiled_pattern(pattern)
    assert compiled is not None
    for text in accepted:
        assert compiled.fullmatch(text), text
    for text in refused:
        assert not compiled.fullmatch(text), text


@pytest.mark.parametrize("pattern", [r"[a-z&&[^b]]", r"\Qa.b\E", r"[\p{InGreek}]", r"\p{javaLowerCase}"])
def test_untranslatable_patterns_are_reported_and_skipped(pattern: str) -> None:
    with pytest.raises(PatternTranslationError):
        java_to_python(pattern)
    try:
        assert compiled_pattern(pattern) is None
        assert pattern in UNENFORCED_PATTERNS
    finally:
        UNENFORCED_PATTERNS.pop(pattern, None)
        compiled_pattern.cache_clear()


# ------------------------------------------------------------------------ shapes SageMaker lacks


def tiny_operation() -> OperationModel:
    """A one-operation model with the shape types SageMaker's inputs never use (blob, double)."""
    model = ServiceModel(
        {
            "metadata": {"protocol": "json", "jsonVersion": "1.1", "targetPrefix": "Tiny"},
            "operations": {"Op": {"name": "Op", "input": {"shape": "In"}}},
            "shapes": {
                "In": {
                    "type": "structure",
                    "members": {"Data": {"shape": "Data"}, "Ratio": {"shape": "Ratio"}},
                },
                "Data": {"type": "blob", "min": 1, "max": 4},
                "Ratio": {"type": "double", "min": 0, "max": 1},
            },
        }
    )
    return model.operation_model("Op")


def test_blobs_are_base64_and_doubles_are_ranged() -> None:
    op = tiny_operation()
    assert parse_request(op, {"Data": "AAEC", "Ratio": 0.5}) == {"Data": b"\x00\x01\x02", "Ratio": 0.5}
    assert "Member must be valid base64" in refusal(op, {"Data": "not base64!"})
    assert "'Data' failed to satisfy constraint: Member must have length less than" in refusal(
        op, {"Data": "AAECAwQ="}
    )
    assert "'Ratio' failed to satisfy constraint: Member must have value less than or equal to 1" in refusal(
        op, {"Ratio": 1.5}
    )
    assert "'Ratio' failed to satisfy constraint: Member must be a number, got boolean" in refusal(
        op, {"Ratio": True}
    )


def test_messages_are_json_safe() -> None:
    op = operation_model("DescribeTrainingPlan")
    message = refusal(op, {"TrainingPlanName": "bad\u0000name\n"})
    assert json.loads(json.dumps({"message": message}))["message"] == message
    assert validate.MAX_ERRORS == 10


@pytest.mark.parametrize(
    ("name", "member"),
    [
        ("SearchTrainingPlanOfferings", ("InstanceType",)),
        ("CreateTrainingJob", ("ResourceConfig", "InstanceType")),
        ("CreateCluster", ("InstanceGroups", 0, "InstanceType")),
    ],
)
def test_an_instance_type_off_aws_list_is_left_to_the_fleet_when_spelt_as_one(
    name: str, member: tuple[str | int, ...]
) -> None:
    """Which types exist is the fleet's to say (its services list its own types); a value not spelt as
    an instance type is refused here, as AWS refuses it."""
    op = operation_model(name)

    def with_type(value: str) -> dict[str, Any]:
        body = copy.deepcopy(VALID[name])
        *path, last = member
        place: Any = body
        for step in path:
            place = place[step]
        place[last] = value
        return body

    for fleet_type in ("ml.mi300x.48xlarge", "ml.m5.12xlarge"):
        parsed = parse_request(op, with_type(fleet_type))
        assert json.dumps(parsed, default=str).count(f'"{fleet_type}"') == 1
    for not_a_type in ("p5.48xlarge", "ML.P5.48XLARGE", "ml." + "x" * 60 + ".large", "ml.p5 48xlarge"):
        assert "must satisfy enum value set" in refusal(op, with_type(not_a_type))
