"""The Slurm back end's step runner: runs one task's program inside a Slurm step (or batch script) and
records how it ended. Standard library only: it runs on the cluster's nodes, as the account's user.

``python3 slurm_runner.py TASK_DIR`` reads ``TASK_DIR/run.json`` (argv, env, cwd, the node's envdir),
and with ``--group GROUP_DIR`` picks the member ``SLURM_NODEID`` of a multi-node group first. It writes,
in the task's ``out/`` directory (the user's):

- ``started.json``: its pid, the Slurm job and step, the node (``SLURMD_NODENAME``);
- ``stdout.log``, ``stderr.log``: the program's output (appended);
- ``timed.log``: each line of it with the time it was written (``timedlog.py``'s format);
- ``exit.json``: the program's exit code, or the signal that ended it.

The program runs in the runner's process group (the one Slurm signals), with the variables published
in the envdir added to its environment. The runner itself ignores SIGTERM and the like: Slurm signals
the group, the program gets it directly. Under ``proctrack/cgroup`` Slurm signals (all but SIGKILL)
only each task's first process, the runner: it then passes them on to its process group. A SIGKILL ends
the runner too; then there is no ``exit.json`` and the back end says how the task ended (it ordered the
kill, or the task is Lost).

The program runs under the timed-log wrapper (``timedlog.py``), in the same process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

PR_SET_PDEATHSIG = 1
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)

TIMEDLOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timedlog.py")


def write_json(path: str, value: object) -> None:
    directory = os.path.dirname(path)
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    with os.fdopen(fd, "w") as out:
        json.dump(value, out)
    os.replace(temporary, path)


def published(env_dir: str | None) -> dict[str, str]:
    if not env_dir:
        return {}
    found = {}
    try:
        for name in os.listdir(env_dir):
            path = os.path.join(env_dir, name)
            if not name.startswith(".") and os.path.isfile(path):
                with open(path) as value:
                    found[name] = value.read()
    except OSError:
        pass
    return found


def host_addresses(nodes: list[str]) -> list[str]:
    """Each allocated node's address (Slurm's NodeAddr), in the allocation's order."""
    try:
        text = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(nodes)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return list(nodes)
    addresses = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split(" ") if "=" in word)
        if "NodeName" in fields:
            addresses[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
    return [addresses.get(node, node) for node in nodes]


def expand_nodes(nodelist: str) -> list[str]:
    try:
        text = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [nodelist]
    return text.split()


def group_member(group_dir: str) -> tuple[str, dict[str, str]]:
    """The task directory of this node's member of a group, and the hosts' variables for it."""
    with open(os.path.join(group_dir, "group.json")) as spec:
        members = json.load(spec)["members"]
    index = int(os.environ.get("SLURM_NODEID", "0"))
    nodes = expand_nodes(os.environ.get("SLURM_JOB_NODELIST", ""))
    addresses = host_addresses(nodes)
    hosts = [f"algo-{i + 1}" for i in range(len(members))]
    extra = {
        "HYPERPLAN_HOSTS": ",".join(f"{h}={a}" for h, a in zip(hosts, addresses, strict=False)),
        "HYPERPLAN_SLURM_NODES": ",".join(nodes),
        "MASTER_ADDR": addresses[0] if addresses else "127.0.0.1",
    }
    return members[index], extra


def _parent_is_a_shell() -> bool:
    """Not slurmstepd (a step, or a batch script that is the runner itself), which tracks its children."""
    try:
        with open(f"/proc/{os.getppid()}/comm") as comm:
            return comm.read().strip() != "slurmstepd"
    except OSError:
        return False


def _signalled_alone() -> bool:
    """Slurm gives a step's signals (SIGKILL aside) to the runner alone: it is the task's first process
    (slurmstepd's child) and the step is tracked by proctrack/cgroup, whose cgroup is the step's in the
    freezer hierarchy (v1) or the unified one (v2). proctrack/linuxproc signals every process of the
    step, the program included: passing them on would deliver each twice."""
    if _parent_is_a_shell():
        return False
    try:
        with open("/proc/self/cgroup") as cgroups:
            lines = cgroups.read().splitlines()
    except OSError:
        return False
    step = re.compile(r"/job_\d+/step_")
    return any(
        line.split(":", 2)[1] in ("freezer", "") and step.search(line.split(":", 2)[2])
        for line in lines
        if line.count(":") >= 2
    )


def _pass_on(sig: int, _frame: object) -> None:
    """A signal Slurm gave the runner alone, to its process group (the program; the wrapper ignores
    it), not to itself again."""
    signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.killpg(os.getpgrp(), sig)
    signal.signal(sig, _pass_on)


def _die_with_parent() -> None:
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(137)  # the parent died before the setting took effect


def main(argv: list[str]) -> int:
    extra: dict[str, str] = {}
    if argv[0] == "--group":
        task_dir, extra = group_member(argv[1])
    else:
        task_dir = argv[0]
    if _parent_is_a_shell():
        # Run by a node's batch script (OnCreate): the script is SIGKILLed when the back end's grace
        # ends, and its children would be left to init, outside what Slurm tracks (proctrack/linuxproc
        # follows parents). The runner goes with it; its program with the runner (timedlog.py).
        _die_with_parent()
    with open(os.path.join(task_dir, "run.json")) as spec_file:
        spec = json.load(spec_file)
    out = os.path.join(task_dir, "out")
    alone = _signalled_alone()
    for sig in IGNORED:
        signal.signal(sig, _pass_on if alone else signal.SIG_IGN)
    # Slurm's own variables (SLURM_JOB_ID, SLURMD_NODENAME, CUDA_VISIBLE_DEVICES...) pass through.
    slurm = {k: v for k, v in os.environ.items() if k.startswith(("SLURM", "CUDA_", "GPU_DEVICE"))}
    env = {**slurm, **spec["env"], **extra, **published(spec.get("env_dir"))}
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    stdout = os.open(os.path.join(out, "stdout.log"), flags, 0o600)
    stderr = os.open(os.path.join(out, "stderr.log"), flags, 0o600)

    def child_setup() -> None:
        # In the runner's process group: Slurm signals a step's (and a batch script's) process group.
        # A runner killed (SIGKILL at the end of a grace) takes its program with it.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for sig in IGNORED:
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    # The program runs under the timed-log wrapper (timedlog.py, beside this file, standard library only
    # too): its output reaches the two logs unchanged, and each line with its time reaches timed.log.
    wrapped = [sys.executable, "-I", "-S", TIMEDLOG, "--log", os.path.join(out, "timed.log"), "--"]
    try:
        process = subprocess.Popen(
            [*wrapped, *spec["argv"]],
            env=env,
            cwd=spec["cwd"],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=child_setup,
        )
    except OSError as error:
        os.write(stderr, f"cannot start {spec['argv'][0]}: {error}\n".encode())
        write_json(
            os.path.join(out, "exit.json"), {"exit_code": 127, "signal": None, "ended_at": time.time()}
        )
        return 127
    job, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "batch")
    started = {"pid": process.pid, "job": job, "step": step, "node": os.environ.get("SLURMD_NODENAME", "")}
    write_json(os.path.join(out, "started.json"), {**started, "started_at": time.time()})
    while True:
        try:
            code = process.wait()
            break
        except InterruptedError:
            continue
    ended = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None}
    write_json(os.path.join(out, "exit.json"), {**ended, "ended_at": time.time()})
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
