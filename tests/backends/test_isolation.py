"""Work that runs as an account's OS user (``RunAs``), on the real local back end with real processes:
what those processes are, and what they can no longer reach.

Each module run makes two throwaway system users (a unique suffix per run and xdist worker) and removes
them, and their groups, after. Programs that run as them are plain shell commands or the system's
/usr/bin/python3: the server's own interpreter may lie where they cannot read it.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import tarfile
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hyperplan.backends import (
    LocalBackend,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    TaskRef,
    TaskSpec,
    TaskState,
)
from hyperplan.backends.base import BackendError, RunAs
from hyperplan.objects.storage import Storage
from hyperplan.training.contract import Channel, JobSpec
from hyperplan.training.workspace import pack_model, prepare, read_failure, sync_checkpoints
from tests.backends.contract import INSTANCE_TYPE, NODE, SECOND, node_settled, task_final

pytestmark = [
    pytest.mark.isolation,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: creates OS users and drops privileges"),
]

# What a tenant's process tries. Every attempt but the last must be refused.
PROBE = textwrap.dedent("""\
    echo "id $(id -u) $(id -g) [$(id -G)] $USER $LOGNAME"
    echo "at $HOME $(pwd)"
    attempt() { if eval "$2" >/dev/null 2>&1; then echo "ALLOWED: $1"; else echo "refused: $1"; fi; }
    attempt "read the server's file" 'cat "$SECRET"'
    attempt "list another user's home" 'ls "$OTHER_HOME"'
    attempt "list the nodes" 'ls "$HYPERPLAN_BACKEND_ROOT/nodes"'
    attempt "list the tasks" 'ls "$HYPERPLAN_BACKEND_ROOT/tasks"'
    attempt "list its node's directory" 'ls "$HYPERPLAN_NODE_DIR"'
    attempt "read the agent's log" 'cat "$HYPERPLAN_NODE_DIR/agent.log"'
    for record in node.json state.json agent.json agent.lock new.json; do
        attempt "write $record" "echo x >> '$HYPERPLAN_NODE_DIR/$record'"
    done
    attempt "publish a variable" 'echo 1 > "$HYPERPLAN_ENV_DIR/X"'
    if [ -n "$HYPERPLAN_TASK_ID" ]; then
        task="$HYPERPLAN_BACKEND_ROOT/tasks/$HYPERPLAN_TASK_ID"
        attempt "write task.json" "echo x >> '$task/task.json'"
        attempt "write exit.json" "echo '{}' > '$task/exit.json'"
        attempt "read its own log by name" "cat '$task/stdout.log'"
    fi
    echo mine > "$HOME/mine" && echo "wrote its home"
""")


def check_probe(output: bytes, user: RunAs, home: Path, cwd: Path, as_task: bool) -> None:
    lines = output.decode().splitlines()
    assert lines[:2] == [f"id {user.uid} {user.gid} [{user.gid}] {user.user} {user.user}", f"at {home} {cwd}"]
    assert [line for line in lines if not line.startswith("refused: ")][2:] == ["wrote its home"], lines
    assert sum(line.startswith("refused: ") for line in lines) == (15 if as_task else 12), lines


def _useradd(name: str) -> None:
    command = [
        "useradd",
        "--system",
        "--no-create-home",
        "--shell",
        "/usr/sbin/nologin",
        "--user-group",
        name,
    ]
    for _ in range(50):  # another worker may hold the lock on /etc/passwd for a moment
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return
        if "lock" not in done.stderr:
            break
        time.sleep(0.1)
    raise RuntimeError(f"useradd {name}: {done.stderr.strip()}")


def _exists(name: str) -> bool:
    for lookup in (pwd.getpwnam, grp.getgrnam):
        try:
            lookup(name)
            return True
        except KeyError:
            pass
    return False


def _userdel(name: str) -> None:
    """Remove the user and its group (userdel removes a user's own group, but not always)."""
    for _ in range(50):
        subprocess.run(["userdel", name], capture_output=True)
        if _exists(name):
            subprocess.run(["groupdel", name], capture_output=True)
        if not _exists(name):
            return
        time.sleep(0.1)
    raise RuntimeError(f"could not remove the test user {name}")


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[RunAs, RunAs]]:
    suffix = uuid.uuid4().hex[:10]
    made: list[str] = []
    try:
        for letter in "ab":
            name = f"hp-test-{suffix}{letter}"
            made.append(name)
            _useradd(name)
        entries = [pwd.getpwnam(name) for name in made]
        first, second = (RunAs(e.pw_name, e.pw_uid, e.pw_gid) for e in entries)
        yield first, second
    finally:
        for name in made:
            _userdel(name)


@pytest.fixture(scope="module")
def place() -> Iterator[Path]:
    """A directory every user can pass through (pytest's own are 0700), with a stand-in for the
    server's data directory: a 0600 file of root's in a 0755 directory, and a file root may not lose."""
    base = Path(tempfile.mkdtemp(prefix="hp-isolation-", dir="/tmp"))
    try:
        base.chmod(0o711)
        server = base / "server"
        server.mkdir(mode=0o755)
        (server / "credentials").write_text("admin secret\n")
        (server / "credentials").chmod(0o600)
        (server / "victim").write_text("untouched\n")
        (server / "victim").chmod(0o644)
        private = base / "private"
        private.mkdir(mode=0o700)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def backend(place: Path) -> Iterator[LocalBackend]:
    root = place / f"backend-{uuid.uuid4().hex[:8]}"
    backend = LocalBackend(root)
    yield backend
    backend.close()
    LocalBackend(root).adopt([])  # nothing a test started outlives it
    shutil.rmtree(root, ignore_errors=True)


def mode_and_owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return stat.S_IMODE(info.st_mode), info.st_uid


def test_a_node_and_a_sandbox_run_as_their_users_and_reach_nothing_else(
    backend: LocalBackend, users: tuple[RunAs, RunAs], place: Path
) -> None:
    a, b = users
    secret, victim = place / "server/credentials", place / "server/victim"
    layout = backend.layout
    node, sandbox = layout.node(NODE), layout.task("job-b-1").sandbox

    # A node of user a, then a sandboxed job instance of user b, which tries a's node home.
    scripts = place / f"lifecycle-{uuid.uuid4().hex[:8]}"
    (scripts / "sub").mkdir(parents=True)
    (scripts / "on_create.sh").write_text(PROBE)
    (scripts / "sub/victim").symlink_to(victim)  # handing the home over must not give this away
    env = {"SECRET": str(secret), "OTHER_HOME": str(sandbox / "home")}
    backend.provision(NodeSpec(NODE, "ip-10-1-0-1", INSTANCE_TYPE, env, scripts, "on_create.sh", run_as=a))
    assert node_settled(backend).state is NodeState.RUNNING, backend.node_status(NODE).message
    on_create = backend.read_log(NodeRef(NODE), LogStream.STDOUT).data
    check_probe(on_create, a, node.home, node.lifecycle_dir, as_task=False)
    job_env = {"SECRET": str(secret), "OTHER_HOME": str(node.home)}
    backend.run(TaskSpec("job-b-1", ("/bin/sh", "-c", PROBE), env=job_env, run_as=b))
    status = task_final(backend, "job-b-1")
    assert (status.state, status.exit_code) == (TaskState.EXITED, 0), status.message
    check_probe(
        backend.read_log(TaskRef("job-b-1"), LogStream.STDOUT).data,
        b,
        sandbox / "home",
        sandbox / "home",
        True,
    )

    # A task on the node, and a command run with exec, as user a.
    backend.run(TaskSpec("task-a-1", ("/bin/sh", "-c", PROBE), NODE))
    status = task_final(backend, "task-a-1")
    assert (status.state, status.exit_code) == (TaskState.EXITED, 0), status.message
    check_probe(backend.read_log(TaskRef("task-a-1"), LogStream.STDOUT).data, a, node.home, node.home, True)
    result = backend.exec(NODE, ["/bin/sh", "-c", PROBE], SECOND * 20)
    assert result.exit_code == 0, result.stderr
    check_probe(result.stdout, a, node.home, node.home, True)

    # Nothing of the agent's is open in its children: 3 is ls's own look at the directory.
    assert backend.exec(NODE, ["/bin/ls", "/proc/self/fd"], SECOND * 20).stdout == b"0\n1\n2\n3\n"
    # A directory the user may not enter is not entered for it.
    backend.run(TaskSpec("task-a-2", ("/bin/pwd",), NODE, cwd=place / "private"))
    status = task_final(backend, "task-a-2")
    assert status.exit_code == 127 and "Permission denied" in status.message, status

    # Who owns what.
    assert mode_and_owner(node.home) == (0o700, a.uid)
    assert mode_and_owner(sandbox / "home") == (0o700, b.uid)
    assert os.lstat(node.lifecycle_dir / "sub/victim").st_uid == a.uid
    assert mode_and_owner(victim) == (0o644, 0) and victim.read_text() == "untouched\n"
    for passage in (layout.root, layout.nodes, layout.tasks, node.path, sandbox):
        assert mode_and_owner(passage) == (0o711, 0), passage
    task = layout.task("task-a-1")
    for record in (
        node.spec,
        node.state,
        node.agent,
        node.agent_log,
        task.spec,
        task.exit,
        task.log(LogStream.STDOUT),
    ):
        assert mode_and_owner(record) == (0o600, 0), record


def test_a_training_tree_is_handed_to_its_user_and_read_back_without_following_its_links(
    backend: LocalBackend, users: tuple[RunAs, RunAs], place: Path
) -> None:
    a, _ = users
    jobs = place / f"jobs-{uuid.uuid4().hex[:8]}"  # the server's, as DATA_DIR/jobs/ID/attempt-N is
    jobs.mkdir(mode=0o711)
    buckets = jobs / "s3"
    (buckets / "bkt/data").mkdir(parents=True)
    (buckets / "bkt/data/x.csv").write_text("1\n")
    storage = Storage({}, buckets)
    spec = JobSpec(
        job_name="job-1",
        instance_type="ml.m5.xlarge",
        hosts=("algo-1",),
        current_host="algo-1",
        output_path="s3://out/models/",
        hyperparameters={},
        channels=(Channel("training", "s3://bkt/data"),),
        checkpoint_uri="s3://bkt/checkpoints/job-1",
        entrypoint=("true",),
    )
    root = jobs / "algo-1"
    prepare(root, spec, storage, owner=a)
    assert mode_and_owner(root) == (0o700, a.uid)
    assert os.lstat(root / "input/data/training/x.csv").st_uid == a.uid

    # The job trains, and plants links to the server's files everywhere the server reads back.
    secret, victim = place / "server/credentials", place / "server/victim"
    job = f"""
        cat input/data/training/x.csv > model/weights && echo one > checkpoints/epoch-1
        ln -s {secret} model/key && ln -s {secret} checkpoints/key && ln -s {secret} output/failure
        mkdir -p .hyperplan && ln -s {victim} .hyperplan/model.tar.gz
    """
    backend.run(TaskSpec("job-1-algo-1", ("/bin/sh", "-c", job), cwd=root, run_as=a))
    status = task_final(backend, "job-1-algo-1")
    assert (status.state, status.exit_code) == (TaskState.EXITED, 0), status.message

    assert sync_checkpoints(root, spec, storage) == 1
    assert {item.key for item in storage.list("s3://bkt/checkpoints/job-1")} == {"checkpoints/job-1/epoch-1"}
    pack_model(root, spec, storage)
    with tarfile.open(buckets / "out/models/job-1/output/model.tar.gz") as tar:
        assert tar.getnames() == ["weights"]
        weights = tar.extractfile("weights")
        assert weights is not None and weights.read() == b"1\n"
    assert read_failure(root, 1000) == ""
    assert victim.read_text() == "untouched\n"


def test_work_never_runs_as_root_by_request(backend: LocalBackend) -> None:
    with pytest.raises(BackendError, match="must not be 0"):
        backend.run(TaskSpec("job-1", ("true",), run_as=RunAs("root", 0, 0)))
    assert backend.layout.task_ids() == []
