"""Tenant isolation in mode users, as root: each account's work runs as its own OS user, and the OS
refuses it the server's secrets and other accounts' trees.

A server in mode users with two accounts. Account B's job runs first and leaves its instance tree; then
account A's job, a Python program run by the interpreter other users can run (the fleet's [images], or
/usr/bin/python3 when the server's own lies where they cannot read it), tries to read DATA_DIR's
credentials, database and master key, to list the work directory, and to read B's tree: the kernel says
Permission denied to each, and A's FailureReason carries the answers. A job whose program A's user cannot
read fails with a FailureReason naming the path, before anything runs. A cluster node's lifecycle script
and an `exec` on it run as the account's user and are refused the same files. `accounts delete` removes
the user the server made. Every user a test makes is removed in its teardown, even on failure.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.services.os_users import exists
from hyperplan.signing import Credentials
from tests.harness import Server, wait_until

pytestmark = [
    pytest.mark.isolation,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="mode users makes OS users and drops privileges: needs root"
    ),
]

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
M5 = "ml.m5.12xlarge"  # on-demand in the small fleet
ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"

PROBE = """
import os, sys
answers = []
for path in sys.argv[1:]:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            open(path, "rb").read(1)
        answers.append(f"{path}: READ")
    except OSError as error:
        answers.append(f"{path}: {error.strerror}")
answers.append(f"uid {os.getuid()} gid {os.getgid()} groups {os.getgroups()}")
print("\\n".join(answers))
with open("output/failure", "w") as failure:  # /opt/ml/output/failure; the job runs in /opt/ml
    failure.write("; ".join(answers))
sys.exit(3)
"""


def _made_users(data_dir: Path) -> list[str]:
    """The OS users the server made for its accounts, read from its store (also after a crash)."""
    database = data_dir / "hyperplan.db"
    if not database.exists():
        return []
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT os_user FROM accounts WHERE os_user_made AND os_user IS NOT NULL")
        return [str(user) for (user,) in rows]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may pass through: pytest's own directories are 0700."""
    path = Path(tempfile.mkdtemp(prefix="hp-isolation-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def isolated(server_factory: type[Server], tmp_path: Path, open_dir: Path) -> Iterator[Server]:
    """A server in mode users, its work directory where accounts' users can reach it. Its users go with
    the test, whatever happens."""
    data_dir = tmp_path / "data"
    work_dir = open_dir / "work"
    server = server_factory(
        data_dir=data_dir,
        fleet=SMALL_FLEET,
        extra_args=("--isolation", "users", "--work-dir", str(work_dir)),
    )
    channel = data_dir / "s3" / "bucket" / "input"
    channel.mkdir(parents=True)
    (channel / "data.csv").write_text("1,2\n")
    (data_dir / "s3" / "lifecycle").mkdir()
    try:
        server.start()
        # The hand-made buckets are the administrators': every account may read them (a dataset).
        for bucket in ("bucket", "lifecycle"):
            server.native().post(f"/api/v1/buckets/{bucket}/grants", {"Account": "*", "ReadOnly": True})
        yield server
    finally:
        users = _made_users(data_dir)
        server.close()  # the server and everything it started end before their users go
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
        leftover = [user for user in users if exists(user)]
        assert not leftover, f"users left behind: {leftover}"


def _job(name: str, argv: list[str]) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": IMAGE,
            "ContainerEntrypoint": argv[:2],
            **({"ContainerArguments": argv[2:]} if argv[2:] else {}),
        },
        "InputDataConfig": [
            {
                "ChannelName": "training",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/input"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": f"s3://out-{name}/output"},  # the job's account's own
        "ResourceConfig": {"InstanceType": M5, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def _ended(server: Server, credentials: Credentials, name: str) -> dict[str, Any]:
    client = server.sagemaker(credentials)
    final = ("Completed", "Failed", "Stopped")
    job = wait_until(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in final and d,
        timeout=120,
    )
    assert job, f"{name} did not end:\n{server.log()[-3000:]}"
    return dict(job)


def test_an_accounts_job_runs_as_its_user_and_the_os_refuses_it_the_servers_secrets(
    isolated: Server, open_dir: Path
) -> None:
    server = isolated
    assert server.native().get("/api/v1/whoami")["Admin"]
    alpha, beta = server.new_account("alpha"), server.new_account("beta")
    accounts = {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}
    alpha_user = accounts["alpha"]["OsUser"]
    assert alpha_user == f"hp-{accounts['alpha']['AccountId']}"
    entry = pwd.getpwnam(alpha_user)
    assert grp.getgrgid(entry.pw_gid).gr_name == alpha_user  # a group of its own, and no other
    assert not [g.gr_name for g in grp.getgrall() if alpha_user in g.gr_mem]
    assert entry.pw_shell.endswith(("nologin", "false"))

    probe = open_dir / "probe.py"
    probe.write_text(PROBE)
    probe.chmod(0o644)
    server.sagemaker(beta).create_training_job(**_job("beta-job", ["sh", "-c", "echo mine > own.txt"]))
    assert _ended(server, beta, "beta-job")["TrainingJobStatus"] == "Completed"
    beta_tree = open_dir / "work" / "jobs" / "1" / "attempt-1" / "algo-1"
    assert beta_tree.stat().st_uid == pwd.getpwnam(accounts["beta"]["OsUser"]).pw_uid
    assert (server.data_dir / "s3" / "out-beta-job" / "output" / "beta-job").is_dir()
    data = server.data_dir
    targets = [
        data / "credentials",
        data / "hyperplan.db",
        data / "master.key",
        open_dir / "work" / "jobs",
        beta_tree,
        data / "s3" / "out-beta-job" / "output",  # beta's bucket, where its model went
    ]
    job = _job("alpha-probe", ["python3", str(probe), *map(str, targets)])
    server.sagemaker(alpha).create_training_job(**job)
    reason = _ended(server, alpha, "alpha-probe")["FailureReason"]
    for target in targets:
        assert f"{target}: Permission denied" in reason, reason
    assert f"uid {entry.pw_uid} gid {entry.pw_gid} groups []" in reason


def test_a_program_the_accounts_user_cannot_read_fails_the_job_naming_it(
    isolated: Server, open_dir: Path
) -> None:
    server = isolated
    team = server.new_account("team")
    secret = open_dir / "train.py"
    secret.write_text("print('never')\n")
    secret.chmod(0o600)  # root's alone
    server.sagemaker(team).create_training_job(**_job("unreadable", ["python3", str(secret)]))
    job = _ended(server, team, "unreadable")
    assert job["TrainingJobStatus"] == "Failed"
    assert f"{secret}: the account's user hp-" in job["FailureReason"]
    assert "may not read it (Permission denied)" in job["FailureReason"]


def test_deleting_an_account_removes_the_os_user_the_server_made(isolated: Server) -> None:
    server = isolated
    server.new_account("brief")
    listed = {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}
    user = listed["brief"]["OsUser"]
    assert user == f"hp-{listed['brief']['AccountId']}" and exists(user)
    assert all(exists(a["OsUser"]) for a in listed.values())  # the administrator's too, made at start
    deleted = server.native().delete("/api/v1/accounts/brief")
    assert deleted["OsUser"] == user
    assert not exists(user)


def test_a_lifecycle_script_and_an_exec_of_an_account_are_refused_the_servers_secrets(
    isolated: Server, open_dir: Path
) -> None:
    server = isolated
    alpha = server.new_account("alpha")
    user = {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}["alpha"]["OsUser"]
    data = server.data_dir
    targets = [
        data / "credentials",
        data / "hyperplan.db",
        data / "master.key",
        open_dir / "work" / "backend",
    ]
    script = data / "s3" / "lifecycle" / "src" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(
        "#!/bin/sh\n"
        f"for t in {' '.join(map(str, targets))}; do\n"
        '  if [ -d "$t" ]; then ls "$t"; else head -c1 "$t"; fi > /dev/null 2>> probe.txt\n'
        "done\n"
        "id -u >> probe.txt\n"
    )
    server.sagemaker(alpha).create_cluster(
        ClusterName="probe",
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": M5,
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
            }
        ],
    )
    client = server.sagemaker(alpha)

    def running() -> list[dict[str, Any]]:
        nodes = client.list_cluster_nodes(ClusterName="probe")["ClusterNodeSummaries"]
        return [n for n in nodes if n["InstanceStatus"]["Status"] == "Running"]

    nodes = wait_until(running, timeout=120)
    assert nodes, client.list_cluster_nodes(ClusterName="probe")
    native = server.native(alpha)
    path = f"/api/v1/clusters/probe/nodes/{nodes[0]['InstanceId']}/exec"
    probe = native.post(path, {"Command": ["cat", "lifecycle/probe.txt"]})["Stdout"]
    uid = pwd.getpwnam(user).pw_uid
    for target in targets:
        assert any(str(target) in line and "Permission denied" in line for line in probe.splitlines()), probe
    assert probe.splitlines()[-1] == str(uid)  # the lifecycle script ran as the account's user
    for target in targets[:3]:
        answer = native.post(path, {"Command": ["cat", str(target)]})
        assert answer["ExitCode"] != 0 and "Permission denied" in answer["Stderr"], answer
    assert native.post(path, {"Command": ["id", "-u"]})["Stdout"].strip() == str(uid)
