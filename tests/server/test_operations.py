"""Operating the fleet (docs/OPERATIONS.md): the audit trail records every administrator action and
security-relevant event with who, when and from where; a drain refuses new work with 503
ServiceUnavailable while reads go on, survives a restart, and with --stop-running sends running jobs
back to wait; resume starts them again."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from hyperplan.backends.fake import Program
from hyperplan.cli.client import ApiError, NativeClient
from hyperplan.signing import Credentials
from tests.harness import ADMIN, REGION, Server, boundary_after, free_port, service_now, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_clusters import ON_CREATE, SUBNETS
from tests.server.test_clusters import _counts as cluster_counts
from tests.server.test_clusters import _group as cluster_group
from tests.server.test_jobs import (
    JOB_PERIODS,
    M5,
    P5,
    SMALL_FLEET,
    _buy,
    _job,
    _make_dataset,
    _sleeper,
    _status,
    _wait_status,
)


@pytest.fixture
def fast_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET, env=JOB_PERIODS)
    _make_dataset(server)
    yield server.start()
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _audit(server: InProcessServer, **query: str) -> list[dict[str, Any]]:
    return list(server.native().get("/api/v1/audit", **query)["Events"])


def test_every_administrator_action_and_refused_signatures_are_in_the_audit_trail(
    fast_small: InProcessServer,
) -> None:
    server = fast_small
    admin = server.native()
    start = service_now(server)
    team = server.new_account("team", PaymentMode="approval")
    key = admin.post("/api/v1/accounts/team/keys")
    admin.call("PATCH", "/api/v1/accounts/team", body={"Quotas": {"MaxActivePlans": 3}, "Budget": "100"})
    alice = admin.post("/api/v1/users", {"UserName": "alice", "Account": "team"})
    admin.post(f"/api/v1/keys/{key['AccessKeyId']}/deactivate")
    admin.call("DELETE", f"/api/v1/keys/{key['AccessKeyId']}")
    admin.call("DELETE", "/api/v1/users/alice", query={"account": "team"})
    # Two purchases awaiting approval: one approved then cancelled, one rejected.
    window = {"StartTimeAfter": boundary_after(start + timedelta(days=1))}
    _buy(server, team, "kept", 1, 1, **window)
    _buy(server, team, "refused", 1, 1, **window)
    invoices = {i["TrainingPlanName"]: i["InvoiceId"] for i in admin.get("/api/v1/invoices")["Invoices"]}
    admin.post(f"/api/v1/invoices/{invoices['kept']}/approve")
    admin.post(f"/api/v1/invoices/{invoices['refused']}/reject", {"Reason": "not this quarter"})
    admin.post("/api/v1/accounts/team/plans/kept/cancel", {"Reason": "maintenance"})
    admin.post("/api/v1/buckets/bucket/grants", {"Account": "team", "ReadOnly": True})
    admin.call("DELETE", "/api/v1/buckets/bucket/grants/team")
    admin.post("/api/v1/clock/advance", {"Duration": "1h"})
    admin.post("/api/v1/drain", {})
    admin.post("/api/v1/resume")
    admin.post("/api/v1/master-key/rotate")
    intruder = NativeClient(server.url, Credentials(team.access_key, "not-the-secret"), region=REGION)
    for _ in range(3):
        with pytest.raises(ApiError):
            intruder.get("/api/v1/whoami")
    forged_s3 = boto3.client(  # and once through S3, whose signatures are checked by rules of their own
        "s3",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=team.access_key,
        aws_secret_access_key="not-the-secret",
        config=Config(retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
        forged_s3.list_buckets()

    events = _audit(server)
    actions = [e["Action"] for e in events]
    for action in (
        "account.create", "key.create", "account.update", "user.create", "key.deactivate", "key.delete",
        "user.delete", "invoice.approve", "invoice.reject", "plan.cancel", "bucket.grant", "bucket.revoke",
        "clock.advance", "fleet.drain", "fleet.resume", "master-key.rotate", "signature.refused",
    ):  # fmt: skip
        assert action in actions, (action, actions)
    by_action = {e["Action"]: e for e in events}
    update = by_action["account.update"]
    assert update["Actor"]["AccountName"] == "admin" and update["RemoteAddress"] == "127.0.0.1"
    assert update["AccountName"] == "team" and update["At"] is not None
    assert update["Detail"]["MaxActivePlans"]["To"] == 3 and update["Detail"]["Budget"]["To"] == "100"
    assert by_action["invoice.reject"]["Detail"]["Reason"] == "not this quarter"
    assert by_action["user.create"]["Detail"]["AccessKeyId"] == alice["AccessKey"]["AccessKeyId"]
    refused = [e for e in events if e["Action"] == "signature.refused"]
    assert len(refused) == 1 and refused[0]["Detail"]["Count"] == 4  # in bulk: one record, counted
    assert refused[0]["Detail"]["AccessKeyIds"] == [team.access_key]
    assert refused[0]["Actor"] is None and refused[0]["RemoteAddress"] == "127.0.0.1"
    clock = by_action["clock.advance"]["Detail"]
    assert clock["To"] > clock["From"]

    # One account's records, from an instant on, through our CLI; nothing changes a record.
    later = _audit(server, since=by_action["clock.advance"]["At"], account="team")
    assert later == [] or all(e["At"] >= by_action["clock.advance"]["At"] for e in later)
    listed = json.loads(server.cli("audit", "list", "--account", "team", "--json").stdout)
    assert {e["Action"] for e in listed} >= {"account.create", "plan.cancel", "bucket.grant"}
    assert "fleet.drain" not in {e["Action"] for e in listed}
    for method in ("DELETE", "PATCH", "PUT"):
        with pytest.raises(ApiError) as refused_change:
            admin.call(method, "/api/v1/audit")
        assert refused_change.value.status == 405  # no route changes or removes a record


def test_a_drain_refuses_new_work_with_503_keeps_reads_and_resume_restarts_the_stopped_job(
    fast_small: InProcessServer,
) -> None:
    server = fast_small
    client = server.sagemaker()
    start = boundary_after(service_now(server) + timedelta(hours=1))
    arn = _buy(server, ADMIN, "steady", 2, 2, StartTimeAfter=start)
    client.create_training_job(**_sleeper("running", plan=arn, count=1))
    server.set_clock(start)
    _wait_status(server, "running", "Training")

    assert server.cli("admin", "drain").returncode == 0
    once = server.sagemaker()  # one attempt: the SDKs' retries would otherwise wait out the drain
    with pytest.raises(ClientError) as refused:
        once.create_training_job(**_sleeper("new", plan=arn, count=1))
    assert refused.value.response["Error"]["Code"] == "ServiceUnavailable"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert "hyperplan admin resume" in refused.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as no_plan:
        _buy(server, ADMIN, "another", 1, 1, StartTimeAfter=start + timedelta(days=3))
    assert no_plan.value.response["Error"]["Code"] == "ServiceUnavailable"
    # Reads and searches are answered; the running job runs on.
    assert client.describe_training_plan(TrainingPlanName="steady")["Status"] == "Active"
    assert _status(server, "running") == ("InProgress", "Training")

    server.restart()  # the drain is kept in the store (the server has a new port: new clients)
    client = server.sagemaker()
    assert server.native().get("/api/v1/drain")["Draining"] is True
    state = server.native().post("/api/v1/drain", {"StopRunning": True})
    assert state["StopRunning"] is True
    _wait_status(server, "running", "Pending")
    message = _describe_last_message(server, "running")
    assert "drained for maintenance" in message
    server.advance_clock("1h")
    assert _status(server, "running") == ("InProgress", "Pending")  # nothing starts while drained

    server.native().post("/api/v1/resume")
    _wait_status(server, "running", "Training")
    assert server.native().get("/api/v1/drain")["Draining"] is False
    client.create_training_job(**_sleeper("after", plan=arn, count=1))
    _wait_status(server, "after", "Training")
    for name in ("running", "after"):
        client.stop_training_job(TrainingJobName=name)
    actions = [e["Action"] for e in _audit(server)]
    assert actions.count("fleet.drain") == 2 and actions.count("fleet.resume") == 1


def _describe_last_message(server: InProcessServer, name: str) -> str:
    job = server.sagemaker().describe_training_job(TrainingJobName=name)
    return str(job["SecondaryStatusTransitions"][-1].get("StatusMessage", ""))


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the metrics listener, parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_after_the_boto3_walkthrough_say_what_it_did(
    server_factory: type[Server], tmp_path: Path
) -> None:
    """A real server (its counters are its own) with --metrics-listen, through the seed's boto3
    walkthrough on the small fleet, then to the plan's start."""
    port = free_port()
    server = server_factory(
        data_dir=tmp_path / "data", fleet=SMALL_FLEET, extra_args=("--metrics-listen", f"127.0.0.1:{port}")
    ).start()
    client = server.sagemaker()
    now = service_now(server)
    offerings = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=2,
        DurationHours=96,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=now + timedelta(days=1),
        EndTimeBefore=now + timedelta(days=15),
    )["TrainingPlanOfferings"]
    offering = offerings[0]
    client.create_training_plan(
        TrainingPlanName="boto-plan", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    plan = client.describe_training_plan(TrainingPlanName="boto-plan")
    assert plan["Status"] == "Scheduled"
    with pytest.raises(ClientError):
        client.describe_training_plan(TrainingPlanName="no-such-plan")
    segments = plan["ReservedCapacitySummaries"]
    zone = segments[0]["AvailabilityZone"]
    server.native().get("/api/v1/whoami")

    before = _scrape(port)
    sagemaker = {"api": "sagemaker"}
    for operation, code, count in (
        ("SearchTrainingPlanOfferings", "200", 1),
        ("CreateTrainingPlan", "200", 1),
        ("DescribeTrainingPlan", "200", 1),
        ("DescribeTrainingPlan", "400", 1),
    ):
        labels = {**sagemaker, "operation": operation, "code": code}
        assert _value(before, "hyperplan_requests_total", **labels) == count, (operation, code)
    assert (
        _value(
            before,
            "hyperplan_request_duration_seconds_count",
            api="sagemaker",
            operation="CreateTrainingPlan",
        )
        == 1
    )
    assert (
        _value(before, "hyperplan_requests_total", api="native", operation="GET /api/v1/whoami", code="200")
        == 1
    )
    assert _value(before, "hyperplan_plans", status="Scheduled") == 1
    assert _value(before, "hyperplan_reserved_capacities", status="Scheduled") == len(segments)
    for pool_zone, reservable in (("us-west-2a", 8), ("us-west-2b", 4)):
        labels = {"instance_type": P5, "zone": pool_zone}
        assert _value(before, "hyperplan_pool_instances", **labels, state="reserved") == 0
        assert _value(before, "hyperplan_pool_instances", **labels, state="free") == reservable
    booked = _value(before, "hyperplan_pool_booked_ratio", instance_type=P5, zone=zone, horizon="56d")
    hours = sum((s["EndTime"] - s["StartTime"]).total_seconds() for s in segments) / 3600
    reservable = 8 if zone == "us-west-2a" else 4
    assert booked == pytest.approx(2 * hours / (reservable * 56 * 24), rel=0.01)
    assert _value(before, "hyperplan_job_queue_length") == 0
    assert _value(before, "hyperplan_work_dir_bytes") >= 0

    server.set_clock(segments[0]["StartTime"])
    after = _scrape(port)
    assert _value(after, "hyperplan_plans", status="Active") == 1
    labels = {"instance_type": P5, "zone": zone}
    assert _value(after, "hyperplan_pool_instances", **labels, state="reserved") == 2
    assert _value(after, "hyperplan_pool_instances", **labels, state="free") == reservable - 2
    # The manual clock runs each event at its due time: every one ran with no lag.
    ran = _value(after, "hyperplan_lifecycle_lag_seconds_count")
    assert ran >= 1 and _value(after, "hyperplan_lifecycle_lag_seconds_sum") == 0
    assert _value(after, "hyperplan_lifecycle_lag_seconds_bucket", le="0.0") == ran


@pytest.fixture
def clusters_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    return server.start()


def test_usage_of_a_plan_whose_nodes_ran_half_its_time_per_day_and_by_tag(
    clusters_small: InProcessServer,
) -> None:
    server = clusters_small
    client = server.sagemaker()
    team = [{"Key": "team", "Value": "vision"}]
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=2,
        DurationHours=24,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=service_now(server) + timedelta(days=1),
    )["TrainingPlanOfferings"][0]
    arn = client.create_training_plan(
        TrainingPlanName="half", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"], Tags=team
    )["TrainingPlanArn"]
    plan = client.describe_training_plan(TrainingPlanName="half")
    start, end = plan["StartTime"], plan["EndTime"]
    cluster = client.create_cluster(
        ClusterName="half-nodes",
        InstanceGroups=[cluster_group("workers", 2, arn)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
        Tags=team,
    )["ClusterArn"]
    # Tags as SageMaker has them.
    assert client.list_tags(ResourceArn=cluster)["Tags"] == team
    client.add_tags(ResourceArn=arn, Tags=[{"Key": "cost-centre", "Value": "42"}])
    assert client.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "cost-centre", "Value": "42"}, *team]
    client.delete_tags(ResourceArn=arn, TagKeys=["cost-centre"])
    assert client.list_tags(ResourceArn=arn)["Tags"] == team
    with pytest.raises(ClientError) as reserved_key:
        client.add_tags(ResourceArn=arn, Tags=[{"Key": "aws:owner", "Value": "x"}])
    assert "reserved for AWS" in reserved_key.value.response["Error"]["Message"]
    other_key = server.new_account("other")
    other = server.sagemaker(other_key)
    with pytest.raises(ClientError) as not_theirs:
        other.list_tags(ResourceArn=arn)
    assert not_theirs.value.response["Error"]["Code"] == "AccessDeniedException"

    server.set_clock(start)
    assert wait_until(lambda: cluster_counts(server, "half-nodes") == {"workers": (2, 2)})
    server.set_clock(start + (end - start) / 2)
    client.delete_cluster(ClusterName="half-nodes")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [])
    server.set_clock(end + timedelta(days=1))

    window = {"from": (start - timedelta(days=1)).isoformat(), "to": (end + timedelta(days=1)).isoformat()}
    rows = server.native().get("/api/v1/usage", account="admin", **window)["Usage"]
    hours = (end - start).total_seconds() / 3600
    assert {(r["InstanceType"], r["AvailabilityZone"]) for r in rows} == {
        (P5, plan["ReservedCapacitySummaries"][0]["AvailabilityZone"])
    }
    assert sum(r["ReservedInstanceHours"] for r in rows) == pytest.approx(2 * hours)
    assert sum(r["UsedInstanceHours"] for r in rows) == pytest.approx(hours)  # two nodes, half the time
    assert [r["PlanUsedInstanceHours"] for r in rows] == [r["UsedInstanceHours"] for r in rows]
    assert {r["OnDemandInstanceHours"] for r in rows} == {0}  # all of it on the plan
    days = sorted({r["Day"] for r in rows})
    assert days[0] == start.date().isoformat() and days[-1] == end.date().isoformat()
    first = next(r for r in rows if r["Day"] == days[0])
    midnight = datetime.combine(start.date() + timedelta(days=1), datetime.min.time(), UTC)
    assert first["ReservedInstanceHours"] == pytest.approx(2 * (midnight - start).total_seconds() / 3600)
    by_tag = server.native().get("/api/v1/usage", tag="team", **window)["Usage"]
    assert {r["TagValue"] for r in by_tag} == {"vision"}
    assert sum(r["UsedInstanceHours"] for r in by_tag) == pytest.approx(hours)
    # The CLI's CSV, with the columns.
    lines = server.cli(
        "usage", "--account", "admin", "--csv", "--from", window["from"], "--to", window["to"]
    ).stdout
    header, *body = lines.strip().splitlines()
    assert header == (
        "account,instance_type,zone,day,reserved_instance_hours,used_instance_hours,"
        "plan_used_instance_hours,on_demand_instance_hours,"
        "lent_instance_hours,spot_instance_hours,spot_charged,lending_credited,"
        "returned_instance_hours,refunded,resale_credited"
    )
    assert len(body) == len(rows) and all(line.startswith(f"admin,{P5},") for line in body)
    # Another account sees only its own usage.
    assert server.native(other_key).get("/api/v1/usage", **window)["Usage"] == []


def test_retention_removes_an_old_jobs_files_and_a_deleted_clusters_node_and_nothing_else(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    fleet = tmp_path / "retained.toml"
    fleet.write_text(SMALL_FLEET.read_text() + '\n[retention]\nperiod = "1d"\n')
    env = {**JOB_PERIODS, "HYPERPLAN_RETENTION_POLL": "0.2"}
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=fleet, env=env)
    _make_dataset(server)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    server.start()
    client = server.sagemaker()
    start = boundary_after(service_now(server) + timedelta(hours=1))
    arn = _buy(server, ADMIN, "kept", 2, 3, StartTimeAfter=start)
    done = list(server.world.command(Program.exits(0, stdout=b"done\n")))
    client.create_training_job(**_job("old", done, plan=arn))  # job id 1
    client.create_training_job(**_sleeper("running", plan=arn))  # job id 2
    client.create_cluster(ClusterName="gone", InstanceGroups=[cluster_group("c", 1, instance_type=M5)])
    server.set_clock(start)
    _wait_status(server, "old", "Completed")
    _wait_status(server, "running", "Training")
    [node] = client.list_cluster_nodes(ClusterName="gone")["ClusterNodeSummaries"]
    client.delete_cluster(ClusterName="gone")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [])
    server.advance_clock("12h")
    client.create_training_job(**_job("young", done, plan=arn))  # job id 3
    _wait_status(server, "young", "Completed")
    jobs = server.work_dir / "jobs"
    assert sorted(p.name for p in jobs.iterdir()) == ["1", "2", "3"]
    buckets = sorted(p for p in (server.data_dir / "s3").rglob("*") if p.is_file())
    with server.world.lock:
        tasks = dict(server.world.tasks)
        node_ids = set(server.world.nodes)
    assert len([n for n in node_ids if n.startswith("node-")]) == 1  # the deleted cluster's, Terminated

    server.advance_clock("12h5m")  # "old" and the node ended over a day ago; "young" half a day ago
    assert wait_until(lambda: not (jobs / "1").exists()), sorted(p.name for p in jobs.iterdir())
    assert sorted(p.name for p in jobs.iterdir()) == ["2", "3"]
    assert wait_until(lambda: not [n for n in server.world.nodes if n.startswith("node-")])
    assert {"sandbox.job-2-a1-algo-1", "sandbox.job-3-a1-algo-1"} <= set(server.world.nodes)
    with server.world.lock:
        left = set(server.world.tasks)
    assert len(left) == len(tasks) - 1 and left < set(tasks)  # the old job's one task, forgotten
    assert sorted(p for p in (server.data_dir / "s3").rglob("*") if p.is_file()) == buckets  # untouched
    assert _status(server, "old") == ("Completed", "Completed")  # still described
    assert node["InstanceId"]
    client.stop_training_job(TrainingJobName="running")
