"""How the Slurm back end's work reaches Slurm: the tools the nodes run, the batch scripts, a batch job's
options, and the ``sbatch`` and ``srun`` command lines, run as the account's OS user.

Slurm runs a job as the user who submits it, and steps inside it only as that user: so every command
that starts work runs under ``runuser -u USER`` (``as_user``), from a directory that user may enter.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

from hyperplan.backends import slurm_runner
from hyperplan.backends.base import ENV_DIR_VARIABLE, BackendError, Placement, RunAs
from hyperplan.backends.layout import (
    PASSAGE_MODE,
    READABLE_DIR_MODE,
    READABLE_FILE_MODE,
    inherited_mark,
    make_dir,
    write_atomically,
)
from hyperplan.backends.slurm_records import write_json
from hyperplan.slurm import on_demand_time
from hyperplan.slurm.client import SlurmClient, SlurmError

SUBMIT_RETRY_SECONDS = 120.0
"""A job refused because its reservation does not exist yet (it is made when the segment starts) is
submitted again at each look for this long; then the node or task fails with Slurm's answer."""
STEP_TRY_SECONDS = 3
"""How long one srun waits for Slurm to create its step (``--immediate``) before it gives up; the next
look launches another, until ``slurm_tasks.STEP_START_SECONDS`` after the first. Without it srun waits:
right after slurmctld restarts, the nodes are UNKNOWN until their slurmd registers again and a step is
refused as "Requested nodes are busy"; srun then waits for a word from slurmctld that never comes for
that, and tries again only after SlurmctldTimeout (120 s by default), past an exec's caller's patience."""
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
SYSTEM_PYTHON = "/usr/bin/python3"
RECLAIM_DIR = "reclaim"
"""A node's directory for its reclaim hook's runner spec (``run.json``) and records (``out/``)."""
READ_GRACE = 'import json, sys; print(max(0.1, float(json.load(open(sys.argv[1]))["grace"])))'
"""The hook's time, read by the node's batch script from ``terminate.json`` (``timeout`` takes 0 as none)."""


# --- what the nodes run -----------------------------------------------------------------------------


def runner_python() -> str:
    """The runner needs only the standard library, and the account's user must be able to run it:
    the system's Python when there is one (the server's may sit in a directory closed to others)."""
    return SYSTEM_PYTHON if os.access(SYSTEM_PYTHON, os.X_OK) else sys.executable


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


def base_env(home: Path, run_as: RunAs | None, node_dir: Path) -> dict[str, str]:
    """The environment every program of a node starts with, before the spec's own variables."""
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


def write_runner_spec(
    directory: Path,
    argv: list[str],
    env: Mapping[str, str],
    cwd: Path | str,
    run_as: RunAs | None,
    env_dir: Path,
    container: Mapping[str, Any] | None = None,
    log_dir: Path | None = None,
) -> None:
    """The step runner's ``run.json`` (what it runs, where, with what; ``container``: in which container,
    ``slurm_containers.lay_out``; ``log_dir``: where its output goes, if not its ``out/``) and its
    ``out/``, the user's."""
    make_dir(directory, PASSAGE_MODE)
    out = directory / "out"
    make_dir(out, 0o700)
    spec: dict[str, Any] = {"argv": argv, "env": dict(env), "cwd": str(cwd), "env_dir": str(env_dir)}
    if container is not None:
        spec["container"] = dict(container)
    if log_dir is not None:
        spec["log_dir"] = str(log_dir)
    write_json(directory / "run.json", spec)
    if run_as is not None:
        os.chown(directory / "run.json", run_as.uid, run_as.gid)
        os.chown(out, run_as.uid, run_as.gid)


# --- as whom ----------------------------------------------------------------------------------------


def as_user(run_as: RunAs | None) -> list[str]:
    """Slurm runs a job as the user who submits it; steps inside it only as that user."""
    return ["runuser", "-u", run_as.user, "--"] if run_as is not None else []


def check_run_as(run_as: RunAs | None) -> None:
    if run_as is None:
        return
    if run_as.uid == 0 or run_as.gid == 0:
        raise BackendError(f"cannot run work as {run_as.user}: uid and gid must not be 0 (root)")
    if os.geteuid() != 0:
        raise BackendError(
            f"cannot run work as {run_as.user}: the server is not root, so it cannot change user"
        )


def not_yet(error: SlurmError) -> bool:
    """sbatch refused the job because its reservation is not there (yet), or does not admit its user yet
    (a managed spot job's user is added to the lending plan's reservation by the next reservation pass)."""
    detail = error.detail.lower()
    return "reservation" in detail and any(
        word in detail for word in ("invalid", "not found", "access denied")
    )


class Submitter:
    """Builds the scripts and command lines of the back end over ``root`` and runs them."""

    def __init__(self, client: SlurmClient, root: Path, python: str, tools: Path) -> None:
        self.client = client
        self.root = root
        self.python = python
        self.tools = tools
        self.runner = tools / RUNNER_FILE

    # --- scripts ---------------------------------------------------------------------------------

    def node_script(self, directory: Path, on_create: bool) -> str:
        quoted = shlex.quote(str(directory))
        lines = ["#!/bin/sh", f"node={quoted}"]
        if on_create:
            runner = shlex.join(step_argv(self.python, self.runner, directory / "oncreate"))
            lines += [f"{runner} || exit $?"]
        # Held until a SIGTERM reaches the batch script: only terminate sends one (``--full``; a plain
        # signal to the node goes to its steps), or Slurm when it cancels the job or its time is up.
        # The trap reaps its sleep before it exits: slurmstepd then finds the batch step's cgroup empty
        # at its first look; a sleep still dying there costs the job a second in COMPLETING.
        # At a reclaim terminate signals the batch script alone (``--batch``) after writing the hook's
        # runner spec (``RECLAIM_DIR``): the trap runs it for at most the grace of ``terminate.json``,
        # then sends the node's steps their SIGTERM (without ``--full``: the steps only) and ends.
        lines += [
            f"reclaim() {{\n{self._reclaim_lines(directory)}\n}}",
            'touch "$node/out/held"',
            "trap 'kill $! 2>/dev/null; wait; reclaim; exit 0' TERM",
            "while :; do sleep 5 & wait $!; done",
        ]
        return "\n".join(lines) + "\n"

    def _reclaim_lines(self, directory: Path) -> str:
        """The batch script's ``reclaim``: the hook (if terminate wrote its spec), then the steps' SIGTERM."""
        grace = shlex.join([self.python, "-I", "-S", "-c", READ_GRACE, str(directory / "terminate.json")])
        runner = shlex.join(step_argv(self.python, self.runner, directory / RECLAIM_DIR))
        spec = shlex.quote(str(directory / RECLAIM_DIR / "run.json"))
        return "\n".join([
            f"  [ -f {spec} ] || return 0",
            f"  grace=$({grace}) || return 0",
            f'  timeout -s KILL "$grace" {runner}',
            '  scancel --signal=TERM "$SLURM_JOB_ID" 2>/dev/null',
        ])  # fmt: skip

    def sandbox_script(self, directory: Path) -> str:
        """A sandboxed task's batch script: the runner itself, so Slurm's ExitCode is the runner's."""
        return "#!/bin/sh\nexec " + shlex.join(step_argv(self.python, self.runner, directory)) + "\n"

    def group_script(self, directory: Path, group: Path, size: int) -> str:
        """A group's batch script: one runner per node, each finding its member in ``group.json``."""
        runner = shlex.join(step_argv(self.python, self.runner, directory, group))
        return (
            "#!/bin/sh\n"
            f"exec srun --nodes={size} --ntasks-per-node=1 --kill-on-bad-exit=0 "
            f"--output=/dev/null --error={shlex.quote(str(directory / 'out' / 'srun.log'))} {runner}\n"
        )

    # --- batch jobs ------------------------------------------------------------------------------

    def batch_options(self, name: str, nodes: int, directory: Path, placement: Placement | None) -> list[str]:
        """A whole-node batch job's options; the job's name first (``submit`` looks for it by name)."""
        return [
            f"--job-name={name}",
            f"--nodes={nodes}",
            "--exclusive",
            NO_REQUEUE,
            f"--chdir={directory / 'home'}",
            f"--output={directory / 'out' / 'batch.log'}",
            *self.placement_options(placement),
        ]

    def placement_options(self, placement: Placement | None) -> list[str]:
        if placement is None:
            return []
        options = []
        if placement.constraint:
            options.append(f"--constraint={placement.constraint}")
        if placement.memory_bytes is not None:
            # Per node, for every step of the job (a node's tasks too): task/cgroup holds each step to
            # it, and the kernel kills a process of a step past it (Slurm: OUT_OF_MEMORY).
            options.append(f"--mem={-(-placement.memory_bytes // 2**20)}M")
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

    def sbatch(self, script: Path | None, options: Sequence[str], run_as: RunAs | None) -> int:
        """Submit ``script`` (None: the options carry ``--wrap``) as ``run_as`` (None: the server's own
        user); the new job's id."""
        command = [*as_user(run_as), "sbatch", "--parsable", *options, *([str(script)] if script else [])]
        text = self._tool(command)
        try:
            return int(text.strip().split(";")[0])
        except ValueError:
            raise SlurmError(command, f"unreadable job id {text.strip()!r}") from None

    # --- steps -----------------------------------------------------------------------------------

    def srun_command(self, job_id: int, run_as: RunAs | None, step_name: str, task_dir: Path) -> list[str]:
        """A node task's step: the runner on one node of the node's job, beside its batch script."""
        return [
            *as_user(run_as),
            "srun",
            f"--jobid={job_id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--job-name={step_name}",
            "--output=/dev/null",
            "--error=/dev/null",
            "--input=none",
            f"--immediate={STEP_TRY_SECONDS}",
            *step_argv(self.python, self.runner, task_dir),
        ]

    def start_srun(self, command: Sequence[str], srun_log: IO[bytes]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            env=self.tool_env(),
            cwd=self.root,  # srun's is its step's until the runner's own: one the user may enter
            stdin=subprocess.DEVNULL,
            stdout=srun_log,
            stderr=srun_log,
            start_new_session=True,  # outlives the server, as a node agent does
            close_fds=True,
        )

    # --- Slurm's tools ---------------------------------------------------------------------------

    def tool_env(self) -> dict[str, str]:
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
                env=self.tool_env(),
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
