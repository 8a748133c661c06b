"""The Slurm step runner's container mode, run as a Slurm step runs it: ``slurm_runner.py`` (the back end's
copy of it) as an unprivileged user, on a task directory laid out as the Slurm back end lays it out, its
program in a rootless runc container of the session's Python image, unpacked as the server unpacks it.

Needs root (a throwaway user, an unpacked image that is root's, cgroups of the test's): elsewhere the
tests skip, saying why. Each test checks that no container, runc state or process of the user is left.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hyperplan.backends.base import Mount, RunAs
from hyperplan.backends.layout import inherited_mark
from hyperplan.backends.oci_bundle import ENV_DIR_INSIDE, TEMPLATE, OciSpec, write_template
from hyperplan.backends.slurm_submit import RUNNER_FILE, install_tools
from hyperplan.containers.podman import PodmanStore
from tests.backends.test_isolation import _useradd, _userdel
from tests.image_fixtures import Built, podman

pytestmark = [
    pytest.mark.containers,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="needs root: makes a throwaway user, unpacks an image as root's and makes cgroups",
    ),
]

PYTHON = "/usr/bin/python3"
"""The runner's interpreter on the node (the system's, as ``slurm_submit.runner_python`` picks it)."""
CATATONIT = Path("/usr/bin/catatonit")
MOUNT_DIRS = (
    "/opt/ml", "/opt/sagemaker", "/run/hyperplan/env", "/tmp", "/var/tmp", "/root", "/proc", "/dev", "/sys",
)  # fmt: skip
MOUNT_FILES = ("/run/hyperplan/init", "/etc/hosts", "/etc/resolv.conf")
MARKER_FILE = "/etc/hp-image-marker"
PUBLISHED = ("HP_PUBLISHED", "from-the-node")
SLURM_ENV = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "node-a"}
RUN_TIMEOUT = 120
OOM_LIMIT = 64 * 1024 * 1024

PROBE = """
import json, os, socket, sys
task_dir = sys.argv[1]
report = {
    "ids": [os.getuid(), os.getgid()],
    "hostname": socket.gethostname(),
    "marker": open("/etc/hp-image-marker").read(),
    "published": [os.environ.get("HP_PUBLISHED"), open("/run/hyperplan/env/HP_PUBLISHED").read()],
    "slurm_job": os.environ.get("SLURM_JOB_ID"),
    "algo-1": socket.gethostbyname("algo-1"),
}
os.makedirs("/opt/ml/model", exist_ok=True)
with open("/opt/ml/model/weights.txt", "w") as weights:
    weights.write("trained")
for path in ("/etc/hp-image-marker", "/usr/written-by-the-program"):
    try:
        open(path, "w")
        report[path] = "written"
    except OSError as error:
        report[path] = error.errno
for path in (task_dir, os.path.join(task_dir, "run.json"), os.path.join(task_dir, "out", "stdout.log")):
    try:
        open(path).close()
        report[path] = "opened"
    except OSError as error:
        report[path] = error.errno
print(json.dumps(report))
sys.exit(3)
"""
HOSTS_PROBE = """
import json, os, socket
names = {name: socket.gethostbyname(name) for name in ("algo-1", "algo-2", "algo-3")}
print(json.dumps({"hostname": socket.gethostname(), "names": names, "hosts": os.environ["HYPERPLAN_HOSTS"]}))
"""
TRAPPING = "trap 'echo trapped; trap - TERM; kill -TERM $$' TERM; echo ready; sleep 300 & wait"
HOG = "keep = []\nwhile True:\n    keep.append(b'\\1' * (8 << 20))"
FAKE_SLURMSTEPD = """
import ctypes, subprocess, sys
ctypes.CDLL(None).prctl(15, b"slurmstepd", 0, 0, 0)  # PR_SET_NAME: what the runner looks for
runner = subprocess.Popen(sys.argv[1:], process_group=0)  # a task of its own group, as slurmstepd makes
print(runner.pid, flush=True)
code = runner.wait()
sys.exit(code if code >= 0 else 128 - code)
"""
"""Stands for slurmstepd under proctrack/cgroup: the runner's parent, named so, in a step's cgroup."""
FAKE_SCONTROL = """#!/bin/sh
# scontrol show hostnames LIST | scontrol show node -o LIST, for three nodes (one known by name only).
if [ "$2" = hostnames ]; then printf 'hpnode1\\nhpnode2\\nhpnode3\\n'; exit 0; fi
echo "NodeName=hpnode1 NodeAddr=127.0.0.11 State=IDLE"
echo "NodeName=hpnode2 NodeAddr=127.0.0.12 State=IDLE"
echo "NodeName=hpnode3 NodeAddr=localhost State=IDLE"
"""


@dataclass(frozen=True)
class Place:
    """The test's work root (every user may pass), the unpacked image, the tools and the node's
    published variables, and the account's user."""

    base: Path
    rootfs: Path
    tools: Path
    env_dir: Path
    user: RunAs
    marker: str


@dataclass(frozen=True)
class Task:
    directory: Path
    ml: Path
    name: str

    def record(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.directory / "out" / name).read_text())
        return found

    def log(self, name: str) -> str:
        """A log of the runner's ("" until the runner made it)."""
        try:
            return (self.directory / "out" / name).read_text()
        except FileNotFoundError:
            return ""


@pytest.fixture(scope="module")
def place(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Place]:
    if shutil.which("runc") is None or not CATATONIT.exists():
        pytest.skip("needs runc and catatonit (apt-get install runc catatonit)")
    base = Path(tempfile.mkdtemp(prefix="hp-runner-containers-", dir="/tmp"))  # pytest's are 0700
    base.chmod(0o711)
    name = f"hp-rt-{uuid.uuid4().hex[:8]}"
    made = False
    try:
        _useradd(name)
        made = True
        entry = pwd.getpwnam(name)
        rootfs = base / "rootfs"
        unpack(built.python, rootfs, PodmanStore(tmp_path_factory.mktemp("runner-store")))
        marker = uuid.uuid4().hex
        (rootfs / MARKER_FILE.lstrip("/")).write_text(marker)
        env_dir = base / "env"
        env_dir.mkdir(mode=0o755)
        (env_dir / PUBLISHED[0]).write_text(PUBLISHED[1])
        install_tools(base / "tools")
        yield Place(base, rootfs, base / "tools", env_dir, RunAs(name, entry.pw_uid, entry.pw_gid), marker)
    finally:
        if made:
            _userdel(name)
        shutil.rmtree(base, ignore_errors=True)


def unpack(reference: str, rootfs: Path, store: PodmanStore) -> None:
    """The image's file system in ``rootfs``, its owners kept (root's), with the configurations' mount
    points: as the server unpacks an image for its Slurm nodes."""
    store.prepare()
    try:
        pulled = podman(store, "pull", "--quiet", "--tls-verify=false", reference)
        assert pulled.returncode == 0, pulled.stderr
        created = podman(store, "create", reference, "/bin/true")
        assert created.returncode == 0, created.stderr
        rootfs.mkdir(mode=0o755)
        export = subprocess.Popen(
            ["podman", "export", created.stdout.strip()],
            env=store.environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
        )
        assert export.stdout is not None
        untar = subprocess.run(
            ["tar", "-x", "--numeric-owner", "-p", "-C", str(rootfs)],
            stdin=export.stdout,
            capture_output=True,
            timeout=300,
        )
        export.stdout.close()
        assert export.wait(timeout=300) == 0 and untar.returncode == 0, untar.stderr
        podman(store, "rm", "--force", created.stdout.strip())
    finally:
        store.remove()
    for directory in MOUNT_DIRS:
        path = rootfs / directory.lstrip("/")
        if path.is_symlink():
            path.unlink()
        path.mkdir(mode=0o755, parents=True, exist_ok=True)
    for file in MOUNT_FILES:
        path = rootfs / file.lstrip("/")
        if path.is_symlink():
            path.unlink()
        path.touch(mode=0o644)
    rootfs.chmod(0o755)


# --- a task directory, as the back end lays it out ----------------------------------------------------


def users_dir(path: Path, user: RunAs) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, user.uid, user.gid)
    return path


def lay_out(place: Place, name: str, argv: Sequence[str], hostname: str = "algo-1") -> Task:
    """A task's directory (root's, 0711) with its ``run.json``, its ``oci.json`` (root's), its ``out/``,
    ``bundle/`` and ``runc/`` (the user's, 0700) and its ``hosts`` (the user's, for the runner to write);
    its ``/opt/ml`` and ``/tmp`` the user's directories beside it."""
    user = place.user
    task = place.base / name
    task.mkdir()
    task.chmod(0o711)
    for own in ("out", "bundle", "runc"):
        users_dir(task / own, user)
    ml, tmp = users_dir(place.base / f"{name}-ml", user), users_dir(place.base / f"{name}-tmp", user)
    hosts = task / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n")
    hosts.chmod(0o644)
    os.chown(hosts, user.uid, user.gid)
    mounts = (
        Mount(ml, "/opt/ml"),
        Mount(tmp, "/tmp"),
        Mount(place.env_dir, ENV_DIR_INSIDE, read_only=True),
        Mount(hosts, "/etc/hosts", read_only=True),
    )
    # The run's mark reaches the container's processes too, so that the run's leak check finds them.
    env = {"HOME": "/root", "HYPERPLAN_ENV_DIR": ENV_DIR_INSIDE, **inherited_mark()}
    spec = OciSpec(place.rootfs, user.uid, user.gid, tuple(argv), env, "/", hostname, mounts, init=CATATONIT)
    write_template(task, spec)
    container = {
        "template": str(task / TEMPLATE),
        "bundle": str(task / "bundle"),
        "state": str(task / "runc"),
        "name": f"hp-{name}",
        "runc": "runc",
        "hosts": str(hosts),
    }
    run = {"argv": list(argv), "env": {}, "cwd": "/", "env_dir": str(place.env_dir), "container": container}
    (task / "run.json").write_text(json.dumps(run))
    (task / "run.json").chmod(0o644)
    return Task(task, ml, container["name"])


def lay_out_host_task(place: Place, name: str, argv: Sequence[str]) -> Path:
    """A task of today's kind: its program a host process."""
    task = place.base / name
    task.mkdir()
    task.chmod(0o711)
    users_dir(task / "out", place.user)
    run = {"argv": list(argv), "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/", "env_dir": str(place.env_dir)}
    (task / "run.json").write_text(json.dumps(run))
    (task / "run.json").chmod(0o644)
    return task


# --- running the runner -----------------------------------------------------------------------------


def runner_command(place: Place, arguments: Sequence[str], env: Mapping[str, str] = SLURM_ENV) -> list[str]:
    """The runner as a Slurm step runs it: as the user, the system's Python, isolated."""
    variables = [f"{name}={value}" for name, value in env.items()]
    runner = str(place.tools / RUNNER_FILE)
    return ["runuser", "-u", place.user.user, "--", "env", *variables, PYTHON, "-I", "-S", runner, *arguments]


def run(place: Place, task: Task, *arguments: str, env: Mapping[str, str] = SLURM_ENV) -> int:
    done = subprocess.run(
        runner_command(place, arguments or (str(task.directory),), env),
        cwd=place.base,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=RUN_TIMEOUT,
    )
    check_nothing_left(place, task)
    return done.returncode


def check_nothing_left(place: Place, task: Task) -> None:
    assert not (task.directory / "runc" / task.name).exists(), "runc's state of the container is left"
    assert eventually(lambda: not processes_of(place.user)), processes_of(place.user)


def processes_of(user: RunAs) -> list[str]:
    found = subprocess.run(["pgrep", "-a", "-u", str(user.uid)], capture_output=True, text=True)
    return found.stdout.splitlines()


def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def cgroup(directory: Path) -> Iterator[Path]:
    """A cgroup of the test's (made; removed after, with whatever a failed test left running in it)."""
    directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        for level in (directory, *directory.parents):
            if not level.name.startswith(("hp-runner-", "job_", "step_")):
                break
            eventually(functools.partial(_removed, level))


def _removed(directory: Path) -> bool:
    try:
        directory.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False  # its last processes are still on their way out
    return True


def in_cgroup(directory: Path, command: list[str]) -> list[str]:
    """``command`` run in the cgroup ``directory`` (it moves itself there, then execs)."""
    return ["sh", "-c", f'echo $$ > {directory / "cgroup.procs"} && exec "$@"', "sh", *command]


# --- the tests ----------------------------------------------------------------------------------------


def test_the_program_runs_as_root_inside_the_image_and_writes_only_its_binds(place: Place) -> None:
    # The program is told where its task's directory is on the node, and looks for its records there.
    task = lay_out(place, "probe", ["python3", "-c", PROBE, str(place.base / "probe")])

    assert run(place, task) == 3

    report = json.loads(task.log("stdout.log"))
    assert report["ids"] == [0, 0]
    assert report["hostname"] == "algo-1"
    assert report["marker"] == place.marker  # a file only the image has
    assert report["published"] == [PUBLISHED[1], PUBLISHED[1]]  # as a variable and as a file
    assert report["slurm_job"] == "7"  # Slurm's variables pass through
    assert report["algo-1"] == "127.0.0.1"  # /etc/hosts, as the runner wrote it
    assert report["/etc/hp-image-marker"] == errno.EROFS
    assert report["/usr/written-by-the-program"] == errno.EROFS
    for path in ("run.json", "out/stdout.log"):  # the task's records are not in its world
        assert report[str(task.directory / path)] == errno.ENOENT
    assert report[str(task.directory)] == errno.ENOENT
    weights = task.ml / "model" / "weights.txt"
    assert weights.read_text() == "trained"
    assert (weights.stat().st_uid, weights.stat().st_gid) == (place.user.uid, place.user.gid)

    assert task.record("exit.json")["exit_code"] == 3
    assert task.record("exit.json")["signal"] is None
    assert task.record("exit.json")["out_of_memory"] is False
    started = task.record("started.json")
    assert (started["job"], started["step"], started["node"]) == ("7", "0", "node-a")
    assert "o " in (task.directory / "out" / "timed.log").read_text()  # the wrapper timed its lines
    assert oct((task.directory / "bundle" / "config.json").stat().st_mode & 0o777) == "0o600"


def test_a_group_members_hosts_name_every_member_at_its_nodes_address(place: Place) -> None:
    task = lay_out(place, "member", ["python3", "-c", HOSTS_PROBE], hostname="algo-2")
    group = place.base / "group"
    group.mkdir()
    group.chmod(0o711)
    members = [str(place.base / "member-1"), str(task.directory), str(place.base / "member-3")]
    (group / "group.json").write_text(json.dumps({"members": members}))
    (group / "group.json").chmod(0o644)
    fake_bin = place.base / "fake-bin"
    fake_bin.mkdir(mode=0o755)
    (fake_bin / "scontrol").write_text(FAKE_SCONTROL)
    (fake_bin / "scontrol").chmod(0o755)
    env = {
        **SLURM_ENV,
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "hpnode[1-3]",
        "PATH": f"{fake_bin}:/usr/bin:/bin",
    }

    assert run(place, task, "--group", str(group), env=env) == 0

    report = json.loads(task.log("stdout.log"))
    assert report["hostname"] == "algo-2"
    # hpnode3's address is a name: resolved on the node, as /etc/hosts needs an address.
    assert report["names"] == {"algo-1": "127.0.0.11", "algo-2": "127.0.0.12", "algo-3": "127.0.0.1"}
    assert report["hosts"] == "algo-1=127.0.0.11,algo-2=127.0.0.12,algo-3=localhost"
    assert oct((task.directory / "hosts").stat().st_mode & 0o777) == "0o644"


def test_a_container_left_by_an_earlier_try_is_removed_first(place: Place) -> None:
    task = lay_out(place, "again", ["true"])
    assert run(place, task) == 0
    runc = ["runuser", "-u", place.user.user, "--", "runc", "--root", str(task.directory / "runc")]
    bundle = task.directory / "bundle"
    with tempfile.TemporaryFile() as said:  # not a pipe: the container's process 1 keeps runc's stdio
        try:
            leftover = subprocess.run(  # made, never started: as a runner killed meanwhile leaves it
                [*runc, "create", "--bundle", str(bundle), task.name],
                cwd=bundle,
                stdin=subprocess.DEVNULL,
                stdout=said,
                stderr=said,
                timeout=RUN_TIMEOUT,
            )
            said.seek(0)
            assert leftover.returncode == 0, said.read()
            assert (task.directory / "runc" / task.name).exists()

            assert run(place, task) == 0
            assert task.record("exit.json")["exit_code"] == 0
        finally:
            subprocess.run([*runc, "delete", "--force", task.name], capture_output=True, timeout=60)


def test_a_sigterm_slurm_gives_the_runner_alone_reaches_the_program_which_ends_by_it(place: Place) -> None:
    task = lay_out(place, "term", ["sh", "-c", TRAPPING])
    fake = place.base / "fake-slurmstepd.py"
    fake.write_text(FAKE_SLURMSTEPD)
    fake.chmod(0o644)
    v1 = Path("/sys/fs/cgroup/freezer")
    if not v1.is_dir() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("needs cgroups (v1's freezer or v2): the runner finds a step by its cgroup")
    top = v1 if v1.is_dir() else Path("/sys/fs/cgroup")
    with cgroup(top / f"hp-runner-{uuid.uuid4().hex[:8]}" / "job_1" / "step_0") as step:
        stepd = runner_command(place, [str(task.directory)])
        stepd[stepd.index(PYTHON) :] = [PYTHON, "-I", "-S", str(fake), *stepd[stepd.index(PYTHON) :]]
        process = subprocess.Popen(
            in_cgroup(step, stepd),
            cwd=place.base,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            runner = int(process.stdout.readline())
            assert eventually(lambda: "ready" in task.log("stdout.log"), timeout=60)
            os.kill(runner, signal.SIGTERM)
            assert process.wait(timeout=60) == 128 + signal.SIGTERM
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    check_nothing_left(place, task)
    assert task.log("stdout.log").split() == ["ready", "trapped"]  # its trap ran, once
    # Ended by the signal it re-raised: catatonit exits 128 + 15, which reads as an exit code, as on the
    # local back end's containers (a trap's `exit 143` reads the same).
    ended = task.record("exit.json")
    assert (ended["exit_code"], ended["signal"], ended["out_of_memory"]) == (
        128 + signal.SIGTERM,
        None,
        False,
    )


def test_a_program_the_memory_limit_kills_is_recorded_out_of_memory(place: Place) -> None:
    memory = Path("/sys/fs/cgroup/memory")
    if not memory.is_dir():
        pytest.skip("needs the cgroup v1 memory hierarchy (/sys/fs/cgroup/memory)")
    own = next(
        line.split(":", 2)[2]
        for line in Path("/proc/self/cgroup").read_text().splitlines()
        if "memory" in line.split(":", 2)[1].split(",")
    )
    task = lay_out(place, "hog", ["python3", "-c", HOG])
    with cgroup(memory / own.lstrip("/") / f"hp-runner-{uuid.uuid4().hex[:8]}") as limited:
        (limited / "memory.limit_in_bytes").write_text(str(OOM_LIMIT))
        if (limited / "memory.memsw.limit_in_bytes").exists():
            (limited / "memory.memsw.limit_in_bytes").write_text(str(OOM_LIMIT))  # no swapping instead
        done = subprocess.run(
            in_cgroup(limited, runner_command(place, [str(task.directory)])),
            cwd=place.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=RUN_TIMEOUT,
        )
        check_nothing_left(place, task)
        kills = (limited / "memory.oom_control").read_text()
    ended = task.record("exit.json")
    assert ended["out_of_memory"] is True, (ended, kills, task.log("stderr.log"))
    assert (ended["exit_code"], ended["signal"]) == (None, signal.SIGKILL)
    assert done.returncode == 128 + signal.SIGKILL


def test_the_start_overhead_of_a_container(place: Place, capsys: pytest.CaptureFixture[str]) -> None:
    """Figures printed, never asserted (tests assert behaviour): the runner with ``true`` in a container
    and as a host process, each run 10 times, alternating."""
    contained = lay_out(place, "overhead", ["true"])
    host = Task(lay_out_host_task(place, "overhead-host", ["/bin/true"]), place.base, "none")
    seconds: dict[str, list[float]] = {"container": [], "host": []}
    for _ in range(10):
        for kind, task in (("container", contained), ("host", host)):
            began = time.monotonic()
            assert run(place, task) == 0
            seconds[kind].append(time.monotonic() - began)
    medians = {kind: statistics.median(values) for kind, values in seconds.items()}
    with capsys.disabled():
        print(
            f"\nrunner with true, median of 10: container {medians['container']:.3f} s, host "
            f"{medians['host']:.3f} s, overhead {medians['container'] - medians['host']:.3f} s "
            f"(container min {min(seconds['container']):.3f} max {max(seconds['container']):.3f})"
        )
