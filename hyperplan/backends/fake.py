"""An in-memory back end with the same contract as the real ones, for fast service tests.

Nothing runs. A :class:`FakeWorld` stands for the machine: it holds the nodes and tasks and outlives
any :class:`FakeBackend` over it, so a test "restarts the server" by making a new ``FakeBackend`` over
the same world and calling ``adopt``. What a process does is a :class:`Program` (exit with a code,
after some seconds or never, write some output, obey or ignore SIGTERM); the world maps a task's argv,
or a node's lifecycle source, to a program (see :meth:`FakeWorld.command` and
:meth:`FakeWorld.lifecycle`), and falls back to the back end's defaults. Time is the world's clock
(``time.monotonic`` unless a test gives another): a program "ends" when the clock passes its end, as
seen by the next call. Tests may also drive the world directly: :meth:`FakeBackend.complete`,
:meth:`FakeBackend.finish_provision`, :meth:`FakeBackend.fail_provision`, :meth:`FakeBackend.lose_node`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from signal import SIGKILL, SIGTERM, Signals

from hyperplan.backends.base import (
    EXEC_OUTPUT_LIMIT,
    AdoptReport,
    BackendError,
    ExecResult,
    LogChunk,
    LogStream,
    NodeRef,
    NodeSpec,
    NodeState,
    NodeStatus,
    NodeUnavailable,
    Ref,
    RunAs,
    SpecConflict,
    TaskRef,
    TaskSpec,
    TaskState,
    TaskStatus,
    TimedLine,
    TimedLines,
    UnknownResource,
    check_env,
)

PROGRAM_ARGV0 = "fake-program"


@dataclass(frozen=True)
class Program:
    """What a fake process does, in place of a script."""

    exit_code: int | None = 0
    """The code it exits with; None: it runs until a signal ends it."""
    seconds: float = 0.0
    """How long it runs before it exits by itself."""
    stdout: bytes = b""
    stderr: bytes = b""
    on_term: int | None = 143
    """The code it exits with on SIGTERM; None: it ignores SIGTERM (so only SIGKILL ends it)."""
    echo: tuple[str, ...] = ()
    """Variables whose values (from its environment at start) it writes to stdout, one a line."""

    @classmethod
    def exits(cls, code: int = 0, *, after: float = 0.0, stdout: bytes = b"", stderr: bytes = b"") -> Program:
        return cls(code, after, stdout, stderr)

    @classmethod
    def runs(cls, *, on_term: int | None = 143, stdout: bytes = b"", echo: tuple[str, ...] = ()) -> Program:
        return cls(None, 0.0, stdout, b"", on_term, echo)


@dataclass
class _Proc:
    program: Program
    started_at: float
    env: dict[str, str]
    outcome: TaskStatus | None = None
    kill_at: float | None = None
    signals: list[int] = field(default_factory=list)
    extra_stdout: bytes = b""
    extra_stderr: bytes = b""
    started_wall: float = field(default_factory=time.time)
    """When it started, as wall time: its program's output is timed then."""
    extra_lines: list[TimedLine] = field(default_factory=list)
    """Output a test added later (:meth:`FakeBackend.complete`), timed when added."""

    def status(self, now: float) -> TaskStatus:
        if self.outcome is None:
            self.outcome = self._natural_end(now)
        return self.outcome or TaskStatus(TaskState.RUNNING)

    def _natural_end(self, now: float) -> TaskStatus | None:
        ends: list[tuple[float, TaskStatus]] = []
        if self.program.exit_code is not None:
            ends.append((self.started_at + self.program.seconds, self._exited(self.program.exit_code)))
        if self.kill_at is not None:
            ends.append((self.kill_at, TaskStatus(TaskState.KILLED, signal=SIGKILL, message=self._tail())))
        ended = [status for when, status in sorted(ends, key=lambda end: end[0]) if when <= now]
        return ended[0] if ended else None

    def deliver(self, sig: int, now: float, kill_at: float | None = None) -> None:
        if self.status(now).state.is_final():
            return
        self.signals.append(sig)
        if sig == SIGKILL:
            self.outcome = TaskStatus(TaskState.KILLED, signal=SIGKILL, message=self._tail())
        elif sig == SIGTERM and self.program.on_term is not None:
            self.outcome = self._exited(self.program.on_term)
        elif sig == SIGTERM and kill_at is not None:
            self.kill_at = kill_at if self.kill_at is None else min(self.kill_at, kill_at)

    def stdout(self) -> bytes:
        echoed = b"".join(f"{self.env.get(name, '')}\n".encode() for name in self.program.echo)
        return self.program.stdout + echoed + self.extra_stdout

    def stderr(self) -> bytes:
        return self.program.stderr + self.extra_stderr

    def timed_lines(self) -> list[TimedLine]:
        """Both streams line by line: the program's output at its start, then what was added later."""
        echoed = b"".join(f"{self.env.get(name, '')}\n".encode() for name in self.program.echo)
        at = datetime.fromtimestamp(self.started_wall, UTC)
        return [
            *_timed(self.program.stdout + echoed, LogStream.STDOUT, at),
            *_timed(self.program.stderr, LogStream.STDERR, at),
            *self.extra_lines,
        ]

    def _exited(self, code: int) -> TaskStatus:
        return TaskStatus(TaskState.EXITED, exit_code=code, message=self._tail())

    def _tail(self) -> str:
        return self.stderr()[-2000:].decode(errors="replace").strip()


@dataclass
class _Task:
    spec: TaskSpec
    proc: _Proc | None = None
    outcome: TaskStatus | None = None
    """How it ended without a process: stopped before it started, or lost."""

    def status(self, now: float) -> TaskStatus:
        if self.outcome is not None:
            return self.outcome
        if self.proc is None:
            return TaskStatus(TaskState.PENDING)
        return self.proc.status(now)


@dataclass
class _Node:
    spec: NodeSpec
    on_create: _Proc | None
    sandbox_task: str | None = None
    state: NodeState = NodeState.PENDING
    message: str = ""
    died: bool = False
    published: dict[str, str] = field(default_factory=dict)
    terminate_at: float | None = None
    tasks: list[str] = field(default_factory=list)


def _timed(data: bytes, stream: LogStream, at: datetime) -> list[TimedLine]:
    pieces = data.split(b"\n")
    if pieces and pieces[-1] == b"":
        pieces.pop()
    return [TimedLine(at, stream, piece.decode(errors="replace")) for piece in pieces]


def _up_to_bytes(lines: list[TimedLine], max_bytes: int | None) -> list[TimedLine]:
    """The leading lines a read bounded by `max_bytes` returns: it stops once their texts hold that many
    bytes (the line that reaches it is the last), as the timed log's reader does."""
    if max_bytes is None:
        return lines
    held = 0
    for count, line in enumerate(lines, start=1):
        held += len(line.text.encode())
        if held >= max_bytes:
            return lines[:count]
    return lines


class FakeWorld:
    """The machine the fake back ends run on: survives them, as real processes survive the server."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.wall = wall
        """Wall time (epoch seconds) for the timed lines: when a program starts, when output is added."""
        self.lock = threading.RLock()
        self.nodes: dict[str, _Node] = {}
        self.tasks: dict[str, _Task] = {}
        self.programs: dict[str, Program] = {}
        self.lifecycles: dict[Path, Program] = {}
        self.execs: list[tuple[str, tuple[str, ...], dict[str, str]]] = []
        self._tokens = itertools.count(1)

    def command(self, program: Program) -> tuple[str, ...]:
        """An argv that makes a fake task run ``program``."""
        token = f"p{next(self._tokens)}"
        self.programs[token] = program
        return (PROGRAM_ARGV0, token)

    def lifecycle(self, program: Program) -> tuple[Path, str]:
        """A (lifecycle_source, on_create) pair whose OnCreate runs ``program``."""
        source = Path(f"/fake/lifecycle/{next(self._tokens)}")
        self.lifecycles[source] = program
        return source, "on_create.sh"

    def program_of(self, argv: tuple[str, ...], default: Program) -> Program:
        if len(argv) == 2 and argv[0] == PROGRAM_ARGV0:
            return self.programs.get(argv[1], default)
        return default


class FakeBackend:
    """The fake back end. ``on_create`` and ``task`` are the programs of OnCreate scripts and commands
    the world does not know: by default OnCreate succeeds at once and a task runs until it is
    completed or signalled."""

    def __init__(
        self,
        world: FakeWorld | None = None,
        *,
        on_create: Program = Program.exits(0),
        task: Program = Program.runs(),
    ) -> None:
        self.world = world or FakeWorld()
        self.default_on_create = on_create
        self.default_task = task

    # --- the contract ----------------------------------------------------------------------------

    def provision(self, spec: NodeSpec) -> None:
        with self.world.lock:
            existing = self.world.nodes.get(spec.node_id)
            if existing is not None:
                if existing.spec != spec:
                    raise SpecConflict(f"node {spec.node_id} exists with another spec")
                return
            on_create = None
            if spec.on_create is not None and spec.lifecycle_source is not None:
                program = self.world.lifecycles.get(spec.lifecycle_source, self.default_on_create)
                on_create = _Proc(
                    program, self._now(), self._env(spec.env, {}), started_wall=self.world.wall()
                )
            node = _Node(spec, on_create, state=NodeState.PENDING if on_create else NodeState.RUNNING)
            self.world.nodes[spec.node_id] = node

    def run(self, spec: TaskSpec) -> None:
        with self.world.lock:
            self._advance()
            existing = self.world.tasks.get(spec.task_id)
            if existing is not None:
                if existing.spec != spec:
                    raise SpecConflict(f"task {spec.task_id} exists with another spec")
                return
            if spec.node_id is None:
                sandbox = NodeSpec(f"sandbox.{spec.task_id}", spec.task_id, "")
                node = _Node(sandbox, None, sandbox_task=spec.task_id, state=NodeState.RUNNING)
                self.world.nodes[sandbox.node_id] = node
            else:
                node = self._node(spec.node_id)
                if node.state not in (NodeState.PENDING, NodeState.RUNNING):
                    raise NodeUnavailable(f"node {spec.node_id} is {node.state}: it takes no new tasks")
            node.tasks.append(spec.task_id)
            self.world.tasks[spec.task_id] = _Task(spec)
            self._advance()

    def node_status(self, node_id: str) -> NodeStatus:
        with self.world.lock:
            self._advance()
            node = self._node(node_id)
            return NodeStatus(node.state, node.message, died=node.died and node.state is NodeState.FAILURE)

    def task_status(self, task_id: str) -> TaskStatus:
        with self.world.lock:
            self._advance()
            return self._task(task_id).status(self._now())

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        with self.world.lock:
            self._advance()
            node, procs = self._target(ref)
            self._publish(node, env)
            for proc in procs:
                proc.deliver(sig, self._now())
            self._advance()

    def terminate(
        self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None, hook: str | None = None
    ) -> None:
        with self.world.lock:
            self._advance()
            node, procs = self._target(ref)
            self._publish(node, env)
            now = self._now()
            kill_at = now + max(0.0, grace.total_seconds())
            whole_node = isinstance(ref, NodeRef) or (node is not None and node.sandbox_task is not None)
            if node is None:
                return
            if whole_node:
                if node.state is NodeState.TERMINATED:
                    return
                node.terminate_at = kill_at if node.terminate_at is None else min(node.terminate_at, kill_at)
                node.state = NodeState.SHUTTING_DOWN
                for task_id in node.tasks:
                    self._stop_unstarted(
                        self.world.tasks[task_id], "its node was terminated before it started"
                    )
            else:
                assert isinstance(ref, TaskRef)
                self._stop_unstarted(self._task(ref.task_id), "terminated")
            for proc in procs:
                proc.deliver(SIGTERM, now, kill_at)
            self._advance()

    def exec(
        self,
        node_id: str,
        argv: Iterable[str],
        timeout: timedelta,
        env: Mapping[str, str] | None = None,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> ExecResult:
        with self.world.lock:
            self._advance()
            node = self._node(node_id)
            if node.state is not NodeState.RUNNING:
                raise NodeUnavailable(f"node {node_id} is {node.state}: commands run only on Running nodes")
            command = tuple(argv)
            full_env = self._env({**node.spec.env, **(env or {})}, node.published)
            self.world.execs.append((node_id, command, full_env))
            program = self.world.program_of(command, Program.exits(0))
            proc = _Proc(program, 0.0, full_env)
            out, err = proc.stdout(), proc.stderr()
            timed_out = program.exit_code is None or program.seconds > timeout.total_seconds()
            return ExecResult(
                None if timed_out else program.exit_code,
                out[:output_limit],
                err[:output_limit],
                signal=SIGKILL if timed_out else None,
                timed_out=timed_out,
                stdout_truncated=len(out) > output_limit,
                stderr_truncated=len(err) > output_limit,
            )

    def read_log(self, ref: Ref, stream: LogStream, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        with self.world.lock:
            self._advance()
            if isinstance(ref, NodeRef):
                proc = self._node(ref.node_id).on_create
            else:
                proc = self._task(ref.task_id).proc
            data = b"" if proc is None else proc.stdout() if stream is LogStream.STDOUT else proc.stderr()
            chunk = data[offset : offset + limit]
            return LogChunk(chunk, offset + len(chunk))

    def read_lines(
        self, ref: Ref, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        with self.world.lock:
            self._advance()
            if isinstance(ref, NodeRef):
                proc = self._node(ref.node_id).on_create
            else:
                proc = self._task(ref.task_id).proc
            lines = [] if proc is None else proc.timed_lines()
            chunk = _up_to_bytes(lines[cursor : cursor + limit], max_bytes)
            return TimedLines(tuple(chunk), cursor + len(chunk))

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        with self.world.lock:
            self._advance()
            known = set(known)
            running: list[Ref] = []
            ended: list[Ref] = []
            killed: list[Ref] = []
            for node_id, node in list(self.world.nodes.items()):
                if node.sandbox_task is not None:
                    continue
                ref: Ref = NodeRef(node_id)
                if ref not in known:
                    self._kill_node(node)
                    del self.world.nodes[node_id]
                    killed.append(ref)
                    continue
                final = node.state in (NodeState.FAILURE, NodeState.TERMINATED)
                (ended if final else running).append(ref)
            for task_id, task in list(self.world.tasks.items()):
                ref = TaskRef(task_id)
                if ref not in known:
                    self._drop_task(task_id)
                    killed.append(ref)
                    continue
                (ended if task.status(self._now()).state.is_final() else running).append(ref)
            found = {*running, *ended}
            missing = tuple(ref for ref in known if ref not in found)
            return AdoptReport(tuple(running), tuple(ended), missing, tuple(killed))

    def forget(self, ref: Ref) -> None:
        with self.world.lock:
            self._advance()
            if isinstance(ref, NodeRef):
                node = self.world.nodes.get(ref.node_id)
                if node is None:
                    return
                if node.state is not NodeState.TERMINATED:
                    raise NodeUnavailable(f"node {ref.node_id} is {node.state}: terminate it first")
                del self.world.nodes[ref.node_id]
                return
            task = self.world.tasks.get(ref.task_id)
            if task is None:
                return
            state = task.status(self._now()).state
            if not state.is_final():
                raise NodeUnavailable(f"task {ref.task_id} is {state}: terminate it first")
            self._drop_task(ref.task_id)

    def clear_user(self, run_as: RunAs) -> None:
        """The fake has no machine, so nothing of a user lingers on one; uid 0 is refused, as everywhere."""
        if run_as.uid == 0:
            raise BackendError(f"cannot clear {run_as.user}: uid 0 is root")

    def close(self) -> None:
        """Nothing to release: the world goes on."""

    # --- driving it from a test ------------------------------------------------------------------

    def complete(self, task_id: str, exit_code: int = 0, stdout: bytes = b"", stderr: bytes = b"") -> None:
        """End a running task now, as if its process had exited with ``exit_code``."""
        with self.world.lock:
            self._advance()
            task = self._task(task_id)
            if task.proc is None or task.proc.status(self._now()).state.is_final():
                raise NodeUnavailable(f"task {task_id} is not running")
            task.proc.extra_stdout += stdout
            task.proc.extra_stderr += stderr
            at = datetime.fromtimestamp(self.world.wall(), UTC)
            task.proc.extra_lines += [
                *_timed(stdout, LogStream.STDOUT, at),
                *_timed(stderr, LogStream.STDERR, at),
            ]
            task.proc.outcome = task.proc._exited(exit_code)
            self._advance()

    def finish_provision(self, node_id: str) -> None:
        """End a Pending node's OnCreate with exit code 0 now."""
        with self.world.lock:
            node = self._node(node_id)
            if node.on_create is not None and node.state is NodeState.PENDING:
                node.on_create.outcome = TaskStatus(TaskState.EXITED, exit_code=0)
            self._advance()

    def fail_provision(self, node_id: str, message: str) -> None:
        """Make a Pending node's OnCreate fail now, with ``message`` as its error output."""
        with self.world.lock:
            node = self._node(node_id)
            if node.state is NodeState.PENDING:
                node.state, node.message = NodeState.FAILURE, message
                if node.on_create is not None:
                    node.on_create.outcome = TaskStatus(TaskState.EXITED, exit_code=1, message=message)

    def lose_node(self, node_id: str, message: str = "the node was lost") -> None:
        """What the real back end reports when a node's agent dies: Failure, its tasks Lost."""
        with self.world.lock:
            self._advance()
            node = self._node(node_id)
            for task_id in node.tasks:
                task = self.world.tasks[task_id]
                if not task.status(self._now()).state.is_final():
                    task.outcome = TaskStatus(TaskState.LOST, message=f"ended unwatched: {message}")
            node.state, node.message, node.died = NodeState.FAILURE, message, True

    def published_env(self, ref: Ref) -> dict[str, str]:
        """The variables published to the node of ``ref`` (its ``$HYPERPLAN_ENV_DIR``)."""
        with self.world.lock:
            node = self._target(ref)[0]
            return dict(node.published) if node is not None else {}

    def signals_of(self, task_id: str) -> list[int]:
        """The signals delivered to a task's process, in order."""
        with self.world.lock:
            proc = self._task(task_id).proc
            return list(proc.signals) if proc is not None else []

    # --- the world's time ------------------------------------------------------------------------

    def _now(self) -> float:
        return self.world.clock()

    def _advance(self) -> None:
        """Bring every node and task up to the clock: OnCreate outcomes, starts on Running nodes,
        SIGKILL deadlines, sandboxes that end with their task."""
        now = self._now()
        for node in list(self.world.nodes.values()):
            self._advance_node(node, now)

    def _advance_node(self, node: _Node, now: float) -> None:
        if node.state is NodeState.PENDING and node.on_create is not None:
            status = node.on_create.status(now)
            if status.state is TaskState.EXITED and status.exit_code == 0:
                node.state = NodeState.RUNNING
            elif status.state.is_final():
                node.state, node.message = NodeState.FAILURE, _failure_message(node, status)
        if node.state is NodeState.RUNNING:
            for task_id in node.tasks:
                task = self.world.tasks[task_id]
                if task.proc is None and task.outcome is None:
                    env = self._env({**node.spec.env, **task.spec.env}, node.published)
                    program = self.world.program_of(task.spec.argv, self.default_task)
                    task.proc = _Proc(program, now, env, started_wall=self.world.wall())
        if node.state is NodeState.SHUTTING_DOWN:
            procs = self._procs(node)
            if all(proc.status(now).state.is_final() for proc in procs):
                node.state = NodeState.TERMINATED
        sandbox_task = self.world.tasks.get(node.sandbox_task or "")
        if node.state is NodeState.RUNNING and sandbox_task and sandbox_task.status(now).state.is_final():
            node.state = NodeState.TERMINATED  # a sandbox lives as long as its task

    # --- helpers ---------------------------------------------------------------------------------

    def _node(self, node_id: str) -> _Node:
        node = self.world.nodes.get(node_id)
        if node is None or node.sandbox_task is not None:
            raise UnknownResource(f"no node {node_id}")
        return node

    def _task(self, task_id: str) -> _Task:
        task = self.world.tasks.get(task_id)
        if task is None:
            raise UnknownResource(f"no task {task_id}")
        return task

    def _node_of(self, task: _Task) -> _Node | None:
        """The task's node or sandbox; None once it has been removed (killed by adopt)."""
        node_id = task.spec.node_id if task.spec.node_id is not None else f"sandbox.{task.spec.task_id}"
        return self.world.nodes.get(node_id)

    def _target(self, ref: Ref) -> tuple[_Node | None, list[_Proc]]:
        if isinstance(ref, NodeRef):
            node = self._node(ref.node_id)
            return node, self._procs(node)
        task = self._task(ref.task_id)
        host = self._node_of(task)
        if host is not None and host.sandbox_task is not None:
            return host, self._procs(host)
        return host, [task.proc] if task.proc is not None else []

    def _procs(self, node: _Node) -> list[_Proc]:
        procs = [self.world.tasks[task_id].proc for task_id in node.tasks]
        return [proc for proc in (node.on_create, *procs) if proc is not None]

    def _stop_unstarted(self, task: _Task, why: str) -> None:
        if task.proc is None and task.outcome is None:
            task.outcome = TaskStatus(TaskState.KILLED, message=f"stopped before it started: {why}")

    def _kill_node(self, node: _Node) -> None:
        for proc in self._procs(node):
            proc.deliver(SIGKILL, self._now())
        for task_id in node.tasks:
            self._stop_unstarted(self.world.tasks[task_id], "its node was killed")
        node.state = NodeState.TERMINATED

    def _drop_task(self, task_id: str) -> None:
        task = self.world.tasks[task_id]
        node = self._node_of(task)
        if node is not None and node.sandbox_task is not None:
            self._kill_node(node)
            del self.world.nodes[node.spec.node_id]
        elif node is not None:
            if task.proc is not None:
                task.proc.deliver(SIGKILL, self._now())
            node.tasks.remove(task_id)
        del self.world.tasks[task_id]

    def _publish(self, node: _Node | None, env: Mapping[str, str] | None) -> None:
        if env and node is not None:
            check_env(env)
            node.published.update(env)

    def _env(self, env: Mapping[str, str], published: Mapping[str, str]) -> dict[str, str]:
        return {**env, **published}


def _failure_message(node: _Node, status: TaskStatus) -> str:
    how = f"exited with code {status.exit_code}" if status.exit_code is not None else "was killed"
    return f"OnCreate script {node.spec.on_create} {how}" + (f": {status.message}" if status.message else "")
