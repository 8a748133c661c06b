"""`hyperplan usage` keeps a plan's use apart from on-demand work (docs/OPERATIONS.md, "Usage per
account"): a plan's used hours never exceed its reserved hours, even when the manual clock jumps days
past its end in one move, and on-demand nodes and jobs in the same pool have a column of their own; a
plan's instances lent to managed spot training, and the spot jobs that ran on them, have theirs, with
their money, each on its own account's rows."""

from __future__ import annotations

import json
import os
from datetime import UTC, date, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import select

from hyperplan.cli.views.ops import UsageTable
from hyperplan.services.accounts import accounts
from hyperplan.services.jobs import spot_money
from hyperplan.store.schema import ReservedCapacity, SpotRun, TrainingJob, TrainingPlan
from tests.cli.test_views import GOLDEN, render
from tests.harness import SERVER_START, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_clusters import _group as cluster_group
from tests.server.test_clusters import put_lifecycle_script
from tests.server.test_jobs import P5, _job, _sleeper, _status

ZONE = "us-west-2b"
SUBNET = "subnet-00000000000000b01"
# One pool that plans and on-demand work share, as p5 in us-west-2b did in the issue: 4 of its 8
# instances may be reserved, the others are on-demand capacity.
SHARED_POOL = f"""
region = "us-west-2"
currency = "USD"

[[zones]]
name = "{ZONE}"
zone_id = "usw2-az2"
subnets = ["{SUBNET}"]

[[pools]]
instance_type = "{P5}"
zone = "{ZONE}"
count = 8
reservable = 4
price_per_instance_hour = "40.00"

[policy]
ranking = "earliest"  # each plan starts at the instant the test asks for

[policy.reclaim_lead]
hyperpod-cluster = "30m"
training-job = "1h"
"""
HOUR = timedelta(hours=1)
# The instants the test chooses; segments start and end at 11:30 UTC.
CLUSTER_PLAN_START = datetime(2027, 1, 1, 11, 30, tzinfo=UTC)  # 2 instances for 48 h
JOB_PLAN_START = datetime(2027, 1, 2, 11, 30, tzinfo=UTC)  # 1 instance for 24 h
ON_DEMAND_JOB = (datetime(2027, 1, 1, 18, 0, tzinfo=UTC), datetime(2027, 1, 2, 6, 0, tzinfo=UTC))
REPORT_END = datetime(2027, 1, 4, 12, 0, tzinfo=UTC)

Spans = list[tuple[datetime, datetime, int]]


def _hours_in(day: date, spans: Spans) -> float:
    """Instance-hours of the spans inside one UTC day."""
    first = datetime.combine(day, datetime.min.time(), UTC)
    last = first + timedelta(days=1)
    return sum(max(min(b, last) - max(a, first), timedelta(0)) / HOUR * n for a, b, n in spans)


def _buy(server: InProcessServer, name: str, count: int, hours: int, target: str, start: datetime) -> str:
    client = server.sagemaker()
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=count,
        DurationHours=hours,
        TargetResources=[target],
        StartTimeAfter=start,
    )["TrainingPlanOfferings"][0]
    arn = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    plan = client.describe_training_plan(TrainingPlanName=name)
    assert (plan["StartTime"], plan["EndTime"]) == (start, start + hours * HOUR)
    return str(arn)


@pytest.fixture
def shared_pool(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "shared-pool.toml"
    fleet.write_text(SHARED_POOL)
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet)
    put_lifecycle_script(server)
    dataset = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    dataset.parent.mkdir(parents=True)
    dataset.write_text("x,y\n1,2\n")
    return server.start()


def test_plans_use_at_most_what_they_reserve_and_on_demand_work_is_counted_apart_day_by_day(
    shared_pool: InProcessServer,
) -> None:
    server, client = shared_pool, shared_pool.sagemaker()
    cluster_plan = _buy(server, "cluster-plan", 2, 48, "hyperpod-cluster", CLUSTER_PLAN_START)
    job_plan = _buy(server, "job-plan", 1, 24, "training-job", JOB_PLAN_START)
    # At the server's start: a cluster whose controller runs on demand at once and whose workers wait
    # for their plan, and a job queued on the other plan.
    client.create_cluster(
        ClusterName="trainer",
        InstanceGroups=[cluster_group("controller", 1), cluster_group("workers", 2, cluster_plan)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": [SUBNET]},
    )
    client.create_training_job(**_sleeper("on-the-plan", plan=job_plan))
    # An on-demand job beside the plan's workers, for twelve hours across a midnight.
    server.set_clock(ON_DEMAND_JOB[0])
    client.create_training_job(**_job("on-demand", ["python", "-c", "pass"]))
    assert wait_until(lambda: _status(server, "on-demand") == ("InProgress", "Training"))
    server.set_clock(ON_DEMAND_JOB[1])
    client.stop_training_job(TrainingJobName="on-demand")
    assert wait_until(lambda: _status(server, "on-demand")[0] == "Stopped")
    # One move across both plans' ends and a day past them, as the issue's user did.
    server.set_clock(REPORT_END)

    window = {"from": "2026-12-31T00:00:00Z", "to": REPORT_END.isoformat()}
    rows = server.native().get("/api/v1/usage", account="admin", **window)["Usage"]
    cluster_end, job_end = CLUSTER_PLAN_START + 48 * HOUR, JOB_PLAN_START + 24 * HOUR
    reserved: Spans = [(CLUSTER_PLAN_START, cluster_end, 2), (JOB_PLAN_START, job_end, 1)]
    # Held from each segment's start to its reclaim time (its end less the target's reclaim lead).
    plan_used: Spans = [
        (CLUSTER_PLAN_START, cluster_end - HOUR / 2, 2),
        (JOB_PLAN_START, job_end - HOUR, 1),
    ]
    on_demand: Spans = [(SERVER_START, REPORT_END, 1), (*ON_DEMAND_JOB, 1)]  # the controller runs on
    days = [date(2026, 12, 31) + timedelta(days=n) for n in range(5)]
    assert [(r["InstanceType"], r["AvailabilityZone"], r["Day"]) for r in rows] == [
        (P5, ZONE, day.isoformat()) for day in days
    ]
    for row, day in zip(rows, days, strict=True):
        expected = [_hours_in(day, spans) for spans in (reserved, plan_used, on_demand)]
        found = [row["ReservedInstanceHours"], row["PlanUsedInstanceHours"], row["OnDemandInstanceHours"]]
        assert found == pytest.approx(expected, abs=1e-4), day
        assert row["PlanUsedInstanceHours"] <= row["ReservedInstanceHours"]
        assert row["UsedInstanceHours"] == pytest.approx(found[1] + found[2], abs=1e-4)
    # The last plan day, written out: 23 h of the cluster plan's 2 instances and 11.5 h of the job
    # plan's one reserved, 22 h and 10.5 h of them used; the controller on demand all day.
    assert rows[3] | {"Day": ""} == {
        "Account": "admin",
        "InstanceType": P5,
        "AvailabilityZone": ZONE,
        "Day": "",
        "ReservedInstanceHours": 34.5,
        "PlanUsedInstanceHours": 32.5,
        "OnDemandInstanceHours": 24.0,
        "UsedInstanceHours": 56.5,
        "LentInstanceHours": 0.0,
        "SpotInstanceHours": 0.0,
        "SpotCharged": "0.00",
        "LendingCredited": "0.00",
        "ReturnedInstanceHours": 0.0,
        "Refunded": "0.00",
        "ResaleCredited": "0.00",
    }

    # The CLI's CSV: the earlier columns as they were, the two parts after them, then spot's four, then
    # returns' three.
    csv = server.cli("usage", "--account", "admin", "--csv", "--from", window["from"], "--to", window["to"])
    header, *lines = csv.stdout.strip().splitlines()
    assert header == CSV_HEADER
    assert lines[3] == f"admin,{P5},{ZONE},2027-01-03,34.5,56.5,32.5,24.0,0.0,0.0,0.00,0.00,0.0,0.00,0.00"
    assert len(lines) == len(rows)


CSV_HEADER = (
    "account,instance_type,zone,day,reserved_instance_hours,used_instance_hours,"
    "plan_used_instance_hours,on_demand_instance_hours,"
    "lent_instance_hours,spot_instance_hours,spot_charged,lending_credited,"
    "returned_instance_hours,refunded,resale_credited"
)


def _spot_job_lent(
    server: InProcessServer, borrower: str, plan_name: str, start: datetime, seconds: float
) -> None:
    """A managed spot training job of `borrower` that ran `seconds` on 2 instances its plan lent, settled
    as the spot scheduler settles an ended run (inserted: this file checks the report, not placement)."""
    assert server.runtime is not None
    runtime = server.runtime.context
    end = start + timedelta(seconds=seconds)
    with runtime.db.write() as session:
        borrower_id = accounts.get_account(session, borrower).id
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == plan_name)).one()
        segment = session.scalars(select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id)).one()
        job = TrainingJob(
            account_id=borrower_id,
            name="borrowed",
            instance_type=P5,
            instance_count=2,
            availability_zone=ZONE,
            status="Completed",
            secondary_status="Completed",
            request=json.dumps({"TrainingJobName": "borrowed", "EnableManagedSpotTraining": True}),
            created_at=start,
            updated_at=end,
            spot=True,
            max_wait_seconds=86_400,
        )
        session.add(job)
        session.flush()
        run = SpotRun(
            job_id=job.id,
            attempt=1,
            account_id=borrower_id,
            plan_id=plan.id,
            reserved_capacity_id=segment.id,
            owner_account_id=plan.account_id,
            instance_type=P5,
            availability_zone=ZONE,
            count=2,
            price_per_instance_hour=spot_money.spot_price_of(runtime, runtime.fleet.pools_of_type(P5)[0]),
            currency="USD",
            lender_share=runtime.fleet.spot.lender_share,
            started_at=start,
            ended_at=end,
        )
        session.add(run)
        session.flush()
        spot_money.settle(session, runtime, run, end)


def test_usage_shows_the_owner_its_lent_hours_and_credits_and_the_borrower_its_spot_hours_and_charges(
    shared_pool: InProcessServer,
) -> None:
    server = shared_pool
    owner, borrower = server.new_account("vision"), server.new_account("speech")
    client = server.sagemaker(owner)
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=2,
        DurationHours=24,
        TargetResources=["training-job"],
        StartTimeAfter=JOB_PLAN_START,
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName="lender", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    # 2 instances lent from 12:30 for 643.5 s: 2 x 643.5 x 14.00 (0.35 x 40.00) / 3600 = 5.005, charged
    # 5.01 (half up); the owner's 0.8 of it, 4.008, credited 4.00 (down).
    _spot_job_lent(server, "speech", "lender", JOB_PLAN_START + HOUR, 643.5)
    server.set_clock(JOB_PLAN_START + 2 * HOUR)
    window = {"from": "2027-01-02T00:00:00Z", "to": (JOB_PLAN_START + 2 * HOUR).isoformat()}
    lent = round(2 * 643.5 / 3600, 4)

    [mine] = server.native(owner).get("/api/v1/usage", **window)["Usage"]
    assert (mine["Account"], mine["Day"]) == ("vision", "2027-01-02")
    assert (mine["LentInstanceHours"], mine["LendingCredited"]) == (lent, "4.00")
    assert (mine["SpotInstanceHours"], mine["SpotCharged"]) == (0.0, "0.00")
    # Lent instances are the plan's idle ones, not its use.
    assert mine["PlanUsedInstanceHours"] == 0.0

    [theirs] = server.native(borrower).get("/api/v1/usage", **window)["Usage"]
    assert (theirs["Account"], theirs["Day"]) == ("speech", "2027-01-02")
    assert (theirs["SpotInstanceHours"], theirs["SpotCharged"]) == (lent, "5.01")
    assert (theirs["LentInstanceHours"], theirs["LendingCredited"]) == (0.0, "0.00")
    assert (theirs["OnDemandInstanceHours"], theirs["UsedInstanceHours"]) == (0.0, lent)

    # The borrower's CSV: its spot columns at the end, the owner nowhere in it.
    csv = server.cli("usage", "--csv", "--from", window["from"], "--to", window["to"], credentials=borrower)
    assert csv.stdout.strip().splitlines() == [
        CSV_HEADER,
        f"speech,{P5},{ZONE},2027-01-02,0.0,{lent},0.0,0.0,0.0,{lent},5.01,0.00,0.0,0.00,0.00",
    ]


USAGE: list[dict[str, Any]] = [
    {
        "Account": "vision",
        "InstanceType": P5,
        "AvailabilityZone": ZONE,
        "Day": "2027-01-03",
        "ReservedInstanceHours": 34.5,
        "PlanUsedInstanceHours": 32.5,
        "OnDemandInstanceHours": 24.0,
        "UsedInstanceHours": 56.5,
        "LentInstanceHours": 0.0,
        "SpotInstanceHours": 0.0,
        "SpotCharged": "0.00",
        "LendingCredited": "0.00",
    },
    {
        "Account": "vision",
        "InstanceType": P5,
        "AvailabilityZone": ZONE,
        "Day": "2027-01-04",
        "ReservedInstanceHours": 0.0,
        "PlanUsedInstanceHours": 0.0,
        "OnDemandInstanceHours": 12.0,
        "UsedInstanceHours": 12.0,
        "LentInstanceHours": 0.0,
        "SpotInstanceHours": 0.0,
        "SpotCharged": "0.00",
        "LendingCredited": "0.00",
    },
]


# An owner that lent 6.25 instance-hours of its plan and ran 3 of its own on spot, and a day with neither.
SPOT_USAGE: list[dict[str, Any]] = [
    USAGE[0]
    | {
        "UsedInstanceHours": 59.5,
        "LentInstanceHours": 6.25,
        "SpotInstanceHours": 3.0,
        "SpotCharged": "42.00",
        "LendingCredited": "21.00",
    },
    USAGE[1],
]


def _golden(name: str, text: str) -> None:
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("HYPERPLAN_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


def test_the_usage_table_shows_plan_use_and_on_demand_hours_in_columns_of_their_own() -> None:
    # No spot work in any row: no spot columns, the table as it always was.
    _golden("usage_table", render(UsageTable(USAGE)))


def test_the_usage_table_shows_spot_columns_when_a_row_lent_or_ran_spot_work() -> None:
    # Eleven columns: at the width of a wide terminal (the golden views' 100 would cut every header).
    out = StringIO()
    Console(width=160, file=out, color_system=None, force_terminal=False).print(UsageTable(SPOT_USAGE))
    text = "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())
    _golden("usage_table_spot", text)
    assert "Lending credited" in text and "21.00" in text
