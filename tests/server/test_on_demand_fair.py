"""On-demand fair share (issue 16): a quota per account per type at any instant, and on-demand use metered
per started instance-hour of service time into the ledger.

In process, over the fake back end (tests/inprocess.py): boto3, the server and the store are real; nodes
come up at once and jobs' tasks run until they are stopped. The small fleet keeps 4 ml.m5.12xlarge for
on-demand work at 2.50 USD an instance-hour; here each account may hold half of them.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests.harness import ADMIN, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_clusters import ON_CREATE, _group
from tests.server.test_jobs import JOB_PERIODS, M5, _make_dataset, _sleeper

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
HALF = "\n[quotas]\nmax_on_demand_share_per_type = 0.5\n"


@pytest.fixture
def fair(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(SMALL_FLEET.read_text() + HALF)
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet, env=JOB_PERIODS)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    _make_dataset(server)
    server.start()
    for bucket in ("lifecycle", "bucket"):  # made by hand, so the administrators': every account reads
        server.native().post(f"/api/v1/buckets/{bucket}/grants", {"Account": "*", "ReadOnly": True})
    return server


def _job(name: str, count: int) -> dict[str, Any]:
    return _sleeper(
        name, instance_type=M5, count=count, OutputDataConfig={"S3OutputPath": f"s3://out-{name}/models"}
    )


def _refused(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as refused:
        call(**kwargs)
    assert refused.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    return str(refused.value.response["Error"]["Message"])


def _on_demand_lines(server: InProcessServer, account: str) -> list[dict[str, Any]]:
    entries = server.native().get(f"/api/v1/accounts/{account}/ledger")["Entries"]
    return [e for e in entries if e["Description"].startswith("On-demand")]


def _account(server: InProcessServer, name: str) -> dict[str, Any]:
    return {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}[name]


def test_one_account_holds_at_most_half_the_on_demand_instances_and_administrators_too(
    fair: InProcessServer,
) -> None:
    greedy, modest = fair.new_account("greedy"), fair.new_account("modest")
    g = fair.sagemaker(greedy)
    g.create_cluster(ClusterName="g", InstanceGroups=[_group("c", 2, instance_type=M5)])
    quota = "Quota on-demand-capacity-ml.m5.12xlarge is 2 instances for account greedy"
    # Over its half: another job, another cluster, or a group scaled up.
    assert quota in _refused(g.create_training_job, **_job("more", 1))
    assert quota in _refused(
        g.create_cluster, ClusterName="g2", InstanceGroups=[_group("c", 1, instance_type=M5)]
    )
    message = _refused(g.update_cluster, ClusterName="g", InstanceGroups=[_group("c", 3, instance_type=M5)])
    assert quota in message and "holds 0" in message  # the group's own nodes are what it asks again
    # An administrator's own account is held to it too.
    admin = _refused(
        fair.sagemaker(ADMIN).create_cluster,
        ClusterName="a",
        InstanceGroups=[_group("c", 3, instance_type=M5)],
    )
    assert "Quota on-demand-capacity-ml.m5.12xlarge is 2" in admin
    # The other half is another account's, and it gets it.
    fair.sagemaker(modest).create_training_job(**_job("fits", 2))
    assert fair.sagemaker(modest).describe_training_job(TrainingJobName="fits")["TrainingJobStatus"] == (
        "InProgress"
    )
    # An administrator gives greedy a quota of its own: the quota passes, the pool is what is short.
    fair.cli("accounts", "update", "greedy", "--max-on-demand-instances", "3")
    quotas = _account(fair, "greedy")["Quotas"]
    assert quotas["MaxOnDemandInstancesPerType"] == 3 and quotas["MaxOnDemandSharePerType"] is None
    assert _account(fair, "modest")["Quotas"]["MaxOnDemandSharePerType"] == 0.5
    assert "0 free" in _refused(g.create_training_job, **_job("more", 1))
    # A quota lowered below what a group holds never stops the group from being updated as it is.
    fair.native().call(
        "PATCH", "/api/v1/accounts/greedy", body={"Quotas": {"MaxOnDemandInstancesPerType": 1}}
    )
    g.update_cluster(ClusterName="g", InstanceGroups=[_group("c", 2, instance_type=M5)])


def test_on_demand_use_is_charged_per_started_instance_hour_once_across_a_restart(
    fair: InProcessServer,
) -> None:
    team = fair.new_account("team")
    fair.native().call("PATCH", "/api/v1/accounts/team", body={"Quotas": {"MaxOnDemandInstancesPerType": 3}})
    client = fair.sagemaker(team)
    client.create_training_job(**_job("train", 2))
    client.create_cluster(ClusterName="c", InstanceGroups=[_group("c", 1, instance_type=M5)])
    wait_until(lambda: client.describe_training_job(TrainingJobName="train")["SecondaryStatus"] == "Training")
    fair.advance_clock("90m")
    client.stop_training_job(TrainingJobName="train")
    wait_until(
        lambda: client.describe_training_job(TrainingJobName="train")["TrainingJobStatus"] == "Stopped"
    )
    # The job: 2 instances for 90 service minutes = 2 started hours x 2 instances x 2.50.
    job_lines = [e for e in _on_demand_lines(fair, "team") if "training job train" in e["Description"]]
    assert [(e["Amount"], e["Description"].split(", ")[1]) for e in job_lines] == [
        ("-5.00", "hour 1"),
        ("-5.00", "hour 2"),
    ]
    assert "2 x ml.m5.12xlarge in us-west-2a" in job_lines[0]["Description"]

    fair.restart()
    fair.advance_clock("30m")  # the node's third hour starts now, and is charged once
    fair.advance_clock("30m")
    client = fair.sagemaker(team)
    client.delete_cluster(ClusterName="c")
    wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [])
    fair.advance_clock("3h")  # nothing holds instances any more: nothing more is charged
    node_lines = [e for e in _on_demand_lines(fair, "team") if "node i-" in e["Description"]]
    assert [e["Description"].split(", ")[-2] for e in node_lines] == ["hour 1", "hour 2", "hour 3"]
    assert {e["Amount"] for e in node_lines} == {"-2.50"}
    total = sum(Decimal(e["Amount"]) for e in _on_demand_lines(fair, "team"))
    assert total == Decimal("-17.50")
    assert Decimal(_account(fair, "team")["Spend"]) == Decimal("17.50")
    assert _account(fair, "team")["Budget"] == "0"  # mode auto: the ledger, not the budget


def test_a_budget_with_no_hour_left_starts_nothing_new_but_running_work_carries_on(
    fair: InProcessServer,
) -> None:
    thrifty: Credentials = fair.new_account("thrifty", PaymentMode="budget")
    fair.cli("accounts", "update", "thrifty", "--budget", "4.00")
    client = fair.sagemaker(thrifty)
    message = _refused(client.create_training_job, **_job("big", 2))  # its first hour is 5.00
    assert "budget, which holds 4.00 USD" in message and "5.00 USD" in message
    client.create_training_job(**_job("small", 1))  # 2.50 now, 2.50 at the start of each later hour
    wait_until(lambda: client.describe_training_job(TrainingJobName="small")["SecondaryStatus"] == "Training")
    fair.advance_clock("3h")  # four hours started: the budget goes below zero, and the job runs on
    assert client.describe_training_job(TrainingJobName="small")["SecondaryStatus"] == "Training"
    assert Decimal(_account(fair, "thrifty")["Budget"]) == Decimal("-6.00")
    refused = _refused(
        client.create_cluster, ClusterName="c", InstanceGroups=[_group("c", 1, instance_type=M5)]
    )
    assert "budget, which holds -6.00 USD" in refused and "2.50 USD" in refused
    client.stop_training_job(TrainingJobName="small")


def test_groups_hold_their_on_demand_instances_from_the_request_on(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    # No quota here: the pool's 4 on-demand instances are the only limit. Two groups of one request, or
    # two requests before any node is up, must not together take more than the pool has.
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=SMALL_FLEET)
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    server.start()
    server.native().post("/api/v1/buckets/lifecycle/grants", {"Account": "*", "ReadOnly": True})
    client = server.sagemaker(server.new_account("team"))
    two_groups = [_group("a", 3, instance_type=M5), _group("b", 2, instance_type=M5)]
    assert "1 free" in _refused(client.create_cluster, ClusterName="both", InstanceGroups=two_groups)
    assert client.list_clusters()["ClusterSummaries"] == []  # refused whole: nothing half-written
    client.create_cluster(ClusterName="first", InstanceGroups=[_group("a", 3, instance_type=M5)])
    assert "1 free" in _refused(
        client.create_cluster, ClusterName="second", InstanceGroups=[_group("b", 2, instance_type=M5)]
    )
    client.create_cluster(ClusterName="second", InstanceGroups=[_group("b", 1, instance_type=M5)])
