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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from signal import SIGKILL, SIGTERM, Signals
from typing import Any

from hyperplan.backends import slurm_runner, tenant_files
from hyperplan.backends.base import (
    ENV_DIR_VARIABLE,
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
    Placement,
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
    PASSAGE_MODE,
    READABLE_DIR_MODE,
    READABLE_FILE_MODE,
    hand_over,
    inherited_mark,
    make_dir,
    placement_record,
    tail,
    write_atomically,
)
from hyperplan.backends.runner_records import (
    MAX_RECORD_BYTES,
    BadRecord,
    RunnerExit,
    parse_exit_record,
    witnessed,
)
from hyperplan.slurm import on_demand_time
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.parse import Job

log = logging.getLogger(__name__)

LIVE_JOB_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING"}
)
CACHE_SECONDS = 0.3
SUBMIT_RETRY_SECONDS = 120.0
"""A job refused because its reservation does not exist yet (it is made when the segment starts) is
submitted again at each look for this long; then the node or task fails with Slurm's answer."""
CANCEL_AGAIN_SECONDS = 10.0
"""A node being failed (its OnCreate record says so) is cancelled again this often until its job ends."""
KILLED = "killed"
"""The server's mark, in a task's directory, that the task still ran when the server sent it SIGKILL (the
end of a grace): it ended killed by SIGKILL, whatever the runner's record (the tenant's) says."""
SRUN_EXIT_WAIT = 5.0
"""How long a look waits for a node task's srun to exit once Slurm says its step has ended."""
STEP_START_SECONDS = 60.0
"""A step's srun that has gone without its runner ever starting: Lost after this long."""
STEP_TRY_SECONDS = 3
"""How long one srun waits for Slurm to create its step (``--immediate``) before it gives up; the next
look launches another, until ``STEP_START_SECONDS`` after the first. Without it srun waits on its own:
right after slurmctld restarts, the nodes are UNKNOWN until their slurmd registers again and a step is
refused as "Requested nodes are busy"; srun then waits for a word from slurmctld that never comes for
that, and tries again only after SlurmctldTimeout (120 s by default), past an exec's caller's patience."""
STEP_REFUSED = "Unable to create step"
"""What srun says (in ``srun.log``) when Slurm did not create its step: none ran, so another try is safe."""
NO_REQUEUE = "--no-requeue"
"""No job of this back end is run again by Slurm itself: by default a batch job whose node fails (a
slurmd silent past SlurmdTimeout) is requeued and later restarted from its start, beneath the store
(a training job's attempt; a cluster node that would run OnCreate again unseen). Without requeue it
ends NODE_FAIL, which the task's or node's status then says; hyperplan, not Slurm, decides what runs
again: a job in a plan's next segment, from its checkpoints; a node through automatic node recovery."""
PACKAGE_DIR = Path(slurm_runner.__file__).resolve().parent
RUNNER_FILE, TIMEDLOG_FILE, SCRATCH_FILE = "slurm_runner.py", "timedlog.py", "scratch.py"
TOOLS = (RUNNER_FILE, TIMEDLOG_FILE, SCRATCH_FILE)
"""The scripts that run on the nodes (standard library only, importing nothing of hyperplan): the step
runner, the timed-log wrapper it runs every program under (found beside it), and the scratch sweeper
``clear_user`` runs. The back end runs copies of them (``install_tools``), never the package's own."""
CLEAR_TIME_LIMIT = 5
"""Minutes a node's clearing job (``clear_user``) may run: a sweep of its scratch directories takes
seconds; a short limit lets Slurm fit it in before a reservation that starts soon."""
CLEAR_WAIT_SECONDS = 30.0
"""How long ``clear_user`` waits for its clearing jobs to end (the nodes free: a few seconds) before it
returns and leaves the rest queued. The caller removes the OS user next, which ``userdel`` refuses
while a process of it runs on the server's machine (a node too, on a one-machine cluster)."""
RECORD_LIMIT = 1 << 20
"""The most bytes of one of the server's own records read (they are a few hundred)."""
SYSTEM_PYTHON = "/usr/bin/python3"


def runner_python() -> str:
    """The runner needs only the standard library, and the account's user must be able to run it:
    the system's Python when there is one (the server's may sit in a directory closed to others)."""
    return SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable


def job_prefix(root: Path) -> str:
    """The name prefix of every job of the back end over ``root``."""
    return "hp." + hashlib.sha256(str(root).encode()).hexdigest()[:10] + "."


def step_argv(python: str, runner: Path, task_dir: Path, group_dir: Path | None = None) -> list[str]:
    """What a Slurm step (or batch script) runs for a task: the step runner (the back end's copy) on its
    directory, which runs the program under the timed-log wrapper. The one place that builds it. The
    interpreter runs isolated (``-I -S``): the runner needs nothing but the standard library."""
    if group_dir is not None:
        return [python, "-I", "-S", str(runner), "--group", str(group_dir)]
    return [python, "-I", "-S", str(runner), str(task_dir)]


def install_tools(directory: Path) -> None:
    """Copy ``TOOLS`` into ``directory`` (root's, 0755; each file 0644, replaced whole by a rename at every
    start, so that an upgrade reaches the nodes and a step starting meanwhile reads one version or the
    other). The package itself may lie where the accounts' users cannot pass (a clone in a 0700 home, a
    virtual environment under /root): a runner run from there dies before its first line, exit code 2."""
    make_dir(directory, READABLE_DIR_MODE)
    for name in TOOLS:
        write_atomically(directory / name, (PACKAGE_DIR / name).read_bytes(), READABLE_FILE_MODE)


# --- records ---------------------------------------------------------------------------------------


def _write(path: Path, value: Mapping[str, Any], mode: int = 0o600) -> None:
    write_atomically(path, json.dumps(value, indent=1, default=str).encode(), mode)


def _read(path: Path) -> dict[str, Any] | None:
    """One of the server's own records (in a directory of its own; read as carefully as a tenant's)."""
    try:
        data = tenant_files.read_capped(path, RECORD_LIMIT)
    except tenant_files.Refused:
        return None
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None  # a file being replaced is never half-read (rename), but a foreign one might be
    return value if isinstance(value, dict) else None


def _runner_exit(path: Path) -> RunnerExit | str | None:
    """How the runner says its program ended (``exit.json``, in a directory the account's user owns):
    None when it has not said, the words of the refusal when its record is not one the server takes (a
    link, a FIFO, a giant file, values out of range: the program may have rewritten it)."""
    try:
        data = tenant_files.read_capped(path, MAX_RECORD_BYTES)
        if data is None:
            return None
        return parse_exit_record(data)
    except (tenant_files.Refused, BadRecord) as refused:
        return f"its runner's record {path.parent.name}/{path.name} is refused: {refused}"


def _run_as_record(run_as: RunAs | None) -> dict[str, Any] | None:
    return asdict(run_as) if run_as is not None else None


@dataclass
class _Terminate:
    grace: float
    deadline: float  # time.time(): real time, the same after a restart


class SlurmBackend:
    """Nodes and tasks as Slurm jobs under ``root`` (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        client: SlurmClient,
        python: str | None = None,
        machines: Sequence[str] | None = None,
        partition: str | None = None,
    ) -> None:
        """``machines``: the Slurm nodes its work runs on (the fleet's pools'; None: every node Slurm
        knows), where ``clear_user`` sweeps; ``partition``: theirs (None: the cluster's default)."""
        self.root = root.resolve()
        self.client = client
        self.python = python or runner_python()
        self.machines = tuple(machines) if machines is not None else None
        self.partition = partition
        self.prefix = job_prefix(self.root)
        self.nodes, self.tasks, self.groups = self.root / "nodes", self.root / "tasks", self.root / "groups"
        self.clears = self.root / "clears"
        for directory in (self.root, self.nodes, self.tasks, self.groups):
            make_dir(directory, PASSAGE_MODE)
        make_dir(self.clears, 0o700)  # root's: the clearing jobs' output
        self.tools = self.root / "tools"
        install_tools(self.tools)
        self.runner = self.tools / RUNNER_FILE
        self._lock = threading.RLock()
        self._cache: tuple[float, dict[int, Job]] = (0.0, {})
        self._steps: tuple[float, dict[str, str]] = (0.0, {})  # live steps: id (J.S) -> name
        self._timers: set[threading.Timer] = set()
        self._launches: dict[str, subprocess.Popen[bytes]] = {}

    # --- nodes -----------------------------------------------------------------------------------

    def provision(self, spec: NodeSpec) -> None:
        _check_run_as(spec.run_as)
        record = {
            "node_id": spec.node_id,
            "name": spec.name,
            "instance_type": spec.instance_type,
            "env": dict(spec.env),
            "lifecycle_source": str(spec.lifecycle_source.resolve()) if spec.lifecycle_source else None,
            "on_create": spec.on_create,
            "on_create_args": list(spec.on_create_args),
            "run_as": _run_as_record(spec.run_as),
            "placement": placement_record(spec.placement),
        }
        directory = self.nodes / spec.node_id
        with self._lock:
            existing = _read(directory / "node.json")
            if existing is not None:
                if {k: existing.get(k) for k in record} != record:
                    raise SpecConflict(f"node {spec.node_id} exists with another spec")
                self._submit_node(directory)
                return
            self._prepare_node(directory, spec)
            _write(directory / "node.json", {**record, "created_at": time.time(), "nonce": _nonce()})
            self._submit_node(directory)

    def _prepare_node(self, directory: Path, spec: NodeSpec) -> None:
        shutil.rmtree(directory, ignore_errors=True)  # what a forgotten node of this id left behind
        make_dir(directory, PASSAGE_MODE)
        make_dir(directory / "env", READABLE_DIR_MODE)
        home = directory / "home"
        make_dir(home, 0o700)
        if spec.lifecycle_source is not None:
            try:
                shutil.copytree(spec.lifecycle_source, home / "lifecycle", symlinks=True, dirs_exist_ok=True)
            except (OSError, shutil.Error) as error:
                raise BackendError(f"cannot copy the lifecycle scripts: {error}") from None
        cwd = home
        if spec.on_create is not None:
            script = home / "lifecycle" / spec.on_create
            cwd = script.parent
            try:
                argv = tenant_files.lifecycle_argv(script, spec.on_create_args)
            except (OSError, tenant_files.Refused) as refused:
                raise BackendError(f"OnCreate script {spec.on_create}: {refused}") from None
            env = {**self._base_env(home, spec.run_as, directory), **dict(spec.env)}
            self._write_runner_spec(directory / "oncreate", argv, env, cwd, spec.run_as, directory / "env")
        out = directory / "out"
        make_dir(out, 0o700)
        if spec.run_as is not None:
            hand_over(home, spec.run_as)
            os.chown(out, spec.run_as.uid, spec.run_as.gid)
        script_text = self._node_script(directory, spec.on_create is not None)
        write_atomically(directory / "node.sh", script_text.encode(), READABLE_FILE_MODE)

    def _node_script(self, directory: Path, on_create: bool) -> str:
        quoted = shlex.quote(str(directory))
        lines = ["#!/bin/sh", f"node={quoted}"]
        if on_create:
            runner = shlex.join(step_argv(self.python, self.runner, directory / "oncreate"))
            lines += [f"{runner} || exit $?"]
        # Held until a SIGTERM reaches the batch script: only terminate sends one (``--full``; a plain
        # signal to the node goes to its steps), or Slurm when it cancels the job or its time is up.
        lines += [
            'touch "$node/out/held"',
            "trap 'exit 0' TERM",
            "while :; do sleep 5 & wait $!; done",
        ]
        return "\n".join(lines) + "\n"

    def _submit_node(self, directory: Path) -> None:
        """Submit the node's job unless it has one (or is settled); a refusal because the reservation
        does not exist yet is tried again at the next look."""
        if (directory / "job.json").exists() or (directory / "state.json").exists():
            return
        record = _read(directory / "node.json")
        assert record is not None
        if (directory / "terminate.json").exists():
            self._settle(directory, NodeState.TERMINATED, "")
            return
        placement = _placement_of(record.get("placement"))
        options = [
            f"--job-name={self.prefix}n.{record['node_id']}.{record.get('nonce', '')}",
            "--nodes=1",
            "--exclusive",
            NO_REQUEUE,
            f"--chdir={directory / 'home'}",
            f"--output={directory / 'out' / 'batch.log'}",
            *self._placement_options(placement),
        ]
        self._submit(directory, directory / "node.sh", options, _run_as_of(record), record)

    def _submit(
        self,
        directory: Path,
        script: Path,
        options: Sequence[str],
        run_as: RunAs | None,
        record: Mapping[str, Any],
    ) -> None:
        found = self._job_named(options[0].split("=", 1)[1])
        if found is not None:  # submitted before a crash, its id not recorded
            _write(directory / "job.json", {"job_id": found.id})
            return
        try:
            job_id = self._sbatch(script, options, run_as)
        except SlurmError as error:
            created = float(record.get("created_at", time.time()))
            if _not_yet(error) and time.time() - created < SUBMIT_RETRY_SECONDS:
                _write(directory / "submit-error.json", {"error": error.detail})
                return
            self._settle(directory, NodeState.FAILURE, f"Slurm refused the job: {error.detail}")
            return
        _write(directory / "job.json", {"job_id": job_id})
        self._forget_cache()

    def _placement_options(self, placement: Placement | None) -> list[str]:
        if placement is None:
            return []
        options = []
        if placement.constraint:
            options.append(f"--constraint={placement.constraint}")
        limit = placement.time_limit
        if placement.reservation:
            options.append(f"--reservation={placement.reservation}")
            reservation = self.client.reservation(placement.reservation)
            if reservation is not None:
                left = reservation.end - datetime.now(UTC)
                limit = left if limit is None else min(limit, left)
        else:
            ahead = self._free_for(placement.constraint)
            if ahead is not None:
                limit = ahead if limit is None else min(limit, ahead)
            elif limit is None:  # explicit: the partition's DefaultTime would end it (slurm/on_demand_time)
                options.append("--time=UNLIMITED")
        if limit is not None:
            options.append(f"--time={max(1, int(limit.total_seconds() // 60))}")
        return options

    def _free_for(self, feature: str | None) -> timedelta | None:
        """Work outside reservations (on-demand) must end before the next reservation on any node it
        may land on (the nodes with ``feature``), less a margin: Slurm then places it where it fits and
        ends it (TIMEOUT) at that limit. None: no reservation ahead on those nodes."""
        nodes = {node.name for node in self.client.nodes() if feature is None or feature in node.features}
        now = datetime.now(UTC)
        starts = [r.start for r in self.client.reservations() if r.start > now and set(r.nodes) & nodes]
        return on_demand_time.time_limit(starts, now)

    def _sbatch(self, script: Path | None, options: Sequence[str], run_as: RunAs | None) -> int:
        """Submit ``script`` (None: the options carry ``--wrap``) as ``run_as`` (None: the server's own
        user); the new job's id."""
        command = [*_as_user(run_as), "sbatch", "--parsable", *options, *([str(script)] if script else [])]
        text = self._tool(command)
        try:
            return int(text.strip().split(";")[0])
        except ValueError:
            raise SlurmError(command, f"unreadable job id {text.strip()!r}") from None

    def node_status(self, node_id: str) -> NodeStatus:
        directory = self._node_dir(node_id)
        with self._lock:
            return self._node_status(directory)

    def _node_status(self, directory: Path) -> NodeStatus:
        settled = _read(directory / "state.json")
        if settled is not None:
            return NodeStatus(
                NodeState(settled["state"]), settled.get("message", ""), settled.get("host", "")
            )
        self._submit_node(directory)
        settled = _read(directory / "state.json")
        if settled is not None:
            return NodeStatus(NodeState(settled["state"]), settled.get("message", ""))
        terminating = (directory / "terminate.json").exists()
        job_id = self._job_id(directory)
        if job_id is None:
            return NodeStatus(NodeState.SHUTTING_DOWN if terminating else NodeState.PENDING)
        job = self._job(job_id)
        host = job.nodes[0] if job is not None and job.nodes else ""
        failed = self._on_create_failure(
            directory, _runner_exit(directory / "oncreate" / "out" / "exit.json")
        )
        if job is None or job.state not in LIVE_JOB_STATES:
            if terminating:
                return self._settle(directory, NodeState.TERMINATED, "", host)
            if failed:
                return self._settle(directory, NodeState.FAILURE, failed, host)
            state = job.state if job is not None else "gone from Slurm"
            if state == "TIMEOUT":
                state += " (its time limit: the end of its reservation, or the next reservation on its node)"
            elif state == "NODE_FAIL":
                state += f" (its Slurm node {host or '?'} failed)"
            return self._settle(
                directory, NodeState.FAILURE, f"the node's Slurm job {job_id} ended: {state}", host
            )
        if terminating:
            return NodeStatus(NodeState.SHUTTING_DOWN, host=host)
        if failed:
            # Settled only once Slurm says the job has ended: the record is the user's word, and a node
            # forgotten while its job runs would escape every later kill.
            marker = directory / "failing"
            if not tenant_files.exists(marker) or time.time() - marker.stat().st_mtime > CANCEL_AGAIN_SECONDS:
                marker.touch()  # (cancelled again now and then: a cancel Slurm did not take is not final)
                self._cancel(str(job_id))
            return NodeStatus(NodeState.PENDING, host=host)
        if job.state == "RUNNING" and tenant_files.exists(directory / "out" / "held"):
            return NodeStatus(NodeState.RUNNING, host=host)
        return NodeStatus(NodeState.PENDING, host=host)

    def _on_create_failure(self, directory: Path, ended: RunnerExit | str | None) -> str:
        if ended is None or (isinstance(ended, RunnerExit) and ended.exit_code == 0):
            return ""
        record = _read(directory / "node.json") or {}
        if isinstance(ended, str):
            return f"OnCreate script {record.get('on_create')} ended, but {ended}"
        how = (
            f"exited with code {ended.exit_code}" if ended.exit_code is not None else _killed_by(ended.signal)
        )
        output = tail(directory / "oncreate" / "out" / "stderr.log")
        return f"OnCreate script {record.get('on_create')} {how}" + (f": {output}" if output else "")

    def _settle(self, directory: Path, state: NodeState, message: str, host: str = "") -> NodeStatus:
        _write(directory / "state.json", {"state": state.value, "message": message, "host": host})
        if state in (NodeState.FAILURE, NodeState.TERMINATED):
            self._settle_queued(directory.name, f"its node is {state.value}")
        return NodeStatus(state, message, host)

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
        record = {
            "task_id": spec.task_id,
            "node_id": spec.node_id,
            "argv": list(spec.argv),
            "env": dict(spec.env),
            "cwd": str(spec.cwd) if spec.cwd else None,
            "run_as": _run_as_record(spec.run_as),
            "placement": placement_record(spec.placement),
        }
        directory = self.tasks / spec.task_id
        with self._lock:
            existing = _read(directory / "task.json")
            if existing is not None:
                if {k: existing.get(k) for k in record} != record:
                    raise SpecConflict(f"task {spec.task_id} exists with another spec")
                self._advance(directory, existing)
                return
            if spec.node_id is None:
                _check_run_as(spec.run_as)
                self._new_sandbox_task(directory, spec, record)
                return
            node_dir = self._node_dir(spec.node_id)
            node = _read(node_dir / "node.json") or {}
            if spec.run_as is not None and _run_as_of(node) != spec.run_as:
                raise BackendError(f"task {spec.task_id}: a task on a node runs as the node's user")
            state = self._node_status(node_dir).state
            if state not in (NodeState.PENDING, NodeState.RUNNING):
                raise NodeUnavailable(f"node {spec.node_id} is {state}: it takes no new tasks")
            run_as = _run_as_of(node)
            make_dir(directory, PASSAGE_MODE)
            home = node_dir / "home"
            env = {**self._base_env(home, run_as, node_dir), **node.get("env", {}), **dict(spec.env)}
            env["HYPERPLAN_TASK_ID"] = spec.task_id
            cwd = spec.cwd or home
            self._write_runner_spec(directory, list(spec.argv), env, cwd, run_as, node_dir / "env")
            _write(directory / "task.json", {**record, "created_at": time.time(), "nonce": _nonce()})
            self._advance(directory, record)

    def _new_sandbox_task(self, directory: Path, spec: TaskSpec, record: Mapping[str, Any]) -> None:
        make_dir(directory, PASSAGE_MODE)
        make_dir(directory / "env", READABLE_DIR_MODE)
        home = directory / "home"
        make_dir(home, 0o700)
        if spec.run_as is not None:
            hand_over(home, spec.run_as)
        env = {**self._base_env(home, spec.run_as, directory), **dict(spec.env)}
        env["HYPERPLAN_TASK_ID"] = spec.task_id
        cwd = spec.cwd or home
        self._write_runner_spec(directory, list(spec.argv), env, cwd, spec.run_as, directory / "env")
        write_atomically(
            directory / "task.sh",
            ("#!/bin/sh\nexec " + shlex.join(step_argv(self.python, self.runner, directory)) + "\n").encode(),
            READABLE_FILE_MODE,
        )
        _write(directory / "task.json", {**record, "created_at": time.time(), "nonce": _nonce()})
        self._advance(directory, _read(directory / "task.json") or record)

    def _advance(self, directory: Path, record: Mapping[str, Any]) -> None:
        """Move a task on as far as it can go now: launch its step once its node runs, submit its job
        (or its group's, once every member is there)."""
        if (directory / "state.json").exists() or (directory / "terminate.json").exists():
            return
        if record.get("node_id") is None:
            placement = _placement_of(record.get("placement"))
            if placement is not None and placement.group is not None and placement.group_size > 1:
                self._advance_group(directory, record, placement)
                return
            if self._job_id(directory) is None:
                options = [
                    f"--job-name={self.prefix}t.{record['task_id']}.{record.get('nonce', '')}",
                    "--nodes=1",
                    "--exclusive",
                    NO_REQUEUE,
                    f"--chdir={directory / 'home'}",
                    f"--output={directory / 'out' / 'batch.log'}",
                    *self._placement_options(placement),
                ]
                self._submit_task(directory, directory / "task.sh", options, _run_as_of(record), record)
            return
        if (directory / "launch.json").exists():
            return
        node_dir = self._node_dir(record["node_id"])
        state = self._node_status(node_dir)
        if state.state is NodeState.RUNNING:
            self._launch_step(directory, node_dir)

    def _submit_task(
        self,
        directory: Path,
        script: Path,
        options: Sequence[str],
        run_as: RunAs | None,
        record: Mapping[str, Any],
    ) -> None:
        found = self._job_named(options[0].split("=", 1)[1])
        if found is not None:
            _write(directory / "job.json", {"job_id": found.id})
            return
        try:
            job_id = self._sbatch(script, options, run_as)
        except SlurmError as error:
            created = float(record.get("created_at", time.time()))
            if _not_yet(error) and time.time() - created < SUBMIT_RETRY_SECONDS:
                return
            self._end_task(directory, TaskState.LOST, message=f"Slurm refused the job: {error.detail}")
            return
        _write(directory / "job.json", {"job_id": job_id})
        self._forget_cache()

    def _advance_group(self, directory: Path, record: Mapping[str, Any], placement: Placement) -> None:
        assert placement.group is not None
        group = self.groups / placement.group
        make_dir(group, PASSAGE_MODE)
        make_dir(group / "members", 0o700)
        member = group / "members" / str(placement.group_index)
        if not member.exists():
            member.write_text(record["task_id"])
        if self._job_id(group) is not None:
            if not (directory / "job.json").exists():
                _write(directory / "job.json", {"job_id": self._job_id(group), "group": placement.group})
            return
        members = {}
        for index in range(placement.group_size):
            path = group / "members" / str(index)
            if not path.exists():
                return  # the others are not there yet
            members[index] = path.read_text()
        task_dirs = [str(self.tasks / members[i]) for i in range(placement.group_size)]
        _write(group / "group.json", {"members": task_dirs}, READABLE_FILE_MODE)
        runner = shlex.join(step_argv(self.python, self.runner, directory, group))
        script = (
            "#!/bin/sh\n"
            f"exec srun --nodes={placement.group_size} --ntasks-per-node=1 --kill-on-bad-exit=0 "
            f"--output=/dev/null --error={shlex.quote(str(directory / 'out' / 'srun.log'))} {runner}\n"
        )
        write_atomically(group / "group.sh", script.encode(), READABLE_FILE_MODE)
        options = [
            f"--job-name={self.prefix}g.{placement.group}",
            f"--nodes={placement.group_size}",
            "--exclusive",
            NO_REQUEUE,
            f"--chdir={directory / 'home'}",
            f"--output={directory / 'out' / 'batch.log'}",
            *self._placement_options(placement),
        ]
        self._submit_task(group, group / "group.sh", options, _run_as_of(record), record)
        job_id = self._job_id(group)
        if job_id is None:
            state = _read(group / "state.json")
            if state is not None:
                for task_dir in task_dirs:
                    self._end_task(
                        Path(task_dir), TaskState(state["state"]), message=state.get("message", "")
                    )
            return
        for task_dir in task_dirs:
            _write(Path(task_dir) / "job.json", {"job_id": job_id, "group": placement.group})

    def _launch_step(self, directory: Path, node_dir: Path) -> None:
        job_id = self._job_id(node_dir)
        node = _read(node_dir / "node.json") or {}
        record = _read(directory / "task.json") or {}
        if job_id is None:
            return
        command = [
            *_as_user(_run_as_of(node)),
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={self._step_name(record)}",
            "--output=/dev/null",
            "--error=/dev/null",
            "--input=none",
            f"--immediate={STEP_TRY_SECONDS}",
            *step_argv(self.python, self.runner, directory),
        ]
        earlier = _read(directory / "launch.json") or {}
        with open(directory / "srun.log", "ab") as srun_log:
            log_from = srun_log.tell()  # where this srun's words start (an earlier try's are above)
            process = subprocess.Popen(
                command,
                env=self._tool_env(),
                cwd=self.root,  # srun's is its step's until the runner's own: one the user may enter
                stdin=subprocess.DEVNULL,
                stdout=srun_log,
                stderr=srun_log,
                start_new_session=True,  # outlives the server, as a node agent does
                close_fds=True,
            )
        self._launches[directory.name] = process
        now = time.time()
        launch = {"pid": process.pid, "job_id": job_id, "at": now, "first_at": earlier.get("first_at", now)}
        _write(
            directory / "launch.json", {**launch, "log_from": log_from, "tries": earlier.get("tries", 0) + 1}
        )
        # Reaped here while the server lives; srun's exit status is the step's (below, _srun_exit).
        threading.Thread(target=_reap, args=(process, directory / "srun.json"), daemon=True).start()

    def task_status(self, task_id: str) -> TaskStatus:
        directory = self._task_dir(task_id)
        with self._lock:
            return self._task_status(directory)

    def _task_status(self, directory: Path) -> TaskStatus:
        settled = _read(directory / "state.json")
        if settled is not None:
            return _status_of(settled, directory)
        record = _read(directory / "task.json") or {}
        self._advance(directory, record)
        settled = _read(directory / "state.json")
        if settled is not None:
            return _status_of(settled, directory)
        # Slurm's record says whether the work still runs; the runner's records (the user's to rewrite)
        # are read only once it has ended, and then only for how the program ended.
        out = directory / "out"
        started = tenant_files.exists(out / "started.json")
        terminate = _read(directory / "terminate.json")
        job: Job | None = None
        if record.get("node_id") is not None:
            launch = _read(directory / "launch.json")
            if launch is None:
                node_state = self._node_status(self._node_dir(record["node_id"])).state
                if terminate is not None or node_state not in (NodeState.PENDING, NodeState.RUNNING):
                    why = "stopped before it started" if terminate else f"stopped: its node is {node_state}"
                    return self._end_task(directory, TaskState.KILLED, message=why)
                return TaskStatus(TaskState.PENDING)
            step = self._task_step(record, launch)
            if step is not None and terminate is not None:
                self._enforce(directory, step, terminate)  # ordered before the step had started
            # A runner that has started ran in a step Slurm lists while it lives; before that, the
            # step may still be coming (its srun trying).
            if step is not None or (not started and self._srun_alive(directory, launch)):
                return TaskStatus(TaskState.RUNNING if started and step else TaskState.PENDING)
            if not started and terminate is None:
                retried = self._retry_refused_step(directory, record, launch)
                if retried is not None:
                    return retried
            node_dir = self.nodes / record["node_id"]
            if terminate is None and (node_dir / "terminate.json").exists():
                terminate = _read(node_dir / "terminate.json")  # ended with its node
            # srun's status is the step's only while the node's job runs on: when the job ends
            # (terminated, NODE_FAIL, its time limit) srun gives up on the step and may exit 0.
            witness = None
            if started and not tenant_files.exists(directory / KILLED) and self._job_runs(node_dir):
                witness = self._srun_exit(directory)
            if witness is not None:
                ended = _runner_exit(out / "exit.json")
                return self._end_witnessed(directory, ended, witness, "srun's exit status")
        else:
            job_id = self._job_id(directory)
            if job_id is None:
                if terminate is not None:
                    return self._end_task(directory, TaskState.KILLED, message="stopped before it started")
                return TaskStatus(TaskState.PENDING)
            job = self._job(job_id)
            if job is not None and job.state in LIVE_JOB_STATES:
                if not _grouped(record) or _runner_exit(out / "exit.json") is None:
                    return TaskStatus(TaskState.RUNNING if started else TaskState.PENDING)
                # A group's member may end before the others (its node's runner is done while the job
                # runs on): its record is taken, and once every member has ended so must the job, so
                # that members claiming an end they have not reached cannot keep it running unseen.
                status = self._end_from_record(directory, _runner_exit(out / "exit.json"), job, record)
                self._end_group_if_over(record, job_id)
                return status
        return self._end_from_record(
            directory, _runner_exit(out / "exit.json"), job, record, terminate, started
        )

    def _end_from_record(
        self,
        directory: Path,
        ended: RunnerExit | str | None,
        job: Job | None,
        record: Mapping[str, Any],
        terminate: Mapping[str, Any] | None = None,
        started: bool = False,
    ) -> TaskStatus:
        """A task whose step or job has ended (or a group's member whose runner has said so): how."""
        if tenant_files.exists(directory / KILLED):  # it still ran when the server killed it
            return self._end_task(directory, TaskState.KILLED, signal=SIGKILL)
        witness = _batch_exit(job, record)
        if witness is not None:
            return self._end_witnessed(directory, ended, witness, "its Slurm job's ExitCode")
        if isinstance(ended, str):
            return self._end_task(directory, TaskState.LOST, message=f"it ended, but {ended}")
        if ended is not None:
            return self._end_from_runner(directory, ended)
        if terminate is not None:
            return self._end_task(directory, TaskState.KILLED, signal=SIGKILL if started else None)
        why = _why_lost(directory, self._job(self._job_id(directory) or 0))
        return self._end_task(directory, TaskState.LOST, message=why)

    def _end_witnessed(
        self, directory: Path, ended: RunnerExit | str | None, witness: int, source: str
    ) -> TaskStatus:
        """How the runner ended as a source the tenant cannot write says (``witness``: its exit code, or
        128 + the signal that ended it): the runner's record only where it agrees (it tells an exit code
        of 143 from SIGTERM); a record that disagrees, is refused or is missing changes nothing."""
        truth = witnessed(ended if isinstance(ended, RunnerExit) else None, witness)
        message = f"it ended, but {ended}; how it ended is {source}" if isinstance(ended, str) else ""
        if truth.exit_code is not None:
            return self._end_task(directory, TaskState.EXITED, exit_code=truth.exit_code, message=message)
        return self._end_task(directory, TaskState.KILLED, signal=truth.signal, message=message)

    def _retry_refused_step(
        self, directory: Path, record: Mapping[str, Any], launch: Mapping[str, Any]
    ) -> TaskStatus | None:
        """A node task whose srun has ended saying that Slurm did not create its step (see
        ``STEP_TRY_SECONDS``): launched again while its node's job runs, for up to ``STEP_START_SECONDS``
        after the first try; then Lost with srun's words. None when srun did not say so."""
        said = _srun_words(directory, launch)
        if STEP_REFUSED not in said or self._srun_exit(directory) is None:
            return None
        node_dir = self.nodes / record["node_id"]
        if not self._job_runs(node_dir):
            return None  # the node's job has ended: the task ends with it
        if time.time() - float(launch.get("first_at", launch.get("at", 0))) >= STEP_START_SECONDS:
            why = f"Slurm did not start its step within {STEP_START_SECONDS:g} s: {said.strip()}"
            return self._end_task(directory, TaskState.LOST, message=why)
        log.info("step of task %s refused (%s): launched again", directory.name, said.strip())
        self._launch_step(directory, node_dir)
        return TaskStatus(TaskState.PENDING)

    def _job_runs(self, node_dir: Path) -> bool:
        job_id = self._job_id(node_dir)
        job = self._job(job_id) if job_id is not None else None
        return job is not None and job.state == "RUNNING"

    def _srun_exit(self, directory: Path) -> int | None:
        """A node task's srun's exit status, which is its step's (the runner's exit code, or 128 + the
        signal that ended it): srun runs on the server's machine, where the tenant's programs do not, and
        it is the server's child. Known only to the server that launched it (or from ``srun.json``,
        which the server wrote when it reaped srun); None otherwise, or while srun has not ended."""
        process = self._launches.get(directory.name)
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=SRUN_EXIT_WAIT)  # the step has ended: srun follows at once
            code = process.returncode
        else:
            reaped = _read(directory / "srun.json") or {}
            launched = (_read(directory / "launch.json") or {}).get("pid")
            # (an earlier try's srun, relaunched after a refusal, has a record of its own pid)
            code = reaped.get("returncode") if reaped.get("pid", launched) == launched else None
        if not isinstance(code, int) or not 0 <= code <= 255:
            return None  # not known, or runuser itself was killed (no step status then)
        return code

    def _end_group_if_over(self, record: Mapping[str, Any], job_id: int) -> None:
        placement = _placement_of(record.get("placement"))
        group = _read(self.groups / str(placement.group if placement else "") / "group.json") or {}
        members = [Path(str(member)) for member in group.get("members", [])]
        if members and all(tenant_files.exists(member / "state.json") for member in members):
            self._cancel(str(job_id))

    def _enforce(self, directory: Path, step: str, order: Mapping[str, Any]) -> None:
        if not (directory / "signalled").exists():
            (directory / "signalled").touch()
            self._cancel(step, SIGTERM)
        if float(order["deadline"]) <= time.time():
            (directory / KILLED).touch()
            self._cancel(step, SIGKILL)

    def _end_from_runner(self, directory: Path, ended: RunnerExit) -> TaskStatus:
        if ended.exit_code is not None:
            return self._end_task(directory, TaskState.EXITED, exit_code=ended.exit_code)
        return self._end_task(directory, TaskState.KILLED, signal=ended.signal)

    def _end_task(
        self,
        directory: Path,
        state: TaskState,
        exit_code: int | None = None,
        signal: int | None = None,
        message: str = "",
    ) -> TaskStatus:
        record = {"state": state.value, "exit_code": exit_code, "signal": signal, "message": message}
        with contextlib.suppress(FileNotFoundError):
            _write(directory / "state.json", record)
        return _status_of(record, directory)

    def _settle_queued(self, node_id: str, why: str) -> None:
        for task_dir in self._task_dirs():
            record = _read(task_dir / "task.json")
            if record is None or record.get("node_id") != node_id or (task_dir / "state.json").exists():
                continue
            if not (task_dir / "launch.json").exists():
                self._end_task(task_dir, TaskState.KILLED, message=f"stopped: {why}")

    # --- signals ---------------------------------------------------------------------------------

    def signal(self, ref: Ref, sig: Signals, env: Mapping[str, str] | None = None) -> None:
        with self._lock:
            target = self._target(ref)
            self._publish(target.env_dir, env)
            if self._has_ended(ref):
                return
            if target.step is not None:
                self._cancel(target.step, sig)
            elif target.job_id is not None:
                self._cancel(str(target.job_id), sig, full=isinstance(ref, TaskRef) and not target.grouped)

    def terminate(self, ref: Ref, grace: timedelta, env: Mapping[str, str] | None = None) -> None:
        with self._lock:
            target = self._target(ref)
            self._publish(target.env_dir, env)
            if self._has_ended(ref):
                return
            seconds = max(0.0, grace.total_seconds())
            order = _Terminate(seconds, time.time() + seconds)
            path = target.directory / "terminate.json"
            earlier = _read(path)
            first = earlier is None
            if earlier is not None and earlier["deadline"] <= order.deadline:
                order = _Terminate(earlier["grace"], earlier["deadline"])
            else:
                _write(path, asdict(order), READABLE_FILE_MODE)
            if first:
                target = self._target(ref)  # a step may have started meanwhile
                if target.step is not None:
                    (target.directory / "signalled").touch()
                    self._cancel(target.step, SIGTERM)
                elif target.job_id is not None:
                    job = self._job(target.job_id)
                    if job is not None and job.state == "PENDING":
                        self._cancel(str(target.job_id))
                    else:
                        # A node's batch script ends its hold on it; a sandbox's is the runner. A
                        # group's batch script is srun, which would end its step at once: its
                        # step's processes get the signal directly instead.
                        self._cancel(str(target.job_id), SIGTERM, full=not target.grouped)
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
            order = _read(self._target(ref).directory / "terminate.json")
            if order is None or order["deadline"] > time.time() + 0.05:
                return  # forgotten (the id may be another's now), or an earlier order's later timer
            if self._has_ended(ref):
                return
            target = self._target(ref)
            if target.step is not None:
                (target.directory / KILLED).touch()
                self._cancel(target.step, SIGKILL)
            elif target.job_id is not None:
                if isinstance(ref, TaskRef):
                    (target.directory / KILLED).touch()
                self._kill_job(target.job_id)

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
            return self._node_dir(ref.node_id) / "oncreate" / "out"
        return self._task_dir(ref.task_id) / "out"

    # --- restart ---------------------------------------------------------------------------------

    def adopt(self, known: Iterable[Ref]) -> AdoptReport:
        known = set(known)
        running: list[Ref] = []
        ended: list[Ref] = []
        killed: list[Ref] = []
        self._forget_cache()
        with self._lock:
            for directory in self._task_dirs():
                ref: Ref = TaskRef(directory.name)
                if not (directory / "task.json").exists():
                    shutil.rmtree(directory, ignore_errors=True)
                elif ref not in known:
                    self._destroy_task(directory)
                    killed.append(ref)
            for directory in _dirs(self.nodes):
                ref = NodeRef(directory.name)
                if not (directory / "node.json").exists():
                    shutil.rmtree(directory, ignore_errors=True)
                elif ref not in known:
                    job_id = self._job_id(directory)
                    if job_id is not None:
                        self._kill_job(job_id)
                    shutil.rmtree(directory, ignore_errors=True)
                    killed.append(ref)
                else:
                    state = self._node_status(directory).state
                    (ended if state in (NodeState.FAILURE, NodeState.TERMINATED) else running).append(ref)
                    self._resume_timer(ref, directory)
            for directory in self._task_dirs():
                ref = TaskRef(directory.name)
                if ref in known:
                    final = self._task_status(directory).state.is_final()
                    (ended if final else running).append(ref)
                    self._resume_timer(ref, directory)
            self._cancel_strays()
        found = {*running, *ended}
        missing = tuple(ref for ref in known if ref not in found)
        return AdoptReport(tuple(running), tuple(ended), missing, tuple(killed), ())

    def _resume_timer(self, ref: Ref, directory: Path) -> None:
        order = _read(directory / "terminate.json")
        if order is not None and not (directory / "state.json").exists():
            self._arm(ref, float(order["deadline"]))

    def _cancel_strays(self) -> None:
        """Jobs named with this back end's prefix that no node, task or group here records."""
        recorded = set()
        for directory in (*_dirs(self.nodes), *self._task_dirs(), *_dirs(self.groups)):
            job_id = self._job_id(directory)
            if job_id is not None:
                recorded.add(job_id)
        for job in self._jobs().values():
            if job.name.startswith(self.prefix) and job.state in LIVE_JOB_STATES and job.id not in recorded:
                log.warning("cancelling stray Slurm job %s (%s)", job.id, job.name)
                # Not one of ours to the end (no runner): a plain cancel, so Slurm ends every process
                # of it (SIGTERM, SIGKILL after its KillWait); killing its batch script first would
                # orphan the script's children.
                self._cancel(str(job.id))

    def forget(self, ref: Ref) -> None:
        with self._lock:
            if isinstance(ref, NodeRef):
                directory = self.nodes / check_id("node id", ref.node_id)
                if not (directory / "node.json").exists():
                    return
                state = self._node_status(directory).state
                if not state.is_final():
                    raise NodeUnavailable(f"node {ref.node_id} is {state}: terminate it first")
                shutil.rmtree(directory, ignore_errors=True)
                return
            directory = self.tasks / check_id("task id", ref.task_id)
            if not (directory / "task.json").exists():
                return
            status = self._task_status(directory)
            if not status.state.is_final():
                raise NodeUnavailable(f"task {ref.task_id} is {status.state}: terminate it first")
            self._destroy_task(directory)

    # --- an account's user going ---------------------------------------------------------------

    def tenant_paths(self) -> list[tuple[str, bool]]:
        """Every file an account's process runs (True) or reads (False) on the nodes before its own
        program starts: the interpreter, the step runner and the timed-log wrapper. Each must be open to
        other users, else every step dies at once (a start in mode users checks them)."""
        return [(self.python, True), (str(self.runner), False), (str(self.tools / TIMEDLOG_FILE), False)]

    def clear_user(self, run_as: RunAs) -> None:
        """The user's Slurm jobs cancelled, then on each of the back end's nodes one short batch job of
        root's (``--nodelist``, ``CLEAR_TIME_LIMIT``) runs the copied ``scratch.py`` on the user's uid:
        every process of it killed, every file it owns in /tmp, /var/tmp and /dev/shm removed.

        Asynchronous where it must be: this waits up to ``CLEAR_WAIT_SECONDS`` for the jobs to end (on
        free nodes they do in seconds), then returns, leaving the others queued; each runs when Slurm
        can place it on its node. A node that another job holds whole (every job of this back end is
        ``--exclusive``) is swept once that job ends; a node in another account's reservation once the
        reservation has ended (Slurm refuses root a reservation that does not name it, so the job waits
        outside it), or earlier in a gap before one starts; a drained or down node once it is back. The
        uid is never given to another account, so a sweep that comes late removes nothing of anyone
        else's. Each job's output is kept in ``ROOT/clears``. BackendError when Slurm refuses a job (the
        others are submitted first)."""
        if run_as.uid == 0 or run_as.gid == 0:
            raise BackendError(f"cannot clear {run_as.user}: uid 0 is root")
        try:
            self._cancel_jobs_of(run_as.user)
            machines = self.machines if self.machines is not None else [n.name for n in self.client.nodes()]
        except SlurmError as error:
            raise BackendError(f"Slurm does not answer: {error}") from None
        refused, submitted = [], {}
        for machine in machines:
            try:
                submitted[self._submit_clear(run_as.uid, machine)] = machine
            except SlurmError as error:
                refused.append(f"{machine}: {error.detail}")
        if refused:
            raise BackendError(f"cannot clear uid {run_as.uid} on every node: {'; '.join(refused)}")
        queued = self._wait_for_jobs(submitted, CLEAR_WAIT_SECONDS)
        if queued:
            log.warning(
                "uid %s: its sweep still waits for nodes %s (Slurm jobs %s)",
                run_as.uid,
                ",".join(sorted(submitted[job_id] for job_id in queued)),
                ",".join(map(str, sorted(queued))),
            )

    def _wait_for_jobs(self, job_ids: Iterable[int], seconds: float) -> set[int]:
        """Wait until Slurm says each job has ended, for up to ``seconds``; those still live then."""
        live, until = set(job_ids), time.monotonic() + seconds
        while live:
            try:
                live &= {job.id for job in self.client.jobs() if job.state in LIVE_JOB_STATES}
            except SlurmError as error:
                log.info("%s", error)  # (not for us to wait on, then: the jobs go on by themselves)
                break
            if not live or time.monotonic() >= until:
                break
            time.sleep(0.5)
        return live

    def _cancel_jobs_of(self, user: str) -> None:
        """Every job of ``user``: those the server ran have ended, but the user may have submitted its
        own from inside them (its jobs left pending would start later, as nobody)."""
        try:
            self.client.run("scancel", f"--user={user}")
        except SlurmError as error:
            if "invalid user" not in error.detail.lower():
                raise  # (a user already gone from this machine has no job Slurm could name)

    def _submit_clear(self, uid: int, machine: str) -> int:
        """One node's clearing job, as root (the server's own user: no ``runuser``)."""
        command = shlex.join([self.python, "-I", "-S", str(self.tools / SCRATCH_FILE), str(uid)])
        options = [
            f"--job-name=hp-clear.{uid}.{machine}",  # outside the prefix: adopt never cancels it
            f"--nodelist={machine}",
            "--nodes=1",
            "--ntasks=1",
            NO_REQUEUE,
            f"--time={CLEAR_TIME_LIMIT}",
            f"--chdir={self.clears}",
            f"--output={self.clears / f'{uid}.{machine}.log'}",
            *([f"--partition={self.partition}"] if self.partition else []),
            f"--wrap={command}",
        ]
        return self._sbatch(None, options, None)

    def close(self) -> None:
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()

    # --- helpers ---------------------------------------------------------------------------------

    def _destroy_task(self, directory: Path) -> None:
        record = _read(directory / "task.json") or {}
        if record.get("node_id") is not None:
            step = self._task_step(record, _read(directory / "launch.json"))
            if step is not None:
                self._cancel(step, SIGKILL)
        else:
            job_id = self._job_id(directory)
            if job_id is not None:
                self._kill_job(job_id)
        shutil.rmtree(directory, ignore_errors=True)

    @dataclass
    class _Target:
        directory: Path
        env_dir: Path | None
        job_id: int | None
        step: str | None
        grouped: bool = False

    def _target(self, ref: Ref) -> SlurmBackend._Target:
        if isinstance(ref, NodeRef):
            directory = self._node_dir(ref.node_id)
            return self._Target(directory, directory / "env", self._job_id(directory), None)
        directory = self._task_dir(ref.task_id)
        record = _read(directory / "task.json") or {}
        if record.get("node_id") is None:
            placement = _placement_of(record.get("placement"))
            grouped = placement is not None and placement.group is not None and placement.group_size > 1
            return self._Target(directory, directory / "env", self._job_id(directory), None, grouped)
        node_dir = self.nodes / record["node_id"]
        step = self._task_step(record, _read(directory / "launch.json"))
        return self._Target(directory, node_dir / "env", None, step)

    def _has_ended(self, ref: Ref) -> bool:
        if isinstance(ref, NodeRef):
            return self._node_status(self._node_dir(ref.node_id)).state.is_final()
        return self._task_status(self._task_dir(ref.task_id)).state.is_final()

    def _publish(self, env_dir: Path | None, env: Mapping[str, str] | None) -> None:
        if not env or env_dir is None or not env_dir.parent.exists():
            return
        check_env(env)
        make_dir(env_dir, READABLE_DIR_MODE)
        for name, value in env.items():
            write_atomically(env_dir / name, value.encode(), READABLE_FILE_MODE)

    def _node_dir(self, node_id: str) -> Path:
        directory = self.nodes / check_id("node id", node_id)
        if not (directory / "node.json").exists():
            raise UnknownResource(f"no node {node_id}")
        return directory

    def _task_dir(self, task_id: str) -> Path:
        directory = self.tasks / check_id("task id", task_id)
        if not (directory / "task.json").exists():
            raise UnknownResource(f"no task {task_id}")
        return directory

    def _task_dirs(self) -> list[Path]:
        return _dirs(self.tasks)

    def _job_id(self, directory: Path) -> int | None:
        record = _read(directory / "job.json")
        return int(record["job_id"]) if record is not None else None

    def _jobs(self) -> dict[int, Job]:
        at, jobs = self._cache
        if time.monotonic() - at > CACHE_SECONDS:
            try:
                jobs = {job.id: job for job in self.client.jobs()}
            except SlurmError as error:
                raise BackendError(f"Slurm does not answer: {error}") from None
            self._cache = (time.monotonic(), jobs)
        return jobs

    def _job(self, job_id: int) -> Job | None:
        job = self._jobs().get(job_id)
        if job is None:  # submitted after the shared read, perhaps: only a fresh one may say it is gone
            self._cache = (0.0, {})
            job = self._jobs().get(job_id)
        return job

    def _job_named(self, name: str) -> Job | None:
        self._forget_cache()
        live = [job for job in self._jobs().values() if job.name == name and job.state in LIVE_JOB_STATES]
        return max(live, key=lambda job: job.id) if live else None

    def _live_steps(self, fresh: bool = False) -> dict[str, str]:
        """Slurm's live steps, id (``J.S``) -> name, from a read shared for a short while."""
        at, steps = self._steps
        if fresh or time.monotonic() - at > CACHE_SECONDS:
            try:
                text = self.client.run("squeue", "--steps", "--noheader", "--format=%i|%j")
            except SlurmError as error:
                raise BackendError(f"Slurm does not answer: {error}") from None
            steps = dict(line.split("|", 1) for line in text.splitlines() if "|" in line)
            self._steps = (time.monotonic(), steps)
        return steps

    def _step_alive(self, step: str) -> bool:
        # A step missing from a shared read may have started after it: only a fresh read may say
        # that a step has gone (then it is settled once, and never asked about again).
        return step in self._live_steps() or step in self._live_steps(fresh=True)

    def _step_name(self, record: Mapping[str, Any]) -> str:
        """A node task's step's name: with the task's nonce, which only the server knows (task.json is
        its own), so the tenant cannot make a step of its own pass for the task's before it starts."""
        return f"{self.prefix}s.{record.get('task_id')}.{record.get('nonce', '')}"

    def _task_step(self, record: Mapping[str, Any], launch: Mapping[str, Any] | None) -> str | None:
        """The live step of a task on a node, as Slurm names it (never as the runner's ``started.json``
        says: the program may have rewritten that); None once it has gone, or before it has started.
        Of several with its name (the user may start more once it has seen it) the first one."""
        if launch is None:
            return None
        name, job = self._step_name(record), f"{launch.get('job_id')}."

        def found(steps: Mapping[str, str]) -> str | None:
            ids = [step for step, named in steps.items() if named == name and step.startswith(job)]
            return min(ids, key=lambda step: int(step.rpartition(".")[2])) if ids else None

        return found(self._live_steps()) or found(self._live_steps(fresh=True))

    def _srun_alive(self, directory: Path, launch: Mapping[str, Any]) -> bool:
        """A launched step whose runner has not started yet: its srun still trying, for a while."""
        process = self._launches.get(directory.name)
        if process is not None:
            return process.poll() is None
        return time.time() - float(launch.get("at", 0)) < STEP_START_SECONDS

    def _forget_cache(self) -> None:
        self._cache = (0.0, {})
        self._steps = (0.0, {})

    def _cancel(self, what: str, sig: Signals | None = None, full: bool = False, batch: bool = False) -> None:
        command = [
            "scancel",
            *(["--full"] if full else []),
            *(["--batch"] if batch else []),
            *([f"--signal={sig.name[3:]}"] if sig else []),
            what,
        ]
        try:
            self.client.run(*command)
        except SlurmError as error:
            log.info("%s", error)  # ended meanwhile
        self._forget_cache()

    def _kill_job(self, job_id: int) -> None:
        """SIGKILL to all of a job, now. (``scancel --signal=KILL J`` is taken as a cancel, which
        signals SIGTERM and kills only ``KillWait`` later: so each step, then the batch script.)"""
        steps = self._live_steps(fresh=True)
        for step in sorted(steps):
            if step.startswith(f"{job_id}.") and not step.endswith(".batch") and not step.endswith(".extern"):
                self._mark_killed(steps[step])
                self._cancel(step, SIGKILL)
        self._cancel(str(job_id), SIGKILL, batch=True)
        self._cancel(str(job_id))  # and cancelled: Slurm ends whatever the batch script left behind

    def _mark_killed(self, step_name: str) -> None:
        """A node task's step that still ran when the server killed it (its name says which task)."""
        if not step_name.startswith(f"{self.prefix}s."):
            return
        task_id = step_name.removeprefix(f"{self.prefix}s.").rpartition(".")[0]
        with contextlib.suppress(OSError, ValueError):
            directory = self.tasks / check_id("task id", task_id)
            if (directory / "task.json").exists() and not (directory / "state.json").exists():
                (directory / KILLED).touch()

    def live_jobs(self) -> list[Job]:
        """This back end's jobs Slurm still runs (or has queued), by name prefix."""
        self._forget_cache()
        return [
            job
            for job in self._jobs().values()
            if job.name.startswith(self.prefix) and job.state in LIVE_JOB_STATES
        ]

    def _tool_env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "SLURM_CONF": str(self.client.slurm_conf),
            "TZ": "UTC",
            **inherited_mark(),
        }
        return env

    def _tool(self, command: Sequence[str]) -> str:
        try:
            result = subprocess.run(
                command,
                env=self._tool_env(),
                cwd=self.root,  # one the account's user may enter (the server's own may be closed to it)
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmError(command, str(error)) from None
        if result.returncode != 0:
            detail = result.stderr.strip() or f"exit status {result.returncode}"
            raise SlurmError(command, detail, result.returncode)
        return result.stdout

    def _base_env(self, home: Path, run_as: RunAs | None, node_dir: Path) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": str(home),
            ENV_DIR_VARIABLE: str(node_dir / "env"),
            **inherited_mark(),
        }
        if run_as is not None:
            env["USER"] = env["LOGNAME"] = run_as.user
        return env

    def _write_runner_spec(
        self,
        directory: Path,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        run_as: RunAs | None,
        env_dir: Path,
    ) -> None:
        make_dir(directory, PASSAGE_MODE)
        out = directory / "out"
        make_dir(out, 0o700)
        spec = {"argv": argv, "env": dict(env), "cwd": str(cwd), "env_dir": str(env_dir)}
        _write(directory / "run.json", spec)
        if run_as is not None:
            os.chown(directory / "run.json", run_as.uid, run_as.gid)
            os.chown(out, run_as.uid, run_as.gid)


def _nonce() -> str:
    """Part of a job's name: a job of an earlier node or task with the same id is never taken for it."""
    return uuid.uuid4().hex[:8]


def _dirs(directory: Path) -> list[Path]:
    try:
        return sorted(
            entry for entry in directory.iterdir() if entry.is_dir() and not entry.name.startswith(".")
        )
    except FileNotFoundError:
        return []


def _placement_of(record: Mapping[str, Any] | None) -> Placement | None:
    if record is None:
        return None
    limit = record.get("time_limit")
    return Placement(
        reservation=record.get("reservation"),
        constraint=record.get("constraint"),
        time_limit=timedelta(seconds=limit) if limit is not None else None,
        group=record.get("group"),
        group_size=int(record.get("group_size", 1)),
        group_index=int(record.get("group_index", 0)),
    )


def _run_as_of(record: Mapping[str, Any]) -> RunAs | None:
    value = record.get("run_as")
    return RunAs(**value) if value else None


def _as_user(run_as: RunAs | None) -> list[str]:
    """Slurm runs a job as the user who submits it; steps inside it only as that user."""
    return ["runuser", "-u", run_as.user, "--"] if run_as is not None else []


def _check_run_as(run_as: RunAs | None) -> None:
    if run_as is None:
        return
    if run_as.uid == 0 or run_as.gid == 0:
        raise BackendError(f"cannot run work as {run_as.user}: uid and gid must not be 0 (root)")
    if os.geteuid() != 0:
        raise BackendError(
            f"cannot run work as {run_as.user}: the server is not root, so it cannot change user"
        )


def _not_yet(error: SlurmError) -> bool:
    """sbatch refused the job because its reservation is not there (yet)."""
    detail = error.detail.lower()
    return "reservation" in detail and ("invalid" in detail or "not found" in detail)


def _status_of(record: Mapping[str, Any], directory: Path | None = None) -> TaskStatus:
    message = record.get("message") or ""
    if not message and directory is not None:
        message = tail(directory / "out" / "stderr.log")
    return TaskStatus(TaskState(record["state"]), record.get("exit_code"), record.get("signal"), message)


def _grouped(record: Mapping[str, Any]) -> bool:
    """A member of a multi-node group (one Slurm job for all)."""
    placement = _placement_of(record.get("placement"))
    return placement is not None and placement.group is not None and placement.group_size > 1


def _killed_by(signal: int | None) -> str:
    try:
        return f"was killed by {Signals(signal or 0).name}"
    except ValueError:
        return f"was killed by signal {signal}"


def _reap(process: subprocess.Popen[bytes], record: Path) -> None:
    """Wait for a step's srun and write down its exit status (in the task's directory, the server's)."""
    code = process.wait()
    with contextlib.suppress(OSError):
        _write(record, {"returncode": code, "pid": process.pid, "at": time.time()})


def _srun_words(directory: Path, launch: Mapping[str, Any]) -> str:
    """What the latest srun of a node task has said so far (its part of ``srun.log``, the server's file)."""
    try:
        with open(directory / "srun.log", "rb") as srun_log:
            srun_log.seek(int(launch.get("log_from", 0)))
            return srun_log.read(RECORD_LIMIT).decode(errors="replace")
    except (OSError, ValueError):
        return ""


def _batch_exit(job: Job | None, record: Mapping[str, Any]) -> int | None:
    """A sandbox's runner is its job's batch script: Slurm recorded how the runner ended (the program's
    code, or 128 + its signal; Slurm's signal when the script itself was killed), when the batch script
    ended by itself (COMPLETED, FAILED: a cancelled job's code is Slurm's own). None otherwise, and for
    a group (its batch script is srun, for all members) or a node task (a step)."""
    if job is None or _grouped(record) or record.get("node_id") is not None:
        return None
    if job.state not in ("COMPLETED", "FAILED"):
        return None
    return 128 + job.signal if job.signal else job.exit_code


def _why_lost(directory: Path, job: Job | None) -> str:
    srun = tail(directory / "srun.log")
    state = f"its Slurm job is {job.state}" if job is not None else "its Slurm job is gone"
    return f"ended without a record: {state}" + (f"; srun: {srun}" if srun else "")
