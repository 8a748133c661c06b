"""The execution back-end contract: how hyperplan starts, watches and stops work on its fleet.

A back end keeps two kinds of things, both named by the caller:

- a **node**: one instance of a HyperPod instance group. It has a working directory (its home), an
  instance id, a hostname-like name and its own set of processes. Provisioning copies the group's
  lifecycle scripts to the node and runs its OnCreate script there; the node is Pending while the
  script runs, Running when it exits 0, and Failure (with the script's error output) otherwise.
- a **task**: one process (and whatever it starts) either on a node, queued until that node is
  Running, or, with ``node_id=None``, in an instance sandbox of its own that lives exactly as long as
  the task (one instance of a training job).

Operating rules. Every implementation keeps them; ``tests/backends/contract.py`` checks them.

1. **The caller names everything.** Node and task ids come from the caller, so the store can record
   an id *before* the back end acts. A crash between the two then leaves a recorded id with nothing
   behind it (reported by :meth:`Backend.adopt` as ``missing``: call ``provision``/``run`` again),
   never work that the store does not know.
2. **Idempotent.** ``provision``/``run`` of an id that exists with the same spec do nothing (with a
   different spec they raise :class:`SpecConflict`); ``signal`` and ``terminate`` of something that
   has ended do nothing; a second ``terminate`` can only bring the SIGKILL deadline nearer.
3. **Quick.** No method waits for a process, except ``exec``, which is bounded by its timeout. Long
   work (OnCreate, tasks, grace periods) goes on in the background; watch it by polling ``node_status``
   and ``task_status``. A status call may settle what it finds (say, record that a node's processes
   died), but never waits.
4. **Restart-safe.** Work outlives the server. A server that starts again builds a new back end over
   the same state and calls :meth:`Backend.adopt` with every id its store knows, before anything
   else: known work is reconnected, work that ended meanwhile reports how it ended, and work the store
   does not know is killed (no orphans).
5. **Real time.** Grace periods follow real time, never the service clock. ``terminate`` sends SIGTERM
   now and SIGKILL when the grace has passed, even if the server dies in between.
6. **Thread-safe.** Methods may be called from several threads at once.

Logs. Every back end keeps two logs of a task's output (for a node: its OnCreate's): the bytes as
written, per stream (:meth:`Backend.read_log`, a byte offset as cursor), and the **timed lines**
(:meth:`Backend.read_lines`): every line of both streams, in the order read, each with the wall-clock
time at which it was written, taken by a reader between the process and its log (the wrapper of
``backends/timedlog.py``, which a back end runs around every program), never from a file's mtime. On
disk the timed log is one record a line, ``SECONDS.MICROS STREAM TEXT``: the Unix time with six
decimals, ``o`` or ``e``, the line's bytes without its newline; a line longer than 64 KiB is cut in
records, a partial line is recorded when its pipe closes or after a second's wait (``timedlog.py`` says
it all). A cursor is an opaque integer (the local back end's: a byte offset in that file), 0 at the start.
Where work runs on a back end of many machines (Slurm) the caller says with a :class:`Placement` on
the spec: the reservation, the machines' feature, and for a multi-instance job's tasks the group they
form (one allocation of that many machines). Back ends with one machine keep it and ignore it.

Errors are :class:`BackendError` and its subclasses: a back end's own failures, which the services turn
into their own errors (nothing here is a wire error).

The reclaim warning: a running process's environment cannot be changed, so variables published with
``signal(..., env=...)`` or ``terminate(..., env=...)`` (``SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_
TIMESTAMP``) are written, before the signal is sent, as one file per variable in the directory named by
``$HYPERPLAN_ENV_DIR`` (an "envdir": the file's name is the variable, its content the value); a signal
handler reads them there. Every process started on the node afterwards has them in its environment too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path, PurePosixPath
from signal import Signals
from typing import Protocol, runtime_checkable

EXPIRATION_VARIABLE = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
"""The reclaim warning: the capacity block's end, as epoch seconds in a string."""

ENV_DIR_VARIABLE = "HYPERPLAN_ENV_DIR"
"""Every process on a node finds the published variables in this directory, one file each."""

EXEC_OUTPUT_LIMIT = 1 << 20
"""The most of each of stdout and stderr that :meth:`Backend.exec` returns, by default (1 MiB)."""

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# --- errors -----------------------------------------------------------------------------------------


class BackendError(Exception):
    """A back end could not do what it was asked: a bug or the host's fault, never the user's."""


class UnknownResource(BackendError):
    """No node or task with this id exists in the back end (never provisioned, or forgotten)."""


class SpecConflict(BackendError):
    """``provision`` or ``run`` of an id that exists with a different spec."""


class NodeUnavailable(BackendError):
    """The node cannot take this request in its current state (say, ``exec`` on a Pending node)."""


# --- identities and specs ---------------------------------------------------------------------------


def check_id(kind: str, value: str) -> str:
    """Ids become directory and job names, so they are kept to a safe alphabet."""
    if not _ID.fullmatch(value):
        raise ValueError(f"{kind} {value!r}: 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit")
    return value


def check_env(env: Mapping[str, str]) -> None:
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name) or "\0" in value:
            raise ValueError(f"environment variable {name!r}: not a valid name or value")


@dataclass(frozen=True)
class RunAs:
    """The OS user an account's work runs as: its processes get this uid and gid and no supplementary
    groups, and their homes and sandboxes belong to it. A spec without one runs as the server's own user
    (isolation mode ``none``)."""

    user: str
    uid: int
    gid: int


@dataclass(frozen=True)
class NodeRef:
    node_id: str


@dataclass(frozen=True)
class TaskRef:
    task_id: str


Ref = NodeRef | TaskRef


@dataclass(frozen=True)
class Placement:
    """Where work runs on a back end of many machines (Slurm). The local and fake back ends keep it
    with the spec (a different placement is a different spec) and otherwise ignore it.

    ``reservation``: the Slurm reservation of the plan's segment the work must run in (None: outside
    any, in the partition). ``constraint``: the machines' feature (the pool's instance type).
    ``time_limit``: real time the work may run at most (on-demand work, before the next reservation on
    its nodes); inside a reservation the back end limits it to the reservation's end itself.
    ``group``, ``group_size``, ``group_index``: a task that is one instance of a multi-instance
    training job: the ``group_size`` tasks of one group run as one allocation of that many whole
    machines, task ``group_index`` on the allocation's machine of that index.
    ``memory_bytes``: what the work may use on each of its machines (the instance type's memory times its
    pool's ``limits_scale``); the machine's kernel kills a process of it past that (Slurm: ``--mem``).
    None: no limit of its own.
    """

    reservation: str | None = None
    constraint: str | None = None
    time_limit: timedelta | None = None
    group: str | None = None
    group_size: int = 1
    group_index: int = 0
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.group is not None:
            check_id("group", self.group)
        if self.group_size < 1 or not 0 <= self.group_index < self.group_size:
            raise ValueError(f"group index {self.group_index} of {self.group_size}: out of range")


@dataclass(frozen=True)
class Mount:
    """A host directory seen inside a container at ``target``."""

    source: Path
    target: str
    read_only: bool = False

    def __post_init__(self) -> None:
        target = PurePosixPath(self.target)
        if not target.is_absolute() or ".." in target.parts or "," in self.target or ":" in self.target:
            raise ValueError(f"mount target {self.target!r}: an absolute path without '..', ',' or ':'")


@dataclass(frozen=True)
class IdMap:
    """A container's user namespace: its ids 0..size-1 are the host's ``host_first``.. (so root inside is
    ``host_first`` outside, a user nobody on the host is)."""

    host_first: int
    size: int = 65536

    def __post_init__(self) -> None:
        if self.host_first < 1 or self.size < 1 or self.host_first + self.size > 2**32 - 1:
            raise ValueError(f"id map {self.host_first}+{self.size}: out of the range of ids")


@dataclass(frozen=True)
class Limits:
    """What one container may use: CPUs (fractions allowed), memory in bytes (swap included: none more),
    and processes (threads count)."""

    cpus: float
    memory_bytes: int
    pids: int

    def __post_init__(self) -> None:
        if self.cpus <= 0 or self.memory_bytes < 6 * 2**20 or self.pids < 16:
            raise ValueError(f"limits {self}: cpus > 0, memory >= 6 MiB and pids >= 16")


@dataclass(frozen=True)
class ContainerSpec:
    """Run a node (or a sandboxed task's instance) as a container of ``image`` rather than as host
    processes. Containers naming the same ``pod`` share one network namespace of their own, where the
    names in ``hosts`` resolve to its loopback (a training job's instances, ``algo-1..N``); nothing else
    is reachable there except, with ``endpoint`` (``HOST:PORT`` on the host), that address, served
    inside at ``127.0.0.1`` on the same port. Without ``endpoint`` the pod has no way out at all. An
    image the back end's store does not have yet is pulled as the node is made (with the NodeSpec's
    ``image_login``, else anonymously)."""

    image: str
    ids: IdMap
    limits: Limits
    pod: str | None = None
    hosts: tuple[str, ...] = ()
    endpoint: str | None = None
    mounts: tuple[Mount, ...] = ()
    insecure_registry: bool = False
    """Where the back end pulls ``image`` itself (it is not in its store yet): over plain HTTP."""
    disk_bytes: int | None = None
    """A disk of this size of the node's own (``backends/disks.py``), seen inside as ``/opt/sagemaker``,
    ``/tmp`` and ``/var/tmp``; None: those are the image's own directories."""

    def __post_init__(self) -> None:
        if self.pod is not None:
            check_id("pod", self.pod)
        for host in self.hosts:
            check_id("host name", host)


@dataclass(frozen=True)
class Login:
    """A registry's username and password (``services/accounts/registry_credentials.py`` keeps them
    sealed): what an image is pulled with."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class NodeSpec:
    """One node to provision.

    ``lifecycle_source`` is a local directory: the caller has already resolved the group's
    ``LifeCycleConfig.SourceS3Uri`` to it. The back end copies it to the node and runs ``on_create``
    (a path inside it) there, with ``on_create_args``. ``env`` is given to every process on the node.
    """

    node_id: str
    name: str
    instance_type: str
    env: Mapping[str, str] = field(default_factory=dict)
    lifecycle_source: Path | None = None
    on_create: str | None = None
    on_create_args: tuple[str, ...] = ()
    run_as: RunAs | None = None
    placement: Placement | None = None
    container: ContainerSpec | None = None
    """None: the node's processes are host processes (the ``process`` runtime)."""
    image_login: Login | None = field(default=None, repr=False)
    """What the back end logs in to the container image's registry with, if it pulls it; never kept in
    the node's record (only in a 0600 file of root's until the pull is done)."""

    def __post_init__(self) -> None:
        check_id("node id", self.node_id)
        check_env(self.env)
        if self.on_create is not None:
            script = PurePosixPath(self.on_create)
            if self.lifecycle_source is None:
                raise ValueError("on_create needs a lifecycle_source to find it in")
            if not self.on_create or script.is_absolute() or ".." in script.parts:
                raise ValueError(f"on_create {self.on_create!r}: must be a path inside the lifecycle source")


@dataclass(frozen=True)
class TaskSpec:
    """One process to run.

    ``env`` is the process's environment, over a minimal base (PATH, LANG, HOME) that it may override;
    the back end adds its own ``HYPERPLAN_*`` variables, the node's ``env`` and published variables.
    ``cwd`` defaults to the node's home. With ``node_id=None`` the task gets an instance sandbox of its
    own, and ``signal``/``terminate`` of the task then reach every process of that sandbox; on a shared
    node they reach the task's process group only.
    """

    task_id: str
    argv: tuple[str, ...]
    node_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    run_as: RunAs | None = None
    """For a sandboxed task (``node_id=None``); a task on a node runs as the node's user."""
    placement: Placement | None = None
    """For a sandboxed task: where its instance runs (see :class:`Placement`)."""
    container: ContainerSpec | None = None
    """For a sandboxed task: its instance is this container, and ``argv`` and ``cwd`` are seen inside."""

    def __post_init__(self) -> None:
        check_id("task id", self.task_id)
        if self.node_id is not None:
            check_id("node id", self.node_id)
        if not self.argv:
            raise ValueError("argv must name a program")
        check_env(self.env)


# --- statuses ---------------------------------------------------------------------------------------


class NodeState(StrEnum):
    PENDING = "Pending"
    """Being provisioned: the lifecycle scripts are being copied or OnCreate runs."""
    RUNNING = "Running"
    """OnCreate exited 0 (or there was none): tasks and exec run."""
    FAILURE = "Failure"
    """Provisioning failed, or the node's processes died on their own; the message says why."""
    SHUTTING_DOWN = "ShuttingDown"
    """Terminating: SIGTERM sent, SIGKILL due when the grace has passed."""
    TERMINATED = "Terminated"
    """Nothing of the node runs any more. The only final state."""

    def is_final(self) -> bool:
        return self is NodeState.TERMINATED


class TaskState(StrEnum):
    PENDING = "Pending"
    """Accepted, not started yet (its node is still Pending, or the start is under way)."""
    RUNNING = "Running"
    EXITED = "Exited"
    """Ended by itself: ``exit_code`` says how."""
    KILLED = "Killed"
    """Ended by a signal (``signal``), or stopped before it started (``signal`` is None)."""
    LOST = "Lost"
    """Ended without a witness: what watched it died, so how it ended is unknown."""

    def is_final(self) -> bool:
        return self in (TaskState.EXITED, TaskState.KILLED, TaskState.LOST)


@dataclass(frozen=True)
class NodeStatus:
    state: NodeState
    message: str = ""
    host: str = field(default="", compare=False)
    """The machine the node runs on, once known (Slurm: the node's name); "" when the back end has
    no machines of its own (local, fake)."""
    died: bool = False
    """A Failure of the node's own making, not of its provisioning: what runs the node died (the local
    back end's node agent). The message says how, and what it said last. Automatic node recovery
    replaces such a node (services/clusters/node_recovery.py); a failed OnCreate would fail again."""


@dataclass(frozen=True)
class TaskStatus:
    """How a task stands. ``message`` holds the tail of its stderr once it has ended."""

    state: TaskState
    exit_code: int | None = None
    signal: int | None = None
    message: str = ""
    out_of_memory: bool = False
    """It ended after its container's memory limit made the kernel kill a process of it."""


class LogStream(StrEnum):
    STDOUT = "stdout"
    STDERR = "stderr"


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    next_offset: int
    """Where the next read should start; equal to the offset asked for when nothing new was there."""


@dataclass(frozen=True)
class TimedLine:
    """One line of a task's or node's output: when it was written (aware, UTC), on which stream, its
    text (decoded as UTF-8, bad bytes replaced; no newline)."""

    time: datetime
    stream: LogStream
    text: str


@dataclass(frozen=True)
class TimedLines:
    lines: tuple[TimedLine, ...]
    next_cursor: int
    """Where the next read should start; equal to the cursor asked for when nothing new was there."""


def timed_line(micros: int, stream: str, text: bytes) -> TimedLine:
    """A timed log's record (``timedlog.read_records``) as the contract's value."""
    return TimedLine(
        datetime.fromtimestamp(micros / 1_000_000, UTC),
        LogStream.STDOUT if stream == "o" else LogStream.STDERR,
        text.decode(errors="replace"),
    )


@dataclass(frozen=True)
class ExecResult:
    """The outcome of :meth:`Backend.exec`: ``exit_code`` is None when a signal ended the command
    (``signal`` says which) or when it ran out of time (``timed_out``) and was killed. Each stream is
    its first ``output_limit`` bytes; ``*_truncated`` says the command wrote more."""

    exit_code: int | None
    stdout: bytes
    stderr: bytes
    signal: int | None = None
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False


@dataclass(frozen=True)
class AdoptReport:
    """What :meth:`Backend.adopt` found."""

    running: tuple[Ref, ...] = ()
    """Known and still going: reconnected."""
    ended: tuple[Ref, ...] = ()
    """Known, and ended while no server watched (a final task, a Terminated or Failure node)."""
    missing: tuple[Ref, ...] = ()
    """Known to the store, unknown to the back end: the call that makes it never happened. Call
    ``provision``/``run`` again."""
    killed: tuple[Ref, ...] = ()
    """Unknown to the store: killed and removed."""
    stray_pids: tuple[int, ...] = ()
    """Processes that belonged to no known node or task: killed."""


# --- the contract -----------------------------------------------------------------------------------


@runtime_checkable
class Backend(Protocol):
    """An execution back end. See the module docstring for the rules every method keeps."""

    def provision(self, spec: NodeSpec) -> None:
        """Create the node and start its OnCreate script, if any. Returns at once; the node is Pending
        until the script has ended. Again with the same spec: nothing happens (after a restart: the
        node is started if it never was)."""
        ...

    def run(self, spec: TaskSpec) -> None:
        """Start a task: on its node (queued until the node is Running) or, with ``node_id=None``, in
        a sandbox of its own. Returns at once. Raises :class:`UnknownResource` for an unknown node and
        :class:`NodeUnavailable` for one that is shutting down, terminated or failed."""
        ...

    def node_status(self, node_id: str) -> NodeStatus:
        """How the node stands now. Raises :class:`UnknownResource`."""
        ...

    def task_status(self, task_id: str) -> TaskStatus:
        """How the task stands now. Raises :class:`UnknownResource`."""
        ...

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        """Publish ``env`` to the node (see the module docstring), then send ``sig`` to every process of
        a node, of a sandboxed task, or of a task's process group. Nothing happens for ended work."""
        ...

    def terminate(
        self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None, hook: str | None = None
    ) -> None:
        """Publish ``env``, send SIGTERM now, SIGKILL to whatever is left once ``grace`` has passed in
        real time, even if the server dies meanwhile. Returns at once: a node is ShuttingDown, then
        Terminated; a task ends Exited or Killed. Again: the earlier SIGKILL deadline wins.

        ``hook`` (nodes only): a script of the node's lifecycle directory that, if the node is Running
        and has it, runs first, as the node's processes do, its output in the node's log, for at most
        ``grace``; SIGTERM follows when it ends, SIGKILL ``grace`` later (the reclaim's on_reclaim.sh)."""
        ...

    def exec(
        self,
        node_id: str,
        argv: Iterable[str],
        timeout: timedelta,
        env: Mapping[str, str] | None = None,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run a command on a Running node, in its home and with its environment, and wait for it up to
        ``timeout`` (then kill it). The one blocking method. Raises :class:`NodeUnavailable`. At most
        ``output_limit`` bytes of each stream are returned, and never more are held in memory."""
        ...

    def read_log(self, ref: Ref, stream: LogStream, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        """Up to ``limit`` bytes of a task's output (for a node: its OnCreate's) from ``offset``. To
        follow a log, call again from ``next_offset`` until the task is final and nothing more comes."""
        ...

    def read_lines(
        self, ref: Ref, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        """Up to ``limit`` timed lines of a task's output (for a node: its OnCreate's), both streams in the
        order they were read, from ``cursor`` (0: the start). With ``max_bytes`` the read also stops once
        its lines' texts hold that many bytes as written (the line that reaches it is the last), so that
        it holds at most ``max_bytes`` and one line. Follow as with ``read_log``; a line still being
        written is not returned until it is whole (or cut: see the module docstring)."""
        ...

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        """After a server start: take over the work of ``known`` refs, kill everything else. Call once,
        before anything else, with every node and task id the store knows (ended ones included)."""
        ...

    def forget(self, ref: Ref) -> None:
        """Remove what the back end keeps of a Terminated node or a final task (logs included).
        Raises :class:`NodeUnavailable` for work that has not ended; an unknown ref is fine."""
        ...

    def clear_user(self, run_as: RunAs) -> None:
        """An account's OS user is going (``accounts delete``): end every process it has on the machines
        this back end runs work on, and remove every file it owns in their scratch directories
        (``/tmp``, ``/var/tmp``, ``/dev/shm``: ``backends/scratch.py``). The caller has ended and
        forgotten the account's nodes and tasks first. Never for uid 0."""
        ...

    def close(self) -> None:
        """Release the back end's own resources. Never stops any node or task: they outlive the server."""
        ...
