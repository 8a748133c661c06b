"""HyperPod nodes as Slurm jobs, against the dev cluster: the seed's HyperPod walkthrough with the real
`aws` CLI on the Slurm fleet (docs/SLURM.md, "Nodes and jobs are Slurm jobs"). A real `hyperplan serve`
on the Slurm back end in isolation mode users, under the manual clock; the server, its accounts' users,
the `hp-` reservations and any Slurm job go with the test (tests/slurm/test_reservations.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.local import LocalBackend
from hyperplan.slurm.devcluster import NODES
from tests.harness import SERVER_START, Server, boundary_after, service_now, wait_until
from tests.slurm.cluster import Cluster, dev_cluster
from tests.slurm.contained import (
    IMAGE_READY,
    MarkedImage,
    instance_tree,
    nothing_contained_left,
    with_containers,
)
from tests.slurm.test_reservations import (
    DAY,
    WAIT,
    _buy,
    _events,
    _held,
    _resume,
    _split_plan,
    _until,
    _user_of,
    slurm_server,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

ROLE = "arn:aws:iam::123456789012:role/hyperpod"
G5_SOLD_AS = "ml.p5e.48xlarge"  # the dev cluster's g5 nodes, in _fleet_with_on_demand_g5
ON_CREATE = (
    "#!/bin/sh\n"
    'echo "created on $SLURMD_NODENAME as $(id -un) until '
    '$SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > created.txt\n'
)
LOOP = "while :; do sleep 0.2; done"
TRAINER = (
    'trap \'cat "$HYPERPLAN_ENV_DIR/SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP" > warned.txt; '
    "exit 0' TERM\n"
    "echo started > started.txt\n"
    "while :; do sleep 0.2; done\n"
)


def _fleet_with_on_demand_g5(cluster: Cluster, directory: Path) -> Path:
    """The dev cluster's fleet with its g5 nodes sold as a type plans can book (ml.p5e.48xlarge, the
    nodes' feature unchanged), two of the four kept out of plans (on-demand)."""
    text = cluster.fleet.read_text()
    g5 = 'instance_type = "ml.g5.12xlarge"\n'
    assert text.count(g5) == 1
    fleet = directory / "fleet.toml"
    fleet.write_text(text.replace(g5, f'instance_type = "{G5_SOLD_AS}"\ncount = 4\nreservable = 2\n'))
    return fleet


def _jobs_of(cluster: Cluster, user: str) -> list[dict[str, str]]:
    text = cluster.client.run("squeue", "--noheader", f"--user={user}", "--format=%i|%j|%T|%N|%R|%v|%l")
    keys = ("id", "name", "state", "nodes", "reason", "reservation", "limit")
    return [dict(zip(keys, line.split("|"), strict=True)) for line in text.splitlines() if line.strip()]


ALGO_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"
"""The training image this file's jobs name: on a contained fleet, the marked image (its sh, its Python)."""


@pytest.fixture
def contained_slurm_server(
    podman_store_dir: Path,
    slurm_server: Callable[..., Server],
    cluster: Cluster,
    tmp_path: Path,
    slurm_marked_image: MarkedImage,
) -> Callable[..., Server]:
    """Starts a server, under the manual clock, on a fleet (the dev cluster's unless one is given) with
    its work in containers (tests/slurm/contained.py): every node program and job instance runs in the
    marked image, ALGO_IMAGE mapped to it. The store is asked for before slurm_server: it goes after the
    server (issue 46: these tests hold with containers as they did with processes)."""

    def start(fleet: Path | None = None) -> Server:
        text = (fleet or cluster.fleet).read_text()
        image_map = {ALGO_IMAGE: slurm_marked_image.reference}
        path = tmp_path / "contained-fleet.toml"
        path.write_text(with_containers(text, podman_store_dir, slurm_marked_image, image_map))
        return slurm_server("manual", path)

    return start


def test_the_hyperpod_walkthrough_runs_its_nodes_as_slurm_jobs_in_the_plan_reservations(
    cluster: Cluster, slurm_server: Callable[..., Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPERPLAN_JOB_RECLAIM_GRACE", "5")  # the on-demand job's SIGTERM to SIGKILL
    server = slurm_server("manual", _fleet_with_on_demand_g5(cluster, tmp_path))
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team, other, plan = _split_plan(server, first_day)
    other_id, _ = _user_of(server, "other")
    _buy(server, other, "g5plan", 2, 24, first_day + DAY, first_day + 2 * DAY, instance_type=G5_SOLD_AS)
    team_id, team_user = _user_of(server, "team")
    rc1, rc2 = f"hp-{team_id}-split-rc1", f"hp-{team_id}-split-rc2"
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    server.cli("buckets", "grant", "lifecycle", "team")
    config = {
        "ClusterName": "ml-cluster",
        "InstanceGroups": [
            {
                "InstanceGroupName": "worker-group-1",
                "InstanceType": "ml.p5.48xlarge",
                "InstanceCount": 2,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
                "TrainingPlanArn": plan["TrainingPlanArn"],
            }
        ],
    }
    (tmp_path / "cluster-config.json").write_text(json.dumps(config))
    aws = lambda *args: server.aws(*args, credentials=team)  # noqa: E731
    aws("sagemaker", "create-cluster", "--cli-input-json", f"file://{tmp_path / 'cluster-config.json'}")

    team_sagemaker = server.sagemaker(team)

    def nodes() -> list[dict[str, Any]]:
        """Polled with boto3 (each CLI call is a new Python process: seconds on a loaded machine); the
        CLI's own answer is checked once below."""
        found: list[dict[str, Any]] = team_sagemaker.list_cluster_nodes(ClusterName="ml-cluster")[
            "ClusterNodeSummaries"
        ]
        return found

    def running() -> list[dict[str, Any]]:
        return [n for n in nodes() if n["InstanceStatus"]["Status"] == "Running"]

    # `other`'s on-demand work (g5: two of the pool's four nodes are kept out of plans): a training job
    # and a node. The Slurm node under the node fails (drained): the instance is replaced by a new one on
    # another node, as HyperPod's automatic node recovery does. The node stays drained until the third
    # day. The job runs without a time limit (not the partition's DefaultTime), as on the local back end.
    other_user = _user_of(server, "other")[1]
    other_jobs = server.sagemaker(other)
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    server.cli("buckets", "grant", "bucket", "other")
    od_job = _on_demand_job("od-job", "echo ready; trap 'echo warned; exit 0' TERM; " + LOOP, G5_SOLD_AS)
    other_jobs.create_training_job(**od_job)
    assert wait_until(lambda: "ready" in _output(server, other, "od-job"), timeout=WAIT)
    [slurm_job] = _jobs_of(cluster, other_user)
    assert (slurm_job["reservation"], slurm_job["limit"]) == ("(null)", "UNLIMITED"), slurm_job
    job_host = slurm_job["nodes"]
    server.cli("buckets", "grant", "lifecycle", "other")
    group = {**config["InstanceGroups"][0], "InstanceGroupName": "od-g5", "InstanceType": G5_SOLD_AS,
             "InstanceCount": 1}  # fmt: skip
    del group["TrainingPlanArn"]
    (tmp_path / "od-config.json").write_text(
        json.dumps({"ClusterName": "od-cluster", "InstanceGroups": [group]})
    )
    server.aws(
        "sagemaker", "create-cluster", "--cli-input-json", f"file://{tmp_path / 'od-config.json'}",
        credentials=other,
    )  # fmt: skip

    sagemaker = server.sagemaker(other)  # boto3: quicker to poll than the CLI

    od_nodes = lambda: _live_nodes(sagemaker, "od-cluster")  # noqa: E731

    def od_until(check: Callable[[dict[str, tuple[str, str]]], bool]) -> dict[str, tuple[str, str]]:
        wait_until(lambda: check(od_nodes()), timeout=WAIT)
        found = od_nodes()
        assert check(found), found
        return found

    def recovered() -> dict[str, dict[str, Any]]:
        events = server.native().get("/api/v1/audit")["Events"]
        return {e["Target"]: e for e in events if e["Action"] == "cluster-node.recovered"}

    one_running = lambda n: [s for s, _ in n.values()] == ["Running"]  # noqa: E731
    od = od_until(one_running)
    failed_instance, (_, failed_host) = sorted(od.items())[0]
    cluster.client.drain([failed_host], "ECC errors")
    od = od_until(lambda n: one_running(n) and failed_instance not in n)
    assert failed_host not in {host for _, host in od.values()} | {job_host}
    event = recovered()[failed_instance]
    assert event["AccountId"] == other_id and event["Detail"]["SlurmNode"] == failed_host, event
    assert "ECC errors" in event["Detail"]["Reason"], event

    # The first segment: two nodes, each a whole-node Slurm job of the account's user in rc1.
    server.set_clock(first_day)
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), nodes()
    held = _held(cluster)
    listed = aws("sagemaker", "list-cluster-nodes", "--cluster-name", "ml-cluster")["ClusterNodeSummaries"]
    assert {n["InstanceId"] for n in listed} == {n["InstanceId"] for n in running()}
    jobs = _jobs_of(cluster, team_user)
    assert len(jobs) == 2 and {j["reservation"] for j in jobs} == {rc1}, jobs
    assert {j["nodes"] for j in jobs} == set(held[rc1].nodes)
    hosts = {n["PrivateDnsHostname"].split(".")[1] for n in running()}
    assert hosts == set(held[rc1].nodes), hosts  # ip-A-B-C-D.<the Slurm node's name>.<region>...
    node_id = running()[0]["InstanceId"]
    described = aws(
        "sagemaker", "describe-cluster-node", "--cluster-name", "ml-cluster", "--node-id", node_id
    )
    host = described["NodeDetails"]["PrivateDnsHostname"].split(".")[1]
    assert host in held[rc1].nodes

    # OnCreate ran on the node as the account's user; `clusters exec` is a step of the node's job.
    shown = server.cli(
        "clusters", "exec", "ml-cluster", node_id, "--", "sh", "-c",
        'echo "$SLURMD_NODENAME $SLURM_JOB_ID $(id -un)"; cat lifecycle/created.txt; pwd',
        credentials=team,
    ).stdout.split("\n")  # fmt: skip
    assert len(shown[0].split()) == 3, shown
    name, job_id, user = shown[0].split()
    assert (name, user) == (host, team_user)
    end = str(int((first_day + DAY).timestamp()))
    assert shown[1] == f"created on {host} as {team_user} until {end}"
    trainer_home = Path(shown[2])  # the node's home, on the shared work root

    # A command that swaps its own logs and record for links to a file of the server's, then kills its
    # runner so that nothing writes over them: the server answers, and nothing of that file comes back.
    secret = server.data_dir / "secret.txt"
    secret.write_text("the server's secret\n")
    secret.chmod(0o600)
    forger = (
        'out="${HYPERPLAN_ENV_DIR%/nodes/*}/tasks/$HYPERPLAN_TASK_ID/out"; '
        "for f in exit.json stdout.log stderr.log timed.log; do "
        f'rm -f "$out/$f"; ln -s {secret} "$out/$f"; done; '
        'kill -KILL "$(cut -d" " -f4 /proc/$PPID/stat)"'
    )
    forged = server.cli(
        "clusters", "exec", "ml-cluster", node_id, "--", "sh", "-c", forger, credentials=team, check=False
    )
    assert forged.returncode == 1 and "secret" not in forged.stdout + forged.stderr, forged

    # A training process of the user's own, started with srun in the node's job, is warned at reclaim.
    assert trainer_home.name == "home" and trainer_home.stat().st_uid != 0
    (trainer_home / "trainer.sh").write_text(TRAINER)
    trainer = subprocess.Popen(
        ["runuser", "-u", team_user, "--", "srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1",
         f"--chdir={trainer_home}", "sh", "trainer.sh"],
        env={**os.environ, "SLURM_CONF": str(cluster.conf),
             "HYPERPLAN_ENV_DIR": str(trainer_home.parent / "env")},
        cwd="/tmp",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(lambda: (trainer_home / "started.txt").exists(), timeout=WAIT)
        server.set_clock(first_day + DAY - timedelta(minutes=30))
        warned = trainer_home / "warned.txt"
        assert wait_until(lambda: warned.exists() and warned.read_text().strip(), timeout=WAIT), "no SIGTERM"
        assert warned.read_text().strip() == end
        assert wait_until(lambda: not running() and not _jobs_of(cluster, team_user), timeout=WAIT)
    finally:
        trainer.kill()
        trainer.wait(timeout=30)

    # Two minutes before `other`'s g5 plan starts (its node's grace and the two minutes before the
    # reservation its Slurm limit would keep, as under the wall clock), the plan's reservation is made
    # (IGNORE_JOBS) and takes, the pool being short (one node drained, the free one under maintenance),
    # the nodes of the on-demand node and job: the node ends (SIGTERM, as at reclaim) and is replaced by
    # a new instance, Pending until a g5 node is free again; the job ends Interrupted, as on the local
    # back end when its capacity is taken back (a drain). The plan has not started yet.
    [spare] = set(NODES[4:]) - {failed_host, job_host} - {h for _, h in od.values()}  # the g5 nodes
    cluster.client.drain([spare], "maintenance")
    g5plan = f"hp-{other_id}-g5plan-rc1"
    server.set_clock(first_day + DAY - timedelta(minutes=2))
    held = _until(cluster, lambda h: g5plan in h and len(h[g5plan].nodes) == 2)
    [(taken_instance, (_, taken_host))] = od.items()
    assert set(held[g5plan].nodes) == {taken_host, job_host}
    od = od_until(lambda n: taken_instance not in n and len(n) == 1)
    assert [s for s, _ in od.values()] == ["Pending"], od
    event = recovered()[taken_instance]
    assert f"Slurm node {taken_host} is taken by the plan reservation {g5plan}" in event["Detail"]["Reason"]
    ended = wait_until(
        lambda: (
            (d := other_jobs.describe_training_job(TrainingJobName="od-job"))["TrainingJobStatus"] in FINAL
            and d
        ),
        timeout=WAIT,
    )
    assert ended and (ended["TrainingJobStatus"], ended["SecondaryStatus"]) == ("Stopped", "Interrupted")
    assert "FailureReason" not in ended, ended
    [*_, stopping, interrupted] = ended["SecondaryStatusTransitions"]
    assert stopping["Status"] == "Stopping" and interrupted["Status"] == "Interrupted", ended
    assert stopping["StatusMessage"] == (
        f"Its on-demand capacity is taken back: Slurm node {job_host} is taken by the plan reservation "
        f"{g5plan}; the instances got SIGTERM and get SIGKILL after 5 s. It ends Interrupted."
    )
    assert interrupted["StatusMessage"].startswith("Interrupted: its on-demand capacity was taken back")
    assert "warned" in _output(server, other, "od-job")
    assert other_jobs.describe_training_plan(TrainingPlanName="g5plan")["Status"] == "Scheduled"
    # The segment starts: the reservation starts now, if its Slurm start was still ahead.
    server.set_clock(first_day + DAY + timedelta(hours=1))
    held = _until(cluster, lambda h: g5plan in h and h[g5plan].state == "ACTIVE")
    assert set(held[g5plan].nodes) == {taken_host, job_host}

    # Back at the next segment, in rc2; after it, nothing of the account runs on the cluster. The g5
    # plan has ended: the on-demand group runs whole again.
    _resume(cluster, failed_host)
    _resume(cluster, spare)
    server.set_clock(first_day + 2 * DAY)
    od_until(one_running)
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), nodes()
    held = _until(cluster, lambda h: rc2 in h)
    assert {j["reservation"] for j in _jobs_of(cluster, team_user)} == {rc2}
    assert {n["PrivateDnsHostname"].split(".")[1] for n in running()} == set(held[rc2].nodes)

    # Automatic node recovery: the Slurm node under a Running node is drained; the reservation takes a
    # free node of the pool in its place, the instance on it ends and a new one runs on the new node.
    [old] = [n for n in running() if n["PrivateDnsHostname"].split(".")[1] == held[rc2].nodes[0]]
    failed = held[rc2].nodes[0]
    cluster.client.drain([failed], "GPU fell off the bus")
    try:
        held = _until(cluster, lambda h: rc2 in h and failed not in h[rc2].nodes and len(h[rc2].nodes) == 2)
        replaced = lambda found: len(found) == 2 and old["InstanceId"] not in {n["InstanceId"] for n in found}  # noqa: E731
        assert wait_until(lambda: replaced(running()), timeout=WAIT), nodes()  # (one look: not two)
        assert {n["PrivateDnsHostname"].split(".")[1] for n in running()} == set(held[rc2].nodes)
        assert {j["nodes"] for j in _jobs_of(cluster, team_user)} == set(held[rc2].nodes)
        # Gone from ListClusterNodes and DescribeClusterNode once terminated, as on HyperPod; the
        # plan's history says what happened.
        gone = server.aws(
            "sagemaker", "describe-cluster-node", "--cluster-name", "ml-cluster",
            "--node-id", old["InstanceId"], credentials=team, check=False,
        )  # fmt: skip
        assert gone.returncode != 0 and "ResourceNotFound" in gone.stderr, gone
        [recovered] = _events(server, "team", "split", "cluster-node-recovered")
        instance = old["InstanceId"]
        assert f"Cluster node {instance} (group worker-group-1) was on Slurm node {failed}" in recovered
        assert "GPU fell off the bus" in recovered
    finally:
        _resume(cluster, failed)
    server.set_clock(first_day + 3 * DAY)
    assert wait_until(lambda: not running() and not _jobs_of(cluster, team_user), timeout=WAIT)


# A checkpointing trainer in plain sh (the accounts' users run the system's Python, which has no numpy):
# one epoch every 0.5 s, its count in the checkpoint directory; on SIGTERM it says so and exits.
TRAIN_SH = r"""
ckpt="$SM_CHECKPOINT_DIR"; mkdir -p "$ckpt"
n=$(cat "$ckpt/epoch" 2>/dev/null || echo 0)
[ "$n" -gt 0 ] && echo "resuming after epoch $n"
echo "$SM_CURRENT_HOST of $SM_HOSTS on $SLURMD_NODENAME as $(id -un),"\
  "master $MASTER_ADDR, hosts $HYPERPLAN_HOSTS"
trap 'echo "interrupted: saved epoch $n"; exit 0' TERM
while [ "$n" -lt "${SM_HP_EPOCHS:-40}" ]; do
  sleep 0.5 & wait $!
  n=$((n + 1)); echo "$n" > "$ckpt/epoch"
done
echo "trained $n epochs on $SM_CURRENT_HOST" > "$SM_MODEL_DIR/model.txt"
echo done
"""


def _buy_for_jobs(
    server: Server, who: Any, name: str, count: int, hours: int, after: Any, before: Any
) -> str:
    client = server.sagemaker(who)
    [offering, *_] = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=count, DurationHours=hours,
        TargetResources=["training-job"], StartTimeAfter=after, EndTimeBefore=before,
    )["TrainingPlanOfferings"]  # fmt: skip
    arn: str = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    return arn


def test_a_two_node_training_job_is_one_slurm_job_interrupted_at_reclaim_and_resumed(
    cluster: Cluster, contained_slurm_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"HYPERPLAN_JOB_RECLAIM_GRACE": "5", "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3"}.items():
        monkeypatch.setenv(name, value)
    server = contained_slurm_server()
    began = time.time()  # real time: the lines' times are when they were written, on the nodes
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team, other = server.new_account("team"), server.new_account("other")
    server.sagemaker(other)  # the blocker: all four p5 nodes on the second day
    _buy_for_jobs(server, other, "blocker", 4, 24, first_day + DAY, first_day + 2 * DAY)
    arn = _buy_for_jobs(server, team, "split", 2, 48, first_day, first_day + 3 * DAY)
    team_id, team_user = _user_of(server, "team")
    rc1, rc2 = f"hp-{team_id}-split-rc1", f"hp-{team_id}-split-rc2"
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    (data.parent / "train.sh").write_text(TRAIN_SH)
    server.cli("buckets", "grant", "bucket", "team")
    client = server.sagemaker(team)
    client.create_training_job(
        TrainingJobName="resumed",
        RoleArn="arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        AlgorithmSpecification={
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": ['exec sh "$SM_CHANNEL_TRAINING/train.sh"'],
        },
        InputDataConfig=[{
            "ChannelName": "training",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/input",
                                            "S3DataDistributionType": "FullyReplicated"}},
        }],
        OutputDataConfig={"S3OutputPath": "s3://bucket/output"},
        ResourceConfig={"InstanceType": "ml.p5.48xlarge", "InstanceCount": 2, "VolumeSizeInGB": 10,
                        "TrainingPlanArn": arn},
        StoppingCondition={"MaxRuntimeInSeconds": 2419200},
        CheckpointConfig={"S3Uri": "s3://bucket/checkpoints/resumed"},
    )  # fmt: skip
    describe = lambda: client.describe_training_job(TrainingJobName="resumed")  # noqa: E731
    stored = server.data_dir / "s3" / "bucket" / "checkpoints" / "resumed" / "epoch"

    def epochs() -> int:
        return int(stored.read_text()) if stored.exists() and stored.read_text().strip() else 0

    # The first segment: one Slurm job of two whole nodes in rc1, as the account's user.
    server.set_clock(first_day + timedelta(minutes=1))
    # (its first instances wait for their image: pulled, then unpacked on the work root)
    assert wait_until(lambda: describe()["SecondaryStatus"] == "Training", timeout=IMAGE_READY), describe()
    running = lambda: [j for j in _jobs_of(cluster, team_user) if j["state"] == "RUNNING"]  # noqa: E731
    assert wait_until(running, timeout=WAIT), _jobs_of(cluster, team_user)
    jobs = _jobs_of(cluster, team_user)
    assert len(jobs) == 1 and jobs[0]["reservation"] == rc1, jobs
    assert set(cluster.client.run("scontrol", "show", "hostnames", jobs[0]["nodes"]).split()) == set(
        _held(cluster)[rc1].nodes
    )
    assert wait_until(lambda: epochs() >= 2, timeout=WAIT), "no checkpoint was synced while it ran"

    server.set_clock(first_day + DAY - timedelta(minutes=30))  # the first segment's reclaim time
    assert wait_until(lambda: describe()["SecondaryStatus"] == "Pending", timeout=WAIT), describe()
    assert wait_until(lambda: not _jobs_of(cluster, team_user), timeout=WAIT)
    interrupted_at = epochs()
    assert 2 <= interrupted_at < 40

    server.set_clock(first_day + 2 * DAY + timedelta(minutes=1))  # the second segment, in rc2
    assert wait_until(lambda: describe()["TrainingJobStatus"] == "Completed", timeout=90), describe()
    job = describe()
    statuses = [t["Status"] for t in job["SecondaryStatusTransitions"]]
    assert statuses.count("Training") == 2, statuses
    # Running time (Downloading and Training) is service time, counted by the server as on every back
    # end (not by Slurm, nor in real time): 23 h 29 min to 23.5 h in the first segment (from the
    # segment's start or from the minute after it the clock jumped to, up to the reclaim) and 0 to 60 s
    # in the second (it completes at the instant the clock reached). Which of the two an attempt starts
    # at varies from run to run (seen: 84600 and 84660 in all).
    seconds = job["TrainingTimeInSeconds"]
    assert seconds == job["BillableTimeInSeconds"] and 84540 <= seconds <= 84660, job
    logs = server.cli("jobs", "logs", "resumed", credentials=team).stdout
    assert "interrupted: saved epoch" in logs and "resuming after epoch" in logs, logs
    assert "algo-1 of" in logs and "master 127.0.0.1" in logs and "algo-2=127.0.0.1" in logs, logs
    second = server.cli("jobs", "logs", "resumed", "--host", "algo-2", credentials=team).stdout
    assert "algo-2 of" in second and " as root," in second  # `id -un` in the container: the user outside
    _check_timed_logs(server, team, job, began)
    model = job["ModelArtifacts"]["S3ModelArtifacts"]
    bucket, _, key = model.removeprefix("s3://").partition("/")
    with tarfile.open(server.data_dir / "s3" / bucket / key) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
    assert "model.txt" in names, names
    assert not _jobs_of(cluster, team_user)
    nothing_contained_left(server, team_user)
    del rc2


LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TIMED_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6})Z (.*)$")


def _check_timed_logs(server: Server, who: Any, job: dict[str, Any], began: float) -> None:
    """Each node's lines with the times the timed-log wrapper on that node read them (not a file's
    mtime): from both instances, in the order written, within the test's real time, the interruption
    before the resume; the same through `jobs logs -t` and CloudWatch Logs."""
    name = job["TrainingJobName"]
    for host in ("algo-1", "algo-2"):
        shown = server.cli("jobs", "logs", name, "--host", host, "-t", credentials=who).stdout
        lines = [line for line in shown.splitlines() if not line.startswith("--- attempt ")]
        parsed = [TIMED_LINE.match(line) for line in lines]
        assert lines and all(parsed), shown
        times = [datetime.fromisoformat(m.group(1)).replace(tzinfo=UTC).timestamp() for m in parsed if m]
        texts = [m.group(2) for m in parsed if m]
        assert times == sorted(times) and began <= times[0] and times[-1] <= time.time(), shown
        assert any(text.startswith(f"{host} of ") for text in texts), shown
        interrupted = next(i for i, text in enumerate(texts) if "interrupted: saved epoch" in text)
        resumed = next(i for i, text in enumerate(texts) if "resuming after epoch" in text)
        assert interrupted < resumed and times[interrupted] < times[resumed], shown
    streams = server.aws(
        "logs", "describe-log-streams", "--log-group-name", LOG_GROUP, "--log-stream-name-prefix", f"{name}/",
        credentials=who,
    )["logStreams"]  # fmt: skip
    names = [s["logStreamName"] for s in streams]
    assert [n.split("/")[1].rsplit("-", 1)[0] for n in names] == ["algo-1", "algo-2"], names
    for stream, host in zip(names, ("algo-1", "algo-2"), strict=True):
        at = ("--log-group-name", LOG_GROUP, "--log-stream-name", stream)
        events = server.aws("logs", "get-log-events", *at, "--start-from-head", credentials=who)["events"]
        stamps = [event["timestamp"] for event in events]
        assert stamps == sorted(stamps) and began * 1000 <= stamps[0] <= stamps[-1] <= time.time() * 1000
        assert any(event["message"].startswith(f"{host} of ") for event in events), events


def test_hyperplan_and_slurmctld_restarted_mid_segment_lose_nothing_and_leave_no_stray_job(
    cluster: Cluster, contained_slurm_server: Callable[..., Server]
) -> None:
    server = contained_slurm_server()
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team, _other, plan = _split_plan(server, first_day)
    team_id, team_user = _user_of(server, "team")
    client = server.sagemaker(team)
    client.create_cluster(
        ClusterName="steady",
        InstanceGroups=[{
            "InstanceGroupName": "workers", "InstanceType": "ml.p5.48xlarge", "InstanceCount": 2,
            "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
            "ExecutionRole": ROLE, "ThreadsPerCore": 1, "TrainingPlanArn": plan["TrainingPlanArn"],
        }],
    )  # fmt: skip
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(ON_CREATE)
    server.cli("buckets", "grant", "lifecycle", "team")

    def nodes() -> dict[str, tuple[str, str]]:
        summaries = client.list_cluster_nodes(ClusterName="steady")["ClusterNodeSummaries"]
        return {n["InstanceId"]: (n["InstanceStatus"]["Status"], n["PrivateDnsHostname"]) for n in summaries}

    def all_running() -> bool:
        found = nodes()
        return len(found) == 2 and {status for status, _ in found.values()} == {"Running"}

    server.set_clock(first_day + timedelta(minutes=1))
    assert wait_until(all_running, timeout=IMAGE_READY), nodes()  # (the node image pulled and unpacked)
    before = nodes()
    jobs = {j["id"]: j for j in _jobs_of(cluster, team_user)}
    assert len(jobs) == 2
    prefix = ".".join(next(iter(jobs.values()))["name"].split(".")[:2]) + "."

    # hyperplan dies; meanwhile a job with its prefix appears that it never made (a stray).
    server.kill()
    stray = cluster.client.run(
        "sbatch", "--parsable", f"--job-name={prefix}n.i-stray.00000000", "-N1", "--time=10",
        "--constraint=ml.g5.12xlarge", "--output=/dev/null", "--wrap=sleep 600",
    ).strip()  # fmt: skip
    server.start()
    assert wait_until(lambda: stray not in {j.id for j in _live_jobs(cluster)} or None, timeout=WAIT)
    assert nodes() == before  # adopted: the same nodes, on the same Slurm nodes, still Running
    assert {j["id"] for j in _jobs_of(cluster, team_user)} == set(jobs)  # the same jobs, none new
    node_id = next(iter(before))
    shown = server.cli("clusters", "exec", "steady", node_id, "--", "sh", "-c", "echo $SLURM_JOB_ID",
                       credentials=team).stdout.strip()  # fmt: skip
    assert shown in jobs

    # slurmctld restarts on its saved state: the jobs carry on, hyperplan sees them as before, and a
    # command runs on a node at once (Slurm refuses steps until the node's slurmd registers again).
    restarted = dev_cluster("restart-controller", cluster.directory)
    assert restarted.returncode == 0, restarted.stderr
    shown = server.cli("clusters", "exec", "steady", node_id, "--", "sh", "-c", "echo $SLURM_JOB_ID",
                       credentials=team).stdout.strip()  # fmt: skip
    assert shown in jobs
    assert wait_until(lambda: {j["id"] for j in _jobs_of(cluster, team_user)} == set(jobs), timeout=WAIT)
    assert wait_until(lambda: nodes() == before, timeout=WAIT), nodes()

    # The segment ends: nothing of the account's is left on the cluster, nor any job with the prefix.
    server.set_clock(first_day + DAY)
    assert wait_until(lambda: not _jobs_of(cluster, team_user), timeout=WAIT)
    assert wait_until(lambda: not [j for j in _live_jobs(cluster) if j.name.startswith(prefix)], timeout=WAIT)
    nothing_contained_left(server, team_user)
    del team_id


def _live_jobs(cluster: Cluster) -> list[Any]:
    return [
        j for j in cluster.client.jobs() if j.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")
    ]


# -- stop, MaxRuntimeInSeconds, failures and on-demand jobs, as on the local back end ------------------

G5 = "ml.g5.12xlarge"
P5 = "ml.p5.48xlarge"
JOB_PERIODS = {
    "HYPERPLAN_JOB_RECLAIM_GRACE": "5",
    "HYPERPLAN_JOB_STOP_GRACE": "5",
    "HYPERPLAN_JOB_CHECKPOINT_SYNC": "0.3",
}
FINAL = ("Completed", "Failed", "Stopped")
OOM = "CUDA out of memory at step 7"


def _on_demand_job(
    name: str, script: str, instance_type: str, count: int = 1, **extra: Any
) -> dict[str, Any]:
    """An on-demand job (no plan) running `script` with sh; TRAIN_SH is in the channel."""
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": [script],
        },
        "InputDataConfig": [{
            "ChannelName": "training",
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/input",
                                            "S3DataDistributionType": "FullyReplicated"}},
        }],
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 2419200},
        **extra,
    }  # fmt: skip


def _outcome(server: Server, job: dict[str, Any]) -> dict[str, Any]:
    """What a user sees of a job that has ended, for comparing back ends: statuses, every transition
    and its message, the failure, the times billed, the model's files and the stored checkpoints."""
    model = job.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    files: list[str] | None = None  # no model stored
    if model:
        bucket, _, key = model.removeprefix("s3://").partition("/")
        if (server.data_dir / "s3" / bucket / key).exists():
            with tarfile.open(server.data_dir / "s3" / bucket / key) as tar:
                files = sorted(m.name for m in tar.getmembers() if m.isfile())
    checkpoints = server.data_dir / "s3" / "bucket" / "checkpoints" / job["TrainingJobName"]
    return {
        "status": (job["TrainingJobStatus"], job["SecondaryStatus"]),
        # The one message that differs on purpose: where a multi-instance job's hosts run.
        "transitions": [
            (t["Status"], (t.get("StatusMessage") or "").replace(" as one Slurm job.", " on loopback."))
            for t in job["SecondaryStatusTransitions"]
        ],
        "model_uri": model,
        "failure": job.get("FailureReason"),
        "training_seconds": job.get("TrainingTimeInSeconds"),
        "billable_seconds": job.get("BillableTimeInSeconds"),
        "model": files,
        "checkpoints": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.exists() else [],
    }


def _live_nodes(sagemaker: Any, cluster: str) -> dict[str, tuple[str, str]]:
    """A cluster's nodes but those shutting down: instance id -> (status, Slurm node)."""
    found = sagemaker.list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    return {
        n["InstanceId"]: (n["InstanceStatus"]["Status"], n["PrivateDnsHostname"].split(".")[1])
        for n in found
        if n["InstanceStatus"]["Status"] != "ShuttingDown"
    }


def _output(server: Server, who: Any, name: str) -> str:
    """algo-1's output so far (its first attempt), through the native API: polled, so no CLI process
    each time (`jobs logs` reads the same pages)."""
    page = server.native(who).get(f"/api/v1/training-jobs/{name}/logs", host="algo-1", stream="stdout")
    return str(page["Data"])


def _stops_failures_and_on_demand(
    server: Server, while_running: Callable[[], None] = lambda: None
) -> dict[str, dict[str, Any]]:
    """Six on-demand jobs on one server under the manual clock: two that fail, one that completes, one
    stopped while it checkpoints, one that ignores SIGTERM, one stopped by MaxRuntimeInSeconds (service
    time). Asserts what tests/server/test_jobs.py asserts on the local back end; returns the outcomes."""
    team = server.new_account("team")
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    (data.parent / "train.sh").write_text(TRAIN_SH)
    server.cli("buckets", "grant", "bucket", "team")
    client = server.sagemaker(team)
    train = 'exec sh "$SM_CHANNEL_TRAINING/train.sh"'
    loop = "echo ready; while :; do sleep 0.2; done"
    requests = [
        _on_demand_job("broken", "echo loading; echo 'cannot open /opt/ml/input/data/x' >&2; exit 1", G5),
        _on_demand_job("explained", f"echo '{OOM}' > \"$SM_OUTPUT_DIR/failure\"; exit 2", G5),
        _on_demand_job("done", train, P5, 2, HyperParameters={"epochs": "2"}),
        _on_demand_job(
            "long", train, P5, 2, HyperParameters={"epochs": "1000"},
            CheckpointConfig={"S3Uri": "s3://bucket/checkpoints/long"},
        ),
        _on_demand_job("stubborn", "trap '' TERM; " + loop, G5),
        _on_demand_job("capped", loop, G5, StoppingCondition={"MaxRuntimeInSeconds": 600}),
    ]  # fmt: skip
    for request in requests:
        client.create_training_job(**request)
    describe = lambda name: client.describe_training_job(TrainingJobName=name)  # noqa: E731
    logs = lambda name: _output(server, team, name)  # noqa: E731

    def ended(name: str) -> dict[str, Any]:
        found = wait_until(lambda: (d := describe(name))["TrainingJobStatus"] in FINAL and d, timeout=90)
        assert found, describe(name)
        return dict(found)

    stored = server.data_dir / "s3" / "bucket" / "checkpoints" / "long" / "epoch"
    assert wait_until(lambda: stored.exists() and int(stored.read_text() or 0) >= 2, timeout=WAIT), describe(
        "long"
    )
    for name in ("stubborn", "capped"):
        assert wait_until(lambda: "ready" in logs(name), timeout=WAIT), describe(name)  # noqa: B023
    while_running()

    broken = ended("broken")
    assert broken["TrainingJobStatus"] == "Failed"
    reason = broken["FailureReason"]
    assert reason.startswith("AlgorithmError: instance algo-1 exited with code 1") and "cannot open" in reason
    explained = ended("explained")
    assert (
        explained["FailureReason"]
        == "AlgorithmError: instance algo-1 exited with code 2: CUDA out of memory at step 7"
    )
    done = ended("done")
    assert done["TrainingJobStatus"] == "Completed", done
    assert "trained" not in logs("done") and "done" in logs("done").split()

    client.stop_training_job(TrainingJobName="long")
    assert describe("long")["TrainingJobStatus"] in ("Stopping", "Stopped")
    long = ended("long")
    assert [t["Status"] for t in long["SecondaryStatusTransitions"]][-3:] == [
        "Training",
        "Stopping",
        "Stopped",
    ]
    assert "StopTrainingJob" in long["SecondaryStatusTransitions"][-1]["StatusMessage"]
    assert "interrupted: saved epoch" in logs("long")

    began = time.monotonic()
    client.stop_training_job(TrainingJobName="stubborn")
    stubborn = ended("stubborn")
    assert stubborn["TrainingJobStatus"] == "Stopped" and time.monotonic() - began >= 4.5  # after the grace

    # MaxRuntimeInSeconds counts service time: nine minutes on, it still trains; at ten it is stopped.
    assert describe("capped")["SecondaryStatus"] == "Training"
    server.set_clock(service_now(server) + timedelta(minutes=9))
    assert describe("capped")["SecondaryStatus"] == "Training"
    server.set_clock(service_now(server) + timedelta(minutes=1))
    capped = ended("capped")
    assert (capped["TrainingJobStatus"], capped["SecondaryStatus"]) == ("Stopped", "MaxRuntimeExceeded")
    assert capped["TrainingTimeInSeconds"] == capped["BillableTimeInSeconds"] == 600
    assert "MaxRuntimeInSeconds (600)" in capped["SecondaryStatusTransitions"][-1]["StatusMessage"]

    jobs = {"broken": broken, "explained": explained, "done": done, "long": long, "stubborn": stubborn,
            "capped": capped}  # fmt: skip
    outcomes = {name: _outcome(server, job) for name, job in jobs.items()}
    assert outcomes["done"]["model"] == ["model.txt"] and outcomes["long"]["checkpoints"] == ["epoch"]
    return outcomes


def _on_demand_fleet(cluster: Cluster, path: Path, local: bool = False) -> Path:
    """The dev cluster's fleet with every instance kept out of plans (on-demand only); with `local`, the
    same pools and prices on the local back end (counts for nodes, no Slurm settings)."""
    text = cluster.fleet.read_text().replace("[[pools]]\n", "[[pools]]\nreservable = 0\n")
    if local:
        head, _, rest = text.partition("[backend]")
        text = head + rest.partition("\n\n")[2]
        lines = [line for line in text.splitlines() if not line.startswith("feature = ")]
        text = "\n".join("count = 4" if line.startswith("nodes = ") else line for line in lines) + "\n"
    path.write_text(text)
    return path


def test_stop_max_runtime_failures_and_on_demand_jobs_end_as_on_the_local_back_end(
    cluster: Cluster,
    slurm_server: Callable[..., Server],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same six on-demand jobs on a Slurm server and on a local one, at once: each ends the same way
    on both (statuses, transitions and their messages, FailureReason, billed time, model, checkpoints).
    On Slurm each ran as a Slurm job of the account's user outside every reservation, and none is left."""
    for name, value in JOB_PERIODS.items():
        monkeypatch.setenv(name, value)
    server = slurm_server("manual", _on_demand_fleet(cluster, tmp_path / "fleet.toml"))
    local = Server(
        data_dir=tmp_path / "local",
        clock="manual",
        clock_start=SERVER_START,
        fleet=_on_demand_fleet(cluster, tmp_path / "local-fleet.toml", local=True),
    )
    seen: list[list[dict[str, str]]] = []

    def on_slurm() -> None:  # every job of the account is a Slurm job in no reservation
        _, user = _user_of(server, "team")
        jobs = _jobs_of(cluster, user)
        seen.append(jobs)
        assert jobs and {j["reservation"] for j in jobs} == {"(null)"}, jobs
        assert {j["limit"] for j in jobs} == {"UNLIMITED"}, jobs  # not the partition's DefaultTime

    try:
        local.start()
        with ThreadPoolExecutor(2) as pool:
            on_local = pool.submit(_stops_failures_and_on_demand, local)
            slurm = _stops_failures_and_on_demand(server, on_slurm)
            expected = on_local.result(timeout=300)
    finally:
        local.close()
        LocalBackend(local.work_dir / "backend").adopt([])
    assert seen and len({j["nodes"] for j in seen[0]}) == len(seen[0])  # whole nodes, none shared
    for name, outcome in expected.items():
        assert slurm[name] == outcome, name
    _, user = _user_of(server, "team")
    assert wait_until(lambda: not _jobs_of(cluster, user), timeout=WAIT), _jobs_of(cluster, user)


IDLE, RESERVED = ("IDLE", ()), ("IDLE", ("RESERVED",))


def _node_flags(cluster: Cluster, node: str) -> tuple[str, tuple[str, ...], str]:
    [found] = cluster.client.nodes([node])
    return found.state, tuple(found.flags), found.reason or ""


def test_a_killed_slurmd_fails_its_job_as_slurm_reports_while_a_restarted_one_carries_on(
    cluster: Cluster, contained_slurm_server: Callable[..., Server], tmp_path: Path
) -> None:
    """Two on-demand jobs, each on its own node; both nodes' slurmd killed (as a crash). One is started
    again while Slurm only marks its node not responding: the job carries on and completes. The other
    stays dead: after SlurmdTimeout Slurm marks its node DOWN and ends the job NODE_FAIL (never
    requeued), and the job fails saying so, as the platform's failure. A cluster node on a plan whose
    pool is that one Slurm node, its slurmd killed with it: its Slurm job ends NODE_FAIL too (never
    requeued: OnCreate does not run again beneath the store), and automatic node recovery replaces the
    instance by a new one, Pending in the reservation until the node answers again, then Running there.
    Nothing is lost from the store; no Slurm job is left."""
    # The g5 pool on-demand only; the p5 pool one node (hp-n01), for plans: no node can replace it.
    text = cluster.fleet.read_text()
    p5_nodes, g5 = 'nodes = "hp-n[01-04]"\n', f'instance_type = "{G5}"\n'
    assert text.count(p5_nodes) == 1 and text.count(g5) == 1
    text = text.replace(p5_nodes, 'nodes = "hp-n01"\n').replace(g5, g5 + "reservable = 0\n")
    (tmp_path / "fleet.toml").write_text(text)
    server = contained_slurm_server(tmp_path / "fleet.toml")
    team = server.new_account("team")
    _, user = _user_of(server, "team")
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    server.cli("buckets", "grant", "bucket", "team")
    client = server.sagemaker(team)
    describe = lambda name: client.describe_training_job(TrainingJobName=name)  # noqa: E731
    waiting = 'echo "ready on $SLURMD_NODENAME in $PWD"; until [ -e go ]; do sleep 0.2; done; echo "went on"'
    for name in ("survivor", "casualty"):
        client.create_training_job(**_on_demand_job(name, waiting, G5))
    script = server.data_dir / "s3" / "bucket" / "lifecycle" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    plan = _buy(server, team, "one", 1, 24, first_day, first_day + DAY)
    server.set_clock(first_day)
    group = {
        "InstanceGroupName": "workers", "InstanceType": P5, "InstanceCount": 1, "ExecutionRole": ROLE,
        "LifeCycleConfig": {"SourceS3Uri": "s3://bucket/lifecycle", "OnCreate": "on_create.sh"},
        "TrainingPlanArn": plan["TrainingPlanArn"],
    }  # fmt: skip
    client.create_cluster(ClusterName="od-cluster", InstanceGroups=[group])

    cluster_nodes = lambda: _live_nodes(client, "od-cluster")  # noqa: E731

    shown = lambda name: _output(server, team, name)  # noqa: E731
    ready = {}
    for name in ("survivor", "casualty"):
        assert wait_until(lambda: "ready on " in shown(name), timeout=IMAGE_READY), describe(name)  # noqa: B023
        ready[name] = shown(name).split("ready on ", 1)[1].split("\n")[0].split(" in ", 1)
    nodes = {name: node for name, (node, _) in ready.items()}
    # In its container the program's working directory is its /opt/ml; on the host, the instance's tree.
    assert ready["survivor"][1] == "/opt/ml", ready
    home = instance_tree(server, "survivor")
    assert home is not None and home.is_dir(), home
    assert nodes["survivor"] != nodes["casualty"]
    assert wait_until(lambda: [s for s, _ in cluster_nodes().values()] == ["Running"], timeout=WAIT)
    [(instance, (_, nodes["cluster node"]))] = cluster_nodes().items()
    jobs = {j["nodes"]: j for j in _jobs_of(cluster, user)}
    assert sorted((node, job["state"]) for node, job in jobs.items()) == sorted(
        (node, "RUNNING") for node in nodes.values()
    )
    node_job = int(jobs[nodes["cluster node"]]["id"])
    killed = list(nodes.values())  # the survivor's first: it is the first to be seen not responding
    try:
        for node in killed:
            assert dev_cluster("kill-node", cluster.directory, node).returncode == 0
        # Slurm first marks the node not responding; the job runs on meanwhile, and so says the job.
        survivor_flags = lambda: _node_flags(cluster, nodes["survivor"])  # noqa: E731
        assert wait_until(lambda: "NOT_RESPONDING" in survivor_flags()[1], timeout=60), survivor_flags()
        assert [j["state"] for j in _jobs_of(cluster, user) if j["nodes"] == nodes["survivor"]] == ["RUNNING"]
        assert describe("survivor")["SecondaryStatus"] == "Training"
        started = dev_cluster("start-node", cluster.directory, nodes["survivor"])
        assert started.returncode == 0, started.stderr

        # The casualty's node stays silent: DOWN after SlurmdTimeout, its job NODE_FAIL, not requeued.
        assert wait_until(lambda: _node_flags(cluster, nodes["casualty"])[0] == "DOWN", timeout=90)
        assert "Not responding" in _node_flags(cluster, nodes["casualty"])[2]
        failed = wait_until(lambda: (d := describe("casualty"))["TrainingJobStatus"] == "Failed" and d, WAIT)
        assert failed, describe("casualty")
        reason = failed["FailureReason"]
        assert reason.startswith("InternalServerError: instance algo-1 was lost") and "NODE_FAIL" in reason
        assert [j for j in _jobs_of(cluster, user) if j["nodes"] == nodes["casualty"]] == []

        # The cluster node's job ended NODE_FAIL, not requeued. No node can replace its Slurm node: the
        # instance is replaced by a new one, Pending in the reservation, and the plan's history says so.
        [node_failed] = [j for j in cluster.client.jobs() if j.id == node_job]
        assert node_failed.state == "NODE_FAIL", node_failed
        pending = lambda n: instance not in n and [s for s, _ in n.values()] == ["Pending"]  # noqa: E731
        assert wait_until(lambda: pending(cluster_nodes()), timeout=WAIT), cluster_nodes()
        [recovered] = _events(server, "team", "one", "cluster-node-recovered")
        assert f"Cluster node {instance} (group workers) was on Slurm node hp-n01, DOWN" in recovered
        assert "Pending until a node of it is healthy" in recovered
        # Its slurmd back, the node answers again and the new instance runs on it.
        assert dev_cluster("start-node", cluster.directory, nodes["cluster node"]).returncode == 0
        again = lambda n: list(n.values()) == [("Running", "hp-n01")]  # noqa: E731
        assert wait_until(lambda: again(cluster_nodes()), timeout=WAIT), cluster_nodes()

        # The survivor's slurmd is back: its node answers, the job still runs and ends as it would have.
        assert wait_until(lambda: "NOT_RESPONDING" not in _node_flags(cluster, nodes["survivor"])[1], WAIT)
        assert describe("survivor")["SecondaryStatus"] == "Training"
        (home / "go").touch()
        done = wait_until(lambda: (d := describe("survivor"))["TrainingJobStatus"] == "Completed" and d, WAIT)
        assert done, describe("survivor")
        assert "went on" in shown("survivor")
    finally:
        with contextlib.suppress(Exception):  # its nodes' jobs end, wherever they run
            client.delete_cluster(ClusterName="od-cluster")
        for node in killed:  # whatever happened, every slurmd runs again and its node comes back
            dev_cluster("start-node", cluster.directory, node)
        assert dev_cluster("status", cluster.directory).returncode == 0
        for node in killed:
            # Back as the other tests expect it: idle and answering (nothing of the jobs left on it;
            # hp-n01 in the plan's reservation until the test's end).
            back = lambda: _node_flags(cluster, node)[:2] in (IDLE, RESERVED)  # noqa: B023, E731
            assert wait_until(back, timeout=WAIT), _node_flags(cluster, node)
    # Nothing lost from the store, nothing of the account's left on the cluster (the casualty's
    # processes, orphaned on the silent node, ended when its slurmd registered again).
    listed = {
        j["TrainingJobName"]: j["TrainingJobStatus"]
        for j in client.list_training_jobs()["TrainingJobSummaries"]
    }
    assert listed == {"survivor": "Completed", "casualty": "Failed"}
    assert wait_until(lambda: not _jobs_of(cluster, user), timeout=WAIT), _jobs_of(cluster, user)
    nothing_contained_left(server, user)  # (no process of the account's user either)
