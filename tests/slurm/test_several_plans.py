"""A group and a training job on several plans (issue 48) on the Slurm back end, against the session's dev
cluster: a node is a Slurm job inside its plan's segment reservation and cannot move to another
reservation, so at plan A's reclaim time the group's node on A is replaced by a new node (a new Slurm job)
in plan B's reservation, while its node on B carries on in the same Slurm job; a job given a further plan
runs in the reservation of the plan its attempt holds, not in the named plan's (docs/DECISIONS.md,
"Consumers").

A real `hyperplan serve` on the Slurm back end in isolation mode users, under the manual clock
(tests/slurm/test_reservations.py's slurm_server, which takes the server, its accounts' users, their
Slurm jobs and the `hp-` reservations away after the test)."""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from hyperplan.signing import Credentials
from hyperplan.slurm.parse import Job
from tests.harness import SERVER_START, Server, boundary_after, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.test_reservations import DAY, WAIT, _held, _user_of, slurm_server
from tests.slurm.test_work import ON_CREATE, P5, ROLE, _buy_for_jobs, _on_demand_job

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")


def _buy(server: Server, who: Credentials, name: str, count: int, start: datetime, days: int) -> str:
    """A hyperpod-cluster plan of `count` p5 nodes for exactly `days` days from `start`: its ARN."""
    client = server.sagemaker(who)
    [offering, *_] = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=["hyperpod-cluster"],
        StartTimeAfter=start,
        EndTimeBefore=start + days * DAY,
    )["TrainingPlanOfferings"]
    arn: str = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )["TrainingPlanArn"]
    return arn


def _slurm_jobs(cluster: Cluster, user: str) -> list[Job]:
    """The user's Slurm jobs that have not ended."""
    return [job for job in cluster.client.jobs() if job.user == user and job.state in LIVE]


def _node_jobs(cluster: Cluster, user: str) -> dict[str, Job]:
    """Each node's Slurm job (named `<prefix>n.node-<instance id>.<nonce>`), by instance id."""
    found = {}
    for job in _slurm_jobs(cluster, user):
        _, marker, rest = job.name.partition("n.node-")
        if marker:
            found[rest.split(".")[0]] = job
    return found


def test_a_node_on_a_plan_that_ends_is_replaced_in_the_other_plans_reservation_and_a_job_follows_its_plan(
    cluster: Cluster, slurm_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYPERPLAN_JOB_RECLAIM_GRACE", "5")  # the job's SIGTERM to SIGKILL at reclaim
    server = slurm_server("manual")
    first_day = boundary_after(SERVER_START + timedelta(hours=1))
    team = server.new_account("team")
    team_id, team_user = _user_of(server, "team")
    # The four p5 nodes on the first day: the group's plans A (1) and B (2, for two days) and the job's
    # further plan (1); on the second day B's two and the job's named plan (1).
    plan_a = _buy(server, team, "group-a", 1, first_day, 1)
    plan_b = _buy(server, team, "group-b", 2, first_day, 2)
    job_b = _buy_for_jobs(server, team, "job-b", 1, 24, first_day, first_day + DAY)
    job_a = _buy_for_jobs(server, team, "job-a", 1, 24, first_day + DAY, first_day + 2 * DAY)
    reservation = lambda plan: f"hp-{team_id}-{plan}-rc1"  # noqa: E731

    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    data = server.data_dir / "s3" / "bucket" / "input" / "data.csv"
    data.parent.mkdir(parents=True)
    data.write_text("x,y\n1,2\n")
    for bucket in ("lifecycle", "bucket"):
        server.cli("buckets", "grant", bucket, "team")
    client = server.sagemaker(team)
    client.create_cluster(
        ClusterName="c",
        InstanceGroups=[{
            "InstanceGroupName": "workers", "InstanceType": P5, "InstanceCount": 2,
            "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
            "ExecutionRole": ROLE, "ThreadsPerCore": 1, "TrainingPlanArn": plan_a,
        }],
    )  # fmt: skip
    native = server.native(team)
    native.call("PUT", "/api/v1/clusters/c/instance-groups/workers/plans/group-b")
    job = _on_demand_job("hopper", "echo ready; while :; do sleep 0.2; done", P5)
    job["ResourceConfig"]["TrainingPlanArn"] = job_a  # the plan it names starts a day later
    client.create_training_job(**job)
    native.call("PUT", f"/api/v1/training-jobs/hopper/plans/{job_b}")

    def described() -> tuple[int, int, str, str]:
        """DescribeCluster's group (boto3, checked against the model)."""
        [group] = client.describe_cluster(ClusterName="c")["InstanceGroups"]
        shown = ("CurrentCount", "TargetCount", "TrainingPlanArn", "TrainingPlanStatus")
        current, target, arn, status = (group[member] for member in shown)
        return current, target, arn, status

    def running() -> set[str]:
        nodes = client.list_cluster_nodes(ClusterName="c")["ClusterNodeSummaries"]
        return {n["InstanceId"] for n in nodes if n["InstanceStatus"]["Status"] == "Running"}

    def training_on() -> str | None:
        """The reservation of the job's running Slurm job (named `<prefix>t.<task>.<nonce>`)."""
        jobs = [j for j in _slurm_jobs(cluster, team_user) if ".t." in j.name and j.state == "RUNNING"]
        return jobs[0].reservation if len(jobs) == 1 else None

    def plan_of_job() -> Any:
        return native.get("/api/v1/training-jobs/hopper")["RunningOnPlan"]

    assert described() == (0, 2, plan_a, "Scheduled")

    # Both of the group's plans and the job's further plan start: a node in A's reservation and one in
    # B's; the job runs in its further plan's reservation (the named one has none yet).
    server.set_clock(first_day + timedelta(minutes=1))
    assert wait_until(lambda: len(running()) == 2, timeout=WAIT), client.list_cluster_nodes(ClusterName="c")
    before = _node_jobs(cluster, team_user)
    assert sorted(j.reservation or "" for j in before.values()) == [
        reservation("group-a"),
        reservation("group-b"),
    ], before
    assert set(before) == running()
    [on_a] = [i for i, j in before.items() if j.reservation == reservation("group-a")]
    [on_b] = [i for i, j in before.items() if j.reservation == reservation("group-b")]
    assert described() == (2, 2, plan_a, "Active")
    assert wait_until(lambda: training_on() == reservation("job-b"), timeout=WAIT), _slurm_jobs(
        cluster, team_user
    )
    assert plan_of_job() == job_b
    assert reservation("job-a") not in _held(cluster)

    # A's reclaim time (and the job's further plan's): the node on A cannot move to B's reservation, so
    # it ends and a new node, a new Slurm job, starts in B's; the node on B runs on in the same job.
    server.set_clock(first_day + DAY - timedelta(minutes=30))

    def replaced() -> set[str]:
        now = running()
        return now if len(now) == 2 and on_b in now and on_a not in now else set()

    after = wait_until(replaced, timeout=WAIT)
    assert after, client.list_cluster_nodes(ClusterName="c")
    [new] = after - {on_b}
    jobs = _node_jobs(cluster, team_user)
    assert jobs.keys() == {on_b, new}, jobs
    assert jobs[on_b].id == before[on_b].id  # the same Slurm job: no new lifecycle run
    assert jobs[new].reservation == reservation("group-b") and jobs[new].id not in {
        j.id for j in before.values()
    }
    ended = lambda: (found := cluster.client.job(before[on_a].id)) is None or found.state not in LIVE  # noqa: E731
    assert wait_until(ended, timeout=WAIT), cluster.client.job(before[on_a].id)
    assert described() == (2, 2, plan_b, "Active")  # B serves the group now
    assert wait_until(lambda: training_on() is None and plan_of_job() is None, timeout=WAIT)

    # The job's named plan starts: the job runs on again, in that plan's reservation.
    server.set_clock(first_day + DAY + timedelta(minutes=1))
    assert wait_until(lambda: training_on() == reservation("job-a"), timeout=WAIT), _slurm_jobs(
        cluster, team_user
    )
    assert plan_of_job() == job_a
    assert _node_jobs(cluster, team_user).keys() == {on_b, new}
    assert described() == (2, 2, plan_b, "Active")
