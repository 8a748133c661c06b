"""Training jobs that book their own capacity (issue 49): the tag `hyperplan:auto-book` on the wire, the
native `AutoBook` structure, the plan bought on the account's behalf, the wait and its ends.

Each server runs a fleet of this module's own, two reservable types whose prices make one the cheaper,
under a manual clock that starts at 11:00 UTC, half an hour before a segment boundary: the soonest plan
then starts at a boundary, with no partial day, so its price is the type's hourly price x count x 24.
No test waits for service time: the clock is moved. The run to completion is on a real server with real
processes; the rules are on in-process servers over the fake back end (tests/inprocess.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.backends.fake import Program
from hyperplan.backends.local import LocalBackend
from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import ADMIN, Server, wait_until
from tests.inprocess import InProcessServer

START = datetime(2027, 3, 1, 11, 0, tzinfo=UTC)
BOUNDARY = START + timedelta(minutes=30)  # where the soonest plan starts: 11:30 UTC
P5, P4D = "ml.p5.48xlarge", "ml.p4d.24xlarge"
P5_PRICE, P4D_PRICE = Decimal("60.00"), Decimal("20.00")
ROLE = "arn:aws:iam::123456789012:role/AutoBookRole"
TAG = "hyperplan:auto-book"

FLEET = f"""
region = "us-west-2"
currency = "USD"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["subnet-00000000000000a01"]

[[pools]]
instance_type = "{P5}"
zone = "us-west-2a"
count = 2
price_per_instance_hour = "{P5_PRICE}"

[[pools]]
instance_type = "{P4D}"
zone = "us-west-2a"
count = 4
price_per_instance_hour = "{P4D_PRICE}"
"""


def _fleet(tmp_path: Path) -> Path:
    path = tmp_path / "auto-book-fleet.toml"
    path.write_text(FLEET)
    return path


@pytest.fixture
def real(server_factory: type[Server], tmp_path: Path) -> Iterator[Server]:
    server = server_factory(data_dir=tmp_path / "data", fleet=_fleet(tmp_path), clock_start=START)
    yield server.start()
    LocalBackend(server.work_dir / "backend").adopt([])  # whatever the test left running goes with it
    assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture
def fast(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=_fleet(tmp_path), clock_start=START)
    yield server.start()
    assert "Traceback" not in server.log(), server.log()[-5000:]


# -- helpers -----------------------------------------------------------------------------------------


def _job(
    name: str, command: list[str], bucket: str, *, tag: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A CreateTrainingJob request; `tag` is the auto-book tag's value. Its ResourceConfig asks for one
    p5, which is what DescribeTrainingJob keeps showing whatever the job books."""
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "ContainerEntrypoint": command[:2],
            **({"ContainerArguments": command[2:]} if command[2:] else {}),
        },
        "OutputDataConfig": {"S3OutputPath": f"s3://{bucket}/output"},
        "ResourceConfig": {"InstanceType": P5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        **extra,
    }
    if tag is not None:
        request["Tags"] = [{"Key": TAG, "Value": tag}, {"Key": "team", "Value": "vision"}]
    return request


def _cli_option(member: str) -> str:
    """The aws CLI's option for a request member: TrainingJobName -> training-job-name."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", member).lower()


def _bucket(server: Server, credentials: Credentials, name: str) -> str:
    server.native(credentials).post("/api/v1/buckets", {"Name": name})
    return name


def _describe(server: Server, name: str, credentials: Credentials = ADMIN) -> dict[str, Any]:
    return dict(server.sagemaker(credentials).describe_training_job(TrainingJobName=name))


def _last_message(job: dict[str, Any]) -> str:
    return str(job["SecondaryStatusTransitions"][-1]["StatusMessage"])


def _messages(job: dict[str, Any]) -> list[str]:
    return [t["StatusMessage"] for t in job["SecondaryStatusTransitions"]]


def _wait_status(
    server: Server, name: str, secondary: str, credentials: Credentials = ADMIN, timeout: float = 90
) -> dict[str, Any]:
    job = wait_until(
        lambda: (d := _describe(server, name, credentials))["SecondaryStatus"] == secondary and d, timeout
    )
    if not job:
        found = _describe(server, name, credentials)
        pytest.fail(
            f"{name} is not {secondary} after {timeout} s: {found['TrainingJobStatus']}/"
            f"{found['SecondaryStatus']} {found.get('FailureReason')!r}; {_messages(found)}\n"
            f"{server.log()[-3000:]}"
        )
    return dict(job)


def _buy(
    server: Server, credentials: Credentials, name: str, instance_type: str, count: int, days: int
) -> None:
    """Another account takes capacity: the first offering, bought."""
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=instance_type,
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=["training-job"],
        StartTimeAfter=BOUNDARY,
        EndTimeBefore=BOUNDARY + timedelta(days=days),
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )


def _plan_names(server: Server, credentials: Credentials) -> list[str]:
    plans = server.sagemaker(credentials).list_training_plans()["TrainingPlanSummaries"]
    return sorted(plan["TrainingPlanName"] for plan in plans)


# -- tests -------------------------------------------------------------------------------------------


def test_a_tagged_job_books_the_cheapest_acceptable_offering_and_runs_on_it(real: Server) -> None:
    server, client = real, real.sagemaker()
    bucket = _bucket(server, ADMIN, "auto-out")
    # One p5 or two p4d for a day, within a week: two p4d cost 2 x 20 an hour, one p5 60.
    tag = f"types={P5}:1+{P4D}:2/days=1/within=7d/max-usd=5000"
    program = "import os; print('trained on', os.environ['SM_CURRENT_INSTANCE_TYPE'], os.environ['SM_HOSTS'])"
    request = _job("cheap", ["python", "-c", program], bucket, tag=tag)
    # As a wire user sends it: the real aws CLI, the request's members as JSON.
    arguments = [
        f"--{_cli_option(member)}={value if isinstance(value, str) else json.dumps(value)}"
        for member, value in request.items()
    ]
    arn = server.aws("sagemaker", "create-training-job", *arguments)["TrainingJobArn"]

    job = _describe(server, "cheap")
    fee = 2 * P4D_PRICE * 24
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
    booked = _last_message(job)
    assert f"Booked plan cheap ({P4D} x2, 1 segment, {fee:,.2f} USD)" in booked, _messages(job)
    assert "2027-03-01 11:30 UTC" in booked  # when its segment starts
    assert "books itself" in _messages(job)[0]
    # What it was sent with stays what it shows; what it runs on is the plan's.
    assert job["ResourceConfig"] == {"InstanceType": P5, "InstanceCount": 1, "VolumeSizeInGB": 10}
    plan = client.describe_training_plan(TrainingPlanName="cheap")
    segments = plan["ReservedCapacitySummaries"]
    assert (plan["Status"], plan["TotalInstanceCount"], len(segments)) == ("Scheduled", 2, 1)
    assert (segments[0]["InstanceType"], segments[0]["StartTime"]) == (P4D, BOUNDARY)
    assert Decimal(plan["UpfrontFee"]) == fee
    plan_tags = {t["Key"]: t["Value"] for t in client.list_tags(ResourceArn=plan["TrainingPlanArn"])["Tags"]}
    assert plan_tags == {"hyperplan:auto-booked-for": "cheap"}
    job_tags = {t["Key"]: t["Value"] for t in client.list_tags(ResourceArn=arn)["Tags"]}
    assert job_tags == {TAG: tag, "team": "vision"}
    listed = client.list_training_jobs(TrainingPlanArnEquals=plan["TrainingPlanArn"])["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in listed] == ["cheap"]
    # The ledger has the charge, and the plan's history says whom it was bought for.
    entries = server.native().get("/api/v1/accounts/admin/ledger")["Entries"]
    assert [(Decimal(e["Amount"]), "cheap" in e["Description"]) for e in entries] == [(-fee, True)]
    events = server.native().get("/api/v1/plans/cheap/events")["Events"]
    assert [e["Message"] for e in events if e["Kind"] == "auto-booked"] == [
        "Bought for training job cheap, which books its own capacity; the job runs on it."
    ]
    native = server.native().get("/api/v1/training-jobs/cheap")["AutoBook"]
    assert (native["BookedPlan"], native["Waiting"]) == ("cheap", None)
    assert native["Request"]["InstanceTypes"] == [
        {"InstanceType": P5, "InstanceCount": 1},
        {"InstanceType": P4D, "InstanceCount": 2},
    ]

    server.set_clock(BOUNDARY + timedelta(minutes=1))
    job = _wait_status(server, "cheap", "Completed", timeout=120)
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == [
        "Starting", "Pending", "Downloading", "Training", "Uploading", "Completed"
    ]  # fmt: skip
    logs = server.cli("jobs", "logs", "cheap").stdout
    assert f'trained on {P4D} ["algo-1","algo-2"]' in logs, logs  # the plan's two p4d, not one p5
    assert server.cli("jobs", "logs", "cheap", "--host", "algo-2").returncode == 0


def test_a_job_waits_while_nothing_is_free_books_when_a_plan_is_cancelled_and_fails_when_its_window_passes(
    fast: InProcessServer,
) -> None:
    server = fast
    other = server.new_account("other")
    _buy(server, other, "all-p5", P5, 2, 14)
    _buy(server, other, "all-p4d", P4D, 4, 14)
    team = server.new_account("team")
    client = server.sagemaker(team)
    bucket = _bucket(server, team, "team-out")
    program = list(server.world.command(Program.exits(0, stdout=b"done\n")))
    client.create_training_job(
        **_job("patient", program, bucket, tag=f"types={P5}:2+{P4D}:4/days=1/within=7d")
    )
    client.create_training_job(**_job("hurried", program, bucket, tag=f"types={P5}:2/days=1/within=3d"))
    limited = {"MaxRuntimeInSeconds": 86400, "MaxPendingTimeInSeconds": 5400}
    impatient = _job(
        "impatient", program, bucket, tag=f"types={P5}:2/days=1/within=7d", StoppingCondition=limited
    )
    client.create_training_job(**impatient)

    for name in ("patient", "hurried", "impatient"):
        job = _describe(server, name, team)
        assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Pending")
        message = _last_message(job)
        assert message.startswith("Waiting to book capacity: no offering of "), message
        assert "looks again when capacity frees" in message, message
    assert _plan_names(server, team) == []
    waiting = server.native(team).get("/api/v1/training-jobs/patient")["AutoBook"]
    assert waiting["BookedPlan"] is None and waiting["Waiting"].startswith("Waiting to book capacity")

    # MaxPendingTimeInSeconds counts from the job's creation while it waits to book: it fails then.
    server.set_clock(START + timedelta(minutes=89))
    assert _describe(server, "impatient", team)["SecondaryStatus"] == "Pending"
    server.set_clock(START + timedelta(minutes=90))
    impatient_now = _describe(server, "impatient", team)
    assert (impatient_now["TrainingJobStatus"], impatient_now["SecondaryStatus"]) == ("Failed", "Failed")
    assert "MaxPendingTimeInSeconds (5400) passed at 2027-03-01 12:30 UTC" in impatient_now["FailureReason"]

    # A day later it has looked every hour: still nothing.
    day = START + timedelta(days=1)
    server.set_clock(day)
    assert _describe(server, "patient", team)["SecondaryStatus"] == "Pending"
    # An administrator cancels the other account's p4d plan: its capacity is free, and the job books it.
    server.native().post("/api/v1/accounts/other/plans/all-p4d/cancel", {"Reason": "maintenance"})
    job = _describe(server, "patient", team)
    assert f"Booked plan patient ({P4D} x4, 1 segment, {4 * P4D_PRICE * 24:,.2f} USD)" in _last_message(job)
    assert "2027-03-02 11:30 UTC" in _last_message(job)  # the soonest start
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == ["Starting", "Pending", "Pending"]
    assert _plan_names(server, team) == ["patient"]
    hurried = _describe(server, "hurried", team)  # it wants p5, still taken; a plan from 11:30 would fit
    assert hurried["SecondaryStatus"] == "Pending", hurried.get("FailureReason")

    server.set_clock(day + timedelta(hours=1))  # the plan started at 11:30
    _wait_status(server, "patient", "Completed", team)
    hurried = _describe(server, "hurried", team)
    assert (hurried["TrainingJobStatus"], hurried["SecondaryStatus"]) == ("Failed", "Failed")
    reason = hurried["FailureReason"]
    assert reason.startswith("Could not book capacity: its window can no longer be met"), reason
    assert "2027-03-04 11:00 UTC" in reason  # the window's end: three days from its creation
    assert _plan_names(server, team) == ["patient"]


def test_a_budget_too_small_for_every_acceptable_offering_fails_the_job_at_once(
    fast: InProcessServer,
) -> None:
    server = fast
    thrifty = server.new_account("thrifty", PaymentMode="budget")
    server.native().call("PATCH", "/api/v1/accounts/thrifty", body={"Budget": "500.00"})
    bucket = _bucket(server, thrifty, "thrifty-out")
    client = server.sagemaker(thrifty)
    program = list(server.world.command(Program.exits(0)))
    client.create_training_job(**_job("dear", program, bucket, tag=f"types={P5}:1+{P4D}:2/days=1"))
    job = _describe(server, "dear", thrifty)
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Failed", "Failed")
    reason = job["FailureReason"]
    assert "budget" in reason and "500.00 USD" in reason, reason
    assert f"({P4D} x2) costs {2 * P4D_PRICE * 24:,.2f} USD" in reason, reason  # the cheapest
    assert _plan_names(server, thrifty) == []  # nothing bought
    ledger = server.native().get("/api/v1/accounts/thrifty/ledger")["Entries"]
    assert [Decimal(e["Amount"]) for e in ledger] == [Decimal("500.00")]  # the budget given, no charge

    # With a budget that pays for the cheaper type only, it books that one, whatever it prefers.
    server.native().call("PATCH", "/api/v1/accounts/thrifty", body={"Budget": "1000.00"})
    tag = f"types={P5}:1+{P4D}:2/days=1/prefer=earliest"
    client.create_training_job(**_job("affordable", program, bucket, tag=tag))
    assert f"Booked plan affordable ({P4D} x2" in _last_message(_describe(server, "affordable", thrifty))


def test_in_approval_mode_the_job_waits_for_the_invoice_and_fails_when_it_is_rejected(
    fast: InProcessServer,
) -> None:
    server = fast
    team = server.new_account("careful", PaymentMode="approval")
    bucket = _bucket(server, team, "careful-out")
    client = server.sagemaker(team)
    program = list(server.world.command(Program.exits(0)))
    client.create_training_job(**_job("approved", program, bucket, tag=f"types={P4D}:2/days=1"))
    client.create_training_job(**_job("rejected", program, bucket, tag=f"types={P4D}:2/days=1"))
    invoices = {
        i["TrainingPlanName"]: i["InvoiceId"]
        for i in server.native().get("/api/v1/invoices", status="Pending")["Invoices"]
    }
    for name in ("approved", "rejected"):
        message = _last_message(_describe(server, name, team))
        assert f"Booked plan {name} " in message and f"invoice {invoices[name]} " in message, message
        assert "awaits an administrator's approval" in message, message

    server.native().post(f"/api/v1/invoices/{invoices['rejected']}/reject", {"Reason": "not this quarter"})
    job = _describe(server, "rejected", team)
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Failed", "Failed")
    assert "plan booked for the job, rejected, failed" in job["FailureReason"], job["FailureReason"]
    assert "not this quarter" in job["FailureReason"], job["FailureReason"]

    server.native().post(f"/api/v1/invoices/{invoices['approved']}/approve")
    server.set_clock(BOUNDARY + timedelta(minutes=1))
    _wait_status(server, "approved", "Completed", team)


def test_the_native_route_books_and_bad_requests_are_refused_naming_the_part(fast: InProcessServer) -> None:
    server = fast
    team = server.new_account("natives")
    bucket = _bucket(server, team, "natives-out")
    native, client = server.native(team), server.sagemaker(team)
    # The account has a plan named after the job already: the one it books is NAME-2.
    _buy(server, team, "native", P5, 1, 1)
    program = list(server.world.command(Program.exits(0)))
    body = {
        "TrainingJob": _job("native", program, bucket),
        "AutoBook": {
            "InstanceTypes": [{"InstanceType": P4D, "InstanceCount": 2}],
            "DurationHours": 24,
            "Within": "7d",
            "MaxPrice": "2000",
            "Prefer": "earliest",
        },
    }
    arn = native.post("/api/v1/training-jobs", body)["TrainingJobArn"]
    assert arn.endswith(":training-job/native")
    shown = native.get("/api/v1/training-jobs/native")
    assert shown["AutoBook"]["BookedPlan"] == "native-2" and shown["AutoBook"]["Waiting"] is None
    assert shown["AutoBook"]["Request"]["MaxPrice"] == "2000"
    assert shown["TrainingPlans"] == [arn.replace("training-job/native", "training-plan/native-2")]
    # Stopped before its plan starts: the plan stays the account's.
    client.stop_training_job(TrainingJobName="native")
    assert _describe(server, "native", team)["TrainingJobStatus"] == "Stopped"
    assert client.describe_training_plan(TrainingPlanName="native-2")["Status"] == "Scheduled"

    def refused(call: Any, code: str, *words: str) -> None:
        with pytest.raises((ClientError, ApiError)) as caught:
            call()
        error = caught.value
        found = (
            (error.response["Error"]["Code"], error.response["Error"]["Message"])
            if isinstance(error, ClientError)
            else (error.code, error.message)
        )
        assert found[0] == code and all(word in found[1] for word in words), (words, found)

    jobs_before = client.list_training_jobs()["TrainingJobSummaries"]
    plans_before = _plan_names(server, team)
    bad = _job("bad", program, bucket, tag=f"types={P4D}:2/days=x")
    refused(lambda: client.create_training_job(**bad), "ValidationException", TAG, "part 'days=x'")
    unknown = _job("bad", program, bucket, tag="types=ml.g5.xlarge:1/days=1")
    refused(lambda: client.create_training_job(**unknown), "ValidationException", "has no ml.g5.xlarge")
    odd = _job("bad", program, bucket, tag=f"types={P4D}:3/days=1")
    refused(lambda: client.create_training_job(**odd), "ValidationException", f"{P4D} x3")
    named = _job("bad", program, bucket, tag=f"types={P4D}:2/days=1")
    named["ResourceConfig"]["TrainingPlanArn"] = arn.replace("training-job/native", "training-plan/native")
    refused(lambda: client.create_training_job(**named), "ValidationException", "TrainingPlanArn", "not both")
    with_plan = {**body, "TrainingJob": {**named, "Tags": []}}
    refused(lambda: native.post("/api/v1/training-jobs", with_plan), "ValidationException", "TrainingPlanArn")
    twice = {**body, "TrainingJob": _job("bad", program, bucket, tag=f"types={P4D}:2/days=1")}
    refused(
        lambda: native.post("/api/v1/training-jobs", twice), "ValidationException", "give the request once"
    )
    no_type = {
        **body,
        "TrainingJob": _job("bad", program, bucket),
        "AutoBook": {
            **body["AutoBook"],
            "InstanceTypes": [{"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}],
        },
    }
    refused(
        lambda: native.post("/api/v1/training-jobs", no_type),
        "ValidationException",
        "AutoBook.InstanceTypes[0].InstanceType",
        "has no ml.g5.xlarge",
    )
    no_count = {
        **body,
        "TrainingJob": {k: v for k, v in _job("bad", program, bucket).items() if k != "RoleArn"},
    }
    refused(
        lambda: native.post("/api/v1/training-jobs", no_count),
        "ValidationException",
        "TrainingJob",
        "RoleArn",
    )
    # Nothing half-written: no job, no plan, no tag.
    assert client.list_training_jobs()["TrainingJobSummaries"] == jobs_before
    assert _plan_names(server, team) == plans_before
