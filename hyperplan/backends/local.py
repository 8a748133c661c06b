"""The local back end, the embedded default: every node and every job instance is real on this machine.

A node is a directory (``ROOT/nodes/NODE_ID``, see ``layout.py``) and a node agent (``agent.py``): a
small process, detached from the server, that leads the node's session, is the parent of every process
on the node and writes what happens to them into files. The server never waits on a process; it writes
orders (a spec, a queue entry, a terminate order), pokes the agent with SIGUSR1, and reads the files
back. So:

- **The server may die at any time.** Agents and their processes run on; exit statuses are still
  written (by the agent, their parent). A new :class:`LocalBackend` over the same root reads the same
  files and :meth:`~LocalBackend.adopt` reconnects what the store knows and kills the rest, including
  strays found by the ``HYPERPLAN_BACKEND_ROOT`` variable every process of the back end carries.
- **SIGKILL after the grace is the agent's job.** It keeps the deadline (CLOCK_MONOTONIC, real time)
  from the terminate order and kills at that time, with or without a server. The server arms a backstop
  timer too, a little later, for an agent that hangs.
- **An agent that dies** (it should not) leaves processes nobody can watch: the next look at its node
  (a status call, adopt) kills them at once and records the node as Failure (Terminated if it was being
  terminated), saying how the agent ended and what it said last, and its unfinished tasks as Lost.
  How it ended only a parent learns: the agent's parent is a shell that waits for it and writes its
  exit status (a SIGKILL leaves the agent itself no chance to say anything).

One root belongs to one server at a time: ``adopt`` kills whatever under the root it was not told about.

**Privileges.** A node or sandbox whose spec has ``run_as`` (isolation mode ``users``) runs its work as
that OS user; without one, as the server's own user, as before. The agent itself stays the server's user
(root): it writes the records the back end trusts. Each child it forks (OnCreate, a task, an ``exec``
command, which is a task too) closes every descriptor above 2, drops every supplementary group, sets its
gid, then its uid (real, effective and saved), checks that it cannot become root again, and only then
changes to its directory and execs, with HOME the node's home and USER/LOGNAME the user's. The home is
filled as root (the lifecycle scripts copied with their links as links, the OnCreate script opened
without following one) and handed to the user afterwards, entry by entry with lchown, the top last and
0700; every other file under the root stays root's and 0600 in directories of 0711 (see ``layout.py``),
so a tenant reaches its own home and nothing else. ``run_as`` with a server that is not root, or naming
uid or gid 0, is refused with :class:`BackendError`, never quietly run as the server. The variables a
tenant's processes carry name the back end's root and their node's directory; the root should lie
outside the server's data directory, which this module does not decide.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from signal import SIGKILL, SIGUSR1, Signals

import hyperplan
from hyperplan.backends import containers, disks, procfs, scratch, tenant_files
from hyperplan.backends.base import (
    EXEC_OUTPUT_LIMIT,
    AdoptReport,
    BackendError,
    ExecResult,
    LogChunk,
    Login,
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
    TimedLines,
    UnknownResource,
    check_env,
    check_id,
    timed_line,
)
from hyperplan.backends.commands import run_command
from hyperplan.backends.layout import (
    NODE_DIR_VARIABLE,
    PASSAGE_MODE,
    PRIVATE_MODE,
    READABLE_DIR_MODE,
    READABLE_FILE_MODE,
    RECORD_MODE,
    ROOT_VARIABLE,
    ExitRecord,
    Layout,
    NodeFiles,
    NodeRecord,
    ProcRecord,
    StateRecord,
    TaskFiles,
    TaskRecord,
    TerminateOrder,
    inherited_mark,
    make_dir,
    placement_record,
    read_record,
    run_as_of,
    run_as_record,
    tail,
    write_atomically,
    write_record,
)

AGENT_START_SECONDS = 30.0
"""An agent that has not written its record this long after its node was made never started."""
WATCH_WAIT_SECONDS = 2.0
"""How long a look at a node whose agent has just died waits for the agent's parent to write how it
ended (it does so at once: this only bounds the wait on a parent that was stopped)."""
LAST_WORDS = 500
"""How much of the end of a dead agent's error output its node's failure quotes."""
WATCH_SCRIPT = (
    'exit_file=$1; shift; { ( "$@" ) >&3 2>&3 3>&-; code=$?; [ "$code" = 0 ] || { umask 077; '
    'echo "$code" > "$exit_file.new" && mv -f "$exit_file.new" "$exit_file"; }; } 3>&2 >/dev/null 2>&1 & '
    "echo $!"
)
"""The agent's launcher: the agent runs in the background, its output to the agent's log, under a shell
that waits for it and then writes its exit status unless it is 0 (an agent that ends its node, or a
duplicate start, exits 0), atomically as every record; the shell's pid is printed for the server. The
shell's own words (sh reports a child's fatal signal) go nowhere: the log holds the agent's alone. The
agent is a subshell that execs it, so that its output is redirected in the child: sh redirects a plain
command's output in the shell itself, where its report would follow."""
BACKSTOP_MARGIN_SECONDS = 2.0
"""How long after a SIGKILL deadline the server kills for an agent that has not."""
PACKAGE_PARENT = Path(hyperplan.__file__).resolve().parent.parent


class LocalBackend:
    """Nodes and tasks as processes on this machine, under ``root``. See the module docstring."""

    def __init__(self, root: Path, python: str = sys.executable, podman_store: Path | None = None) -> None:
        self.layout = Layout(root.resolve())
        for directory in (self.layout.root, self.layout.nodes, self.layout.tasks):
            make_dir(directory, PASSAGE_MODE)
        self.python = python
        self.podman_store = podman_store
        """Where images and containers are kept (``containers/podman.py``); None: no containers."""
        self.podman = containers.Podman(podman_store, self.layout.root) if podman_store else None
        self._timers: set[threading.Timer] = set()
        self._timers_lock = threading.Lock()

    # --- nodes -----------------------------------------------------------------------------------

    def provision(self, spec: NodeSpec) -> None:
        _check_run_as(spec.run_as)
        source = str(spec.lifecycle_source.resolve()) if spec.lifecycle_source else None
        record = NodeRecord(
            spec.node_id,
            spec.name,
            spec.instance_type,
            dict(spec.env),
            source,
            spec.on_create,
            list(spec.on_create_args),
            sandbox_task=None,
            run_as=run_as_record(spec.run_as),
            placement=placement_record(spec.placement),
            container=containers.spec_record(spec.container, self.podman_store),
        )
        files = self.layout.node(spec.node_id)
        login = None
        if spec.container is not None and spec.image_login is not None:
            login = (spec.container.image, spec.image_login)
        self._make_node(files, record, login=login)

    def node_status(self, node_id: str) -> NodeStatus:
        files = self._node(node_id)
        self._settle(files)
        return _node_status(files)

    def exec(
        self,
        node_id: str,
        argv: Iterable[str],
        timeout: timedelta,
        env: Mapping[str, str] | None = None,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> ExecResult:
        return run_command(self, node_id, argv, timeout, env, output_limit, kill_wait=5.0)

    # --- tasks -----------------------------------------------------------------------------------

    def run(self, spec: TaskSpec) -> None:
        files = self.layout.task(spec.task_id)
        cwd = str(spec.cwd) if spec.cwd else None
        _check_run_as(spec.run_as)
        run_as = run_as_record(spec.run_as)
        container = containers.spec_record(spec.container, self.podman_store)
        if container is not None:
            containers.check_passable(spec.env)
        record = TaskRecord(
            spec.task_id,
            spec.node_id,
            list(spec.argv),
            dict(spec.env),
            cwd,
            run_as,
            placement_record(spec.placement),
            container,
        )
        existing = read_record(files.spec, TaskRecord)
        if existing is not None and existing != record:
            raise SpecConflict(f"task {spec.task_id} exists with another spec")
        if spec.node_id is None:
            self._write_task(files, record)
            sandbox = NodeRecord(
                spec.task_id, spec.task_id, "", {}, None, None, [], spec.task_id, run_as, container=container
            )
            self._make_node(NodeFiles(files.sandbox), sandbox, queue=spec.task_id)
            return
        node = self._node(spec.node_id)
        if spec.run_as is not None:
            node_record = read_record(node.spec, NodeRecord)
            if node_record is None or run_as_of(node_record) != spec.run_as:
                raise BackendError(f"task {spec.task_id}: a task on a node runs as the node's user")
        if existing is None:
            state = self.node_status(spec.node_id).state
            if state not in (NodeState.PENDING, NodeState.RUNNING):
                raise NodeUnavailable(f"node {spec.node_id} is {state}: it takes no new tasks")
            self._write_task(files, record)
        (node.queue / spec.task_id).touch()
        self._poke(node)

    def task_status(self, task_id: str) -> TaskStatus:
        files = self._task(task_id)
        if not files.exit.exists():
            self._settle_task(files)
        ended = read_record(files.exit, ExitRecord)
        if ended is not None:
            message = ended.message or tail(files.log(LogStream.STDERR))
            return TaskStatus(
                TaskState(ended.state), ended.exit_code, ended.signal, message, ended.out_of_memory
            )
        if files.proc.exists():
            return TaskStatus(TaskState.RUNNING)
        return TaskStatus(TaskState.PENDING)

    # --- signals ---------------------------------------------------------------------------------

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        node, task = self._target(ref)
        self._publish(node, env)
        if self._has_ended(ref):
            return
        if task is None:
            agent = self._live_agent(node)
            if agent is not None:
                procfs.send(self._programs(node, agent), sig)
            return
        self._signal_task(node, task, sig)

    def terminate(
        self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None, hook: str | None = None
    ) -> None:
        node, task = self._target(ref)
        self._publish(node, env)
        if self._has_ended(ref):
            return
        seconds = max(0.0, grace.total_seconds())
        hook = hook if task is None else None  # a task has no lifecycle of its own
        # With a hook, SIGKILL is due a grace after the hook's: the agent sends SIGTERM when it ends.
        order = TerminateOrder(seconds, time.monotonic() + seconds * (2 if hook else 1), hook=hook)
        path = node.terminate if task is None else task.terminate
        earlier = read_record(path, TerminateOrder)
        if earlier is None or order.deadline < earlier.deadline:
            write_record(path, order)
        else:
            order = earlier
        self._poke(node)
        self._arm_backstop(ref, order.deadline)

    # --- logs ------------------------------------------------------------------------------------

    def read_log(self, ref: Ref, stream: LogStream, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        if isinstance(ref, NodeRef):
            path = self._node(ref.node_id).log(stream)
        else:
            path = self._task(ref.task_id).log(stream)
        data = tenant_files.read_at(path, offset, limit)
        return LogChunk(data, offset + len(data))

    def read_lines(
        self, ref: Ref, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        # Imported here: `python3 -m hyperplan.backends.timedlog` imports this package first, and a
        # module it had already imported would run twice.
        from hyperplan.backends import timedlog

        files = self._node(ref.node_id) if isinstance(ref, NodeRef) else self._task(ref.task_id)
        records, next_cursor = timedlog.read_records(files.timed, cursor, limit, max_bytes)
        return TimedLines(tuple(timed_line(*found) for found in records), next_cursor)

    # --- restart ---------------------------------------------------------------------------------

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        known = set(known)
        running: list[Ref] = []
        ended: list[Ref] = []
        killed: list[Ref] = []
        for node_id in self.layout.node_ids():
            ref: Ref = NodeRef(node_id)
            files = self.layout.node(node_id)
            if not files.spec.exists():
                shutil.rmtree(files.path, ignore_errors=True)  # provision was cut short: nothing ran
            elif ref not in known:
                self._destroy(files)
                killed.append(ref)
            else:
                state = self.node_status(node_id).state
                if state in (NodeState.FAILURE, NodeState.TERMINATED):
                    ended.append(ref)
                else:
                    running.append(ref)
                    self._resume_backstop(ref, files.terminate)
        for task_id in self.layout.task_ids():
            ref = TaskRef(task_id)
            task = self.layout.task(task_id)
            if not task.spec.exists():
                shutil.rmtree(task.path, ignore_errors=True)  # run was cut short: nothing ran
            elif ref not in known:
                self._kill_task(task)
                killed.append(ref)
            elif self._placed(task):
                if self.task_status(task_id).state.is_final():
                    ended.append(ref)
                else:
                    running.append(ref)
                    self._resume_backstop(ref, task.terminate)
            # else: run was cut short after the spec; the caller sees it missing and runs it again.
        found = {*running, *ended}
        missing = tuple(ref for ref in known if ref not in found)
        return AdoptReport(tuple(running), tuple(ended), missing, tuple(killed), self._sweep_strays())

    def forget(self, ref: Ref) -> None:
        if isinstance(ref, NodeRef):
            files = self.layout.node(check_id("node id", ref.node_id))
            if not files.spec.exists():
                return
            state = self.node_status(ref.node_id).state
            if not state.is_final():
                raise NodeUnavailable(f"node {ref.node_id} is {state}: terminate it first")
            disks.release_under(files.path)
            shutil.rmtree(files.path, ignore_errors=True)
            return
        task = self.layout.task(check_id("task id", ref.task_id))
        if not task.spec.exists():
            return
        status = self.task_status(ref.task_id)
        if not status.state.is_final():
            raise NodeUnavailable(f"task {ref.task_id} is {status.state}: terminate it first")
        self._kill_task(task)

    def clear_user(self, run_as: RunAs) -> None:
        """This machine is the only one: its processes of the user, then its files in the scratch
        directories (what it owns under the work directory is the caller's to remove)."""
        if run_as.uid == 0:
            raise BackendError(f"cannot clear {run_as.user}: uid 0 is root")
        scratch.clear_user(run_as.uid, scratch.SCRATCH_DIRS)

    def close(self) -> None:
        with self._timers_lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    # --- nodes: making and settling -------------------------------------------------------------

    def _make_node(
        self,
        files: NodeFiles,
        record: NodeRecord,
        queue: str | None = None,
        login: tuple[str, Login] | None = None,
    ) -> None:
        """The node's files, then its agent; ``login``: the image and the registry login its agent pulls
        it with (a file of root's until the pull is done, never in the record)."""
        existing = read_record(files.spec, NodeRecord)
        if existing is None:
            # home stays the server's until the agent has filled it and hands it to the node's user.
            make_dir(files.path, PASSAGE_MODE)
            make_dir(files.env_dir, READABLE_DIR_MODE)
            make_dir(files.queue, PRIVATE_MODE)
            make_dir(files.home, PRIVATE_MODE)
            if queue is not None:
                (files.queue / queue).touch()
            if login is not None:
                containers.write_pull_login(files.path, *login)
            # Written last: a node exists once its spec does.
            write_record(files.spec, record)
        elif existing != record:
            raise SpecConflict(f"node {record.node_id} exists with another spec")
        # Started only once: an agent leaves its record, a node whose agent never came is settled.
        if not files.agent.exists() and not files.state.exists():
            self._launch(files)

    def _launch(self, files: NodeFiles) -> None:
        """Start the node's agent detached: sh starts a waiting shell in the background (see
        WATCH_SCRIPT) and exits, so the agent's parent is that shell, not the server, and nothing of the
        server's death reaches it. The node's marks are the agent's alone (``env`` sets them for it):
        the waiting shell must never count among the node's processes, which are killed at its end."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "PYTHONPATH": str(PACKAGE_PARENT),
            **inherited_mark(),
        }
        marks = [f"{ROOT_VARIABLE}={self.layout.root}", f"{NODE_DIR_VARIABLE}={files.path}"]
        argv = ["env", *marks, self.python, "-m", "hyperplan.backends.agent", str(self.layout.root)]
        argv.append(str(files.path))
        log_fd = os.open(files.agent_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, RECORD_MODE)
        with os.fdopen(log_fd, "ab") as log:
            launcher = subprocess.run(
                ["/bin/sh", "-c", WATCH_SCRIPT, "sh", str(files.agent_exit), *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=files.path,
                start_new_session=True,
                timeout=30,
                check=False,
            )
        with contextlib.suppress(ValueError, ProcessLookupError):  # gone already: it wrote the status
            watch = int(launcher.stdout)
            write_record(files.watch, ProcRecord(watch, procfs.starttime_of(watch)))

    def _settle(self, files: NodeFiles) -> None:
        """Finish for an agent that is gone without finishing: kill what is left of the node, record
        how it ended, and lose its unfinished tasks. Does nothing while the agent lives."""
        state = read_record(files.state, StateRecord)
        if state is not None and state.state == NodeState.TERMINATED:
            return
        agent = read_record(files.agent, ProcRecord)
        if agent is None:
            record = read_record(files.spec, NodeRecord)
            if state is None and record is not None and time.time() - record.created_at > AGENT_START_SECONDS:
                # Not a death of the node's own: it never ran (a replacement would not start either).
                self._record_death(files, "the node agent did not start" + _said(files), died=False)
            return
        if procfs.is_alive(agent.pid, agent.starttime):
            return
        # The agent writes Terminated just before it exits: look again now that it is known gone.
        state = read_record(files.state, StateRecord)
        if state is not None and state.state == NodeState.TERMINATED:
            return
        self._remove_container(files)
        procfs.kill_until_gone(lambda: self._members(files, agent))
        if state is not None and state.state == NodeState.FAILURE:
            self._record_death(files, state.message, died=state.died)  # failed before, or settled already
        else:
            self._record_death(files, "the node agent died" + _ended(files) + _said(files), died=True)

    def _record_death(self, files: NodeFiles, why: str, died: bool) -> None:
        if files.terminate.exists():
            write_record(files.state, StateRecord(NodeState.TERMINATED))
        else:
            write_record(files.state, StateRecord(NodeState.FAILURE, why, died=died))
        for task_id in files.queued():
            self._lose(self.layout.task(task_id), "its node agent is gone")

    def _settle_task(self, files: TaskFiles) -> None:
        record = read_record(files.spec, TaskRecord)
        if record is None:
            return
        node = self.layout.node_of(record)
        if not node.spec.exists():
            # A node that is gone (forgotten, or killed by adopt) will never run it. A sandbox that
            # does not exist yet was cut short by a crash: run() again makes it.
            if record.node_id is not None:
                self._lose(files, "its node is gone")
            return
        self._settle(node)
        agent = read_record(node.agent, ProcRecord)
        if agent is not None and not procfs.is_alive(agent.pid, agent.starttime):
            self._lose(files, "its node agent is gone")  # nobody will start it or record its end

    def _placed(self, task: TaskFiles) -> bool:
        """Whether ``run`` got as far as handing the task to a node (or sandbox)."""
        record = read_record(task.spec, TaskRecord)
        if record is None:
            return False
        node = self.layout.node_of(record)
        if record.node_id is None:
            return node.spec.exists()
        queued = (node.queue / task.task_id).exists() or task.proc.exists() or task.exit.exists()
        return queued or not node.spec.exists()

    def _lose(self, files: TaskFiles, why: str) -> None:
        if files.exit.exists() or not files.spec.exists():
            return
        if files.proc.exists():
            record = ExitRecord(TaskState.LOST, message=f"ended unwatched: {why}")
        else:
            record = ExitRecord(TaskState.KILLED, message=f"stopped before it started: {why}")
        with contextlib.suppress(OSError):
            write_record(files.exit, record)

    # --- processes -------------------------------------------------------------------------------

    def _members(self, files: NodeFiles, agent: ProcRecord) -> set[int]:
        found = procfs.members(procfs.snapshot(), agent.pid, (NODE_DIR_VARIABLE, str(files.path)))
        running = containers.running_of_file(files.container)
        return found | containers.processes(running) if running is not None else found

    def _programs(self, files: NodeFiles, agent: ProcRecord) -> set[int]:
        """What a signal to a node reaches: in a container its processes (never its clients or conmon,
        see containers.py), else every member."""
        running = containers.running_of_file(files.container)
        return containers.processes(running) if running is not None else self._members(files, agent)

    def _signal_task(self, node: NodeFiles, task: TaskFiles, sig: int) -> None:
        if task.exit.exists():
            return
        running = containers.running_of_file(node.container)
        if running is not None:
            procfs.send(containers.processes(running, task.task_id), sig)
            return
        proc = read_record(task.proc, ProcRecord)
        if proc is not None and procfs.is_alive(proc.pid, proc.starttime):
            procfs.killpg(proc.pid, sig)

    def _remove_container(self, files: NodeFiles) -> None:
        """A node's container and its pod (when it was the pod's last), if the node is one."""
        record = read_record(files.spec, NodeRecord)
        if record is None or record.container is None:
            return
        podman = containers.Podman(Path(record.container["store"]), self.layout.root)
        with contextlib.suppress(BackendError):
            podman.remove(
                record.node_id, containers.spec_of(record.container), self.layout.pod_locks, files.path
            )

    def _live_agent(self, files: NodeFiles) -> ProcRecord | None:
        agent = read_record(files.agent, ProcRecord)
        if agent is None or not procfs.is_alive(agent.pid, agent.starttime):
            return None
        return agent

    def _poke(self, files: NodeFiles) -> None:
        agent = self._live_agent(files)
        if agent is not None:
            procfs.send([agent.pid], SIGUSR1)

    def _destroy(self, files: NodeFiles) -> None:
        """Kill a node's agent and every process of it at once, and remove its files."""
        watch = read_record(files.watch, ProcRecord)
        if watch is not None and procfs.is_alive(watch.pid, watch.starttime):
            procfs.send([watch.pid], SIGKILL)  # first: it would write the agent's end into files going away
        agent = read_record(files.agent, ProcRecord)
        if agent is not None:
            leader = {agent.pid} if procfs.is_alive(agent.pid, agent.starttime) else set()
            # Everything of the node first, a podman command its agent was running included (one that
            # lived on could make the container after its removal); then the container.
            procfs.kill_until_gone(lambda: _still_running(leader) | self._members(files, agent))
            self._remove_container(files)
        disks.release_under(files.path)  # (its disk, if removing the container did not reach it)
        shutil.rmtree(files.path, ignore_errors=True)

    def _kill_task(self, task: TaskFiles) -> None:
        """Kill a task (its sandbox, for a sandboxed one) and remove its files."""
        record = read_record(task.spec, TaskRecord)
        if task.sandbox.exists():
            self._destroy(NodeFiles(task.sandbox))
        elif record is not None and record.node_id is not None:
            (self.layout.node(record.node_id).queue / task.task_id).unlink(missing_ok=True)
        proc = read_record(task.proc, ProcRecord)
        if proc is not None and not task.exit.exists() and procfs.is_alive(proc.pid, proc.starttime):
            procfs.killpg(proc.pid, SIGKILL)
        shutil.rmtree(task.path, ignore_errors=True)

    def _sweep_strays(self) -> tuple[int, ...]:
        """Kill every process that carries this root's mark but belongs to no live node we keep."""
        live = [files for files in self._all_node_files() if self._live_agent(files) is not None]
        keep = {str(files.path) for files in live}
        root = str(self.layout.root)

        def strays() -> set[int]:
            found = set()
            for pid in procfs.all_pids():  # a zombie's environment reads empty: never a stray
                env = procfs.read_environ(pid, having=f"{ROOT_VARIABLE}={root}")
                if env.get(ROOT_VARIABLE) == root and env.get(NODE_DIR_VARIABLE) not in keep:
                    found.add(pid)
            found.discard(os.getpid())
            return found

        killed = strays()
        procfs.kill_until_gone(strays)
        if self.podman is not None:  # containers of this root that no live node (or sandbox) of it has
            records = [read_record(files.spec, NodeRecord) for files in live]
            with contextlib.suppress(BackendError):
                kept = {record.node_id for record in records if record is not None}
                self.podman.strays(kept, self.layout.pod_locks)
        return tuple(sorted(killed))

    def _all_node_files(self) -> list[NodeFiles]:
        nodes = [self.layout.node(node_id) for node_id in self.layout.node_ids()]
        return nodes + [NodeFiles(self.layout.task(task_id).sandbox) for task_id in self.layout.task_ids()]

    # --- helpers ---------------------------------------------------------------------------------

    def _node(self, node_id: str) -> NodeFiles:
        files = self.layout.node(check_id("node id", node_id))
        if not files.spec.exists():
            raise UnknownResource(f"no node {node_id}")
        return files

    def _task(self, task_id: str) -> TaskFiles:
        files = self.layout.task(check_id("task id", task_id))
        if not files.spec.exists():
            raise UnknownResource(f"no task {task_id}")
        return files

    def _target(self, ref: Ref) -> tuple[NodeFiles, TaskFiles | None]:
        """What a signal reaches: a whole node (a node, or a sandboxed task's sandbox) or one task."""
        if isinstance(ref, NodeRef):
            return self._node(ref.node_id), None
        task = self._task(ref.task_id)
        record = read_record(task.spec, TaskRecord)
        if record is None:  # forgotten since _task looked
            raise UnknownResource(f"no task {ref.task_id}")
        if record.node_id is None:
            return NodeFiles(task.sandbox), None
        return self.layout.node(record.node_id), task

    def _has_ended(self, ref: Ref) -> bool:
        if isinstance(ref, NodeRef):
            return self.node_status(ref.node_id).state.is_final()
        return self.task_status(ref.task_id).state.is_final()

    def _write_task(self, files: TaskFiles, record: TaskRecord) -> None:
        make_dir(files.path, PASSAGE_MODE)
        write_record(files.spec, record)

    def _publish(self, files: NodeFiles, env: Mapping[str, str] | None) -> None:
        if not env or not files.spec.exists():
            return
        check_env(env)
        make_dir(files.env_dir, READABLE_DIR_MODE)
        for name, value in env.items():
            # The node's processes read them (as the node's user); only the server writes them.
            write_atomically(files.env_dir / name, value.encode(), READABLE_FILE_MODE)

    # --- the backstop ----------------------------------------------------------------------------

    def _arm_backstop(self, ref: Ref, deadline: float) -> None:
        delay = max(0.0, deadline - time.monotonic()) + BACKSTOP_MARGIN_SECONDS
        timer = threading.Timer(delay, self._backstop, (ref, deadline))
        timer.daemon = True
        with self._timers_lock:
            self._timers.add(timer)
        timer.start()

    def _resume_backstop(self, ref: Ref, order_path: Path) -> None:
        order = read_record(order_path, TerminateOrder)
        if order is not None:
            self._arm_backstop(ref, order.deadline)

    def _backstop(self, ref: Ref, deadline: float) -> None:
        """The agent should have killed by now; if what it should have killed still runs, kill it
        here (and the agent with it, for a node: an agent that misses a deadline is broken). Only for
        the order it was armed for: an id forgotten and given to new work meanwhile has none, or a later
        one (a later order for the same work can only bring its deadline nearer).

        Work forgotten meanwhile, on another thread (`forget` kills it and removes its files), is left
        to that: a record written for it would go into a directory that is gone (FileNotFoundError in
        this timer's thread, seen in a test's server log)."""
        with contextlib.suppress(UnknownResource):
            node, task = self._target(ref)
            try:
                self._enforce(node, task, deadline)
            except FileNotFoundError:
                if node.path.exists() and (task is None or task.path.exists()):
                    raise
        with self._timers_lock:
            self._timers = {timer for timer in self._timers if timer.is_alive()}

    def _enforce(self, node: NodeFiles, task: TaskFiles | None, deadline: float) -> None:
        """The backstop's work on its target, if the order it was armed for still stands."""
        order = read_record(node.terminate if task is None else task.terminate, TerminateOrder)
        if order is None or order.deadline > deadline:
            return  # other work now has the id
        if task is not None:
            self._signal_task(node, task, SIGKILL)
            return
        agent = self._live_agent(node)
        if agent is not None and not _node_status(node).state.is_final():
            procfs.kill_until_gone(lambda: _still_running({agent.pid}) | self._members(node, agent))
        self._settle(node)


def _check_run_as(run_as: RunAs | None) -> None:
    """Work runs as another user only when the server can make it so: refused rather than run as the
    server's own user."""
    if run_as is None:
        return
    if run_as.uid == 0 or run_as.gid == 0:
        raise BackendError(f"cannot run work as {run_as.user}: uid and gid must not be 0 (root)")
    if os.geteuid() != 0:
        raise BackendError(
            f"cannot run work as {run_as.user}: the server is not root, so it cannot change user "
            "(run it as root, or without isolation)"
        )


def _still_running(pids: set[int]) -> set[int]:
    return {pid for pid in pids if (stat := procfs.read_stat(pid)) is not None and not stat.is_zombie}


def _node_status(files: NodeFiles) -> NodeStatus:
    state = read_record(files.state, StateRecord)
    current = NodeState(state.state) if state is not None else NodeState.PENDING
    if files.terminate.exists() and not current.is_final():
        # Ordered but not yet seen by the agent: it is shutting down from the caller's point of view.
        return NodeStatus(NodeState.SHUTTING_DOWN)
    if state is None:
        return NodeStatus(current)
    return NodeStatus(current, state.message, died=state.died)


def _ended(files: NodeFiles) -> str:
    """How a dead agent ended, as its waiting parent wrote it (" (killed by SIGKILL, signal 9)"), or ""
    when nobody knows: its parent is gone without a word (killed with it, or an agent started before
    parents waited). The parent writes at once; a look that comes first waits for it, briefly."""
    watch = read_record(files.watch, ProcRecord)
    until = time.monotonic() + WATCH_WAIT_SECONDS
    while not files.agent_exit.exists() and watch is not None and time.monotonic() < until:
        if not procfs.is_alive(watch.pid, watch.starttime):
            break
        time.sleep(0.01)
    try:
        status = int(files.agent_exit.read_text())
    except (OSError, ValueError):
        return ""
    return f" ({_agent_exit_words(status)})"


def _agent_exit_words(status: int) -> str:
    """A shell's exit status of the agent in words: 128 + N is signal N (the agent itself exits 0 or 1)."""
    if status > 128:
        number = status - 128
        with contextlib.suppress(ValueError):
            return f"killed by {Signals(number).name}, signal {number}"
        return f"killed by signal {number}"
    return f"exit code {status}"


def _said(files: NodeFiles) -> str:
    """What a dead agent said last (the end of its error output), or that it said nothing."""
    words = tail(files.agent_log, LAST_WORDS)
    return f"; its last words: {words}" if words else " and said nothing"
