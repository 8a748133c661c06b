"""One search across instance types (docs/API.md, "Searching several instance types"), against a real
HTTP server with boto3, the native client and the `hyperplan` command.

The fleet makes the order checkable: three types in one zone, with capacity another account bought
before the search, so that, in a window of six days (day 0 to day 5) for four days of 8 (or 4)
instances,

- ml.p5.48xlarge (50 USD an instance-hour) is taken on day 2: it fits only in two segments;
- ml.p4d.24xlarge (30 USD) is free: three one-segment offerings, finishing on days 4, 5 and 6;
- ml.trn1.32xlarge (80 USD, 4 instances) is taken on days 0 and 1: one offering, days 2 to 6.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.cli.support import client_env, closed_port, run_cli
from tests.inprocess import InProcessServer

P5, P4D, TRN1 = "ml.p5.48xlarge", "ml.p4d.24xlarge", "ml.trn1.32xlarge"
ROUTE = "/api/v1/training-plan-offerings/search"
DAY = timedelta(days=1)
DAY0 = datetime(2027, 3, 1, 11, 30, tzinfo=UTC)  # the first boundary after the clock's start
CLOCK_START = DAY0 - timedelta(minutes=30)  # the soonest start is DAY0 itself: no partial first day

FLEET = """
region = "us-west-2"
currency = "USD"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-00000000000000a01"]

[[pools]]
instance_type = "ml.p5.48xlarge"
zone = "us-west-2a"
count = 8
price_per_instance_hour = "50.00"

[[pools]]
instance_type = "ml.p4d.24xlarge"
zone = "us-west-2a"
count = 8
price_per_instance_hour = "30.00"

[[pools]]
instance_type = "ml.trn1.32xlarge"
zone = "us-west-2a"
count = 4
price_per_instance_hour = "80.00"

[[pools]]
instance_type = "ml.m5.12xlarge"
zone = "us-west-2a"
count = 4
reservable = 0
price_per_instance_hour = "2.50"

[policy]
ranking = "earliest"
"""


def day(n: int) -> datetime:
    return DAY0 + n * DAY


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@pytest.fixture
def server(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    """The fleet above, its clock at CLOCK_START, with ml.p5 taken on day 2 and ml.trn1 on days 0 and 1
    by another account."""
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    started = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet, clock_start=CLOCK_START).start()
    assert isinstance(started, InProcessServer)
    other = started.sagemaker(started.new_account("other-team"))
    for name, kind, count, first, stop in (("p5-day-2", P5, 8, 2, 3), ("trn1-days-0-1", TRN1, 4, 0, 2)):
        found = other.search_training_plan_offerings(
            InstanceType=kind,
            InstanceCount=count,
            DurationHours=24 * (stop - first),
            TargetResources=["training-job"],
            StartTimeAfter=day(first),
            EndTimeBefore=day(stop),
        )["TrainingPlanOfferings"]
        assert [segments(o) for o in found] == [[(day(first), day(stop))]], name
        other.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=found[0]["TrainingPlanOfferingId"]
        )
    return started


@pytest.fixture
def vision(server: InProcessServer) -> Credentials:
    return server.new_account("vision")


def when(value: Any) -> datetime:
    """A time as boto3 (a datetime) or the native API (ISO 8601) gives it."""
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def segments(offering: dict[str, Any]) -> list[tuple[datetime, datetime]]:
    return [(when(s["StartTime"]), when(s["EndTime"])) for s in offering["ReservedCapacityOfferings"]]


def search(server: InProcessServer, caller: Credentials, body: dict[str, Any]) -> list[dict[str, Any]]:
    answer = server.native(caller).post(ROUTE, body)
    assert answer["Truncated"] is False
    offerings: list[dict[str, Any]] = answer["TrainingPlanOfferings"]
    return offerings


def three_types(**window: Any) -> dict[str, Any]:
    """ml.p5 and ml.p4d at the top-level count, ml.trn1 at its own: four days, ending by day 6."""
    return {
        "InstanceTypes": [
            {"InstanceType": P5},
            {"InstanceType": P4D},
            {"InstanceType": TRN1, "InstanceCount": 4},
        ],
        "InstanceCount": 8,
        "DurationHours": 96,
        "TargetResources": ["training-job"],
        "EndTimeBefore": iso(day(6)),
        **window,
    }


def shown(offering: dict[str, Any]) -> tuple[str, int, list[tuple[int, int]], str]:
    """(type, count, [(first day, stop day)] of its segments, fee): an offering as the tests read it."""
    days = [((start - DAY0) // DAY, (end - DAY0) // DAY) for start, end in segments(offering)]
    return offering["InstanceType"], offering["InstanceCount"], days, offering["UpfrontFee"]


# -- the order ---------------------------------------------------------------------------------------------


def test_one_search_answers_every_type_in_the_documented_order(
    server: InProcessServer, vision: Credentials
) -> None:
    found = search(server, vision, three_types())
    assert [shown(o) for o in found] == [
        # one segment first; among those each type's best, the earliest finish first (ml.p4d by day 4,
        # ml.trn1 by day 6: its best, so before ml.p4d's second, which finishes sooner and costs less)
        (P4D, 8, [(0, 4)], "23040.00"),
        (TRN1, 4, [(2, 6)], "30720.00"),
        (P4D, 8, [(1, 5)], "23040.00"),
        (P4D, 8, [(2, 6)], "23040.00"),
        # ml.p5, asked for first, fits only in two segments around day 2: last, the earliest finish first
        (P5, 8, [(0, 2), (3, 5)], "38400.00"),
        (P5, 8, [(0, 1), (3, 6)], "38400.00"),
    ]
    for offering in found:
        assert offering["TargetResources"] == ["training-job"]
        assert offering["CurrencyCode"] == "USD" and offering["DurationHours"] == 96
        assert offering["RequestedEndTimeBefore"] == "2027-03-07T11:30:00Z"
        for segment in offering["ReservedCapacityOfferings"]:
            assert segment["InstanceType"] == offering["InstanceType"]
            assert segment["InstanceCount"] == offering["InstanceCount"]
            assert segment["AvailabilityZone"] == "us-west-2a"


def test_each_type_answers_what_its_own_search_answers_in_the_same_order(
    server: InProcessServer, vision: Credentials
) -> None:
    found = search(server, vision, three_types())
    client = server.sagemaker(vision)
    for kind, count in ((P5, 8), (P4D, 8), (TRN1, 4)):
        alone = client.search_training_plan_offerings(
            InstanceType=kind,
            InstanceCount=count,
            DurationHours=96,
            TargetResources=["training-job"],
            EndTimeBefore=day(6),
        )["TrainingPlanOfferings"]
        mine = [o for o in found if o["InstanceType"] == kind]
        assert [(segments(o), o["UpfrontFee"]) for o in mine] == [
            (segments(o), o["UpfrontFee"]) for o in alone
        ]
        assert 1 <= len(mine) <= 3  # the fleet's max_offerings a type


def test_each_type_answers_at_most_the_fleets_max_offerings(
    server: InProcessServer, vision: Credentials
) -> None:
    # In ten days ml.p4d could start on any of the first seven: its three best are answered, no more.
    found = search(server, vision, three_types(EndTimeBefore=iso(day(10))))
    p4d = [shown(o)[2] for o in found if o["InstanceType"] == P4D]
    assert p4d == [[(0, 4)], [(1, 5)], [(2, 6)]]
    assert all(sum(o["InstanceType"] == kind for o in found) <= 3 for kind in (P5, P4D, TRN1))


def test_at_the_same_place_and_finish_the_cheaper_comes_first_whatever_the_order_asked(
    server: InProcessServer, vision: Credentials
) -> None:
    # From day 2: ml.p4d and ml.trn1 each fit days 2 to 6 only; ml.p5 (taken on day 2) not at all.
    body = three_types(StartTimeAfter=iso(day(2)))
    body["InstanceTypes"] = [body["InstanceTypes"][i] for i in (2, 0, 1)]  # ml.trn1 asked first
    found = search(server, vision, body)
    assert [shown(o) for o in found] == [
        (P4D, 8, [(2, 6)], "23040.00"),
        (TRN1, 4, [(2, 6)], "30720.00"),
    ]
    assert all(o["RequestedStartTimeAfter"] == "2027-03-03T11:30:00Z" for o in found)


def test_times_may_be_epoch_seconds_as_boto3_sends_them(server: InProcessServer, vision: Credentials) -> None:
    as_text = search(server, vision, three_types(StartTimeAfter=iso(day(2))))
    as_seconds = search(
        server, vision, three_types(StartTimeAfter=int(day(2).timestamp()), EndTimeBefore=day(6).timestamp())
    )
    assert [shown(o) for o in as_seconds] == [shown(o) for o in as_text]


# -- buying what was found -----------------------------------------------------------------------------


def test_an_offering_found_across_types_is_bought_with_create_training_plan(
    server: InProcessServer, vision: Credentials
) -> None:
    split = next(o for o in search(server, vision, three_types()) if o["InstanceType"] == P5)
    client = server.sagemaker(vision)
    arn = client.create_training_plan(
        TrainingPlanName="p5-around-day-2", TrainingPlanOfferingId=split["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    plan = client.describe_training_plan(TrainingPlanName=arn)
    assert plan["Status"] == "Scheduled" and Decimal(plan["UpfrontFee"]) == Decimal(split["UpfrontFee"])
    bought = [(rc["StartTime"], rc["EndTime"]) for rc in plan["ReservedCapacitySummaries"]]
    assert bought == segments(split) == [(day(0), day(2)), (day(3), day(5))]
    assert {rc["InstanceType"] for rc in plan["ReservedCapacitySummaries"]} == {P5}
    assert plan["TotalInstanceCount"] == 8
    # What was bought is gone from the next search: ml.p5 has no four days left in the window.
    assert P5 not in {o["InstanceType"] for o in search(server, vision, three_types())}


def test_an_offering_is_the_searching_accounts_alone(server: InProcessServer, vision: Credentials) -> None:
    offering = search(server, vision, three_types())[0]
    stranger = server.sagemaker(server.new_account("stranger"))
    with pytest.raises(ClientError) as refused:
        stranger.create_training_plan(
            TrainingPlanName="not-mine", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )
    assert refused.value.response["Error"]["Code"] == "ResourceNotFound"


# -- refusals ----------------------------------------------------------------------------------------------


def refusal(server: InProcessServer, caller: Credentials, body: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(ApiError) as refused:
        server.native(caller).post(ROUTE, body)
    assert refused.value.status == 400
    return refused.value.code, refused.value.message


def with_types(*types: Any, **changed: Any) -> dict[str, Any]:
    return {**three_types(), "InstanceTypes": list(types), **changed}


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (with_types(), "InstanceTypes must be a list of 1 to 8 objects"),
        (with_types(*({"InstanceType": f"ml.p{n}.48xlarge"} for n in range(9))), "; it holds 9."),
        (with_types({"InstanceType": P5}, {"InstanceType": P4D}, {"InstanceType": P5, "InstanceCount": 4}),
         "InstanceTypes[2].InstanceType: ml.p5.48xlarge is given twice"),
        (with_types({"InstanceType": P5}, InstanceCount=None),
         "InstanceTypes[0].InstanceCount is required when the body has no InstanceCount"),
        (with_types({"InstanceType": P5, "InstanceCount": 0}),
         "InstanceTypes[0].InstanceCount must be a whole number from 1 to 1000000, not 0."),
        (with_types({"InstanceType": P5, "InstanceCount": "8"}),
         "InstanceTypes[0].InstanceCount must be a whole number from 1 to 1000000, not '8'."),
        (with_types({"InstanceType": P5}, InstanceCount=-8),
         "InstanceCount must be a whole number from 1 to 1000000, not -8."),
        (with_types({"InstanceType": P5, "Count": 8}), "InstanceTypes[0]: unknown member(s) 'Count'"),
        (with_types("ml.p5.48xlarge"), "InstanceTypes[0] is not an object."),
        (with_types({"InstanceCount": 8}), "InstanceTypes[0].InstanceType is required"),
        (with_types({"InstanceType": P5}, TargetResources=["training-job", "hyperpod-cluster"]),
         "TargetResources must be a list of one target"),
        (with_types({"InstanceType": P5}, StartTimeAfter="next week"),
         "StartTimeAfter: Time 'next week' is not ISO 8601"),
        (with_types({"InstanceType": P5}, EndTimeBefore=-1), "EndTimeBefore must be an ISO 8601 time"),
        (with_types({"InstanceType": P5}, DurationHours=None), "DurationHours is required."),
    ],
    ids=[
        "no type", "nine types", "a type twice", "no count", "count 0", "count as text", "negative count",
        "unknown member", "a type as text", "no type name", "two targets", "a bad time", "a negative epoch",
        "no duration",
    ],
)  # fmt: skip
def test_a_malformed_search_is_refused_naming_the_member(
    server: InProcessServer, vision: Credentials, body: dict[str, Any], said: str
) -> None:
    body = {key: value for key, value in body.items() if value is not None}
    code, message = refusal(server, vision, body)
    assert code == "ValidationException" and said in message, message


def test_a_type_the_fleet_has_no_plans_for_is_named(server: InProcessServer, vision: Credentials) -> None:
    code, message = refusal(
        server, vision, with_types({"InstanceType": P4D}, {"InstanceType": "ml.g5.48xlarge"})
    )
    assert code == "ValidationException"
    assert message.startswith("InstanceType: this fleet has no ml.g5.48xlarge.")
    on_demand = refusal(server, vision, with_types({"InstanceType": P4D}, {"InstanceType": "ml.m5.12xlarge"}))
    assert "ml.m5.12xlarge is on-demand only here" in on_demand[1]


def test_a_count_one_type_refuses_names_that_type(server: InProcessServer, vision: Credentials) -> None:
    code, message = refusal(
        server, vision, with_types({"InstanceType": P4D}, {"InstanceType": TRN1, "InstanceCount": 8})
    )
    assert code == "ValidationException"
    assert message == "InstanceCount: 8 is more than any ml.trn1.32xlarge pool can hold; the largest holds 4."
    code, message = refusal(server, vision, with_types({"InstanceType": P4D, "InstanceCount": 3}))
    assert message.startswith("For ml.p4d.24xlarge: InstanceCount: 3 is not allowed; plans hold 1, 2, 4")


def test_a_quota_refuses_the_whole_search_naming_the_type(
    server: InProcessServer, vision: Credentials
) -> None:
    server.native().call(
        "PATCH", "/api/v1/accounts/vision", body={"Quotas": {"MaxReservedInstancesPerType": 4}}
    )
    # ml.trn1 at 4 is within the quota; ml.p4d at 8 is not: the search answers nothing but the refusal.
    body = with_types({"InstanceType": TRN1, "InstanceCount": 4}, {"InstanceType": P4D})
    code, message = refusal(server, vision, body)
    assert code == "ResourceLimitExceeded"
    assert message.startswith("Quota reserved-capacity-ml.p4d.24xlarge is 4 instances for account vision")
    assert [shown(o)[0] for o in search(server, vision, with_types(body["InstanceTypes"][0]))] == [TRN1]


# -- the command ---------------------------------------------------------------------------------------------

CLI_SEARCH = [
    *["plans", "search", "--instance-type", P5, "--instance-type", P4D, "--instance-type", f"{TRN1}:4"],
    *["--count", "8", "--target", "training-job", "--days", "4", "--end-before", "2027-03-07T11:30Z"],
]


def test_the_command_searches_several_types_and_says_each_offerings_type(
    server: InProcessServer, vision: Credentials
) -> None:
    printed = server.cli(*CLI_SEARCH, credentials=vision).stdout
    titles = re.findall(
        r"^Offering (\d+): (\d+) x (\S+), (\d) segment\(s\), (\S+) USD", printed, re.MULTILINE
    )
    assert titles == [
        ("1", "8", P4D, "1", "23040.00"),
        ("2", "4", TRN1, "1", "30720.00"),
        ("3", "8", P4D, "1", "23040.00"),
        ("4", "8", P4D, "1", "23040.00"),
        ("5", "8", P5, "2", "38400.00"),
        ("6", "8", P5, "2", "38400.00"),
    ]
    assert "│ 4 x ml.trn1.32xlarge │ 2027-03-03 11:30 UTC │ 2027-03-07 11:30 UTC │" in printed
    assert printed.count("buy with: hyperplan plans buy NAME --offering-id tpo-") == 6


def test_an_offering_the_command_found_is_bought_with_the_command(
    server: InProcessServer, vision: Credentials
) -> None:
    answer = json.loads(server.cli(*CLI_SEARCH, "--json", credentials=vision).stdout)
    assert [shown(o) for o in answer["TrainingPlanOfferings"]] == [
        shown(o) for o in search(server, vision, three_types())
    ]
    trn1 = next(o for o in answer["TrainingPlanOfferings"] if o["InstanceType"] == TRN1)
    server.cli(
        "plans", "buy", "trn1-plan", "--offering-id", trn1["TrainingPlanOfferingId"], credentials=vision
    )
    plan = server.sagemaker(vision).describe_training_plan(TrainingPlanName="trn1-plan")
    assert [(rc["InstanceType"], rc["TotalInstanceCount"]) for rc in plan["ReservedCapacitySummaries"]] == [
        (TRN1, 4)
    ]


def test_one_type_is_searched_as_before_with_the_sagemaker_api(
    server: InProcessServer, vision: Credentials
) -> None:
    one = [*CLI_SEARCH[:4], *CLI_SEARCH[8:], "--json"]  # ml.p5 alone, at --count 8
    answer = json.loads(server.cli(*one, credentials=vision).stdout)
    assert isinstance(answer, list)  # SearchTrainingPlanOfferings' list, not the native answer
    assert segments(answer[0]) == [(day(0), day(2)), (day(3), day(5))]
    assert "InstanceType" not in answer[0]
    own_count = server.cli(
        *CLI_SEARCH[:3], f"{TRN1}:4", *CLI_SEARCH[10:], "--json", credentials=vision
    ).stdout
    assert [o["ReservedCapacityOfferings"][0]["InstanceCount"] for o in json.loads(own_count)] == [4]


@pytest.mark.parametrize(
    ("types", "said"),
    [
        (
            ["--instance-type", f"{P5}:eight"],
            f"Invalid value for --instance-type: '{P5}:eight' is not TYPE or ",
        ),
        (["--instance-type", f"{P5}:0"], f"'{P5}:0' is not TYPE or TYPE:COUNT"),
        (["--instance-type", ":8"], "':8' is not TYPE or TYPE:COUNT"),
        (
            ["--instance-type", f"{P5}:8", "--instance-type", f"{P5}:4"],
            f"--instance-type: {P5} is given twice",
        ),
        (["--instance-type", P5, "--instance-type", f"{P4D}:4"], f"--count: {P5} has no count: give --count"),
    ],
    ids=["a word", "zero", "no type", "twice", "no count"],
)
def test_a_bad_instance_type_option_is_one_line_before_any_request(types: list[str], said: str) -> None:
    env = client_env(HYPERPLAN_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}")
    process = run_cli("plans", "search", *types, "--target", "training-job", "--days", "1", env=env)
    output = process.stdout + process.stderr
    assert process.returncode == 2, output
    assert said in output and "Cannot reach" not in output and "Traceback" not in output
    assert len(output.strip().splitlines()) == 1, output
