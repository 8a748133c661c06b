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
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperplan.services.accounts.os_users import exists
from hyperplan.signing import Credentials
from tests import processes, uid_probe
from tests.harness import Server, made_os_users, wait_until

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
        users = made_os_users(data_dir)
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


def test_a_tenants_loader_variables_reach_only_its_own_processes(isolated: Server, open_dir: Path) -> None:
    """LD_PRELOAD, LD_LIBRARY_PATH and GCONV_PATH, set by a job's Environment, exported by a lifecycle
    script, and given to an `exec`: the library they name is loaded by the account's user's processes
    alone. Before the agent built the wrapper's environment itself, the job's variables reached the
    execve of the log wrapper, still root, and the library's constructor ran as uid 0."""
    if uid_probe.compiler() is None:
        pytest.skip("no C compiler to build the probe library with")
    server = isolated
    probe = uid_probe.build(open_dir / "probe")
    variables = probe.environment()
    team = server.new_account("loader")
    user = {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}["loader"]["OsUser"]
    uid = pwd.getpwnam(user).pw_uid

    # A job: its Environment is the tenant's to set; GCONV_PATH is obeyed by a program converting text.
    job = _job("preload", ["sh", "-c", "printf x | iconv -t PROBE// > /dev/null 2>&1; true"])
    job["Environment"] = variables
    server.sagemaker(team).create_training_job(**job)
    assert _ended(server, team, "preload")["TrainingJobStatus"] == "Completed"
    assert probe.uids() == {uid}, probe.lines()

    # A lifecycle script that exports them for what it starts, then an exec that sets them.
    exports = " ".join(f"{name}={value}" for name, value in variables.items())
    script = server.data_dir / "s3" / "lifecycle" / "preload" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!/bin/sh\nexport {exports}\nid -u > /dev/null\n")
    before = len(probe.lines())
    client = server.sagemaker(team)
    client.create_cluster(
        ClusterName="preload",
        InstanceGroups=[
            {
                "InstanceGroupName": "workers",
                "InstanceType": M5,
                "InstanceCount": 1,
                "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/preload", "OnCreate": "on_create.sh"},
                "ExecutionRole": ROLE,
                "ThreadsPerCore": 1,
            }
        ],
    )
    nodes = wait_until(
        lambda: [
            n
            for n in client.list_cluster_nodes(ClusterName="preload")["ClusterNodeSummaries"]
            if n["InstanceStatus"]["Status"] == "Running"
        ],
        timeout=120,
    )
    assert nodes, client.list_cluster_nodes(ClusterName="preload")
    after_script = len(probe.lines())
    assert after_script > before, "the lifecycle script's child did not load the library"
    path = f"/api/v1/clusters/preload/nodes/{nodes[0]['InstanceId']}/exec"
    answer = server.native(team).post(path, {"Command": ["env", *exports.split(" "), "id", "-u"]})
    assert answer["Stdout"].strip() == str(uid), answer
    assert len(probe.lines()) > after_script, "the exec did not load the library"
    assert probe.uids() == {uid}, probe.lines()


def _accounts(server: Server) -> dict[str, dict[str, Any]]:
    return {a["Name"]: a for a in server.native().get("/api/v1/accounts")["Accounts"]}


def test_a_deleted_accounts_files_and_processes_go_with_it_and_its_uid_is_never_handed_out_again(
    isolated: Server, open_dir: Path
) -> None:
    server = isolated
    carol = server.new_account("carol")
    listed = _accounts(server)["carol"]
    carol_uid = listed["OsUid"]
    assert 70000 <= carol_uid <= 99999 and listed["OsGid"] == carol_uid  # the fleet's default range
    entry = pwd.getpwnam(listed["OsUser"])
    assert (entry.pw_uid, entry.pw_gid) == (carol_uid, carol_uid)

    token = uuid.uuid4().hex[:12]
    left = [
        Path(f"/tmp/hp-{token}-secret"),
        Path(f"/var/tmp/hp-{token}-secret"),
        Path(f"/dev/shm/hp-{token}"),
    ]
    writes = (
        f"umask 077; echo secret > {left[0]}; echo secret > {left[1]}; mkdir {left[2]}; "
        f"echo secret > {left[2]}/inside; echo mine > own.txt; "
        # a process that outlives the job, forked away from it: it must not outlive the account
        f"(setsid sleep 600 > /dev/null 2>&1 &)"
    )
    server.sagemaker(carol).create_training_job(**_job("carol-writes", ["sh", "-c", writes]))
    assert _ended(server, carol, "carol-writes")["TrainingJobStatus"] == "Completed"
    trees = list((open_dir / "work" / "jobs").glob("*/attempt-1/algo-1"))
    assert len(trees) == 1 and (trees[0] / "own.txt").exists()
    for path in left:
        assert path.stat().st_uid == carol_uid
    # The job's end killed its instance's processes; one that escaped would show here.
    lingering = processes.owned_by(carol_uid)

    deleted = server.native().delete("/api/v1/accounts/carol")
    assert deleted["OsUser"] == listed["OsUser"]
    assert not exists(listed["OsUser"])
    with pytest.raises(KeyError):
        grp.getgrgid(carol_uid)
    assert [path for path in left if os.path.lexists(path)] == []
    assert not trees[0].parent.parent.exists()  # the whole job tree, WORK/jobs/<id>
    assert processes.owned_by(carol_uid) == [], lingering

    dave = server.new_account("dave")
    dave_uid = _accounts(server)["dave"]["OsUid"]
    assert dave_uid > carol_uid  # carol's uid is free on the system, and never handed out again
    looks = "".join(f"[ -e {path} ] && echo FOUND {path}\n" for path in left)
    script = open_dir / "looks.sh"
    script.write_text(f"echo looked\n{looks}find /tmp /var/tmp /dev/shm -xdev -uid {carol_uid} 2>/dev/null\n")
    script.chmod(0o644)
    server.sagemaker(dave).create_training_job(
        **_job("dave-looks", ["sh", "-c", f"sh {script} > output/failure; exit 3"])
    )
    reason = _ended(server, dave, "dave-looks")["FailureReason"]
    assert reason.endswith(": looked"), reason  # nothing found


def test_a_deletion_cut_short_is_finished_at_the_next_start(isolated: Server) -> None:
    """The account is marked deleted in the store, but the server died before its user went: the next
    start removes the user (and whatever it owns)."""
    server = isolated
    server.new_account("cut")
    listed = _accounts(server)["cut"]
    leftover = Path(f"/var/tmp/hp-{uuid.uuid4().hex[:12]}-cut")
    leftover.write_text("x")
    os.chown(leftover, listed["OsUid"], listed["OsGid"])
    server.stop()
    with sqlite3.connect(server.data_dir / "hyperplan.db") as connection:
        connection.execute("UPDATE accounts SET deleted_at = created_at WHERE name = 'cut'")
    assert exists(listed["OsUser"])
    server.start()
    assert not exists(listed["OsUser"])
    assert not leftover.exists()


def test_an_id_another_store_on_the_machine_freed_is_not_handed_out_again(
    isolated: Server, server_factory: type[Server], tmp_path: Path, open_dir: Path
) -> None:
    """Two servers of different stores on one machine: one deletes an account (its uid is free in
    /etc/passwd again); the other's next account does not get that uid."""
    first = isolated
    first.new_account("leaving")
    freed = _accounts(first)["leaving"]["OsUid"]
    first.native().delete("/api/v1/accounts/leaving")
    with pytest.raises(KeyError):
        pwd.getpwuid(freed)
    data_dir = tmp_path / "second"
    second = server_factory(
        data_dir=data_dir,
        fleet=SMALL_FLEET,
        extra_args=("--isolation", "users", "--work-dir", str(open_dir / "second-work")),
    )
    try:
        second.start()
        second.new_account("arriving")
        ids = {a["Name"]: a["OsUid"] for a in second.native().get("/api/v1/accounts")["Accounts"]}
        assert freed not in ids.values(), ids
        assert ids["arriving"] > freed
    finally:
        users = made_os_users(data_dir)
        second.close()
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)


def test_the_demo_background_load_gets_no_os_user_at_any_start(
    server_factory: type[Server], tmp_path: Path, open_dir: Path
) -> None:
    """Its account holds plans and runs nothing: neither its first start (which makes the account) nor
    the next (which gives every account without a user one) spends a uid on it."""
    fleet = tmp_path / "loaded.toml"
    fleet.write_text(SMALL_FLEET.read_text() + "\n[background_load]\n")
    data_dir = tmp_path / "data"
    server = server_factory(
        data_dir=data_dir,
        fleet=fleet,
        extra_args=("--isolation", "users", "--work-dir", str(open_dir / "work")),
    )
    try:
        server.start()
        assert _accounts(server)["background-load"]["OsUser"] is None
        server.stop()
        server.start()
        accounts = _accounts(server)
        assert accounts["background-load"]["OsUser"] is None
        others = sorted(a["OsUser"] for a in accounts.values() if a["OsUser"])  # the administrators'
        assert sorted(made_os_users(data_dir)) == others
    finally:
        users = made_os_users(data_dir)
        server.close()
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
