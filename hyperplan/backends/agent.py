"""The node agent: one small process per node that starts, watches and stops the node's processes.

``python -m hyperplan.backends.agent ROOT NODE_DIR``. The local back end starts it detached from the
server (under a shell of its own that only waits for it, to write how it ended: ``local.WATCH_SCRIPT``),
so the agent and its node outlive the server. What it prints to its error output (``agent.log``) is
quoted in its node's failure if it dies. Why a process per node rather than the server doing the work:

- An exit status goes only to a process's parent. The agent is the parent of every process of the
  node (OnCreate, tasks, exec) and writes each exit status to a file, whether or not a server is up.
- It leads the node's session (the session id is its pid) and is a child subreaper, so every process
  of the node, even one that forks away from its parent, can be found and signalled: see
  :func:`hyperplan.backends.procfs.members`. (A node in a container is not: its init takes the orphans,
  its processes are found by their PID namespace, and Podman's monitors must not come to the agent:
  ``containers.py``.)
- It enforces SIGKILL deadlines itself: a terminate goes on to its end if the server dies meanwhile.

Each task and each OnCreate runs in a process group of its own inside the node's session, so a task can
be signalled alone and a node as a whole. The agent reads its orders from files (see ``layout.py``) and
is poked with SIGUSR1 when one is written; it also looks every half second, so a lost poke only delays.
It wakes on SIGCHLD, SIGUSR1 and SIGTERM (a SIGTERM to the agent itself, say at host shutdown, is a
terminate with a short grace). It exits once the node is Terminated, or, for an instance sandbox, once
its task has ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from hyperplan.backends import containers, endpoint_relay, procfs, tenant_files, timedlog
from hyperplan.backends.base import (
    ENV_DIR_VARIABLE,
    BackendError,
    LogStream,
    Mount,
    NodeState,
    RunAs,
    TaskState,
)
from hyperplan.backends.layout import (
    NODE_DIR_VARIABLE,
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
    hand_over,
    inherited_mark,
    read_record,
    run_as_of,
    tail,
    write_record,
)

POLL_SECONDS = 0.5
RELAY_START_SECONDS = 10.0
HOME_INSIDE = "/root"
"""Where a node's home (with its lifecycle scripts) is in its container: root's home, as root runs there."""
SELF_TERMINATE_GRACE = 10.0
RUN_SCRIPT = 'if [ "$(head -c 2 "$1")" = "#!" ]; then chmod u+x "$1" && exec "$1"; fi; exec /bin/sh "$1"'
"""How a hook runs, as lifecycle_argv runs OnCreate: a #! script as it asks (storage drops mode bits),
any other under sh; as the node's user, in the shell the hook is started with (``$0`` is its name)."""
LOCK_WAIT_SECONDS = 2.0
PR_SET_CHILD_SUBREAPER = 36
WAKE_SIGNALS = (signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Dispositions a child must not inherit: Python ignores SIGPIPE and SIGXFSZ, and the shell that started
# the agent in the background left SIGINT and SIGQUIT ignored.
CHILD_DEFAULT_SIGNALS = (*WAKE_SIGNALS, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGQUIT)


@dataclass
class Child:
    task_id: str | None
    """None for the OnCreate script."""
    pgid: int
    oom_kills: int = 0
    """In a container: its memory limit's kill count when the child started."""
    killed: bool = False
    """The agent sent its processes SIGKILL (a grace that passed, the node's end)."""


class Agent:
    def __init__(self, layout: Layout, files: NodeFiles, spec: NodeRecord) -> None:
        self.layout = layout
        self.files = files
        self.spec = spec
        self.run_as = run_as_of(spec)
        self.state = NodeState.PENDING
        self.children: dict[int, Child] = {}
        self.seen: set[str] = set()
        self.deadline: float | None = None
        self.hook: int | None = None
        """The pid of the terminate's hook (on_reclaim.sh) while it runs; SIGTERM waits for it."""
        self.hook_until: float | None = None
        self.task_deadlines: dict[str, float] = {}
        self.done = False
        self.wakeup = self._listen()
        self.container = containers.spec_of(spec.container) if spec.container else None
        self.podman = (
            containers.Podman(Path(spec.container["store"]), layout.root) if spec.container else None
        )
        self.running: containers.Running | None = None

    # --- the loop --------------------------------------------------------------------------------

    def main(self) -> None:
        write_record(self.files.agent, ProcRecord(os.getpid(), procfs.starttime_of(os.getpid())))
        self._set_state(NodeState.PENDING)
        if self.files.terminate.exists():
            self._begin_shutdown()
        else:
            try:
                self._provision()
            except Exception as error:  # say why in the node's status rather than die
                traceback.print_exc()
                self._set_state(NodeState.FAILURE, f"provisioning failed: {error}")
        while not self.done:
            # A step first: what was queued while the node was made (a sandbox's own task) starts now,
            # not a poll later.
            try:
                self._step()
            except Exception:
                # One bad step must not orphan the node: log it and look again.
                traceback.print_exc()
                time.sleep(POLL_SECONDS)
            if not self.done:
                self._wait()

    def _step(self) -> None:
        self._reap()
        if not self.files.spec.exists():
            self._finish()  # the node was removed: nothing of it may stay behind
            return
        if self.state is not NodeState.SHUTTING_DOWN and self.files.terminate.exists():
            self._begin_shutdown()
        if self.state is NodeState.SHUTTING_DOWN:
            self._continue_shutdown()
            return
        self._enforce_task_orders()
        self._scan_queue(start=self.state is NodeState.RUNNING)
        if self.state is NodeState.FAILURE:
            self._drop_queued("its node failed before it started")
        if self.spec.sandbox_task is not None and self._sandbox_task_ended():
            self._finish()

    def _listen(self) -> int:
        """Signals only write their number to a pipe; the loop reads it. No work in signal handlers."""
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end)
        for sig in WAKE_SIGNALS:
            signal.signal(sig, lambda *_: None)
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        return read_end

    def _wait(self) -> None:
        timeout = POLL_SECONDS
        for deadline in (self.deadline, self.hook_until, *self.task_deadlines.values()):
            if deadline is not None:
                timeout = min(timeout, max(0.0, deadline - time.monotonic()))
        select.select([self.wakeup], [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            received = os.read(self.wakeup, 512)
            if signal.SIGTERM in received and not self.files.terminate.exists():
                grace = SELF_TERMINATE_GRACE
                write_record(self.files.terminate, TerminateOrder(grace, time.monotonic() + grace))

    # --- provisioning ----------------------------------------------------------------------------

    def _provision(self) -> None:
        """Fill the home while it is still ours (no process of the node's user can reach it yet), then
        hand it over and start OnCreate."""
        spec = self.spec
        self.files.home.mkdir(parents=True, exist_ok=True)
        if self.run_as is not None and os.geteuid() != 0:
            why = f"cannot run as {self.run_as.user}: the node agent is not root"
            self._set_state(NodeState.FAILURE, why)
            return
        if self.container is not None and not self._make_container():
            return
        if spec.lifecycle_source is not None:
            try:
                # Links are copied as links, never followed: the scripts are the tenant's.
                shutil.copytree(
                    spec.lifecycle_source, self.files.lifecycle_dir, symlinks=True, dirs_exist_ok=True
                )
            except (OSError, shutil.Error) as error:
                self._set_state(NodeState.FAILURE, f"cannot copy the lifecycle scripts: {error}")
                return
        argv = None
        if spec.on_create is not None:
            script = self.files.lifecycle_dir / spec.on_create
            try:
                argv = tenant_files.lifecycle_argv(script, spec.on_create_args)
            except (OSError, tenant_files.Refused) as error:
                self._set_state(NodeState.FAILURE, f"OnCreate script {spec.on_create}: {error}")
                return
        if self.run_as is not None:
            hand_over(self.files.home, self.run_as)
        if self.container is not None:
            ids = self.container.ids.host_first
            hand_over(self.files.home, RunAs("root", ids, ids))  # root inside is this id outside
        if argv is None:
            self._set_state(NodeState.RUNNING)
            return
        cwd = script.parent
        if self.container is not None:  # the same files, where the container sees the home
            inside = Path(HOME_INSIDE) / script.relative_to(self.files.home)
            argv = [str(inside) if arg == str(script) else arg for arg in argv]
            cwd = inside.parent
        pid = self._spawn(
            argv, self._env(), cwd, self.files.log, self.files.timed, self.files.path / "oncreate.env"
        )
        self.children[pid] = Child(None, pid, containers.oom_kills(self.running))

    def _make_container(self) -> bool:
        """The node's container, made and recorded (and its endpoint relay started); False when it could
        not be, the node failed with what Podman said."""
        assert self.container is not None and self.podman is not None
        spec = self.container
        if self.spec.sandbox_task is None:  # a node's home is root's there; an instance keeps the image's
            spec = dataclasses.replace(spec, mounts=(*spec.mounts, Mount(self.files.home, HOME_INSIDE)))
        try:
            self.running = self.podman.make(
                self.spec.node_id, spec, self.files.path, self.files.env_dir, self.layout.pod_locks
            )
        except Exception as error:
            self._set_state(NodeState.FAILURE, f"its container could not be made: {error}")
            return False
        write_record(self.files.container, self.running)
        if spec.endpoint is not None:
            problem = self._start_relay(spec.endpoint)
            if problem is not None:
                self._set_state(NodeState.FAILURE, f"the endpoint relay did not start: {problem}")
                return False
        return True

    def _start_relay(self, endpoint: str) -> str | None:
        """The endpoint relay into the pod's network (``endpoint_relay.py``), before any program of the
        container runs, so no program can take its port first; waits for its ``ready``. It is a process of
        the node (it carries the node's marks), so the node's end ends it. None, or what went wrong."""
        assert self.running is not None and self.container is not None
        host, port = endpoint.rsplit(":", 1)
        target = ("127.0.0.1" if host in ("0.0.0.0", "") else host.strip("[]"), int(port))
        netns = f"/proc/{self.running.init_pid}/ns/net"
        source = containers.loopback_source(self.container.ids) if target[0] == "127.0.0.1" else None
        argv = endpoint_relay.relay_argv(
            sys.executable, netns, ("127.0.0.1", target[1]), target, source=source
        )
        relay = subprocess.Popen(  # reaped by the loop as any orphan is; its status is never asked
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=self._wrapper_env(), close_fds=True
        )
        assert relay.stdout is not None
        ready, _, _ = select.select([relay.stdout], [], [], RELAY_START_SECONDS)
        line = relay.stdout.readline() if ready else b""
        relay.stdout.close()
        if line == endpoint_relay.READY:
            return None
        with contextlib.suppress(OSError):
            relay.kill()
        return f"it said {line!r} (its error is in the node's agent log)"

    def _on_create_ended(self, status: int) -> None:
        if self.state is not NodeState.PENDING:
            return
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            self._set_state(NodeState.RUNNING)
            return
        how = f"exited with code {code}" if code > 0 else f"was killed by {signal.Signals(-code).name}"
        output = tail(self.files.log(LogStream.STDERR))
        self._set_state(
            NodeState.FAILURE,
            f"OnCreate script {self.spec.on_create} {how}" + (f": {output}" if output else ""),
        )
        # A failed node runs nothing: what the script left behind goes too.
        procfs.kill_until_gone(self._processes, self._reap)

    # --- tasks -----------------------------------------------------------------------------------

    def _scan_queue(self, start: bool) -> None:
        """Start the tasks queued since the last look (when the node is Running), and end those
        terminated before they could start (whatever the node's state)."""
        for task_id in self.files.queued():
            if task_id in self.seen:
                continue
            files = self.layout.task(task_id)
            record = read_record(files.spec, TaskRecord)
            if record is None or files.proc.exists() or files.exit.exists():
                self.seen.add(task_id)
            elif files.terminate.exists():
                self.seen.add(task_id)
                _record_exit(files, ExitRecord(TaskState.KILLED, message="stopped before it started"))
            elif start:
                self.seen.add(task_id)
                self._start_task(files, record)

    def _start_task(self, files: TaskFiles, record: TaskRecord) -> None:
        env = {**self._env(), **record.env, **self._own_variables(), containers.TASK_VARIABLE: record.task_id}
        env.update(self.files.published_env())
        home = Path(HOME_INSIDE) if self.container is not None else self.files.home
        cwd = Path(record.cwd) if record.cwd else home
        try:
            pid = self._spawn(record.argv, env, cwd, files.log, files.timed, files.path / "exec.env")
        except BackendError as error:
            _record_exit(files, ExitRecord(TaskState.EXITED, exit_code=127, message=str(error)))
            return
        self.children[pid] = Child(record.task_id, pid, containers.oom_kills(self.running))
        with contextlib.suppress(OSError):
            write_record(files.proc, ProcRecord(pid, procfs.starttime_of(pid)))

    def _task_ended(self, child: Child, status: int) -> None:
        assert child.task_id is not None
        if child.task_id in self.task_deadlines:
            # A terminated task is over: what is left of its group goes with it.
            self._signal_task(child, signal.SIGKILL)
            del self.task_deadlines[child.task_id]
        code = os.waitstatus_to_exitcode(status)
        out_of_memory = self.container is not None and containers.oom_kills(self.running) > child.oom_kills
        if self.container is not None and code == 128 + signal.SIGKILL and (child.killed or out_of_memory):
            # podman exec says 128 + N for a program signal N ended, as for one that exited so: only a
            # kill this agent or the memory limit made is known to be one.
            code = -signal.SIGKILL
        if code >= 0:
            record = ExitRecord(TaskState.EXITED, exit_code=code, out_of_memory=out_of_memory)
        else:
            record = ExitRecord(TaskState.KILLED, signal=-code, out_of_memory=out_of_memory)
        _record_exit(self.layout.task(child.task_id), record)

    def _signal_task(self, child: Child, sig: int) -> None:
        """A task's processes: its process group, or in a container those carrying its id (never the
        podman client, whose end would end the task while its program still runs)."""
        child.killed = child.killed or sig == signal.SIGKILL
        if self.running is None:
            procfs.killpg(child.pgid, sig)
        else:
            procfs.send(containers.processes(self.running, child.task_id), sig)

    def _enforce_task_orders(self) -> None:
        for child in list(self.children.values()):
            if child.task_id is None:
                continue
            order = read_record(self.layout.task(child.task_id).terminate, TerminateOrder)
            if order is None:
                continue
            if child.task_id not in self.task_deadlines:
                self._signal_task(child, signal.SIGTERM)
                self.task_deadlines[child.task_id] = order.deadline
            deadline = min(order.deadline, self.task_deadlines[child.task_id])
            self.task_deadlines[child.task_id] = deadline
            if time.monotonic() >= deadline:
                self._signal_task(child, signal.SIGKILL)

    def _drop_queued(self, why: str) -> None:
        for task_id in self.files.queued():
            files = self.layout.task(task_id)
            if task_id not in self.seen and not files.exit.exists() and not files.proc.exists():
                _record_exit(files, ExitRecord(TaskState.KILLED, message=f"stopped: {why}"))
            self.seen.add(task_id)

    def _sandbox_task_ended(self) -> bool:
        task_id = self.spec.sandbox_task
        return task_id is not None and self.layout.task(task_id).exit.exists()

    # --- shutting down ---------------------------------------------------------------------------

    def _begin_shutdown(self) -> None:
        order = read_record(self.files.terminate, TerminateOrder)
        if order is None:
            return
        was_running = self.state is NodeState.RUNNING
        self._set_state(NodeState.SHUTTING_DOWN)
        self.deadline = order.deadline
        self._drop_queued("its node was terminated before it started")
        if order.hook is not None and was_running and self._start_hook(order.hook):
            self.hook_until = time.monotonic() + order.grace
            return  # SIGTERM once the hook has ended (_continue_shutdown)
        # No hook ran: the hook's share of the deadline is not the processes' to have.
        self.deadline = min(order.deadline, time.monotonic() + order.grace)
        procfs.send(self._processes(), signal.SIGTERM)

    def _continue_shutdown(self) -> None:
        order = read_record(self.files.terminate, TerminateOrder)
        if order is not None and self.deadline is not None:
            self.deadline = min(self.deadline, order.deadline)
        if self.hook_until is not None:
            now = time.monotonic()
            if self.hook is not None and now < min(self.hook_until, self.deadline or now):
                return
            self._end_hook(order.grace if order is not None else 0.0)
        if self._processes() and self.deadline is not None and time.monotonic() < self.deadline:
            return
        self._finish()

    def _start_hook(self, name: str) -> bool:
        """Start the node's lifecycle script ``name`` (on_reclaim.sh) as OnCreate runs, its output in the
        node's log; False when the node has no such file. The node's user decides how it runs: the
        agent (root) never opens or changes a file of the home the user owns by now."""
        script = self.files.lifecycle_dir / name
        if not script.is_file():
            return False
        path, cwd = str(script), script.parent
        if self.container is not None:  # the same file, where the container sees the home
            inside = Path(HOME_INSIDE) / script.relative_to(self.files.home)
            path, cwd = str(inside), inside.parent
        argv = ["/bin/sh", "-c", RUN_SCRIPT, name, path]
        self.hook = self._spawn(
            argv, self._env(), cwd, self.files.log, self.files.timed, self.files.path / "hook.env"
        )
        return True

    def _end_hook(self, grace: float) -> None:
        """The hook is over (or out of time: what is left of it is killed); the node goes as any does:
        SIGTERM now, SIGKILL ``grace`` later."""
        if self.hook is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.hook, signal.SIGKILL)
        self.hook_until = None
        procfs.send(self._processes(), signal.SIGTERM)
        if self.deadline is not None:
            self.deadline = min(self.deadline, time.monotonic() + grace)

    def _finish(self) -> None:
        for child in self.children.values():
            child.killed = True
        if self.running is not None and self.podman is not None and self.container is not None:
            # The programs first, so that each podman exec client reports its program's SIGKILL and
            # ends (a client whose container goes first may say something else); then the container.
            procfs.kill_until_gone(self._processes, self._reap)
            self._reap_children(within=2.0)
            with contextlib.suppress(BackendError):
                self.podman.remove(self.spec.node_id, self.container, self.layout.pod_locks, self.files.path)
        elif self.container is not None and self.podman is not None:  # made in part, or not at all
            with contextlib.suppress(BackendError):
                self.podman.remove(self.spec.node_id, self.container, self.layout.pod_locks, self.files.path)
        procfs.kill_until_gone(self._members, self._reap)
        self._reap_children(within=2.0)
        for child in self.children.values():
            if child.task_id is not None:
                _record_exit(
                    self.layout.task(child.task_id), ExitRecord(TaskState.LOST, message="did not die")
                )
        self._set_state(NodeState.TERMINATED)
        self.done = True

    # --- processes -------------------------------------------------------------------------------

    def _reap_children(self, within: float) -> None:
        until = time.monotonic() + within
        while self.children and time.monotonic() < until:
            self._reap()
            time.sleep(0.01)

    def _members(self) -> set[int]:
        """Every process of the node: in a container, its clients and conmon as well."""
        found = procfs.members(procfs.snapshot(), os.getpid(), (NODE_DIR_VARIABLE, str(self.files.path)))
        if self.running is not None:
            found |= containers.processes(self.running)
        return found

    def _processes(self) -> set[int]:
        """The node's programs, what signals reach: in a container, its processes but process 1."""
        if self.running is not None:
            return containers.processes(self.running)
        return self._members()

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.hook:
                self.hook = None
                continue
            child = self.children.pop(pid, None)
            # Orphans re-parented to us (we are a subreaper) are reaped and otherwise ignored.
            if child is None:
                continue
            if child.task_id is None:
                self._on_create_ended(status)
            else:
                self._task_ended(child, status)

    def _spawn(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: Path,
        log: Callable[[LogStream], Path],
        timed: Path,
        env_file: Path,
    ) -> int:
        """Start ``argv`` under the timed-log wrapper (``timedlog.py``): its output goes unchanged to the
        stdout and stderr logs, and line by line, with times, to the timed log. In a container the
        wrapped program is ``podman exec``, run as root in the host's directory of the node with the
        agent's own variables, and ``env`` reaches the program through ``env_file`` (0600)."""
        if self.running is not None and self.podman is not None:
            containers.write_env_file(env_file, env)
            argv = self.podman.exec_argv(self.running.name, argv, env_file, str(cwd))
            env, cwd = {**self._wrapper_env(), **self.podman.environment()}, self.files.path
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        # The server's files (0600): the wrapper (still root) writes them through the descriptors it is
        # given; the program, as the node's user, writes only into the wrapper's pipes.
        paths = (log(LogStream.STDOUT), log(LogStream.STDERR), timed)
        fds = [os.open(path, flags, RECORD_MODE) for path in paths]
        fds.append(_environment_file(env))
        wrapped = [sys.executable, "-I", "-S", timedlog.__file__, "--log-fd", "3", "--env-fd", "4"]
        wrapped += ["--cwd", str(cwd)]
        if self.run_as is not None and self.running is None:
            wrapped += ["--run-as", f"{self.run_as.uid}:{self.run_as.gid}"]
        try:
            pid = os.fork()
            if pid == 0:
                _become([*wrapped, "--", *argv], self._wrapper_env(), fds)
        finally:
            for fd in fds:
                os.close(fd)
        # The child does the same; whichever runs first, the group exists before anyone signals it.
        with contextlib.suppress(OSError):
            os.setpgid(pid, pid)
        return pid

    def _wrapper_env(self) -> dict[str, str]:
        """The wrapper's own environment, built here from the agent's and nothing of the tenant's: the
        wrapper runs as root until the program's fork drops to the node's user, and the dynamic loader
        obeys LD_PRELOAD and the like at its execve. The node's variables (its directory, the run mark)
        are there so that the wrapper counts among the node's processes."""
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}
        return {**base, **self._host_variables()}

    def _env(self) -> dict[str, str]:
        if self.container is not None:
            # The image's own variables (PATH, HOME and the like) are the container's already.
            base = {"HOME": HOME_INSIDE} if self.spec.sandbox_task is None else {}
            return {**base, **self.spec.env, **self._own_variables(), **self.files.published_env()}
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": os.environ.get("LANG", "C.UTF-8")}
        base["HOME"] = str(self.files.home)
        if self.run_as is not None:
            base["USER"] = base["LOGNAME"] = self.run_as.user
        return {**base, **self.spec.env, **self._own_variables(), **self.files.published_env()}

    def _own_variables(self) -> dict[str, str]:
        if self.container is not None:
            # Nothing of the host's paths: the node's names and where its published variables are.
            return {
                "HYPERPLAN_NODE_ID": self.spec.node_id,
                "HYPERPLAN_NODE_NAME": self.spec.name,
                "HYPERPLAN_INSTANCE_TYPE": self.spec.instance_type,
                ENV_DIR_VARIABLE: containers.ENV_DIR_INSIDE,
            }
        return self._host_variables()

    def _host_variables(self) -> dict[str, str]:
        """What a process on the host carries: the node's names, and the marks that find it as the
        node's (its directory, the back end's root, the run's mark)."""
        return {
            "HYPERPLAN_NODE_ID": self.spec.node_id,
            "HYPERPLAN_NODE_NAME": self.spec.name,
            "HYPERPLAN_INSTANCE_TYPE": self.spec.instance_type,
            ENV_DIR_VARIABLE: str(self.files.env_dir),
            ROOT_VARIABLE: str(self.layout.root),
            NODE_DIR_VARIABLE: str(self.files.path),
            **inherited_mark(),
        }

    def _set_state(self, state: NodeState, message: str = "") -> None:
        self.state = state
        # The node's directory may have been removed under us (a forgotten sandbox): nobody to tell.
        with contextlib.suppress(OSError):
            write_record(self.files.state, StateRecord(state, message))


def _environment_file(env: dict[str, str]) -> int:
    """The program's environment as JSON in an anonymous memory file (no name on any file system, gone
    with its last descriptor), read back from the start by the wrapper (``--env-fd``)."""
    fd = os.memfd_create("hyperplan-env", os.MFD_CLOEXEC)
    data = json.dumps(env).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _become(argv: list[str], env: dict[str, str], fds: list[int]) -> NoReturn:
    """In the forked child: a process group of its own, default signals, /dev/null, the three logs and
    the program's environment on 0/1/2/3/4 and no other descriptor, then exec the wrapper (which becomes
    the node's user for the program and enters its directory as that user, so that one it may not enter
    is refused) in ``env``, the wrapper's own."""
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        for sig in CHILD_DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        # Each moved above the targets first, so that no dup2 overwrites a descriptor still to be moved.
        above = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, len(fds) + 1) for fd in fds]
        for target, fd in enumerate(above, start=1):
            os.dup2(fd, target)  # (dup2 clears CLOEXEC on the target)
        # Nothing of the agent's (lock, wakeup pipe, logs) reaches the program, CLOEXEC or not.
        os.closerange(len(fds) + 1, os.sysconf("SC_OPEN_MAX"))
        os.execve(argv[0], argv, env)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.write(2, f"hyperplan: cannot start {argv[0]!r}: {error}\n".encode())
    os._exit(127)


def _record_exit(files: TaskFiles, record: ExitRecord) -> None:
    # The task may have been forgotten meanwhile: then there is nobody to tell.
    with contextlib.suppress(OSError):
        write_record(files.exit, record)


def _lock(files: NodeFiles) -> int | None:
    """Hold the node's lock for life; give up if another agent holds it (a duplicate start)."""
    fd = os.open(files.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, RECORD_MODE)
    until = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > until:
                os.close(fd)
                return None
            time.sleep(0.05)


def _become_subreaper() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def main(argv: list[str]) -> int:
    root, node_dir = Path(argv[0]), Path(argv[1])
    with contextlib.suppress(OSError):
        os.setsid()  # the node's session: its id is our pid
    files = NodeFiles(node_dir)
    # The lock is held until we exit (the descriptor stays open); the kernel drops it even on SIGKILL.
    if _lock(files) is None or files.agent.exists():
        return 0  # another agent has this node, or had it: a node runs once
    spec = read_record(files.spec, NodeRecord)
    if spec is None:
        print(f"no node spec in {node_dir}", file=sys.stderr)
        return 1
    if spec.container is None:
        # Host processes: orphans come to the agent, so every process of the node is found. In a
        # container its init takes them; and Podman's monitors (conmon), which double-fork away, must
        # not: one would count among the node's processes, and a pod's monitor, shared by the
        # containers of a job, would die with the first of them.
        _become_subreaper()
    Agent(Layout(root), files, spec).main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
