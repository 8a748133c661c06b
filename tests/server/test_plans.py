"""Training plans through the real aws CLI and boto3: search, buy, describe, list, reserved capacity.

The seed's walkthroughs and the crash run on real servers; the rules run on in-process ones
(tests/inprocess.py), which speak the same HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.harness import Server
from tests.inprocess import InProcessServer
from tests.postgres import Stores

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"


def _clock(server: Server) -> datetime:
    return datetime.fromisoformat(server.native().get("/api/v1/clock")["Now"])


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    error = exc.value.response["Error"]
    return str(error["Code"]), str(error["Message"])


def _assert_ends_at_1130_utc(moment: datetime) -> None:
    utc = moment.astimezone(UTC)
    assert (utc.hour, utc.minute, utc.second) == (11, 30, 0), utc


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


@pytest.fixture
def demo(fast_server: InProcessServer) -> Server:
    return fast_server


@pytest.fixture
def real_small(server_factory: type[Server], tmp_path: Path) -> Server:
    return server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()


def test_seed_walkthrough_with_the_aws_cli(
    server_factory: type[Server], tmp_path: Path, stores: Stores
) -> None:
    """On SQLite and on PostgreSQL (serve --database-url)."""
    server = server_factory(data_dir=tmp_path / "data", database_url=stores.url()).start()
    now = _clock(server)
    after, before = now + timedelta(days=2), now + timedelta(days=20)
    found = server.aws(
        "sagemaker",
        "search-training-plan-offerings",
        "--target-resources",
        "hyperpod-cluster",
        "--instance-type",
        P5,
        "--instance-count",
        "2",
        "--duration-hours",
        "96",
        "--start-time-after",
        str(int(after.timestamp())),
        "--end-time-before",
        str(int(before.timestamp())),
    )
    offerings = found["TrainingPlanOfferings"]
    assert 1 <= len(offerings) <= 3
    first = offerings[0]
    assert first["TrainingPlanOfferingId"].startswith("tpo-")
    assert first["TargetResources"] == ["hyperpod-cluster"]
    assert Decimal(first["UpfrontFee"]) > 0 and first["CurrencyCode"] == "USD"
    for segment in first["ReservedCapacityOfferings"]:
        start = datetime.fromtimestamp(segment["StartTime"], UTC)
        end = datetime.fromtimestamp(segment["EndTime"], UTC)
        assert after <= start and end <= before
        _assert_ends_at_1130_utc(end)
        assert segment["InstanceType"] == P5 and segment["InstanceCount"] == 2
    assert first["DurationHours"] >= 96

    created = server.aws(
        "sagemaker",
        "create-training-plan",
        "--training-plan-name",
        "large-models-fine-tuning",
        "--training-plan-offering-id",
        first["TrainingPlanOfferingId"],
    )
    account = server.native().get("/api/v1/whoami")["AccountId"]
    arn = f"arn:aws:sagemaker:us-west-2:{account}:training-plan/large-models-fine-tuning"
    assert created == {"TrainingPlanArn": arn}

    listed = server.aws("sagemaker", "list-training-plans")["TrainingPlanSummaries"]
    assert [p["TrainingPlanArn"] for p in listed] == [arn]
    described = server.aws(
        "sagemaker", "describe-training-plan", "--training-plan-name", "large-models-fine-tuning"
    )
    assert described["Status"] == "Scheduled"
    assert described["StatusMessage"] == "Payment confirmed, training plan scheduled."
    assert described["UpfrontFee"] == first["UpfrontFee"]
    assert described["TotalInstanceCount"] == 2 and described["AvailableInstanceCount"] == 2
    summaries = described["ReservedCapacitySummaries"]
    assert len(summaries) == len(first["ReservedCapacityOfferings"])
    for n, (summary, offered) in enumerate(
        zip(summaries, first["ReservedCapacityOfferings"], strict=True), 1
    ):
        assert summary["ReservedCapacityArn"] == (
            f"arn:aws:sagemaker:us-west-2:{account}:reserved-capacity/large-models-fine-tuning-rc{n}"
        )
        assert summary["Status"] == "Scheduled"
        assert (summary["StartTime"], summary["EndTime"]) == (offered["StartTime"], offered["EndTime"])
        assert summary["AvailabilityZone"] == offered["AvailabilityZone"]
    by_arn = server.aws("sagemaker", "describe-training-plan", "--training-plan-name", arn)
    assert by_arn["TrainingPlanName"] == "large-models-fine-tuning"
    rc = server.aws(
        "sagemaker",
        "describe-reserved-capacity",
        "--reserved-capacity-arn",
        summaries[0]["ReservedCapacityArn"],
    )
    assert rc["TotalInstanceCount"] == 2 and rc["InstanceType"] == P5
    assert rc["AvailableInstanceCount"] == 2 and rc["InUseInstanceCount"] == 0


def test_seed_walkthrough_with_boto3(server: Server) -> None:
    client = server.sagemaker()
    now = _clock(server)
    offerings = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=2,
        DurationHours=96,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=now + timedelta(days=1),
        EndTimeBefore=now + timedelta(days=15),
    )["TrainingPlanOfferings"]
    assert offerings
    arn = client.create_training_plan(
        TrainingPlanName="boto-plan", TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    plan = client.describe_training_plan(TrainingPlanName="boto-plan")
    assert plan["TrainingPlanArn"] == arn and plan["Status"] == "Scheduled"
    assert plan["StartTime"] == offerings[0]["ReservedCapacityOfferings"][0]["StartTime"]
    assert plan["EndTime"] == offerings[0]["ReservedCapacityOfferings"][-1]["EndTime"]
    assert client.list_training_plans()["TrainingPlanSummaries"][0]["TrainingPlanName"] == "boto-plan"


def test_soonest_offering_takes_the_partial_day_and_is_priced_by_its_real_length(small: Server) -> None:
    client = small.sagemaker()
    now = _clock(small)
    offerings = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=4, DurationHours=15, TargetResources=["training-job"]
    )["TrainingPlanOfferings"]
    soonest = min(offerings, key=lambda o: o["ReservedCapacityOfferings"][0]["StartTime"])
    segment = soonest["ReservedCapacityOfferings"][0]
    start = segment["StartTime"].astimezone(UTC)
    assert now + timedelta(minutes=30) <= start < now + timedelta(minutes=31)
    assert start.second == 0
    _assert_ends_at_1130_utc(segment["EndTime"])
    length = segment["EndTime"] - segment["StartTime"]
    assert timedelta(hours=24) < length < timedelta(hours=48)
    assert (segment["DurationHours"], segment["DurationMinutes"]) == divmod(
        int(length.total_seconds()) // 60, 60
    )
    hours = Decimal(int(length.total_seconds())) / 3600
    price = Decimal("40.00") if segment["AvailabilityZone"] == "us-west-2b" else Decimal("50.00")
    assert Decimal(soonest["UpfrontFee"]) == (4 * hours * price).quantize(Decimal("0.01"))


def test_an_offering_is_bought_once_by_its_searcher_within_thirty_minutes(small: Server) -> None:
    team = small.sagemaker(small.new_account("team-a"))
    other = small.sagemaker(small.new_account("team-b"))
    offerings = team.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"]
    first, second = offerings[0]["TrainingPlanOfferingId"], offerings[1]["TrainingPlanOfferingId"]
    with pytest.raises(ClientError) as exc:
        other.create_training_plan(TrainingPlanName="theirs", TrainingPlanOfferingId=first)
    assert _error(exc)[0] == "ResourceNotFound"
    team.create_training_plan(TrainingPlanName="ours", TrainingPlanOfferingId=first)
    with pytest.raises(ClientError) as exc:
        team.create_training_plan(TrainingPlanName="ours-again", TrainingPlanOfferingId=first)
    assert _error(exc)[0] == "ResourceNotFound"
    small.advance_clock("31m")
    with pytest.raises(ClientError) as exc:
        team.create_training_plan(TrainingPlanName="too-late", TrainingPlanOfferingId=second)
    code, message = _error(exc)
    assert code == "ResourceNotFound" and "search again" in message
    with pytest.raises(ClientError) as exc:
        team.create_training_plan(TrainingPlanName="forged", TrainingPlanOfferingId="tpo-" + "a" * 80)
    assert _error(exc)[0] == "ResourceNotFound"
    assert [p["TrainingPlanName"] for p in team.list_training_plans()["TrainingPlanSummaries"]] == ["ours"]
    assert other.list_training_plans()["TrainingPlanSummaries"] == []


def test_a_taken_name_is_resource_in_use_and_nothing_is_written(small: Server) -> None:
    client = small.sagemaker()
    offerings = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"]
    client.create_training_plan(
        TrainingPlanName="taken", TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"]
    )
    with pytest.raises(ClientError) as exc:
        client.create_training_plan(
            TrainingPlanName="taken", TrainingPlanOfferingId=offerings[1]["TrainingPlanOfferingId"]
        )
    assert _error(exc)[0] == "ResourceInUse"
    assert len(client.list_training_plans()["TrainingPlanSummaries"]) == 1
    # the offering was not consumed by the refused purchase
    client.create_training_plan(
        TrainingPlanName="second", TrainingPlanOfferingId=offerings[1]["TrainingPlanOfferingId"]
    )


def test_capacity_taken_since_the_search_says_search_again(small: Server) -> None:
    first = small.sagemaker(small.new_account("first"))
    late = small.sagemaker(small.new_account("late"))
    request: dict[str, Any] = {
        "InstanceType": P5,
        "InstanceCount": 8,
        "DurationHours": 48,
        "TargetResources": ["hyperpod-cluster"],
    }
    mine = first.search_training_plan_offerings(**request)["TrainingPlanOfferings"][0]
    theirs = late.search_training_plan_offerings(**request)["TrainingPlanOfferings"][0]
    assert mine["ReservedCapacityOfferings"] == theirs["ReservedCapacityOfferings"]
    first.create_training_plan(TrainingPlanName="won", TrainingPlanOfferingId=mine["TrainingPlanOfferingId"])
    with pytest.raises(ClientError) as exc:
        late.create_training_plan(
            TrainingPlanName="lost", TrainingPlanOfferingId=theirs["TrainingPlanOfferingId"]
        )
    code, message = _error(exc)
    assert code == "ResourceLimitExceeded" and "Search again" in message
    assert late.list_training_plans()["TrainingPlanSummaries"] == []
    again = late.search_training_plan_offerings(**request)["TrainingPlanOfferings"]
    assert all(o["ReservedCapacityOfferings"] != mine["ReservedCapacityOfferings"] for o in again)


def test_accounts_never_see_each_others_plans(small: Server) -> None:
    owner = small.sagemaker(small.new_account("owner"))
    stranger = small.sagemaker(small.new_account("stranger"))
    offering = owner.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    arn = owner.create_training_plan(
        TrainingPlanName="private", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    rc_arn = owner.describe_training_plan(TrainingPlanName="private")["ReservedCapacitySummaries"][0][
        "ReservedCapacityArn"
    ]
    for ref in ("private", arn):
        with pytest.raises(ClientError) as exc:
            stranger.describe_training_plan(TrainingPlanName=ref)
        assert _error(exc)[0] == "ResourceNotFound"
    with pytest.raises(ClientError) as exc:
        stranger.describe_reserved_capacity(ReservedCapacityArn=rc_arn)
    assert _error(exc)[0] == "ResourceNotFound"
    assert stranger.list_training_plans()["TrainingPlanSummaries"] == []
    # the stranger may use the same name: names are per account
    other = stranger.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    stranger.create_training_plan(
        TrainingPlanName="private", TrainingPlanOfferingId=other["TrainingPlanOfferingId"]
    )


@pytest.mark.parametrize(
    ("request_", "member"),
    [
        ({"InstanceCount": 2, "DurationHours": 24, "TargetResources": ["training-job"]}, "InstanceType"),
        ({"InstanceType": P5, "DurationHours": 24, "TargetResources": ["training-job"]}, "InstanceCount"),
        ({"InstanceType": P5, "InstanceCount": 2, "TargetResources": ["training-job"]}, "DurationHours"),
        ({"InstanceType": P5, "InstanceCount": 2, "DurationHours": 24}, "TargetResources"),
        (
            {
                "InstanceType": P5,
                "InstanceCount": 2,
                "DurationHours": 24,
                "TargetResources": ["training-job", "hyperpod-cluster"],
            },
            "TargetResources",
        ),
        (
            {"InstanceType": P5, "InstanceCount": 2, "DurationHours": 24, "TargetResources": ["endpoint"]},
            "endpoint",
        ),
        (
            {
                "InstanceType": P5,
                "InstanceCount": 3,
                "DurationHours": 24,
                "TargetResources": ["training-job"],
            },
            "InstanceCount",
        ),
        (
            {
                "InstanceType": "ml.trn1.32xlarge",
                "InstanceCount": 2,
                "DurationHours": 24,
                "TargetResources": ["training-job"],
            },
            "ml.trn1.32xlarge",
        ),
    ],
)
def test_bad_searches_name_what_is_wrong(
    fast_shared_server: Server, request_: dict[str, Any], member: str
) -> None:
    with pytest.raises(ClientError) as exc:
        fast_shared_server.sagemaker().search_training_plan_offerings(**request_)
    code, message = _error(exc)
    assert code == "ValidationException"
    assert member in message


def test_no_fit_is_an_empty_list(small: Server) -> None:
    client = small.sagemaker()
    boundary = (_clock(small) + timedelta(days=3)).replace(hour=11, minute=30, second=0, microsecond=0)
    window = {"StartTimeAfter": boundary, "EndTimeBefore": boundary + timedelta(days=3)}
    for count in (8, 4):  # fill both zones for the whole window
        offering = client.search_training_plan_offerings(
            InstanceType=P5, InstanceCount=count, DurationHours=72, TargetResources=["training-job"], **window
        )["TrainingPlanOfferings"][0]
        client.create_training_plan(
            TrainingPlanName=f"fill-{count}", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )
    found = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"], **window
    )
    assert found["TrainingPlanOfferings"] == []


def test_list_filters_sorts_and_pages(small: Server) -> None:
    client = small.sagemaker()
    names = ["charlie", "alpha", "bravo"]
    for days, name in enumerate(names, start=1):
        now = _clock(small)
        offering = client.search_training_plan_offerings(
            InstanceType=P5,
            InstanceCount=1,
            DurationHours=24,
            TargetResources=["training-job"],
            StartTimeAfter=now + timedelta(days=3 * days),
            EndTimeBefore=now + timedelta(days=3 * days + 3),
        )["TrainingPlanOfferings"][0]
        client.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )
    by_start = [p["TrainingPlanName"] for p in client.list_training_plans()["TrainingPlanSummaries"]]
    assert by_start == names
    by_name = client.list_training_plans(SortBy="TrainingPlanName", SortOrder="Descending")
    assert [p["TrainingPlanName"] for p in by_name["TrainingPlanSummaries"]] == ["charlie", "bravo", "alpha"]
    pages = list(client.get_paginator("list_training_plans").paginate(PaginationConfig={"PageSize": 1}))
    assert [p["TrainingPlanSummaries"][0]["TrainingPlanName"] for p in pages] == names
    later = client.list_training_plans(StartTimeAfter=_clock(small) + timedelta(days=5))
    assert [p["TrainingPlanName"] for p in later["TrainingPlanSummaries"]] == ["alpha", "bravo"]
    scheduled = client.list_training_plans(Filters=[{"Name": "Status", "Value": "Scheduled"}])
    assert len(scheduled["TrainingPlanSummaries"]) == 3
    assert (
        client.list_training_plans(Filters=[{"Name": "Status", "Value": "Active"}])["TrainingPlanSummaries"]
        == []
    )


def test_plans_survive_a_crash(real_small: Server) -> None:
    small = real_small
    client = small.sagemaker()
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=8, DurationHours=48, TargetResources=["hyperpod-cluster"]
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName="durable", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    small.kill()
    small.restart()
    client = small.sagemaker()
    assert client.describe_training_plan(TrainingPlanName="durable")["Status"] == "Scheduled"
    # the restarted calendar still knows the capacity is taken
    again = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=8, DurationHours=48, TargetResources=["hyperpod-cluster"]
    )["TrainingPlanOfferings"]
    assert all(o["ReservedCapacityOfferings"] != offering["ReservedCapacityOfferings"] for o in again)


def test_our_cli_searches_buys_and_shows(small: Server) -> None:
    out = small.cli(
        "plans",
        "search",
        "--instance-type",
        P5,
        "--count",
        "4",
        "--days",
        "2",
        "--target",
        "hyperpod-cluster",
    ).stdout
    assert "Offering 1" in out and "per instance-hour" in out and "us-west-2" in out
    import json

    found = json.loads(
        small.cli(
            "plans",
            "search",
            "--instance-type",
            P5,
            "--count",
            "4",
            "--days",
            "2",
            "--target",
            "hyperpod-cluster",
            "--json",
        ).stdout
    )
    small.cli("plans", "buy", "cli-plan", "--offering-id", found[0]["TrainingPlanOfferingId"])
    shown = small.cli("plans", "show", "cli-plan").stdout
    assert "cli-plan" in shown and "Scheduled" in shown and "cli-plan-rc1" in shown
    assert "cli-plan" in small.cli("plans", "list").stdout
    listed = json.loads(small.cli("plans", "list", "--json").stdout)
    assert listed[0]["TrainingPlanName"] == "cli-plan"
    fleet = json.loads(small.cli("fleet", "show", "--json").stdout)
    pool = next(
        p
        for p in fleet
        if p["InstanceType"] == P5
        and p["AvailabilityZone"] == found[0]["ReservedCapacityOfferings"][0]["AvailabilityZone"]
    )
    assert {
        "InstanceType",
        "AvailabilityZone",
        "InstanceCount",
        "ReservableCount",
        "PricePerInstanceHour",
        "CurrencyCode",
        "BookedProfile",
    } <= set(pool)
    assert max(run["Booked"] for run in pool["BookedProfile"]) == 4


def test_the_demo_offers_the_console_example_as_two_segments(demo: Server) -> None:
    """16 x ml.p5.48xlarge for 10 days on a HyperPod cluster within 8 weeks: no single AZ has 10 free days
    in a row on the busy demo calendar, so the best offering is two segments in one AZ."""
    client = demo.sagemaker()
    now = _clock(demo)
    offerings = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=16,
        DurationHours=240,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=now + timedelta(minutes=30),
        EndTimeBefore=now + timedelta(weeks=8),
    )["TrainingPlanOfferings"]
    best = offerings[0]
    segments = best["ReservedCapacityOfferings"]
    assert len(segments) == 2
    assert len({s["AvailabilityZone"] for s in segments}) == 1
    assert segments[0]["EndTime"] <= segments[1]["StartTime"]
    days = sum((s["EndTime"] - s["StartTime"]) / timedelta(days=1) for s in segments)
    assert days >= 10
    plan = client.create_training_plan(
        TrainingPlanName="split", TrainingPlanOfferingId=best["TrainingPlanOfferingId"]
    )
    described = client.describe_training_plan(TrainingPlanName="split")
    assert described["TrainingPlanArn"] == plan["TrainingPlanArn"]
    assert [s["ReservedCapacityArn"].rsplit("-", 1)[1] for s in described["ReservedCapacitySummaries"]] == [
        "rc1",
        "rc2",
    ]


def test_the_demo_background_load_is_held_by_its_own_account_and_kept_up(demo: Server) -> None:
    fleet = demo.native().get("/api/v1/fleet")["Pools"]
    p5 = [p for p in fleet if p["InstanceType"] == P5]
    assert all(0.5 < p["Utilisation"] < 0.95 for p in p5), [p["Utilisation"] for p in p5]
    names = [a["Name"] for a in demo.native().get("/api/v1/accounts")["Accounts"]]
    assert "background-load" in names
    assert demo.sagemaker().list_training_plans()["TrainingPlanSummaries"] == []  # not the admin's
    demo.advance_clock("40d")
    later = demo.native().get("/api/v1/fleet")["Pools"]
    assert all(0.5 < p["Utilisation"] < 0.95 for p in later if p["InstanceType"] == P5)
