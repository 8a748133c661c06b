"""Nothing lost at a segment's end (issue 50): a cluster node's on_reclaim.sh runs at the reclaim signal,
before its processes get SIGTERM, and not when its user scales its group down; a training job with no
segment after the reclaim has its checkpoints stored and its message says how to resume from them.

Real servers over the local back end, real node and job processes, under the manual clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from hyperplan.backends.local import LocalBackend
from tests.harness import ADMIN, REGION, Server, wait_until

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"
SUBNETS = ["subnet-00000000000000a01", "subnet-00000000000000b01"]
LIFECYCLE = {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"}
EXPIRY = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
# The hook looks at the trainer a second into its run: still alive and not yet told to stop shows that
# SIGTERM waits for the hook.
ON_RECLAIM = (
    "#!/bin/sh\n"
    "sleep 1\n"
    'alive=no; kill -0 "$(cat "$HOME/trainer.pid")" 2>/dev/null && [ ! -e "$HOME/terminated.txt" ] '
    "&& alive=yes\n"
    f'echo "${EXPIRY} trainer-alive=$alive" >> "$HOME/reclaimed.txt"\n'
    f'echo "on_reclaim: saving state before ${EXPIRY}"\n'
)
TRAINER = (
    "echo $$ > trainer.pid; trap 'echo terminated > terminated.txt; exit 0' TERM; while :; do sleep 0.1; done"
)


@pytest.fixture
def server(server_factory: type[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    for name, value in {"HYPERPLAN_JOB_RECLAIM_GRACE": "5", "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3"}.items():
        monkeypatch.setenv(name, value)
    server = server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET)
    source = server.data_dir / "s3" / "lifecycle" / "src"
    source.mkdir(parents=True)
    (source / "on_create.sh").write_text("#!/bin/sh\necho created\n")
    (source / "on_reclaim.sh").write_text(ON_RECLAIM)
    dataset = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    dataset.parent.mkdir(parents=True)
    dataset.write_text("1,2\n")
    yield server.start()
    LocalBackend(server.work_dir / "backend").adopt([])  # nothing left running
    assert "Traceback" not in server.log(), server.log()[-5000:]


def _buy(server: Server, name: str, count: int, target: str) -> dict[str, Any]:
    client = server.sagemaker()
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=count, DurationHours=24, TargetResources=[target]
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return dict(client.describe_training_plan(TrainingPlanName=name))


def _group(count: int, arn: str) -> dict[str, Any]:
    return {
        "InstanceGroupName": "w",
        "InstanceType": P5,
        "InstanceCount": count,
        "LifeCycleConfig": LIFECYCLE,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
        "ThreadsPerCore": 1,
        "TrainingPlanArn": arn,
    }


def _nodes(server: Server) -> dict[str, str]:
    summaries = server.sagemaker().list_cluster_nodes(ClusterName="landing")["ClusterNodeSummaries"]
    return {n["InstanceId"]: n["InstanceStatus"]["Status"] for n in summaries}


def _home(server: Server, instance_id: str) -> Path:
    return server.work_dir / "backend" / "nodes" / f"node-{instance_id}" / "home"


def _lifecycle_log(server: Server, instance_id: str) -> list[str]:
    client = server.sagemaker()
    cluster_id = client.describe_cluster(ClusterName="landing")["ClusterArn"].rpartition("/")[2]
    logs = boto3.client(
        "logs",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=ADMIN.access_key,
        aws_secret_access_key=ADMIN.secret_key,
    )
    events = logs.get_log_events(
        logGroupName=f"/aws/sagemaker/Clusters/landing/{cluster_id}",
        logStreamName=f"LifecycleConfig/w/{instance_id}",
        startFromHead=True,
    )["events"]
    return [event["message"] for event in events]


def test_on_reclaim_runs_once_before_sigterm_at_the_reclaim_and_not_at_a_scale_down(server: Server) -> None:
    plan = _buy(server, "landing", 2, "hyperpod-cluster")
    client = server.sagemaker()
    client.create_cluster(
        ClusterName="landing",
        InstanceGroups=[_group(2, plan["TrainingPlanArn"])],
        VpcConfig={"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": SUBNETS},
    )
    server.set_clock(plan["StartTime"] + timedelta(minutes=5))
    assert wait_until(lambda: list(_nodes(server).values()) == ["Running", "Running"]), _nodes(server)
    both = sorted(_nodes(server))
    for node in both:
        (_home(server, node) / "trainer.sh").write_text(TRAINER)
        server.cli(
            "clusters", "exec", "landing", node, "--", "sh", "-c", "nohup sh trainer.sh >/dev/null 2>&1 &"
        )
    assert wait_until(lambda: all((_home(server, n) / "trainer.pid").exists() for n in both))

    # The user scales the group down: the node goes (SIGTERM) without its reclaim hook.
    client.update_cluster(ClusterName="landing", InstanceGroups=[_group(1, plan["TrainingPlanArn"])])
    assert wait_until(lambda: len(_nodes(server)) == 1), _nodes(server)
    (kept,) = _nodes(server)
    (dropped,) = set(both) - {kept}
    assert wait_until(lambda: (_home(server, dropped) / "terminated.txt").exists()), (
        "no SIGTERM at scale-down"
    )
    assert not (_home(server, dropped) / "reclaimed.txt").exists()

    # The reclaim: the hook runs once, with the segment's end, while the trainer still runs; then SIGTERM.
    server.set_clock(plan["EndTime"] - timedelta(minutes=30))
    home = _home(server, kept)
    assert wait_until(lambda: (home / "terminated.txt").exists(), timeout=60), "no SIGTERM at reclaim"
    assert wait_until(lambda: not _nodes(server), timeout=60), _nodes(server)
    end = str(int(plan["EndTime"].timestamp()))
    assert (home / "reclaimed.txt").read_text().splitlines() == [f"{end} trainer-alive=yes"]
    assert f"on_reclaim: saving state before {end}" in _lifecycle_log(server, kept)
    assert not any("on_reclaim" in line for line in _lifecycle_log(server, dropped))


# Says it is ready (a checkpoint the periodic sync stores) once its trap is set, and writes a checkpoint
# only when told to stop: only the sync at the instance's end can store that one.
CHECKPOINT_AT_SIGTERM = (
    "trap 'echo saved > \"$SM_CHECKPOINT_DIR/at-sigterm.txt\"; exit 0' TERM; "
    'echo ready > "$SM_CHECKPOINT_DIR/ready.txt"; while :; do sleep 0.1; done'
)


def test_a_job_with_no_next_segment_stores_its_checkpoints_and_says_how_to_resume(server: Server) -> None:
    plan = _buy(server, "last", 1, "training-job")
    client = server.sagemaker()
    uri = "s3://bucket/checkpoints/landing"
    client.create_training_job(
        TrainingJobName="landing",
        RoleArn="arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": [CHECKPOINT_AT_SIGTERM],
        },
        InputDataConfig=[
            {
                "ChannelName": "training",
                "DataSource": {
                    "S3DataSource": {
                        "S3DataType": "S3Prefix",
                        "S3Uri": "s3://bucket/input",
                        "S3DataDistributionType": "FullyReplicated",
                    }
                },
            }
        ],
        OutputDataConfig={"S3OutputPath": "s3://bucket/output"},
        ResourceConfig={
            "InstanceType": P5,
            "InstanceCount": 1,
            "VolumeSizeInGB": 10,
            "TrainingPlanArn": plan["TrainingPlanArn"],
        },
        StoppingCondition={"MaxRuntimeInSeconds": 2419200},
        CheckpointConfig={"S3Uri": uri},
    )
    server.set_clock(plan["StartTime"] + timedelta(minutes=1))

    def described() -> dict[str, Any]:
        return dict(client.describe_training_job(TrainingJobName="landing"))

    stored = server.data_dir / "s3" / "bucket" / "checkpoints" / "landing"
    assert wait_until(lambda: (stored / "ready.txt").exists(), timeout=90), described()
    server.set_clock(plan["EndTime"] - timedelta(minutes=30))  # the reclaim of the plan's only segment
    resume = f"Its checkpoints are in {uri} (CheckpointConfig.S3Uri): create a new job with the same"
    assert wait_until(lambda: described()["SecondaryStatus"] == "Interrupted", timeout=90), described()
    job = described()
    # The job may pass through Stopping faster than a describe can see it there: its transition keeps it.
    (stopping,) = [t["StatusMessage"] for t in job["SecondaryStatusTransitions"] if t["Status"] == "Stopping"]
    assert "the job will end Interrupted" in stopping and resume in stopping, stopping
    assert job["TrainingJobStatus"] == "Stopped"
    message = job["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "last segment ended before the job finished" in message and resume in message, message
    assert (stored / "at-sigterm.txt").read_text() == "saved\n"
