"""The Slurm back end: nodes and tasks as Slurm jobs and job steps on the fleet's cluster.

- A **node** is one whole-node batch job (``--exclusive -N1``), in its placement's reservation, run as
  the node's user, named ``PREFIX n NODE_ID``. Its batch script (``node.sh``) runs OnCreate through the
  step runner (``slurm_runner.py``) in the node's home, then holds the node until it is terminated.
  The node is Pending until the job runs and OnCreate has exited 0, Running after, Failure with the
  script's error output otherwise.
- A **task on a node** is a job step: ``srun --jobid=J --overlap -N1 -n1`` running the step runner,
  launched by a detached ``srun`` (it outlives the server, as a local node agent does). A task queued
  on a Pending node is launched by the first look (a status call) that finds the node Running; a step
  Slurm refuses (a node not registered yet after slurmctld restarted) is launched again by the next
  look, for a while (``STEP_TRY_SECONDS``).
- A **sandboxed task** (a training job's instance) is a whole-node batch job of its own; the tasks of a
  placement *group* (a multi-instance job) are one batch job of ``group_size`` whole nodes whose batch
  script starts one runner per node (``srun -N N --ntasks-per-node=1``).

The files live under ``root`` (on the work root, which every node mounts at the same path):

    ROOT/nodes/NODE_ID/   node.json job.json state.json terminate.json (the server's) env/ (published,
                          readable) node.sh  home/ (the user's) out/ (the user's: the batch's own output)
                          oncreate/run.json oncreate/out/{stdout,stderr}.log,exit.json (the runner's)
                          reclaim/run.json reclaim/out/ (on_reclaim.sh at a reclaim: terminate's
                          ``hook``, run by the batch script's SIGTERM trap, its output in oncreate/out;
                          for a node in a container, its container's files too, as in oncreate/)
    ROOT/tasks/TASK_ID/   task.json launch.json job.json state.json terminate.json srun.json killed
                          (the server's)  run.json (the runner's spec)  out/{started,exit}.json
                          {stdout,stderr}.log (the runner's)
    ROOT/groups/GROUP/    group.json (the members' task directories, in order) job.json group.sh
    ROOT/tools/           the step runner, the timed-log wrapper and the scratch sweeper every node runs
                          (copied at each start, readable by all: the package may be closed to them)
    ROOT/clears/          the output of ``clear_user``'s clearing jobs, one per uid and node (root's)

Slurm's record is the truth about jobs: a status call reads ``scontrol show job`` (once per short
interval, shared by all calls) and, for steps, ``squeue --steps``. How a program ended comes from what
the tenant cannot write where that exists (a step's srun exit status, a sandbox's Slurm ExitCode, the
server's ``killed`` mark), else from what the runner wrote. Once a node or task is final its state is
written down (``state.json``), so Slurm forgetting a finished job (``MinJobAge``) loses nothing.

Signals: ``scancel --signal=SIG J`` reaches a job's steps, ``--full`` its batch script too, ``J.S`` one
step. ``terminate`` sends SIGTERM now and SIGKILL at the deadline from a timer of this back end; a
server restarted meanwhile resumes the timers from ``terminate.json`` (real time), and a node's batch
script ends at once on SIGTERM, so Slurm kills what is left of it after its ``KillWait`` even if no
server is up.

Restarts: every job is named ``hp.<KEY>.<kind>.<id>``, KEY derived from the root, so ``adopt`` finds
this back end's jobs among the cluster's (also one submitted just before a crash, before its id was
recorded) and cancels those the store does not know.

The parts, each in a module of its own: the files and records under the root (``slurm_records.py``);
what Slurm's queue says of the jobs and steps, and the signals sent to them (``slurm_queue.py``); the
scripts, options and command lines that submit work (``slurm_submit.py``); the nodes' lifecycle
(``slurm_nodes.py``) and the tasks' (``slurm_tasks.py``); a deleted user's clearing (``slurm_clear.py``).
This module holds the back end itself: the contract's methods, terminate's timers, and adopt.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from signal import SIGKILL, SIGTERM, Signals

from hyperplan.backends import slurm_clear, slurm_containers, tenant_files
from hyperplan.backends.base import (
    EXEC_OUTPUT_LIMIT,
    AdoptReport,
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
    TaskRef,
    TaskSpec,
    TaskStatus,
    TimedLines,
    UnknownResource,
    check_env,
    check_id,
    timed_line,
)
from hyperplan.backends.commands import run_command
from hyperplan.backends.containers import Podman
from hyperplan.backends.layout import READABLE_DIR_MODE, READABLE_FILE_MODE, make_dir, write_atomically
from hyperplan.backends.slurm_images import SlurmImages
from hyperplan.backends.slurm_nodes import NodeJobs, node_record
from hyperplan.backends.slurm_queue import LIVE_JOB_STATES, SlurmQueue, job_prefix
from hyperplan.backends.slurm_records import (
    KILLED,
    SlurmDirs,
    TerminateOrder,
    grouped,
    job_id_of,
    read_json,
    subdirs,
    write_json,
)
from hyperplan.backends.slurm_submit import (
    RUNNER_FILE,
    TIMEDLOG_FILE,
    Submitter,
    check_run_as,
    install_tools,
    runner_python,
)
from hyperplan.backends.slurm_tasks import TaskJobs, task_record
from hyperplan.slurm.client import SlurmClient
from hyperplan.slurm.parse import Job

log = logging.getLogger(__name__)


class SlurmBackend:
    """Nodes and tasks as Slurm jobs under ``root`` (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        client: SlurmClient,
        python: str | None = None,
        machines: Sequence[str] | None = None,
        partition: str | None = None,
        podman_store: Path | None = None,
    ) -> None:
        """``machines``: the Slurm nodes its work runs on (the fleet's pools'; None: every node Slurm
        knows), where ``clear_user`` sweeps; ``partition``: theirs (None: the cluster's default);
        ``podman_store``: the server's Podman store, which images are pulled into and unpacked from for
        the nodes' containers (``slurm_containers.py``; None: work runs as host processes)."""
        self.root = root.resolve()
        self.client = client
        self.python = python or runner_python()
        self.machines = tuple(machines) if machines is not None else None
        self.partition = partition
        self.prefix = job_prefix(self.root)
        self._dirs = SlurmDirs(self.root)
        self.nodes, self.tasks, self.groups = self._dirs.nodes, self._dirs.tasks, self._dirs.groups
        self.clears, self.tools = self._dirs.clears, self._dirs.tools
        self._dirs.make()
        install_tools(self.tools)
        self.runner = self.tools / RUNNER_FILE
        self._lock = threading.RLock()
        self._timers: set[threading.Timer] = set()
        self._queue = SlurmQueue(client, self.prefix)
        self._submitter = Submitter(client, self.root, self.python, self.tools)
        self.podman = Podman(podman_store, self.root) if podman_store is not None else None
        self.images = SlurmImages(self.root / "images", self.podman) if self.podman is not None else None
        self._node_jobs = NodeJobs(self._dirs, self._queue, self._submitter, self.images)
        self._task_jobs = TaskJobs(self._dirs, self._queue, self._submitter, self._node_jobs, self.images)

    # --- nodes -----------------------------------------------------------------------------------

    def provision(self, spec: NodeSpec) -> None:
        check_run_as(spec.run_as)
        record = node_record(spec)
        with self._lock:
            self._node_jobs.provision(spec, record)

    def node_status(self, node_id: str) -> NodeStatus:
        directory = self._dirs.node_dir(node_id)
        with self._lock:
            return self._node_jobs.status(directory)

    def exec(
        self,
        node_id: str,
        argv: Iterable[str],
        timeout: timedelta,
        env: Mapping[str, str] | None = None,
        output_limit: int = EXEC_OUTPUT_LIMIT,
    ) -> ExecResult:
        return run_command(self, node_id, argv, timeout, env, output_limit, kill_wait=10.0)

    # --- tasks -----------------------------------------------------------------------------------

    def run(self, spec: TaskSpec) -> None:
        record = task_record(spec)
        with self._lock:
            self._task_jobs.run(spec, record)

    def task_status(self, task_id: str) -> TaskStatus:
        directory = self._dirs.task_dir(task_id)
        with self._lock:
            return self._task_jobs.status(directory)

    # --- signals ---------------------------------------------------------------------------------

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        with self._lock:
            target = self._target(ref)
            self._publish(target.env_dir, env)
            if self._has_ended(ref):
                return
            if target.step is not None:
                self._queue.cancel(target.step, sig)
            elif target.job_id is not None:
                self._queue.cancel(
                    str(target.job_id), sig, full=isinstance(ref, TaskRef) and not target.grouped
                )

    def terminate(
        self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None, hook: str | None = None
    ) -> None:
        with self._lock:
            target = self._target(ref)
            self._publish(target.env_dir, env)
            if self._has_ended(ref):
                return
            seconds = max(0.0, grace.total_seconds())
            path = target.directory / "terminate.json"
            earlier = read_json(path)
            first = earlier is None
            # The hook (a node's, at its first terminate) runs from the batch script's trap: SIGKILL is
            # then due a grace after the hook's, as on the local back end.
            wanted = first and seconds > 0 and isinstance(ref, NodeRef) and hook is not None
            if not wanted or hook is None or not self._node_jobs.prepare_hook(target.directory, hook):
                hook = None
            order = TerminateOrder(seconds, time.time() + seconds * (2 if hook else 1))
            if earlier is not None and earlier["deadline"] <= order.deadline:
                order = TerminateOrder(earlier["grace"], earlier["deadline"])
            else:
                write_json(path, {**asdict(order), "hook": hook}, READABLE_FILE_MODE)
            if first:
                target = self._target(ref)  # a step may have started meanwhile
                if target.step is not None:
                    (target.directory / "signalled").touch()
                    self._queue.cancel(target.step, SIGTERM)
                elif target.job_id is not None:
                    job = self._queue.job(target.job_id)
                    if job is not None and job.state == "PENDING":
                        self._queue.cancel(str(target.job_id))
                    elif hook is not None:
                        # The batch script alone: it runs the hook, then signals the node's steps.
                        self._queue.cancel(str(target.job_id), SIGTERM, batch=True)
                    else:
                        # A node's batch script ends its hold on it; a sandbox's is the runner. A
                        # group's batch script is srun, which would end its step at once: its
                        # step's processes get the signal directly instead.
                        self._queue.cancel(str(target.job_id), SIGTERM, full=not target.grouped)
        self._arm(ref, order.deadline)

    def _arm(self, ref: Ref, deadline: float) -> None:
        timer = threading.Timer(max(0.0, deadline - time.time()), self._kill, (ref,))
        timer.daemon = True
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive()}
            self._timers.add(timer)
        timer.start()

    def _kill(self, ref: Ref) -> None:
        with contextlib.suppress(UnknownResource), self._lock:
            order = read_json(self._target(ref).directory / "terminate.json")
            if order is None or order["deadline"] > time.time() + 0.05:
                return  # forgotten (the id may be another's now), or an earlier order's later timer
            if self._has_ended(ref):
                return
            target = self._target(ref)
            if target.step is not None:
                (target.directory / KILLED).touch()
                self._queue.cancel(target.step, SIGKILL)
            elif target.job_id is not None:
                if isinstance(ref, TaskRef):
                    (target.directory / KILLED).touch()
                self._task_jobs.kill_job(target.job_id)

    # --- logs ------------------------------------------------------------------------------------

    def read_log(self, ref: Ref, stream: LogStream, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        # The runner's files are the account's user's: one replaced by a link (to a secret of the
        # server's) or a FIFO reads as empty.
        data = tenant_files.read_at(self._out_dir(ref) / f"{stream.value}.log", offset, limit)
        return LogChunk(data, offset + len(data))

    def read_lines(
        self, ref: Ref, cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
    ) -> TimedLines:
        # Imported here, as the local back end does: `python3 -m hyperplan.backends.timedlog` imports
        # this package first, and a module it had already imported would run twice.
        from hyperplan.backends import timedlog

        out = self._out_dir(ref)
        records, next_cursor = timedlog.read_records(out / "timed.log", cursor, limit, max_bytes)
        return TimedLines(tuple(timed_line(*found) for found in records), next_cursor)

    def _out_dir(self, ref: Ref) -> Path:
        """Where the step runner keeps a task's (for a node: its OnCreate's) output."""
        if isinstance(ref, NodeRef):
            return self._dirs.node_dir(ref.node_id) / "oncreate" / "out"
        return self._dirs.task_dir(ref.task_id) / "out"

    # --- restart ---------------------------------------------------------------------------------

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        known = set(known)
        running: list[Ref] = []
        ended: list[Ref] = []
        killed: list[Ref] = []
        self._queue.forget()
        with self._lock:
            for directory in self._dirs.task_dirs():
                ref: Ref = TaskRef(directory.name)
                if not (directory / "task.json").exists():
                    shutil.rmtree(directory, ignore_errors=True)
                elif ref not in known:
                    self._task_jobs.destroy(directory)
                    killed.append(ref)
            for directory in subdirs(self.nodes):
                ref = NodeRef(directory.name)
                if not (directory / "node.json").exists():
                    shutil.rmtree(directory, ignore_errors=True)
                elif ref not in known:
                    job_id = job_id_of(directory)
                    if job_id is not None:
                        self._task_jobs.kill_job(job_id)
                    shutil.rmtree(directory, ignore_errors=True)
                    killed.append(ref)
                else:
                    state = self._node_jobs.status(directory).state
                    (ended if state in (NodeState.FAILURE, NodeState.TERMINATED) else running).append(ref)
                    self._resume_timer(ref, directory)
            for directory in self._dirs.task_dirs():
                ref = TaskRef(directory.name)
                if ref in known:
                    final = self._task_jobs.status(directory).state.is_final()
                    (ended if final else running).append(ref)
                    self._resume_timer(ref, directory)
            self._cancel_strays()
        found = {*running, *ended}
        missing = tuple(ref for ref in known if ref not in found)
        return AdoptReport(tuple(running), tuple(ended), missing, tuple(killed), ())

    def _resume_timer(self, ref: Ref, directory: Path) -> None:
        order = read_json(directory / "terminate.json")
        if order is not None and not (directory / "state.json").exists():
            self._arm(ref, float(order["deadline"]))

    def _cancel_strays(self) -> None:
        """Jobs named with this back end's prefix that no node, task or group here records."""
        recorded = set()
        for directory in (*subdirs(self.nodes), *self._dirs.task_dirs(), *subdirs(self.groups)):
            job_id = job_id_of(directory)
            if job_id is not None:
                recorded.add(job_id)
        for job in self._queue.jobs().values():
            if job.name.startswith(self.prefix) and job.state in LIVE_JOB_STATES and job.id not in recorded:
                log.warning("cancelling stray Slurm job %s (%s)", job.id, job.name)
                # Not one of ours to the end (no runner): a plain cancel, so Slurm ends every process
                # of it (SIGTERM, SIGKILL after its KillWait); killing its batch script first would
                # orphan the script's children.
                self._queue.cancel(str(job.id))

    def forget(self, ref: Ref) -> None:
        with self._lock:
            if isinstance(ref, NodeRef):
                directory = self.nodes / check_id("node id", ref.node_id)
                if not (directory / "node.json").exists():
                    return
                state = self._node_jobs.status(directory).state
                if not state.is_final():
                    raise NodeUnavailable(f"node {ref.node_id} is {state}: terminate it first")
                shutil.rmtree(directory, ignore_errors=True)
                return
            directory = self.tasks / check_id("task id", ref.task_id)
            if not (directory / "task.json").exists():
                return
            status = self._task_jobs.status(directory)
            if not status.state.is_final():
                raise NodeUnavailable(f"task {ref.task_id} is {status.state}: terminate it first")
            self._task_jobs.destroy(directory)

    # --- an account's user going ---------------------------------------------------------------

    def tenant_paths(self) -> list[tuple[str, bool]]:
        """Every file an account's process runs (True) or reads (False) on the nodes before its own
        program starts: the interpreter, the step runner and the timed-log wrapper. Each must be open to
        other users, else every step dies at once (a start in mode users checks them)."""
        paths = [(self.python, True), (str(self.runner), False), (str(self.tools / TIMEDLOG_FILE), False)]
        if self.images is not None:  # the containers' runtime and their process 1 (slurm_containers.py)
            paths += [(slurm_containers.runc_program(), True), (str(slurm_containers.init_program()), True)]
        return paths

    def clear_user(self, run_as: RunAs) -> None:
        """The user's Slurm jobs cancelled, and each of the back end's nodes swept of what it left by a
        short clearing job of root's (``slurm_clear.py``); returns before the last sweeps where their
        nodes are busy. BackendError when Slurm refuses a job (the others are submitted first)."""
        slurm_clear.clear_user(self._submitter, run_as, self.machines, self.partition, self.clears)

    def close(self) -> None:
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    def live_jobs(self) -> list[Job]:
        """This back end's jobs Slurm still runs (or has queued), by name prefix."""
        return self._queue.live_jobs()

    # --- helpers ---------------------------------------------------------------------------------

    @dataclass
    class _Target:
        directory: Path
        env_dir: Path | None
        job_id: int | None
        step: str | None
        grouped: bool = False

    def _target(self, ref: Ref) -> SlurmBackend._Target:
        if isinstance(ref, NodeRef):
            directory = self._dirs.node_dir(ref.node_id)
            return self._Target(directory, directory / "env", job_id_of(directory), None)
        directory = self._dirs.task_dir(ref.task_id)
        record = read_json(directory / "task.json") or {}
        if record.get("node_id") is None:
            return self._Target(directory, directory / "env", job_id_of(directory), None, grouped(record))
        node_dir = self.nodes / record["node_id"]
        step = self._queue.task_step(record, read_json(directory / "launch.json"))
        return self._Target(directory, node_dir / "env", None, step)

    def _has_ended(self, ref: Ref) -> bool:
        if isinstance(ref, NodeRef):
            return self._node_jobs.status(self._dirs.node_dir(ref.node_id)).state.is_final()
        return self._task_jobs.status(self._dirs.task_dir(ref.task_id)).state.is_final()

    def _publish(self, env_dir: Path | None, env: Mapping[str, str] | None) -> None:
        if not env or env_dir is None or not env_dir.parent.exists():
            return
        check_env(env)
        make_dir(env_dir, READABLE_DIR_MODE)
        for name, value in env.items():
            write_atomically(env_dir / name, value.encode(), READABLE_FILE_MODE)
