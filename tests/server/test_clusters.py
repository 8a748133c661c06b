"""HyperPod clusters on training plans under the manual clock.

The rules (bindings, provisioning order, deletes) run on in-process servers over the fake back end
(tests/inprocess.py); real lifecycle scripts, node processes, signals and the crash on real servers."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests.harness import ADMIN, REGION, Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"
ROLE = "arn:aws:iam::123456789012:role/hyperpod"
SUBNETS = ["subnet-00000000000000a01", "subnet-00000000000000b01"]
ON_CREATE = (
    "#!/bin/sh\n"
    'echo "created on $(hostname) until $SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" '
    "> created.txt\n"
)


def _buy(
    server: Server,
    credentials: Credentials,
    name: str,
    count: int,
    days: int,
    target: str = "hyperpod-cluster",
    **window: Any,
) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=24 * days, TargetResources=[target], **window
    )["TrainingPlanOfferings"][0]
    return str(
        client.create_training_plan(
            TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
        )["TrainingPlanArn"]
    )


def _counts(server: Server, cluster: str, credentials: Credentials = ADMIN) -> dict[str, tuple[int, int]]:
    groups = server.sagemaker(credentials).describe_cluster(ClusterName=cluster)["InstanceGroups"]
    return {g["InstanceGroupName"]: (g["CurrentCount"], g["TargetCount"]) for g in groups}


def _group(
    name: str, count: int, plan: str | None = None, instance_type: str = P5, **extra: Any
) -> dict[str, Any]:
    group = {
        "InstanceGroupName": name,
        "InstanceType": instance_type,
        "InstanceCount": count,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
        "ExecutionRole": ROLE,
        "ThreadsPerCore": 1,
        **extra,
    }
    if plan:
        group["TrainingPlanArn"] = plan
    return group


def put_lifecycle_script(server: Server) -> None:
    """ON_CREATE in s3://lifecycle/src, where _group's LifeCycleConfig looks."""
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)


@pytest.fixture
def small(server_factory: type[Server], tmp_path: Path) -> Server:
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    put_lifecycle_script(server)
    return server.start()


@pytest.fixture
def fast_small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    """In process, over the fake back end: the lifecycle scripts are found as on a real server, and every
    OnCreate succeeds at once."""
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    put_lifecycle_script(server)
    return server.start()


@pytest.fixture
def split_plan(small: Server) -> tuple[Server, str, datetime]:
    return small, *buy_split_plan(small)


def buy_split_plan(server: Server) -> tuple[str, datetime]:
    """4 x p5 for two one-day segments, two days apart (another team holds every p5 in between): the
    plan's ARN and its start."""
    start = boundary_after(service_now(server) + timedelta(minutes=30))
    blocker = server.new_account("blocker")
    for count, name in ((8, "block-a"), (4, "block-b")):
        _buy(
            server,
            blocker,
            name,
            count,
            2,
            StartTimeAfter=start + timedelta(days=1),
            EndTimeBefore=start + timedelta(days=3),
        )
    arn = _buy(server, ADMIN, "split", 4, 2, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=4))
    return arn, start


def test_seed_hyperpod_walkthrough_with_the_aws_cli(
    split_plan: tuple[Server, str, datetime], tmp_path: Path
) -> None:
    seed_hyperpod_walkthrough(*split_plan, tmp_path)


def seed_hyperpod_walkthrough(server: Server, arn: str, start: datetime, tmp_path: Path) -> None:
    """The README's HyperPod cluster with the aws CLI: an on-demand controller and two worker groups on
    ``arn`` (buy_split_plan's, from ``start``), provisioned in each segment and taken back at its end.
    The lifecycle script is put_lifecycle_script's."""
    config = {
        "ClusterName": "ml-cluster",
        "InstanceGroups": [
            _group("controller-machine", 1, instance_type="ml.m5.12xlarge"),
            _group(
                "worker-group-1",
                2,
                arn,
                InstanceStorageConfigs=[{"EbsVolumeConfig": {"VolumeSizeInGB": 500}}],
            ),
        ],
        "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    }
    (tmp_path / "cluster-config.json").write_text(json.dumps(config))
    created = server.aws(
        "sagemaker", "create-cluster", "--cli-input-json", f"file://{tmp_path / 'cluster-config.json'}"
    )
    assert created["ClusterArn"].split(":cluster/")[1].isalnum()
    update = {"ClusterName": "ml-cluster", "InstanceGroups": [_group("worker-group-2", 1, arn)]}
    (tmp_path / "update.json").write_text(json.dumps(update))
    server.aws("sagemaker", "update-cluster", "--cli-input-json", f"file://{tmp_path / 'update.json'}")

    def counts_in(described: dict[str, Any]) -> dict[str, int]:
        assert all(g["Status"] == "InService" for g in described["InstanceGroups"])
        return {g["InstanceGroupName"]: g["CurrentCount"] for g in described["InstanceGroups"]}

    def counts() -> dict[str, int]:
        return counts_in(server.aws("sagemaker", "describe-cluster", "--cluster-name", "ml-cluster"))

    sdk = server.sagemaker()

    def settle(expected: dict[str, int]) -> None:
        """Waited for with boto3 (an `aws` process per poll costs a second of CPU), then read with the
        aws CLI as a user would."""

        def polled() -> dict[str, int]:
            return counts_in(sdk.describe_cluster(ClusterName="ml-cluster"))

        assert wait_until(lambda: polled() == expected, timeout=120), polled()  # real nodes start
        assert counts() == expected

    def running() -> dict[str, int]:
        nodes = server.aws("sagemaker", "list-cluster-nodes", "--cluster-name", "ml-cluster")[
            "ClusterNodeSummaries"
        ]
        found: dict[str, int] = {}
        for node in nodes:
            if node["InstanceStatus"]["Status"] == "Running":
                found[node["InstanceGroupName"]] = found.get(node["InstanceGroupName"], 0) + 1
        return found

    before = {"controller-machine": 1, "worker-group-1": 0, "worker-group-2": 0}
    during = {"controller-machine": 1, "worker-group-1": 2, "worker-group-2": 1}
    settle(before)
    described = server.aws("sagemaker", "describe-cluster", "--cluster-name", "ml-cluster")
    statuses = {g["InstanceGroupName"]: g["TrainingPlanStatus"] for g in described["InstanceGroups"]}
    assert statuses == {
        "controller-machine": "NotApplicable",
        "worker-group-1": "Scheduled",
        "worker-group-2": "Scheduled",
    }

    server.set_clock(start)
    settle(during)
    assert running() == during
    plan = server.sagemaker().describe_training_plan(TrainingPlanName="split")
    assert (plan["InUseInstanceCount"], plan["AvailableInstanceCount"]) == (3, 1)

    server.set_clock(start + timedelta(days=1, minutes=-30))  # reclaim time
    settle(before)
    server.set_clock(start + timedelta(days=2))
    assert counts() == before
    server.set_clock(start + timedelta(days=3))
    settle(during)
    server.set_clock(start + timedelta(days=4))
    settle(before)
    summaries = server.aws("sagemaker", "list-clusters", "--training-plan-arn", arn)["ClusterSummaries"]
    assert [s["ClusterName"] for s in summaries] == ["ml-cluster"] and summaries[0]["TrainingPlanArns"] == [
        arn
    ]


def test_every_binding_rule_is_refused_with_its_own_message(fast_small: Server) -> None:
    small = fast_small
    team = small.new_account("binder", PaymentMode="approval")
    client = small.sagemaker(team)
    stranger = small.new_account("stranger")
    theirs = _buy(small, stranger, "theirs", 1, 1)
    pending = _buy(small, team, "pending", 1, 1)
    small.cli("accounts", "update", "binder", "--payment-mode", "auto")
    jobs = _buy(small, team, "for-jobs", 1, 1, target="training-job")
    plan = _buy(small, team, "good", 1, 1)
    zone = client.describe_training_plan(TrainingPlanName="good")["ReservedCapacitySummaries"][0][
        "AvailabilityZone"
    ]
    other_subnet = SUBNETS[1] if zone == "us-west-2a" else SUBNETS[0]
    cases = [
        ([_group("w", 1, theirs)], None, "has no training plan"),
        ([_group("w", 1, jobs)], None, "serves training-job"),
        ([_group("w", 1, pending)], None, "is Pending"),
        ([_group("w", 1, plan, instance_type="ml.m5.12xlarge")], None, "reserves ml.p5.48xlarge"),
        ([_group("w", 1, plan)], [other_subnet], "add a subnet of the plan's zone"),
        ([_group("w", 1, plan, CapacityRequirements={"OnDemand": {}})], None, "never both"),
        (
            [
                _group(
                    "w",
                    1,
                    plan,
                    OverrideVpcConfig={
                        "SecurityGroupIds": ["sg-0123456789abcdef0"],
                        "Subnets": [other_subnet],
                    },
                )
            ],
            None,
            "add a subnet",
        ),
    ]
    for groups, subnets, words in cases:
        request: dict[str, Any] = {"ClusterName": "refused", "InstanceGroups": groups}
        if subnets:
            request["VpcConfig"] = {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": subnets}
        with pytest.raises(ClientError) as exc:
            client.create_cluster(**request)
        error = exc.value.response["Error"]
        assert error["Code"] == "ValidationException", (words, error)
        assert words in error["Message"] and "InstanceGroups[0].TrainingPlanArn" in error["Message"], error
    with pytest.raises(ClientError) as exc:
        client.create_cluster(
            ClusterName="too-big", InstanceGroups=[_group("c", 5, instance_type="ml.m5.12xlarge")]
        )
    error = exc.value.response["Error"]
    assert error["Code"] == "ResourceLimitExceeded" and "us-west-2a: 4 free" in error["Message"]
    with pytest.raises(ClientError) as exc:
        client.create_cluster(ClusterName="no-p5-on-demand", InstanceGroups=[_group("w", 1)])
    assert exc.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    assert client.list_clusters()["ClusterSummaries"] == []  # nothing half-written


def test_partial_provisioning_serves_groups_in_creation_order(fast_small: Server) -> None:
    small = fast_small
    arn = _buy(small, ADMIN, "shared", 4, 1)
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="greedy",
        InstanceGroups=[_group("first", 3, arn), _group("second", 3, arn)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    )
    start = client.describe_training_plan(TrainingPlanName="shared")["StartTime"]
    small.set_clock(start + timedelta(minutes=1))
    assert wait_until(lambda: _counts(small, "greedy") == {"first": (3, 3), "second": (1, 3)}), _counts(
        small, "greedy"
    )
    plan = client.describe_training_plan(TrainingPlanName="shared")
    assert (plan["InUseInstanceCount"], plan["AvailableInstanceCount"]) == (4, 0)
    # giving the first group fewer hands its instances to the second
    client.update_cluster(ClusterName="greedy", InstanceGroups=[_group("first", 1, arn)])
    assert wait_until(lambda: _counts(small, "greedy") == {"first": (1, 1), "second": (3, 3)}), _counts(
        small, "greedy"
    )


def test_lifecycle_scripts_run_for_real_and_a_failing_one_fails_its_node(small: Server) -> None:
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="real", InstanceGroups=[_group("controller", 1, instance_type="ml.m5.12xlarge")]
    )
    node = wait_until(
        lambda: [
            n
            for n in client.list_cluster_nodes(ClusterName="real")["ClusterNodeSummaries"]
            if n["InstanceStatus"]["Status"] == "Running"
        ]
    )
    assert node, client.list_cluster_nodes(ClusterName="real")
    out = small.cli("clusters", "exec", "real", node[0]["InstanceId"], "--", "cat", "lifecycle/created.txt")
    assert out.stdout.startswith("created on") and out.stdout.strip().endswith("until 0")

    bad = small.data_dir / "s3" / "lifecycle" / "bad" / "on_create.sh"
    bad.parent.mkdir(parents=True)
    bad.write_text("#!/bin/sh\necho 'cannot mount /fsx: no such device' >&2\nexit 3\n")
    group = _group(
        "broken",
        1,
        instance_type="ml.m5.12xlarge",
        LifeCycleConfig={"SourceS3Uri": "s3://lifecycle/bad", "OnCreate": "on_create.sh"},
    )
    client.update_cluster(ClusterName="real", InstanceGroups=[group])

    def failed() -> list[dict[str, Any]]:
        nodes = client.list_cluster_nodes(ClusterName="real", InstanceGroupNameContains="broken")[
            "ClusterNodeSummaries"
        ]
        return [n for n in nodes if n["InstanceStatus"]["Status"] == "Failure"]

    assert wait_until(failed), client.list_cluster_nodes(ClusterName="real")
    assert "cannot mount /fsx" in failed()[0]["InstanceStatus"]["Message"]
    assert _counts(small, "real")["broken"] == (0, 1)
    # The lifecycle script's output, each line with its time, in the cluster's CloudWatch Logs group.
    cluster_id = client.describe_cluster(ClusterName="real")["ClusterArn"].rpartition("/")[2]
    logs = boto3.client(
        "logs",
        endpoint_url=small.url,
        region_name=REGION,
        aws_access_key_id=ADMIN.access_key,
        aws_secret_access_key=ADMIN.secret_key,
    )
    events = logs.get_log_events(
        logGroupName=f"/aws/sagemaker/Clusters/real/{cluster_id}",
        logStreamName=f"LifecycleConfig/broken/{failed()[0]['InstanceId']}",
        startFromHead=True,
    )["events"]
    assert [event["message"] for event in events] == ["cannot mount /fsx: no such device"]

    missing = _group(
        "missing",
        1,
        instance_type="ml.m5.12xlarge",
        LifeCycleConfig={"SourceS3Uri": "s3://no-such-bucket/src", "OnCreate": "on_create.sh"},
    )
    client.update_cluster(ClusterName="real", InstanceGroups=[missing])
    gone = wait_until(
        lambda: [
            n
            for n in client.list_cluster_nodes(ClusterName="real", InstanceGroupNameContains="missing")[
                "ClusterNodeSummaries"
            ]
            if n["InstanceStatus"]["Status"] == "Failure"
        ]
    )
    assert gone and "s3://no-such-bucket/src" in gone[0]["InstanceStatus"]["Message"]


def test_batch_delete_lowers_the_target_and_delete_cluster_releases_everything(fast_small: Server) -> None:
    small = fast_small
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="shrink", InstanceGroups=[_group("c", 3, instance_type="ml.m5.12xlarge")]
    )
    assert wait_until(lambda: _counts(small, "shrink") == {"c": (3, 3)})
    victim = client.list_cluster_nodes(ClusterName="shrink")["ClusterNodeSummaries"][0]["InstanceId"]
    result = client.batch_delete_cluster_nodes(ClusterName="shrink", NodeIds=[victim, "i-00000000000000000"])
    assert result["Successful"] == [victim]
    assert [f["Code"] for f in result["Failed"]] == ["NodeIdNotFound"]
    assert wait_until(lambda: _counts(small, "shrink") == {"c": (2, 2)})
    client.delete_cluster(ClusterName="shrink")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [])
    # the on-demand capacity is free again
    client.create_cluster(
        ClusterName="again", InstanceGroups=[_group("c", 4, instance_type="ml.m5.12xlarge")]
    )


def _node_processes(work_dir: Path) -> list[int]:
    """Processes running from the back end's node directories (an orphan would show up here)."""
    root = str((work_dir / "backend").resolve())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/cwd").startswith(root):
                found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_server_killed_mid_segment_keeps_clusters_nodes_and_processes_consistent(small: Server) -> None:
    arn = _buy(small, ADMIN, "steady", 2, 2)
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="survivor",
        InstanceGroups=[_group("controller", 1, instance_type="ml.m5.12xlarge"), _group("workers", 2, arn)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    )
    start = client.describe_training_plan(TrainingPlanName="steady")["StartTime"]
    small.set_clock(start + timedelta(hours=1))
    want = {"controller": (1, 1), "workers": (2, 2)}
    assert wait_until(lambda: _counts(small, "survivor") == want), _counts(small, "survivor")
    before = sorted(
        n["InstanceId"] for n in client.list_cluster_nodes(ClusterName="survivor")["ClusterNodeSummaries"]
    )
    node = before[0]
    small.cli("clusters", "exec", "survivor", node, "--", "sh", "-c", "sleep 600 >/dev/null 2>&1 &")

    small.kill()
    small.restart()
    client = small.sagemaker()
    assert _counts(small, "survivor") == want
    after = sorted(
        n["InstanceId"] for n in client.list_cluster_nodes(ClusterName="survivor")["ClusterNodeSummaries"]
    )
    assert after == before  # no node lost, none duplicated

    end = client.describe_training_plan(TrainingPlanName="steady")["EndTime"]
    small.set_clock(end - timedelta(minutes=30))  # reclaim
    assert wait_until(lambda: _counts(small, "survivor")["workers"] == (0, 2))
    client.delete_cluster(ClusterName="survivor")
    assert wait_until(lambda: client.list_clusters()["ClusterSummaries"] == [], timeout=90)
    assert wait_until(lambda: not _node_processes(small.work_dir), timeout=60), _node_processes(
        small.data_dir
    )


def test_at_reclaim_node_processes_get_sigterm_with_the_segment_end(small: Server) -> None:
    arn = _buy(small, ADMIN, "warned", 1, 1)
    client = small.sagemaker()
    client.create_cluster(
        ClusterName="warned",
        InstanceGroups=[_group("w", 1, arn)],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    )
    plan = client.describe_training_plan(TrainingPlanName="warned")
    small.set_clock(plan["StartTime"] + timedelta(minutes=5))
    assert wait_until(lambda: _counts(small, "warned") == {"w": (1, 1)})
    node = client.list_cluster_nodes(ClusterName="warned")["ClusterNodeSummaries"][0]["InstanceId"]
    # A training process that checkpoints when told: it reads the warning from the node's env directory.
    home = next((small.work_dir / "backend" / "nodes").glob("*/home"))
    (home / "trainer.sh").write_text(
        'trap \'cat "$HYPERPLAN_ENV_DIR/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > warned.txt; '
        "exit 0' TERM\n"
        "echo $SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP > started.txt\n"
        "while :; do sleep 0.1; done\n"
    )
    small.cli("clusters", "exec", "warned", node, "--", "sh", "-c", "nohup sh trainer.sh >/dev/null 2>&1 &")
    end = str(int(plan["EndTime"].timestamp()))
    assert wait_until(lambda: (home / "started.txt").exists())
    assert (home / "started.txt").read_text().strip() == end
    small.set_clock(plan["EndTime"] - timedelta(minutes=30))
    warned = home / "warned.txt"  # made by the trap's redirection before `cat` writes: wait for the value
    assert wait_until(lambda: warned.exists() and warned.read_text().strip() != ""), (
        "the node's processes got no SIGTERM"
    )
    assert warned.read_text().strip() == end
    assert wait_until(lambda: _counts(small, "warned") == {"w": (0, 1)})
