"""Tenants on the Slurm back end, against the dev cluster (docs/SLURM.md, "Tenants on the nodes"): a real
`hyperplan serve` on the cluster's fleet in isolation mode users, every instance on-demand.

- A tenant's loader variables (LD_PRELOAD, LD_LIBRARY_PATH, GCONV_PATH), given as a job's Environment,
  exported by a lifecycle script, and set by an `exec`'s command, load the probe library (tests/uid_probe.py)
  into the account's user's processes alone: never into a process running as root (srun, slurmstepd,
  the batch script's shell, the runner's interpreter).
- `accounts delete` sweeps the nodes: the files the account's job left in /tmp, /var/tmp and /dev/shm
  and a process of the user outside every job (what a site tracking processes by their parents,
  proctrack/linuxproc, lets a detached one become; the dev cluster's proctrack/cgroup ends that with
  its job) are gone, by root's clearing job on each node (on the one-host cluster every node's scratch
  directories are the host's).
- A server whose package lies under a directory closed to other users (a clone in a 0700 home) still
  runs a Slurm job to completion (the runner and the wrapper run from the back end's copies), and a
  local one too.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hyperplan
from hyperplan.backends.slurm import SlurmBackend
from hyperplan.errors import StartRefused
from hyperplan.services.accounts.os_users import check_open_to_tenants, closed_to_others, exists
from hyperplan.signing import Credentials
from tests import processes, uid_probe
from tests.harness import SERVER_START, Server, wait_until
from tests.slurm.cluster import Cluster, reachable_directory
from tests.slurm.test_reservations import _accounts, _user_of, slurm_server
from tests.slurm.test_work import G5, _jobs_of, _on_demand_fleet

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons and the accounts' OS users"),
]
__all__ = ["slurm_server"]  # the fixture, shared

ROLE = "arn:aws:iam::123456789012:role/DataAndAPIAccessRole"
IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag"
FINAL = ("Completed", "Failed", "Stopped")
SMALL_FLEET = Path(__file__).parents[1] / "fleets" / "small.toml"
M5 = "ml.m5.12xlarge"  # on-demand in the small fleet (the local server's)


def _job(name: str, script: str, instance_type: str = G5, **extra: Any) -> dict[str, Any]:
    """An on-demand job running `script` with sh, its model in a bucket of its account's own."""
    return {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": IMAGE,
            "ContainerEntrypoint": ["sh", "-c"],
            "ContainerArguments": [script],
        },
        "OutputDataConfig": {"S3OutputPath": f"s3://out-{name}/output"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        **extra,
    }


def _ended(server: Server, who: Credentials, name: str) -> dict[str, Any]:
    client = server.sagemaker(who)
    found = wait_until(
        lambda: (d := client.describe_training_job(TrainingJobName=name))["TrainingJobStatus"] in FINAL and d,
        timeout=120,
    )
    assert found, f"{name} did not end:\n{server.log()[-3000:]}"
    return dict(found)


def _running_nodes(server: Server, who: Credentials, cluster: str) -> list[dict[str, Any]]:
    nodes = server.sagemaker(who).list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    return [n for n in nodes if n["InstanceStatus"]["Status"] == "Running"]


def _work_root(server: Server) -> Path:
    """The server's work directory, as its command line gives it."""
    args = list(server.extra_args)
    return Path(args[args.index("--work-dir") + 1])


@pytest.fixture
def probe() -> Iterator[uid_probe.Probe]:
    if uid_probe.compiler() is None:
        pytest.skip("no C compiler to build the probe library with")
    directory = reachable_directory("hp-slurm-probe-")  # the accounts' users load it from here
    try:
        yield uid_probe.build(directory / "probe")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_tenants_loader_variables_reach_only_its_own_processes_on_slurm(
    cluster: Cluster, slurm_server: Callable[..., Server], probe: uid_probe.Probe, tmp_path: Path
) -> None:
    server = slurm_server("manual", _on_demand_fleet(cluster, tmp_path / "fleet.toml"))
    team = server.new_account("loader")
    uid = pwd.getpwnam(_user_of(server, "loader")[1]).pw_uid
    variables = probe.environment()

    # A job: its Environment is the tenant's to set; GCONV_PATH is obeyed by a program converting text.
    job = _job("preload", "printf x | iconv -t PROBE// > /dev/null 2>&1; true", Environment=variables)
    server.sagemaker(team).create_training_job(**job)
    assert _ended(server, team, "preload")["TrainingJobStatus"] == "Completed"
    assert probe.uids() == {uid}, probe.lines()

    # A cluster's lifecycle script: no request sets its variables, so it exports them for what it starts.
    exports = " ".join(f"{name}={value}" for name, value in variables.items())
    script = server.data_dir / "s3" / "lifecycle" / "preload" / "on_create.sh"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!/bin/sh\nexport {exports}\nid -u > /dev/null\n")
    server.native().post("/api/v1/buckets/lifecycle/grants", {"Account": "*", "ReadOnly": True})
    before = len(probe.lines())
    group = {
        "InstanceGroupName": "workers",
        "InstanceType": G5,
        "InstanceCount": 1,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/preload", "OnCreate": "on_create.sh"},
        "ExecutionRole": ROLE,
        "ThreadsPerCore": 1,
    }
    server.sagemaker(team).create_cluster(ClusterName="preload", InstanceGroups=[group])
    nodes = wait_until(lambda: _running_nodes(server, team, "preload"), timeout=60)
    assert nodes, server.sagemaker(team).list_cluster_nodes(ClusterName="preload")
    after_script = len(probe.lines())
    assert after_script > before, "the lifecycle script's child did not load the library"

    # An exec: the native exec takes a command, which sets them for the program it runs.
    path = f"/api/v1/clusters/preload/nodes/{nodes[0]['InstanceId']}/exec"
    answer = server.native(team).post(path, {"Command": ["env", *exports.split(" "), "id", "-u"]})
    assert answer["Stdout"].strip() == str(uid), answer
    assert len(probe.lines()) > after_script, "the exec did not load the library"
    assert probe.uids() == {uid}, probe.lines()  # the account's user's processes, and no root one


SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")


def test_deleting_an_account_sweeps_what_its_work_left_on_the_nodes(
    cluster: Cluster, slurm_server: Callable[..., Server], tmp_path: Path
) -> None:
    server = slurm_server("manual", _on_demand_fleet(cluster, tmp_path / "fleet.toml"))
    leaver = server.new_account("leaver")
    user = _user_of(server, "leaver")[1]
    uid = pwd.getpwnam(user).pw_uid
    [listed] = [a for a in _accounts(server) if a["Name"] == "leaver"]
    assert (listed["OsUid"], listed["OsGid"]) == (uid, pwd.getpwnam(user).pw_gid)  # what a site makes
    mark = f"hp-leaver-{uuid.uuid4().hex[:8]}"
    left = [Path(d) / mark for d in SCRATCH] + [Path(d) / f"{mark}.txt" for d in SCRATCH]
    # Files in each scratch directory, and a process detached from the job (setsid, its parent gone):
    # Slurm's proctrack/cgroup ends it with the job all the same (linuxproc, following parents, lost it).
    script = (  # (one line: an argument may hold no newline)
        f'for d in {" ".join(SCRATCH)}; do mkdir "$d/{mark}" && echo x > "$d/{mark}/kept" '
        f'&& echo y > "$d/{mark}.txt" || exit 1; done; '
        'setsid sh -c "exec sleep 600" < /dev/null > /dev/null 2>&1 &'
    )
    server.sagemaker(leaver).create_training_job(**_job("leaves", script))
    try:
        assert _ended(server, leaver, "leaves")["TrainingJobStatus"] == "Completed"
        assert all(path.exists() and path.stat().st_uid == uid for path in left), left
        assert wait_until(lambda: not _jobs_of(cluster, user), timeout=30), _jobs_of(cluster, user)
        assert wait_until(lambda: not processes.owned_by(uid), timeout=10), processes.owned_by(uid)
        # What a site whose Slurm tracks processes by their parents (proctrack/linuxproc) would have
        # left: a process of the user outside every job.
        stray = subprocess.Popen(
            ["runuser", "-u", user, "--", "setsid", "sleep", "600"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert wait_until(lambda: processes.owned_by(uid), timeout=10)

        server.native().delete("/api/v1/accounts/leaver")  # swept before it answers: the nodes are free
        stray.wait(timeout=10)  # (runuser, once the sweep has killed its sleep)
        assert [path for path in left if os.path.lexists(path)] == []
        assert wait_until(lambda: not processes.owned_by(uid), timeout=10), processes.owned_by(
            uid
        )  # (reaped by init)
        assert not exists(user)  # userdel went through: no process of it was left
        logs = sorted((_work_root(server) / "slurm" / "clears").glob(f"{uid}.*.log"))
        assert len(logs) == 8, logs  # one clearing job per node of the pools
        said = [log.read_text() for log in logs]
        assert all(text.startswith(f"uid {uid}: ") for text in said), said
        assert sum(int(text.split("processes killed")[0].split()[-1]) for text in said) >= 1, said
        removed = sum(int(text.split("entries removed")[0].split()[-1]) for text in said)
        assert removed >= len(left) + 3, said  # each directory's file too
        assert not [job for job in cluster.client.jobs() if job.name.startswith("hp-clear.")
                    and job.state in ("PENDING", "RUNNING", "COMPLETING")]  # fmt: skip
    finally:
        for pid in processes.owned_by(uid):  # (what a failed sweep left: the detached process)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for path in left:
            subprocess.run(["rm", "-rf", str(path)], check=False)


# -- the package where other users cannot pass --------------------------------------------------------


@pytest.fixture
def closed_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the package under a 0700 directory (as a clone in /root is), which the servers this
    test starts run from: PYTHONPATH names it, and they are started afresh (a fork server's process has
    imported hyperplan from its own place)."""
    closed = tmp_path / "closed"
    source = closed / "src"
    shutil.copytree(
        Path(hyperplan.__file__).parent, source / "hyperplan", ignore=shutil.ignore_patterns("__pycache__")
    )
    closed.chmod(0o700)
    monkeypatch.setenv("PYTHONPATH", str(source))
    monkeypatch.setenv("HYPERPLAN_TEST_FORK", "0")
    found = subprocess.run(
        [sys.executable, "-c", "import hyperplan.backends.slurm_runner as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",  # (-c puts the working directory first on the path: the checkout's, from here)
    ).stdout.strip()
    assert found.startswith(str(source)), found
    assert closed_to_others(found, run=False) is not None  # no account's user may read it there
    return source


def test_a_server_run_from_a_package_closed_to_other_users_runs_a_slurm_job(
    cluster: Cluster, slurm_server: Callable[..., Server], closed_package: Path, tmp_path: Path
) -> None:
    server = slurm_server("manual", _on_demand_fleet(cluster, tmp_path / "fleet.toml"))
    team = server.new_account("team")
    server.sagemaker(team).create_training_job(**_job("closed", "echo ran as $(id -un)"))
    job = _ended(server, team, "closed")
    assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    tools = _work_root(server) / "slurm" / "tools"
    assert sorted(p.name for p in tools.iterdir()) == ["scratch.py", "slurm_runner.py", "timedlog.py"]
    assert all(closed_to_others(p, run=False) is None for p in tools.iterdir())


def test_the_start_refuses_a_step_runner_the_accounts_users_could_not_run(cluster: Cluster) -> None:
    """What app.slurm_backend checks at a start: the interpreter under a 0700 directory, or a copied
    script others may not read, is refused naming the path (every step would die with exit code 2)."""
    open_dir = reachable_directory("hp-slurm-refused-")
    closed = open_dir / "closed"
    closed.mkdir(mode=0o700)
    python = closed / "python3"
    shutil.copy(sys.executable, python)
    python.chmod(0o755)
    try:
        backend = SlurmBackend(open_dir / "slurm", cluster.client, python=str(python))
        with pytest.raises(
            StartRefused, match=re.escape(f"{python}: the directory {closed} does not let other")
        ):
            check_open_to_tenants(backend.tenant_paths(), "the Slurm back end's step runner")
        backend = SlurmBackend(open_dir / "slurm", cluster.client)
        check_open_to_tenants(backend.tenant_paths(), "the Slurm back end's step runner")  # as installed
        (open_dir / "slurm" / "tools" / "timedlog.py").chmod(0o600)
        with pytest.raises(StartRefused, match=re.escape("timedlog.py: other users may not read it")):
            check_open_to_tenants(backend.tenant_paths(), "the Slurm back end's step runner")
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def test_a_server_run_from_a_package_closed_to_other_users_runs_a_local_job(
    closed_package: Path, tmp_path: Path
) -> None:
    open_dir = reachable_directory("hp-closed-local-")
    server = Server(
        data_dir=tmp_path / "local",
        clock="manual",
        clock_start=SERVER_START,
        fleet=SMALL_FLEET,
        extra_args=("--isolation", "users", "--work-dir", str(open_dir / "work")),
    )
    users: list[str] = []
    try:
        server.start()
        team = server.new_account("team")
        users = [a["OsUser"] for a in server.native().get("/api/v1/accounts")["Accounts"] if a.get("OsUser")]
        server.sagemaker(team).create_training_job(**_job("closed", "echo ran", M5))
        job = _ended(server, team, "closed")
        assert job["TrainingJobStatus"] == "Completed", job.get("FailureReason")
    finally:
        server.close()
        for user in users:
            subprocess.run(["userdel", user], capture_output=True, check=False, timeout=60)
        shutil.rmtree(open_dir, ignore_errors=True)
