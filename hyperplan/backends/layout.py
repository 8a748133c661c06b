"""The local back end's files: where each one lives, what it holds, and who writes it.

The files are the truth. The server (``local.py``) and the node agents (``agent.py``) never share memory;
each file has one writer at a time, and every write is atomic (a temporary file renamed over the old
one), so a reader sees the old or the new content, never half of it.

    ROOT/
      nodes/NODE_ID/                a node
        node.json      server       the spec (written first: it is what makes the node exist)
        agent.lock     agent        flock held for the agent's life: one agent per node
        agent.json     agent        the agent's pid and start time
        state.json     agent        Pending/Running/Failure/ShuttingDown/Terminated and message
                                    (the server writes it only when the agent is gone)
        terminate.json server       grace, SIGKILL deadline (CLOCK_MONOTONIC, shared by all processes)
        env/NAME       server       published variables, one file each ($HYPERPLAN_ENV_DIR)
        queue/TASK_ID  server       an empty file per task to run on this node
        home/          processes    the node's working directory ($HOME); lifecycle scripts in home/lifecycle
        container.json agent        the node's container, for a node that is one (``containers.py``)
        hosts          agent        its /etc/hosts
        lifecycle.stdout.log, lifecycle.stderr.log   OnCreate's output
        agent.log      agent        its error output (tracebacks): its last words if it dies
        watch.json     server       the agent's parent: a shell that only waits for it (pid, start time)
        agent.exit     that shell   how the agent ended: its exit status, 128 + N when signal N killed it
      tasks/TASK_ID/                a task
        task.json      server       the spec
        proc.json      agent        pid, start time, once started
        exit.json      agent        how it ended (the server writes Lost when the agent is gone)
        terminate.json server       a task's own terminate order (tasks on a shared node)
        stdout.log, stderr.log
        exec.env       agent        a task's variables for ``podman exec`` (in a container)
        sandbox/                    the instance sandbox of a task run with node_id=None: a node dir
      pods/POD.lock    agents       held while a pod is made, joined or removed

Who may read what, when work runs as an account's OS user (``run_as``): everything belongs to the
server's user (root) except a node's ``home/``, which the agent hands to the node's user (0700) once the
lifecycle scripts are in it. The root, ``nodes/``, ``tasks/``, every node and task directory are 0711:
a tenant can pass through them to its own home but list nothing. Records and logs are 0600 (a process
gets its log as an open descriptor, never by name); ``env/`` and its files are 0755/0644, for the node's
processes read them. No file here is writable by a tenant.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hyperplan.backends import tenant_files
from hyperplan.backends.base import LogStream, Placement, RunAs

T = TypeVar("T")

PASSAGE_MODE = 0o711
"""The root and every node and task directory: traversable, not listable, by other users."""
PRIVATE_MODE = 0o700
READABLE_DIR_MODE = 0o755
READABLE_FILE_MODE = 0o644
RECORD_MODE = 0o600

# Every process of the back end carries these, so that a restarted server can find strays.
ROOT_VARIABLE = "HYPERPLAN_BACKEND_ROOT"
NODE_DIR_VARIABLE = "HYPERPLAN_NODE_DIR"

MARK_VARIABLE = "HYPERPLAN_RUN_MARK"
"""An opaque label (never a path) that every process hyperplan starts inherits from the process that
started it: `hyperplan serve` makes one when its environment has none, and a test run sets its own, so
that whatever outlives its server (node agents, job instances, node tasks) can be found and ended."""


def inherited_mark() -> dict[str, str]:
    """The run mark of this process, to put into the environment of a process it starts."""
    mark = os.environ.get(MARK_VARIABLE)
    return {MARK_VARIABLE: mark} if mark else {}


# --- records ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeRecord:
    node_id: str
    name: str
    instance_type: str
    env: dict[str, str]
    lifecycle_source: str | None
    on_create: str | None
    on_create_args: list[str]
    sandbox_task: str | None
    """The task a sandbox exists for; None for a node of a cluster."""
    run_as: dict[str, Any] | None = None
    """The node's OS user (a :class:`RunAs` as a dict); None: the server's own."""
    placement: dict[str, Any] | None = None
    """The spec's :class:`Placement` (kept for the spec's identity; one machine has nowhere else to go)."""
    container: dict[str, Any] | None = None
    """The node's container (``containers.spec_record``); None: host processes."""
    created_at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class TaskRecord:
    task_id: str
    node_id: str | None
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    run_as: dict[str, Any] | None = None
    """A sandboxed task's OS user, as in :class:`NodeRecord`."""
    placement: dict[str, Any] | None = None
    container: dict[str, Any] | None = None
    """A sandboxed task's container, as in :class:`NodeRecord`."""
    created_at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class ProcRecord:
    """A process, named so that a later process with the same pid is not mistaken for it."""

    pid: int
    starttime: int
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class StateRecord:
    state: str
    message: str = ""
    updated_at: float = field(default_factory=time.time)
    died: bool = False
    """A Failure of the node's own: its agent died (the server's record), not a provisioning failure."""


@dataclass(frozen=True)
class ExitRecord:
    state: str
    """A final TaskState: Exited, Killed or Lost."""
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    out_of_memory: bool = False
    ended_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class TerminateOrder:
    grace: float
    deadline: float
    """time.monotonic() at which SIGKILL is due: CLOCK_MONOTONIC is the same for every process of a
    boot, and no process outlives a reboot."""
    requested_at: float = field(default_factory=time.time)
    hook: str | None = None
    """A node's script (in its lifecycle directory) to run before its SIGTERM, for at most ``grace``:
    then ``deadline`` is two graces after the order (the hook's, then the processes')."""


def run_as_record(run_as: RunAs | None) -> dict[str, Any] | None:
    return asdict(run_as) if run_as is not None else None


def placement_record(placement: Placement | None) -> dict[str, Any] | None:
    if placement is None:
        return None
    record = asdict(placement)
    record["time_limit"] = placement.time_limit.total_seconds() if placement.time_limit else None
    return record


def run_as_of(record: NodeRecord | TaskRecord) -> RunAs | None:
    return RunAs(**record.run_as) if record.run_as is not None else None


def make_dir(path: Path, mode: int) -> None:
    """A directory with exactly ``mode``, whatever the umask (also when it existed)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def hand_over(top: Path, run_as: RunAs) -> None:
    """Give the tree under ``top`` to ``run_as``, ``top`` itself last and 0700. No symbolic link is
    followed: each entry is changed itself (lchown), so a link in the tree cannot make root change a file
    outside it. Call it while nothing of that user can reach the tree yet (``top`` still the server's)."""
    for parent, directories, files in os.walk(top, topdown=False):  # never descends into a link
        for name in (*directories, *files):
            os.chown(os.path.join(parent, name), run_as.uid, run_as.gid, follow_symlinks=False)
    os.chown(top, run_as.uid, run_as.gid, follow_symlinks=False)
    os.chmod(top, PRIVATE_MODE)


def write_record(path: Path, record: Any) -> None:
    write_atomically(path, json.dumps(asdict(record), indent=1).encode())


def read_record(path: Path, kind: type[T]) -> T | None:
    try:
        return kind(**json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None


def write_atomically(path: Path, data: bytes, mode: int = RECORD_MODE) -> None:
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
    try:
        if mode != RECORD_MODE:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def tail(path: Path, limit: int = 2000) -> str:
    """The end of a log, for a status message (read as a tenant's file: no link, FIFO or giant read)."""
    return tenant_files.tail(path, limit)


# --- paths ------------------------------------------------------------------------------------------


class NodeFiles:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.spec = path / "node.json"
        self.lock = path / "agent.lock"
        self.agent = path / "agent.json"
        self.state = path / "state.json"
        self.terminate = path / "terminate.json"
        self.env_dir = path / "env"
        self.queue = path / "queue"
        self.home = path / "home"
        self.lifecycle_dir = self.home / "lifecycle"
        self.agent_log = path / "agent.log"
        self.watch = path / "watch.json"
        self.agent_exit = path / "agent.exit"
        self.container = path / "container.json"
        """The node's container, once the agent has made it (``containers.Running``)."""
        self.timed = path / "lifecycle.timed.log"
        """OnCreate's output line by line with times (``timedlog.py``)."""

    def log(self, stream: LogStream) -> Path:
        return self.path / f"lifecycle.{stream.value}.log"

    def published_env(self) -> dict[str, str]:
        try:
            return {entry.name: entry.read_text() for entry in self.env_dir.iterdir() if entry.is_file()}
        except FileNotFoundError:
            return {}

    def queued(self) -> list[str]:
        try:
            return sorted(entry.name for entry in self.queue.iterdir())
        except FileNotFoundError:
            return []


class TaskFiles:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.task_id = path.name
        self.spec = path / "task.json"
        self.proc = path / "proc.json"
        self.exit = path / "exit.json"
        self.terminate = path / "terminate.json"
        self.sandbox = path / "sandbox"
        self.timed = path / "timed.log"
        """The task's output line by line with times (``timedlog.py``)."""

    def log(self, stream: LogStream) -> Path:
        return self.path / f"{stream.value}.log"


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.nodes = root / "nodes"
        self.tasks = root / "tasks"
        self.pod_locks = root / "pods"

    def node(self, node_id: str) -> NodeFiles:
        return NodeFiles(self.nodes / node_id)

    def task(self, task_id: str) -> TaskFiles:
        return TaskFiles(self.tasks / task_id)

    def node_of(self, record: TaskRecord) -> NodeFiles:
        if record.node_id is None:
            return NodeFiles(self.task(record.task_id).sandbox)
        return self.node(record.node_id)

    def node_ids(self) -> list[str]:
        return _names(self.nodes)

    def task_ids(self) -> list[str]:
        return _names(self.tasks)


def _names(directory: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in directory.iterdir() if not entry.name.startswith("."))
    except FileNotFoundError:
        return []
