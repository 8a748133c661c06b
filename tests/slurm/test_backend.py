"""The Slurm back end against the dev cluster: the back-end contract (tests/backends/contract.py) with
nodes as whole-node Slurm jobs and tasks as job steps, and what only Slurm shows."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.backends import Backend
from hyperplan.backends.base import (
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    Placement,
    RunAs,
    TaskRef,
    TaskSpec,
    TaskState,
)
from hyperplan.backends.fake import Program
from hyperplan.backends.slurm import SlurmBackend
from hyperplan.slurm.parse import key_values
from tests.backends.contract import INSTANCE_TYPE, BackendContract, Harness, eventually, task_final
from tests.backends.test_isolation import _useradd, _userdel
from tests.backends.test_local import render
from tests.slurm.cluster import Cluster, reachable_directory

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: Slurm's daemons"),
]


class SlurmHarness(Harness):
    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.backend: Backend = SlurmBackend(root / "backend", cluster.client)
        self.count = 0

    def command(self, program: Program) -> tuple[str, ...]:
        return ("/bin/sh", "-c", render(program))

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        self.count += 1
        source = self.root / f"lifecycle-{self.count}"
        source.mkdir()
        (source / "on_create.sh").write_text(render(program))
        return source, "on_create.sh"

    def ended_unwatched(self, task_id: str, timeout: float = 10.0) -> bool:
        """Its runner wrote how it ended and Slurm says its job has ended (the back end believes the
        runner's record only then)."""
        task = self.root / "backend" / "tasks" / task_id

        def ended() -> bool:
            if not (task / "out" / "exit.json").exists():
                return False
            job_id = json.loads((task / "job.json").read_text())["job_id"]
            return job_id not in {
                job.id for job in SlurmBackend(self.root / "backend", self.cluster.client).live_jobs()
            }

        return bool(eventually(ended, bool, timeout))

    def restart(self) -> Backend:
        self.backend.close()
        self.backend = SlurmBackend(self.root / "backend", self.cluster.client)
        return self.backend


def slurm_harness(cluster: Cluster) -> Iterator[SlurmHarness]:
    root = reachable_directory("hp-slurm-backend-")
    harness = SlurmHarness(cluster, root)
    try:
        yield harness
    finally:
        harness.backend.close()
        # Whatever a test left behind goes: a back end that knows nothing cancels all its jobs.
        cleaner = SlurmBackend(root / "backend", cluster.client)
        cleaner.adopt([])
        try:
            assert eventually(cleaner.live_jobs, lambda jobs: not jobs, 30) == []
        finally:
            shutil.rmtree(root, ignore_errors=True)  # the test's files go too, not only its jobs


class TestSlurmContract(BackendContract):
    @pytest.fixture
    def harness(self, cluster: Cluster) -> Iterator[SlurmHarness]:
        yield from slurm_harness(cluster)


def _time_limit_minutes(cluster: Cluster, job_id: int) -> int:
    """The job's TimeLimit ([days-]hours:minutes:seconds) in whole minutes."""
    text = cluster.client.run("scontrol", "show", "job", str(job_id), "-o").splitlines()[0]
    days, _, clock = key_values(text)["TimeLimit"].rpartition("-")
    hours, minutes, _ = (int(part) for part in clock.split(":"))
    return int(days or 0) * 1440 + hours * 60 + minutes


def test_on_demand_work_ends_before_the_next_reservation_on_its_nodes(cluster: Cluster) -> None:
    """Outside reservations a node's job gets a --time ending (with a margin) before the earliest
    reservation ahead on the nodes of its feature, so Slurm places it where it fits and ends it there."""
    nodes = [node for node in cluster.client.nodes() if node.features]
    feature = nodes[0].features[0]
    mine = [node.name for node in nodes if feature in node.features]
    now = datetime.now(UTC).replace(microsecond=0)
    cluster.client.create_reservation(
        "ahead-test",
        users=["root"],
        nodes=mine[-1:],
        start=now + timedelta(minutes=40),
        end=now + timedelta(minutes=60),
    )
    try:
        for harness in slurm_harness(cluster):
            backend = harness.backend
            spec = NodeSpec("n-ondemand", "od", feature, placement=Placement(constraint=feature))
            backend.provision(spec)
            job = json.loads((harness.root / "backend" / "nodes" / "n-ondemand" / "job.json").read_text())
            limit = _time_limit_minutes(cluster, int(job["job_id"]))
            assert 36 <= limit <= 38  # 40 minutes ahead, less the 2-minute margin, in whole minutes
    finally:
        cluster.client.delete_reservation("ahead-test")


# --- a tenant rewrites what its runner writes ------------------------------------------------------

# Run as the account's user, in a directory that user owns (OUT: the runner's out/). Each program ends
# by killing its own runner (its parent's parent: the timed-log wrapper's), so that the runner writes
# no true record over the forged one; the wrapper and the program die with it.
KILL_RUNNER = 'kill -KILL "$(cut -d" " -f4 "/proc/$PPID/stat")"\n'
FORGERIES = {
    # what it leaves as exit.json (and its logs), and what the server must say of it
    "link": (
        "for f in exit.json stdout.log stderr.log timed.log; do\n"
        '  rm -f "$OUT/$f"; ln -s "$SECRET" "$OUT/$f"\n'
        "done\n",
        "out/exit.json is refused: exit.json is a symbolic link",
    ),
    "fifo": ('rm -f "$OUT/exit.json"; mkfifo "$OUT/exit.json"\n', "exit.json is a FIFO, not a regular file"),
    "huge": ('truncate -s 10G "$OUT/exit.json"\n', "exit.json is larger than 65536 bytes"),
    "values": (
        'echo \'{"exit_code": "zero", "signal": null}\' > "$OUT/exit.json"\n',
        'its exit_code is "zero", not an integer from 0 to 255',
    ),
}
# Says it ended (and names the node's batch step as its own) while it runs on.
EARLY = (
    'echo \'{"exit_code": 0, "signal": null}\' > "$OUT/exit.json"\n'
    'echo \'{"pid": 1, "job": "1", "step": "batch", "node": "x"}\' > "$OUT/started.json"\n'
    "echo forged > $HOME/forged-$HYPERPLAN_TASK_ID\n"
    "while :; do sleep 0.2; done\n"
)

# A task that fails (exit 3), and another of the same user on the node that waits for its runner's true
# record and rewrites it as a success once the task's step has ended for real.
FAILS = "sleep 1; exit 3\n"
REWRITE = (
    'T="$TASKS/fails/out/exit.json"\n'
    'until grep -qs \'"exit_code": 3\' "$T"; do sleep 0.05; done\n'
    'echo \'{"exit_code": 0, "signal": null}\' > "$T.new"; mv "$T.new" "$T"\n'
)


@pytest.fixture
def tenant() -> Iterator[RunAs]:
    """A throwaway OS user for a tenant; whatever it still runs is killed before it goes."""
    name = f"hp-test-{uuid.uuid4().hex[:10]}"
    _useradd(name)
    try:
        entry = pwd.getpwnam(name)
        yield RunAs(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], check=False, timeout=30)
        _userdel(name)


def test_a_tenant_rewriting_its_runners_records_fools_nobody_and_reads_no_secret(
    cluster: Cluster, tenant: RunAs
) -> None:
    """The account's user owns out/, so its program can swap its records for a link to a server secret,
    a FIFO, a giant file or bad values, or claim an early end. The server does not hang, crash or leak:
    the task ends Lost saying what was wrong, a sandbox's end is Slurm's, and a claimed end of work that
    still runs changes nothing (it is still killed when terminated)."""
    for harness in slurm_harness(cluster):
        _forge_records(harness.backend, harness.root, tenant, cluster)


def _forge_records(backend: Backend, root: Path, tenant: RunAs, cluster: Cluster) -> None:
    secret = root / "secret"
    secret.write_text("admin secret\n")
    secret.chmod(0o600)
    backend.provision(NodeSpec("n-forge", "forge", INSTANCE_TYPE, run_as=tenant))
    # OnCreate that leaves a FIFO as its record: the node fails saying so, and no job is left.
    source = root / "lifecycle"
    source.mkdir()
    (source / "on_create.sh").write_text(
        'OUT="$(dirname "$HYPERPLAN_ENV_DIR")/oncreate/out"\n' + FORGERIES["fifo"][0] + KILL_RUNNER
    )
    backend.provision(
        NodeSpec("n-oncreate", "oc", INSTANCE_TYPE, lifecycle_source=source, on_create="on_create.sh",
                 run_as=tenant)
    )  # fmt: skip
    assert eventually(lambda: backend.node_status("n-forge").state, lambda s: s is NodeState.RUNNING, 60)
    tasks = root / "backend" / "tasks"
    env = lambda task_id: {"OUT": str(tasks / task_id / "out"), "SECRET": str(secret)}  # noqa: E731
    for name, (forgery, _) in FORGERIES.items():
        backend.run(TaskSpec(name, ("/bin/sh", "-c", forgery + KILL_RUNNER), "n-forge", env(name)))
    backend.run(TaskSpec("early", ("/bin/sh", "-c", EARLY), "n-forge", env("early")))
    backend.run(TaskSpec("fails", ("/bin/sh", "-c", FAILS), "n-forge"))
    backend.run(TaskSpec("rewrite", ("/bin/sh", "-c", REWRITE), "n-forge", {"TASKS": str(tasks)}))
    # A sandbox (a whole-node job of its own) claims success, then its runner is killed: Slurm's
    # record of the batch script (killed by SIGKILL) is the truth.
    sandbox = (
        'OUT="$(dirname "$HYPERPLAN_ENV_DIR")/out"\n' + EARLY.splitlines()[0] + "\nsleep 1\n" + KILL_RUNNER
    )
    backend.run(TaskSpec("sandbox", ("/bin/sh", "-c", sandbox), run_as=tenant))

    # Each killed its runner (SIGKILL): srun's exit status (the server's child, on the server's machine)
    # says so, whatever the record; the refused record is named.
    for name, (_, why) in FORGERIES.items():
        status = task_final(backend, name, 60)
        assert (status.state, status.signal) == (TaskState.KILLED, 9), (name, status)
        assert why in status.message and "srun's exit status" in status.message, (name, status)
        assert "admin secret" not in status.message, (name, status)
    # The failure rewritten as a success after its step had ended: still exit code 3. (The forgery is in
    # place before the back end's first look at the task.)
    forged = tasks / "fails" / "out" / "exit.json"
    assert eventually(
        lambda: b'"exit_code": 0' in forged.read_bytes() if forged.exists() else False, bool, 60
    )
    assert task_final(backend, "rewrite", 30).exit_code == 0
    failed = task_final(backend, "fails", 30)
    assert (failed.state, failed.exit_code) == (TaskState.EXITED, 3), failed
    ref = TaskRef("link")
    assert backend.read_log(ref, LogStream.STDOUT).data == b""
    assert backend.read_log(ref, LogStream.STDERR).data == b""
    assert backend.read_lines(ref).lines == ()
    node = eventually(
        lambda: backend.node_status("n-oncreate"), lambda s: s.state is not NodeState.PENDING, 60
    )
    assert node.state is NodeState.FAILURE, node
    assert "OnCreate script on_create.sh ended, but" in node.message and "is a FIFO" in node.message, node
    assert backend.node_status("n-oncreate").state is NodeState.FAILURE  # settled: no hang, no change

    # The early claim: the work still runs as far as the server is concerned, and its forged step
    # name reached nothing (the node's batch script, which holds the node, is untouched).
    home = root / "backend" / "nodes" / "n-forge" / "home"
    assert eventually(lambda: (home / "forged-early").exists(), bool, 30)
    for _ in range(5):
        assert backend.task_status("early").state is TaskState.RUNNING
    backend.terminate(TaskRef("early"), timedelta(seconds=1))
    killed = task_final(backend, "early", 30)
    assert killed.state is TaskState.KILLED and killed.signal == 15, killed
    assert backend.node_status("n-forge").state is NodeState.RUNNING
    assert not [s for s in cluster.client.run("squeue", "--steps", "-h", "-o", "%j").split() if "early" in s]

    ended = task_final(backend, "sandbox", 60)
    assert (ended.state, ended.signal) == (TaskState.KILLED, 9), ended
    backend.terminate(NodeRef("n-forge"), timedelta(seconds=1))
    gone = eventually(lambda: backend.node_status("n-forge").state, lambda state: state.is_final(), 30)
    assert gone is NodeState.TERMINATED
