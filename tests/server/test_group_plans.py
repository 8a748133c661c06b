"""An instance group fed by several plans (issue 48): a group on plan A takes plan B beside it (the native
API, the CLI), runs up to its target across both, keeps its nodes when A ends, and DescribeCluster stays
within botocore's model throughout (every boto3 answer here is checked against it: tests.harness).

In-process servers over the fake back end (tests/inprocess.py): real HTTP, boto3 and our CLI; a node's
OnCreate runs once per node the back end is handed, so the back end's nodes count the lifecycle runs."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import ADMIN, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_clusters import P5, SUBNETS, _group, put_lifecycle_script

P4D = "ml.p4d.24xlarge"
M5 = "ml.m5.12xlarge"
FLEET = f"""
region = "us-west-2"
currency = "USD"

[[zones]]
name = "us-west-2a"
zone_id = "usw2-az1"
subnets = ["{SUBNETS[0]}"]

[[zones]]
name = "us-west-2b"
zone_id = "usw2-az2"
subnets = ["{SUBNETS[1]}"]

[[pools]]
instance_type = "{P5}"
zone = "us-west-2a"
count = 8
price_per_instance_hour = "50.00"

[[pools]]
instance_type = "{P5}"
zone = "us-west-2b"
count = 4
reservable = 2
price_per_instance_hour = "40.00"

[[pools]]
instance_type = "{P4D}"
zone = "us-west-2a"
count = 4
price_per_instance_hour = "30.00"

[[pools]]
instance_type = "{M5}"
zone = "us-west-2a"
count = 4
reservable = 0
price_per_instance_hour = "2.50"
"""
"""p5 in two zones (two of us-west-2b's on demand), another type plans reserve, and on-demand controllers."""
VPC = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS}


@pytest.fixture
def fleet_server(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(FLEET)
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet)
    put_lifecycle_script(server)
    return server.start()


def buy(
    server: InProcessServer,
    name: str,
    count: int,
    start: datetime,
    days: int,
    zone: str = "us-west-2a",
    instance_type: str = P5,
    target: str = "hyperpod-cluster",
    credentials: Credentials = ADMIN,
) -> str:
    """A plan of `count` instances for `days` days from `start`, in `zone`: its ARN."""
    client = server.sagemaker(credentials)
    offerings = client.search_training_plan_offerings(
        InstanceType=instance_type,
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=[target],
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=days),
    )["TrainingPlanOfferings"]
    chosen = [
        o for o in offerings if {r["AvailabilityZone"] for r in o["ReservedCapacityOfferings"]} == {zone}
    ]
    assert chosen, offerings
    offering_id = chosen[0]["TrainingPlanOfferingId"]
    created = client.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
    return str(created["TrainingPlanArn"])


def plans_path(cluster: str, group: str, plan: str = "") -> str:
    path = f"/api/v1/clusters/{cluster}/instance-groups/{group}/plans"
    return f"{path}/{plan}" if plan else path


def shown(server: InProcessServer, cluster: str) -> dict[str, Any]:
    """What DescribeCluster says of the cluster's only group (boto3: checked against the model)."""
    groups = server.sagemaker().describe_cluster(ClusterName=cluster)["InstanceGroups"]
    assert len(groups) == 1
    group: dict[str, Any] = groups[0]
    return group


def running(server: InProcessServer, cluster: str) -> dict[str, datetime]:
    """The cluster's Running nodes: instance id -> launch time."""
    nodes = server.sagemaker().list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    return {n["InstanceId"]: n["LaunchTime"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}


def lifecycle_runs(server: InProcessServer) -> int:
    return sum(1 for node in server.backend.world.nodes.values() if node.on_create is not None)


def plan_rows(answer: dict[str, Any]) -> list[tuple[str, bool, str, bool, int, int]]:
    return [
        (p["TrainingPlanName"], p["Primary"], p["Status"], p["ActiveNow"], p["CapacityNow"], p["Serving"])
        for p in answer["Plans"]
    ]


def in_use(server: InProcessServer, plan: str) -> int:
    return int(server.sagemaker().describe_training_plan(TrainingPlanName=plan)["InUseInstanceCount"])


def test_a_group_runs_across_two_plans_and_keeps_the_later_ones_nodes_when_the_first_ends(
    fleet_server: InProcessServer,
) -> None:
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    plan_a = buy(server, "plan-a", 2, start, 2)
    plan_b = buy(server, "plan-b", 2, start, 4)  # overlaps A and outlives it
    client = server.sagemaker()
    client.create_cluster(ClusterName="c", InstanceGroups=[_group("workers", 2, plan_a)], VpcConfig=VPC)
    server.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: len(running(server, "c")) == 2), running(server, "c")
    on_a = running(server, "c")
    assert lifecycle_runs(server) == 2

    client.update_cluster(ClusterName="c", InstanceGroups=[_group("workers", 4, plan_a)])
    assert (shown(server, "c")["CurrentCount"], shown(server, "c")["TargetCount"]) == (2, 4)  # A alone: 2
    added = json.loads(server.cli("clusters", "plans", "add", "c", "workers", "plan-b", "--json").stdout)
    assert [p["TrainingPlanName"] for p in added["Plans"]] == ["plan-a", "plan-b"]
    assert wait_until(lambda: len(running(server, "c")) == 4), running(server, "c")
    now_running = running(server, "c")
    assert {i: now_running[i] for i in on_a} == on_a  # A's nodes: the same instances, launched when they were
    assert lifecycle_runs(server) == 4  # two new nodes ran OnCreate; A's did not run it again
    listed = server.native().get(plans_path("c", "workers"))
    assert (listed["TargetCount"], listed["CurrentCount"], listed["InstanceType"]) == (4, 4, P5)
    assert plan_rows(listed) == [
        ("plan-a", True, "Active", True, 2, 2),
        ("plan-b", False, "Active", True, 2, 2),
    ]
    group = shown(server, "c")
    assert (group["CurrentCount"], group["TargetCount"]) == (4, 4)
    assert (group["TrainingPlanArn"], group["TrainingPlanStatus"]) == (plan_a, "Active")
    assert (in_use(server, "plan-a"), in_use(server, "plan-b")) == (2, 2)
    on_b = {i: t for i, t in now_running.items() if i not in on_a}

    server.set_clock(start + timedelta(days=2, minutes=-30))  # A's reclaim time: A serves no more
    assert wait_until(lambda: running(server, "c") == on_b), running(server, "c")
    assert lifecycle_runs(server) == 4  # B's nodes stayed up; nothing new was started
    group = shown(server, "c")
    assert (group["CurrentCount"], group["TargetCount"]) == (2, 4)
    assert (group["TrainingPlanArn"], group["TrainingPlanStatus"]) == (plan_b, "Active")  # B serves now
    assert (in_use(server, "plan-a"), in_use(server, "plan-b")) == (0, 2)

    server.set_clock(start + timedelta(days=2))  # A has ended
    group = shown(server, "c")
    assert (group["TrainingPlanArn"], group["TrainingPlanStatus"]) == (plan_b, "Active")
    assert running(server, "c") == on_b
    listed = server.native().get(plans_path("c", "workers"))
    assert plan_rows(listed) == [
        ("plan-a", True, "Expired", False, 0, 0),
        ("plan-b", False, "Active", True, 2, 2),
    ]
    summaries = client.list_clusters(TrainingPlanArn=plan_b)["ClusterSummaries"]
    assert [s["ClusterName"] for s in summaries] == ["c"] and summaries[0]["TrainingPlanArns"] == [
        plan_a,
        plan_b,
    ]

    server.set_clock(start + timedelta(days=4))  # B has ended too: the primary is shown again
    group = shown(server, "c")
    assert (group["CurrentCount"], group["TrainingPlanArn"], group["TrainingPlanStatus"]) == (
        0,
        plan_a,
        "Expired",
    )


def test_nodes_of_a_plan_that_ends_carry_over_to_another_plans_room_without_a_new_lifecycle_run(
    fleet_server: InProcessServer,
) -> None:
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    plan_a = buy(server, "first", 2, start, 1)
    plan_b = buy(server, "second", 2, start, 3)
    client = server.sagemaker()
    client.create_cluster(ClusterName="c", InstanceGroups=[_group("workers", 2, plan_a)], VpcConfig=VPC)
    added = server.native().call("PUT", plans_path("c", "workers", plan_b))  # by its ARN
    assert plan_rows(added) == [
        ("first", True, "Scheduled", False, 0, 0),
        ("second", False, "Scheduled", False, 0, 0),
    ]
    server.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: len(running(server, "c")) == 2)
    before = running(server, "c")
    listed = server.native().get(plans_path("c", "workers"))
    assert plan_rows(listed) == [
        ("first", True, "Active", True, 2, 2),
        ("second", False, "Active", True, 0, 0),
    ]

    server.set_clock(start + timedelta(days=1, minutes=-30))  # the primary's reclaim time
    listed = server.native().get(plans_path("c", "workers"))
    assert plan_rows(listed) == [
        ("first", True, "Active", False, 0, 0),
        ("second", False, "Active", True, 2, 2),
    ]
    assert running(server, "c") == before  # the same nodes, on the second plan now
    assert lifecycle_runs(server) == 2
    assert (in_use(server, "first"), in_use(server, "second")) == (0, 2)
    group = shown(server, "c")
    assert (group["CurrentCount"], group["TrainingPlanArn"]) == (2, plan_b)

    # Removing the plan they now run on takes them back; the primary has nothing left to give.
    removed = json.loads(server.cli("clusters", "plans", "remove", "c", "workers", plan_b, "--json").stdout)
    assert [p["TrainingPlanName"] for p in removed["Plans"]] == ["first"]
    assert wait_until(lambda: running(server, "c") == {})
    assert in_use(server, "second") == 0
    actions = [
        (e["Action"], e["Target"], e["Detail"])
        for e in server.native().get("/api/v1/audit")["Events"]
        if e["Action"].startswith("cluster-group.")
    ]
    assert actions == [
        ("cluster-group.plan-add", "c", {"Group": "workers", "Plan": "second"}),
        ("cluster-group.plan-remove", "c", {"Group": "workers", "Plan": "second"}),
    ]


def test_the_cli_lists_a_groups_plans_as_a_table(fleet_server: InProcessServer) -> None:
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    plan_a = buy(server, "table-a", 1, start, 1)
    buy(server, "table-b", 1, start, 2)
    server.sagemaker().create_cluster(
        ClusterName="t", InstanceGroups=[_group("workers", 2, plan_a)], VpcConfig=VPC
    )
    server.cli("clusters", "plans", "add", "t", "workers", "table-b")
    server.cli("clusters", "plans", "add", "t", "workers", "table-b")  # again: no change
    out = server.cli("clusters", "plans", "list", "t", "workers").stdout
    assert "Plans of group workers of t (ml.p5.48xlarge, 0 of 2 running)" in out
    lines = [line for line in out.splitlines() if "table-" in line and "Plans of" not in line]
    assert [line.split()[1:4] for line in lines] == [
        ["table-a", "│", "primary"],
        ["table-b", "│", "further"],
    ]
    # A cluster deleted with a further plan on a group goes, and leaves the plan free.
    client = server.sagemaker()
    client.delete_cluster(ClusterName="t")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [], timeout=5), server.log()
    assert " ERROR " not in server.log()


def test_every_refusal_names_what_is_wrong_and_writes_nothing(fleet_server: InProcessServer) -> None:
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    primary = buy(server, "primary", 1, start, 2)
    stranger = server.new_account("stranger")
    theirs = buy(server, "theirs", 1, start, 2, credentials=stranger)
    buy(server, "for-jobs", 1, start, 2, target="training-job")
    buy(server, "other-type", 1, start, 2, instance_type=P4D)
    elsewhere = buy(server, "elsewhere", 1, start, 2, zone="us-west-2b")
    buy(server, "spare", 1, start, 2)
    client = server.sagemaker()
    client.create_cluster(
        ClusterName="r",
        InstanceGroups=[
            _group("workers", 2, primary),
            _group("controller", 1, instance_type=M5),
        ],
        VpcConfig=VPC,
    )
    server.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: len(running(server, "r")) == 2)
    nodes_before = running(server, "r")
    listed_before = server.native().get(plans_path("r", "workers"))
    native = server.native()
    refusals = [
        ("PUT", "workers", theirs, "ValidationException", "this account has no training plan " + theirs),
        ("PUT", "workers", "theirs", "ValidationException", "this account has no training plan theirs"),
        ("PUT", "workers", "no-such-plan", "ValidationException", "has no training plan no-such-plan"),
        ("PUT", "workers", "for-jobs", "ValidationException", "serves training-job"),
        ("PUT", "workers", "other-type", "ValidationException", f"reserves {P4D}, but group workers is {P5}"),
        ("PUT", "workers", elsewhere, "ValidationException", "is in us-west-2b, but group workers runs in"),
        ("PUT", "workers", "primary", "ValidationException", "is the primary plan of group workers already"),
        ("PUT", "controller", "spare", "ValidationException", "runs on on-demand capacity; give it a"),
        ("PUT", "nobody", "spare", "ResourceNotFound", "Cluster r has no instance group nobody."),
        ("DELETE", "workers", "primary", "ValidationException", "change it with UpdateCluster"),
        ("DELETE", "workers", "spare", "ResourceNotFound", "Group workers of cluster r has no plan spare."),
        ("DELETE", "workers", "no-such-plan", "ResourceNotFound", "no-such-plan"),
        ("DELETE", "workers", "theirs", "ResourceNotFound", "theirs"),
    ]
    for method, group, plan, code, words in refusals:
        with pytest.raises(ApiError) as exc:
            native.call(method, plans_path("r", group, plan))
        assert (exc.value.code, words in exc.value.message) == (code, True), (method, plan, exc.value)
    with pytest.raises(ApiError) as exc:
        server.native(stranger).get(plans_path("r", "workers"))  # another account's cluster: as if absent
    assert exc.value.code == "ResourceNotFound"
    refused = server.cli("clusters", "plans", "add", "r", "workers", "other-type", check=False)
    assert refused.returncode == 1 and refused.stderr.startswith(
        "ValidationException: Cluster r, group workers"
    )
    # Nothing was written: the same plans, the same nodes, no audit record.
    assert server.native().get(plans_path("r", "workers")) == listed_before
    assert running(server, "r") == nodes_before
    assert lifecycle_runs(server) == 2
    events = server.native().get("/api/v1/audit")["Events"]
    assert not [e for e in events if e["Action"].startswith("cluster-group.")]
    assert in_use(server, "spare") == 0


def test_update_cluster_keeps_further_plans_in_the_groups_zone_and_on_demand_drops_them(
    fleet_server: InProcessServer,
) -> None:
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    first = buy(server, "u-first", 1, start, 2)
    second = buy(server, "u-second", 1, start, 2)
    third = buy(server, "u-third", 1, start, 2)
    elsewhere = buy(server, "u-elsewhere", 1, start, 2, zone="us-west-2b")
    client = server.sagemaker()
    client.create_cluster(ClusterName="u", InstanceGroups=[_group("workers", 2, first)], VpcConfig=VPC)
    server.native().call("PUT", plans_path("u", "workers", "u-second"))
    server.native().call("PUT", plans_path("u", "workers", "u-third"))

    def names() -> list[tuple[str, bool]]:
        listed = server.native().get(plans_path("u", "workers"))
        return [(p["TrainingPlanName"], p["Primary"]) for p in listed["Plans"]]

    # A further plan made primary is no longer a further plan; the old primary is replaced.
    client.update_cluster(ClusterName="u", InstanceGroups=[_group("workers", 2, second)])
    assert names() == [("u-second", True), ("u-third", False)]
    # A primary in another zone than the further plans is refused, naming them; nothing changes.
    with pytest.raises(ClientError) as exc:
        client.update_cluster(ClusterName="u", InstanceGroups=[_group("workers", 2, elsewhere)])
    error = exc.value.response["Error"]
    assert error["Code"] == "ValidationException" and third in error["Message"], error
    assert names() == [("u-second", True), ("u-third", False)]
    # On demand: no plan at all.
    client.update_cluster(ClusterName="u", InstanceGroups=[_group("workers", 1)])
    assert names() == []
    assert first and third  # bought for the steps above
    # A deleted cluster leaves no group plan behind that would stop it from going.
    client.delete_cluster(ClusterName="u")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [])


def test_a_plan_group_made_on_demand_keeps_its_nodes_and_is_charged_for_them_from_then_on(
    fleet_server: InProcessServer,
) -> None:
    """UpdateCluster without a TrainingPlanArn: the nodes the on-demand pool covers stay up, the same
    instances, and each is charged by the hour from the change on, as an on-demand node is."""
    server = fleet_server
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    plan = buy(server, "b-plan", 2, start, 2, zone="us-west-2b")
    client = server.sagemaker()
    client.create_cluster(ClusterName="c", InstanceGroups=[_group("workers", 2, plan)], VpcConfig=VPC)
    server.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: len(running(server, "c")) == 2)
    on_plan = running(server, "c")
    assert _on_demand_charges(server) == []  # a plan's nodes are not charged by the hour

    switched = start + timedelta(hours=3)
    server.set_clock(switched)
    client.update_cluster(ClusterName="c", InstanceGroups=[_group("workers", 1)])
    assert wait_until(lambda: len(running(server, "c")) == 1)
    kept = running(server, "c")
    assert kept.items() <= on_plan.items()  # one of the plan's nodes, not a new one
    assert in_use(server, "b-plan") == 0
    server.set_clock(switched + timedelta(hours=1, minutes=30))  # into its second hour
    assert wait_until(lambda: len(_on_demand_charges(server)) == 2)
    assert _on_demand_charges(server) == [Decimal("-40.00")] * 2  # us-west-2b's price, one node


def _on_demand_charges(server: InProcessServer) -> list[Decimal]:
    entries = server.native().get("/api/v1/accounts/admin/ledger")["Entries"]
    return [Decimal(e["Amount"]) for e in entries if "on-demand" in e.get("Description", "").lower()]
