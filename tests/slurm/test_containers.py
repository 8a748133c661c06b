"""HyperPod nodes and training jobs in containers on the Slurm back end (issue 46), against the dev cluster:
a real `hyperplan serve` as root in isolation mode users, its fleet the dev cluster's with runtime podman
(tests/slurm/contained.py), under the manual clock. The server pulls the session's marked image from the
session's registry into the session's Slurm Podman store (the first test of a worker pulls it) and unpacks
it on its work root; each node's and
instance's program runs in a rootless runc container of it, inside its Slurm step, as the account's user.

What the image holds and the host lacks (a marker file with a random word) shows a program ran in the
image. The server, its accounts' users, their Slurm jobs and the `hp-` reservations go with each test
(the slurm_server fixture, tests/slurm/test_reservations.py); the Podman store after the server.
"""

from __future__ import annotations

import io
import json
import os
import pwd
import tarfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests import processes
from tests.harness import SERVER_START, Server, boundary_after, free_port, wait_until
from tests.slurm.cluster import Cluster
from tests.slurm.contained import (
    G5,
    MARKER_PATH,
    ON_DEMAND_G5,
    P5,
    WAIT_FOR_GO_PATH,
    MarkedImage,
    contained_fleet,
    contained_job,
    container_states,
    created_files,
    model_files,
    put_training_data,
    runc_processes,
    runner_exits,
    say,
)
from tests.slurm.test_reservations import DAY, WAIT, _buy, _held, _user_of, slurm_server
from tests.slurm.test_work import ROLE, _buy_for_jobs, _jobs_of

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

FIRST_DAY = boundary_after(SERVER_START + timedelta(hours=1))
READY = 180.0  # a first node or instance waits for its image: pulled, then unpacked on the work root
FINAL = ("Completed", "Failed", "Stopped")


@pytest.fixture
def contained_server(
    podman_store_dir: Path,
    slurm_server: Callable[..., Server],
    cluster: Cluster,
    tmp_path: Path,
    slurm_marked_image: MarkedImage,
) -> Callable[[], Server]:
    """Starts a server on the contained fleet (tests/slurm/contained.py), under the manual clock."""

    def start() -> Server:
        fleet = contained_fleet(cluster, tmp_path / "fleet.toml", podman_store_dir, slurm_marked_image)
        return slurm_server("manual", fleet)

    return start


def _uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def _nothing_left(server: Server, cluster: Cluster, user: str) -> None:
    """No Slurm job of the account's user, no process of that user on the host, no container known to
    runc under the back end's root, and no runc process of it."""
    assert wait_until(lambda: not _jobs_of(cluster, user), timeout=WAIT), _jobs_of(cluster, user)
    uid = _uid(user)
    assert wait_until(lambda: not processes.owned_by(uid), timeout=WAIT), processes.owned_by(uid)
    assert wait_until(lambda: not container_states(server), timeout=WAIT), container_states(server)
    assert runc_processes(server) == []


def _ended(server: Server, who: Credentials, name: str, timeout: float = READY) -> dict[str, Any]:
    client = server.sagemaker(who)
    describe = lambda: client.describe_training_job(TrainingJobName=name)  # noqa: E731
    found = wait_until(lambda: (d := describe())["TrainingJobStatus"] in FINAL and d, timeout=timeout)
    assert found, f"{name} did not end: {describe()}\n{server.log()[-3000:]}"
    return dict(found)


ON_CREATE = '#!/bin/sh\necho "$(cat /etc/hyperplan-marker) $(id -u) $SLURMD_NODENAME" > created.txt\n'


def test_hyperpod_nodes_run_in_their_image_on_their_own_slurm_nodes_of_the_plan_and_leave_nothing(
    contained_server: Callable[[], Server],
    cluster: Cluster,
    tmp_path: Path,
    slurm_marked_image: MarkedImage,
) -> None:
    """The HyperPod walkthrough, shortened: a plan, a cluster of two p5 nodes on it whose OnCreate runs in
    the fleet's node image, as root inside; `clusters exec` runs in the image too; deleting the cluster
    ends its Slurm jobs, its processes and its containers."""
    marker = slurm_marked_image.marker
    assert not Path(MARKER_PATH).exists()  # the image's, not the host's
    server = contained_server()
    team = server.new_account("team")
    plan = _buy(server, team, "plan", 2, 24, FIRST_DAY, FIRST_DAY + DAY)
    team_id, user = _user_of(server, "team")
    reservation = f"hp-{team_id}-plan-rc1"
    script = server.data_dir / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(ON_CREATE)
    server.cli("buckets", "grant", "lifecycle", "team")
    group = {
        "InstanceGroupName": "workers", "InstanceType": P5, "InstanceCount": 2, "ExecutionRole": ROLE,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
        "ThreadsPerCore": 1, "TrainingPlanArn": plan["TrainingPlanArn"],
    }  # fmt: skip
    (tmp_path / "cluster.json").write_text(json.dumps({"ClusterName": "boxed", "InstanceGroups": [group]}))
    server.aws("sagemaker", "create-cluster", "--cli-input-json", f"file://{tmp_path / 'cluster.json'}",
               credentials=team)  # fmt: skip
    client = server.sagemaker(team)

    def running() -> list[dict[str, Any]]:
        summaries = client.list_cluster_nodes(ClusterName="boxed")["ClusterNodeSummaries"]
        return [n for n in summaries if n["InstanceStatus"]["Status"] == "Running"]

    server.set_clock(FIRST_DAY)
    assert wait_until(lambda: len(running()) == 2, timeout=READY), (
        client.list_cluster_nodes(ClusterName="boxed"),
        server.log()[-3000:],
    )
    assert client.describe_cluster(ClusterName="boxed")["ClusterStatus"] == "InService"

    # Each node a Slurm job of the account's user on a Slurm node of its own, in the plan's reservation.
    jobs = _jobs_of(cluster, user)
    assert len(jobs) == 2 and {j["reservation"] for j in jobs} == {reservation}, jobs
    hosts = {n["PrivateDnsHostname"].split(".")[1] for n in running()}
    assert {j["nodes"] for j in jobs} == hosts and len(hosts) == 2, (jobs, hosts)
    assert hosts <= set(_held(cluster)[reservation].nodes)

    # OnCreate ran in the image (the marker), as root inside, on its node; its file is in the node's home.
    created = created_files(server)
    assert sorted(created.values()) == sorted(f"{marker} 0 {host}\n" for host in hosts), created
    assert {path.stat().st_uid for path in created} == {_uid(user)}  # root inside is the user outside

    # A command on a node runs in its image too.
    node_id = running()[0]["InstanceId"]
    shown = server.cli(
        "clusters", "exec", "boxed", node_id, "--", "sh", "-c", f"cat {MARKER_PATH}; id -u",
        credentials=team,
    ).stdout.split()  # fmt: skip
    assert shown[:2] == [marker, "0"], shown

    client.delete_cluster(ClusterName="boxed")
    _nothing_left(server, cluster, user)


def test_a_two_node_training_job_runs_in_its_image_across_two_slurm_nodes_of_its_plan(
    contained_server: Callable[[], Server], cluster: Cluster, slurm_marked_image: MarkedImage
) -> None:
    """Two instances of the marked image's own `train`, on a training plan: each on a Slurm node of its
    own in the plan's reservation, named algo-1 and algo-2 inside, reaching the other by name across the
    nodes; algo-2's record reaches algo-1, whose model artifact holds both."""
    server = contained_server()
    team = server.new_account("team")
    arn = _buy_for_jobs(server, team, "plan", 2, 24, FIRST_DAY, FIRST_DAY + DAY)
    team_id, user = _user_of(server, "team")
    reservation = f"hp-{team_id}-plan-rc1"
    data = put_training_data(server, "team")
    port = free_port()
    job = contained_job(
        "pair", slurm_marked_image.reference, P5, 2, TrainingPlanArn=arn, HyperParameters={"port": str(port)}
    )
    server.sagemaker(team).create_training_job(**job)
    server.set_clock(FIRST_DAY + timedelta(minutes=1))

    ended = _ended(server, team, "pair")
    assert ended["TrainingJobStatus"] == "Completed", (ended.get("FailureReason"), server.log()[-3000:])
    result = json.loads(model_files(server, ended)["result.json"])
    first, second = result["algo-1"], result["algo-2"]
    assert first["marker"] == second["marker"] == slurm_marked_image.marker
    assert (first["hostname"], second["hostname"]) == ("algo-1", "algo-2")
    assert first["data"] == second["data"] == data
    assert first["uid"] == second["uid"] == 0
    # The exchange: algo-2 reached algo-1:PORT by name and sent its record; it got algo-1's answer (it
    # fails otherwise).
    assert result["answered"] == "thanks from algo-1"
    assert first["addresses"] == second["addresses"], result
    nodes = {first["slurm_node"], second["slurm_node"]}
    assert len(nodes) == 2 and nodes <= set(_held(cluster)[reservation].nodes), (result, _held(cluster))
    assert first["reservation"] == second["reservation"] == reservation
    [slurm_job] = _slurm_jobs_of(cluster, user)  # ended, still listed (MinJobAge)
    assert slurm_job["Reservation"] == reservation, slurm_job
    _nothing_left(server, cluster, user)


def _slurm_jobs_of(cluster: Cluster, user: str) -> list[dict[str, str]]:
    """Every job of ``user`` Slurm still lists, ended ones too, as its `scontrol show job` fields."""
    text = cluster.client.run("scontrol", "show", "job", "-o")
    lines = [line for line in text.splitlines() if f"UserId={user}(" in line]
    return [dict(field.split("=", 1) for field in line.split() if "=" in field) for line in lines]


def test_a_memory_hog_in_a_container_fails_out_of_memory_and_its_node_runs_the_next_job(
    contained_server: Callable[[], Server], cluster: Cluster, slurm_marked_image: MarkedImage
) -> None:
    """A one-instance job whose program allocates twice its instance's memory (Slurm's --mem holds the
    container: it stays in the step's cgroup) ends Failed, OutOfMemoryError; then a job on every
    on-demand g5 node, the hog's one among them, completes: in script mode, its program and arguments
    from its hyperparameters, as the SageMaker SDK sends them."""
    server = contained_server()
    team = server.new_account("team")
    _, user = _user_of(server, "team")
    put_training_data(server, "team")
    client = server.sagemaker(team)
    hog = ["python3", "-c", "x = bytearray(2 * 2**30)"]  # 2 GiB: twice a g5 instance's limit here
    client.create_training_job(
        **contained_job("hog", slurm_marked_image.reference, G5, ContainerEntrypoint=hog)
    )
    hogged = _ended(server, team, "hog")
    assert hogged["TrainingJobStatus"] == "Failed", hogged
    seen = (
        hogged["FailureReason"],
        runner_exits(server),
        [j.get("JobState") for j in _slurm_jobs_of(cluster, user)],
    )
    assert "OutOfMemoryError" in hogged["FailureReason"], seen

    # The next job, on every on-demand g5 node (the hog's among them), in script mode, as the SageMaker
    # SDK submits one: its code a tarball in S3, run by the image's Python with its hyperparameters.
    source = server.data_dir / "s3" / "bucket" / "code" / "source.tar.gz"
    source.parent.mkdir(parents=True)
    with tarfile.open(source, "w:gz") as tar:
        program = SCRIPT.encode()
        member = tarfile.TarInfo("train.py")
        member.size = len(program)
        tar.addfile(member, io.BytesIO(program))
    script_mode = {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"s3://bucket/code/source.tar.gz"',
        "epochs": "3",
    }
    count = len(ON_DEMAND_G5)
    client.create_training_job(
        **contained_job("after", slurm_marked_image.reference, G5, count, HyperParameters=script_mode)
    )
    after = _ended(server, team, "after")
    assert after["TrainingJobStatus"] == "Completed", after.get("FailureReason")
    said = model_files(server, after)["said.txt"].decode()
    assert said == f"{slurm_marked_image.marker} epochs=3 {count} hosts\n", said
    _nothing_left(server, cluster, user)


SCRIPT = """import argparse, json, os
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int)
args = parser.parse_args()
marker = open("/etc/hyperplan-marker").read().strip()
hosts = json.loads(os.environ["SM_HOSTS"])
if os.environ["SM_CURRENT_HOST"] == "algo-1":
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "said.txt"), "w") as out:
        out.write(f"{marker} epochs={args.epochs} {len(hosts)} hosts\\n")
"""


def test_a_contained_job_outlives_a_killed_server_and_completes_leaving_no_container(
    contained_server: Callable[[], Server], cluster: Cluster, slurm_marked_image: MarkedImage
) -> None:
    """A two-instance job in containers runs; the server is killed (SIGKILL) and started again meanwhile;
    the instances carry on, the job completes after, and no container, runc or process of the account's
    user is left."""
    server = contained_server()
    team = server.new_account("team")
    _, user = _user_of(server, "team")
    put_training_data(server, "team")
    client = server.sagemaker(team)
    ports = [free_port(), free_port()]
    job = contained_job(
        "steady", slurm_marked_image.reference, G5, 2,
        ContainerEntrypoint=[WAIT_FOR_GO_PATH], HyperParameters={"ports": ",".join(map(str, ports))},
    )  # fmt: skip
    client.create_training_job(**job)
    describe = lambda: client.describe_training_job(TrainingJobName="steady")  # noqa: E731
    for port in ports:  # both instances listen: they run
        assert say(port, "are you there", timeout=READY), (describe(), server.log()[-3000:])
    assert len(container_states(server)) == 2, container_states(server)
    server.kill()
    server.start()
    assert describe()["TrainingJobStatus"] == "InProgress", describe()
    for port in ports:
        assert say(port, "go"), port
    ended = _ended(server, team, "steady", timeout=WAIT)
    assert ended["TrainingJobStatus"] == "Completed", ended.get("FailureReason")
    assert model_files(server, ended)["marker.txt"].decode().strip() == slurm_marked_image.marker
    _nothing_left(server, cluster, user)


ISOLATED = (
    "import json, socket\n"
    "port = int(json.load(open('/opt/ml/input/config/hyperparameters.json'))['port'])\n"
    "try:\n"
    "    socket.create_connection(('127.0.0.1', port), timeout=5).close()\n"
    "    seen = 'reached the server'\n"
    "except OSError:\n"
    "    seen = 'no way out'\n"
    "links = [line.split(':')[0].strip() for line in open('/proc/net/dev').read().splitlines()[2:]]\n"
    "open('/opt/ml/model/network.txt', 'w').write(seen + ' ' + ','.join(links))\n"
)


def test_network_isolation_cuts_a_one_instance_job_off_and_is_refused_for_several(
    contained_server: Callable[[], Server], slurm_marked_image: MarkedImage
) -> None:
    """EnableNetworkIsolation on Slurm: a one-instance job gets a network of its own, loopback alone, and
    cannot reach the server its node reaches; several instances talk over their nodes' network, so such
    a job is refused, saying why."""
    server = contained_server()
    team = server.new_account("team")
    put_training_data(server, "team")
    (server.data_dir / "s3" / "bucket" / "input" / "isolated.py").write_text(ISOLATED)
    client = server.sagemaker(team)
    common = {
        "ContainerEntrypoint": ["python3", "/opt/ml/input/data/train/isolated.py"],
        "HyperParameters": {"port": str(server.port)},
    }
    with pytest.raises(ClientError) as refused:
        client.create_training_job(
            **contained_job(
                "pair", slurm_marked_image.reference, G5, 2, EnableNetworkIsolation=True, **common
            )
        )
    error = refused.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    assert "only a one-instance job can be cut off from the network" in error["Message"], error
    client.create_training_job(
        **contained_job("alone", slurm_marked_image.reference, G5, EnableNetworkIsolation=True, **common)
    )
    ended = _ended(server, team, "alone")
    assert ended["TrainingJobStatus"] == "Completed", (ended.get("FailureReason"), server.log()[-3000:])
    assert model_files(server, ended)["network.txt"].decode() == "no way out lo"
