"""The Slurm back end's step runner: runs one task's program inside a Slurm step (or batch script) and
records how it ended. Standard library only: it runs on the cluster's nodes, as the account's user.

``python3 slurm_runner.py TASK_DIR`` reads ``TASK_DIR/run.json`` (argv, env, cwd, the node's envdir),
and with ``--group GROUP_DIR`` picks the member ``SLURM_NODEID`` of a multi-node group first. It writes,
in the task's ``out/`` directory (the user's):

- ``started.json``: its pid, the Slurm job and step, the node (``SLURMD_NODENAME``);
- ``stdout.log``, ``stderr.log``: the program's output (appended);
- ``timed.log``: each line of it with the time it was written (``timedlog.py``'s format);
- ``exit.json``: the program's exit code, or the signal that ended it.

With ``log_dir`` in ``run.json`` the three logs are appended there instead (a node's on_reclaim.sh: the
node's log, its OnCreate's ``out/``); the records stay in ``out/``.

The program runs in the runner's process group (the one Slurm signals), with the variables published
in the envdir added to its environment. The runner itself ignores SIGTERM and the like: Slurm signals
the group, the program gets it directly. Under ``proctrack/cgroup`` Slurm signals (all but SIGKILL)
only each task's first process, the runner: it then passes them on to its process group. A SIGKILL ends
the runner too; then there is no ``exit.json`` and the back end says how the task ended (it ordered the
kill, or the task is Lost).

The program runs under the timed-log wrapper (``timedlog.py``), in the same process group.

Container mode: ``run.json`` has a ``container`` object (``template``, ``bundle``, ``state``, ``name``,
``runc``, ``hosts``). The program then runs in a rootless runc container the server described in the
template (``oci_bundle.py``: the program, its working directory and environment are in it): the runner
puts the final environment in a copy (``BUNDLE/config.json``, 0600) and runs, under the same wrapper,
``runc --rootless=true --root=STATE run --bundle BUNDLE NAME``; with ``hosts``, it first writes that file
(the container's ``/etc/hosts``: the hosts of its group, by address). The container stays in the
runner's cgroup (the Slurm step's). ``exit.json`` then also says whether the memory limit killed a
process meanwhile (``out_of_memory``), and an exit status above 128 is recorded as the signal it means.
Signals go as for a host program, to runc, which passes them to the container's process 1 (catatonit),
which passes them to the program's process group. The task's directory is never mounted in the
container: the program cannot reach these records.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

PR_SET_PDEATHSIG = 1
IGNORED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)

TIMEDLOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "timedlog.py")
SBIN_PATH = "/usr/local/sbin:/usr/sbin:/sbin"
"""Where runc may be when the step's PATH (an ordinary user's) leaves the sbin directories out."""
RUNC_DELETE_TIMEOUT = 60
LOCALHOST_LINES = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


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
    # A node's on_reclaim.sh writes its output to the node's log (its OnCreate's), its records here.
    logs = spec.get("log_dir") or out
    alone = _signalled_alone()
    for sig in IGNORED:
        signal.signal(sig, _pass_on if alone else signal.SIG_IGN)
    # Slurm's own variables (SLURM_JOB_ID, SLURMD_NODENAME, CUDA_VISIBLE_DEVICES...) pass through.
    slurm = {k: v for k, v in os.environ.items() if k.startswith(("SLURM", "CUDA_", "GPU_DEVICE"))}
    container = spec.get("container")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    stdout = os.open(os.path.join(logs, "stdout.log"), flags, 0o600)
    stderr = os.open(os.path.join(logs, "stderr.log"), flags, 0o600)
    if container is None:
        env = {**slurm, **spec["env"], **extra, **published(spec.get("env_dir"))}
        command, command_env, cwd = spec["argv"], env, spec["cwd"]
    else:
        try:
            command, command_env, cwd = prepare_container(
                container, slurm, extra, published(spec.get("env_dir"))
            )
        except (OSError, ValueError, KeyError) as error:
            os.write(stderr, f"cannot start the container: {error}\n".encode())
            return failed_to_start(out, container)

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
    wrapped = [sys.executable, "-I", "-S", TIMEDLOG, "--log", os.path.join(logs, "timed.log"), "--"]
    kills_before = None
    if container is not None:
        kills_before = oom_kill_count()
        held = hold_in_own_cgroups(str(container["name"]))
    try:
        process = subprocess.Popen(
            [*wrapped, *command],
            env=command_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            preexec_fn=child_setup,
        )
    except OSError as error:
        os.write(stderr, f"cannot start {command[0]}: {error}\n".encode())
        return failed_to_start(out, container)
    job, step = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURM_STEP_ID", "batch")
    started = {"pid": process.pid, "job": job, "step": step, "node": os.environ.get("SLURMD_NODENAME", "")}
    write_json(os.path.join(out, "started.json"), {**started, "started_at": time.time()})
    while True:
        try:
            code = process.wait()
            break
        except InterruptedError:
            continue
    ended: dict[str, object]
    if container is None:
        ended = {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None}
    else:
        remove_container(command[0], container)
        release_cgroups(held)
        ended = container_ending(code, kills_before)
    write_json(os.path.join(out, "exit.json"), {**ended, "ended_at": time.time()})
    return code if code >= 0 else 128 - code


def failed_to_start(out: str, container: dict[str, object] | None) -> int:
    """``exit.json`` for a program that never started (127, as a shell says of a missing command)."""
    ended: dict[str, object] = {"exit_code": 127, "signal": None}
    if container is not None:
        ended["out_of_memory"] = False
    write_json(os.path.join(out, "exit.json"), {**ended, "ended_at": time.time()})
    return 127


# --- container mode -----------------------------------------------------------------------------------


def prepare_container(
    container: dict[str, str | None],
    slurm: dict[str, str],
    extra: dict[str, str],
    published_env: dict[str, str],
) -> tuple[list[str], dict[str, str], str]:
    """Everything the container needs before runc runs it: its final configuration in the bundle, its
    ``/etc/hosts``, no leftover of an earlier try under its name. Returns the runc command line, runc's
    environment and its working directory (the bundle)."""
    template_path, bundle = _required(container, "template"), _required(container, "bundle")
    state, name = _required(container, "state"), _required(container, "name")
    with open(template_path) as template_file:
        config = json.load(template_file)
    inside = dict(item.split("=", 1) for item in config["process"]["env"])
    # As for a host program: Slurm's variables, then the program's own, the group's, the published ones.
    env = {**slurm, **inside, **extra, **published_env}
    config["process"]["env"] = [f"{key}={value}" for key, value in env.items()]
    write_json(os.path.join(bundle, "config.json"), config)  # 0600 (mkstemp), in the user's 0700 bundle
    hosts = container.get("hosts")
    if hosts:
        write_hosts(hosts, hosts_entries(extra, config.get("hostname")))
    runc_env = runc_environment()
    runc = shutil.which(_required(container, "runc"), path=runc_env["PATH"])
    if runc is None:
        raise OSError(f"{container['runc']} is not installed (not found on {runc_env['PATH']})")
    if os.path.exists(os.path.join(state, name)):
        remove_container(runc, container)  # left by an earlier try (a runner killed before it removed it)
    command = [runc, "--rootless=true", f"--root={state}", "run", "--bundle", bundle, name]
    return command, runc_env, bundle


def _required(container: dict[str, str | None], key: str) -> str:
    value = container.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"run.json's container has no {key}")
    return value


def runc_environment() -> dict[str, str]:
    """runc's own environment: PATH (with the sbin directories, where runc and its helpers live) and
    LANG; nothing of the program's, which reaches it through the configuration alone."""
    path = os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": f"{path}:{SBIN_PATH}"}
    if "LANG" in os.environ:
        env["LANG"] = os.environ["LANG"]
    return env


def remove_container(runc: str, container: dict[str, str | None]) -> None:
    """``runc delete --force NAME``, quietly: after a run it is normally gone already."""
    command = [runc, f"--root={container['state']}", "delete", "--force", str(container["name"])]
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            command,
            env=runc_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=RUNC_DELETE_TIMEOUT,
            check=False,
        )


def hosts_entries(extra: dict[str, str], hostname: object) -> list[tuple[str, str]]:
    """(address, name) for each member of the group (``HYPERPLAN_HOSTS``, ``algo-I=ADDRESS,...``), its
    own name too; a task alone is ``algo-1`` at 127.0.0.1. The container's hostname, if it is none of
    them, is 127.0.0.1 too, so that a program resolving its own name finds it."""
    pairs = [item.split("=", 1) for item in extra.get("HYPERPLAN_HOSTS", "").split(",") if "=" in item]
    entries = [(address, name) for name, address in pairs] or [("127.0.0.1", "algo-1")]
    if isinstance(hostname, str) and hostname and hostname not in {name for _, name in entries}:
        entries.append(("127.0.0.1", hostname))
    return entries


def write_hosts(path: str, entries: list[tuple[str, str]]) -> None:
    """The container's ``/etc/hosts`` (0644): localhost, then each entry whose address is known. Written
    in place: the back end makes the file the user's in a task directory that is root's."""
    lines = [LOCALHOST_LINES]
    for address, name in entries:
        found = ip_address_of(address)
        if found is not None:
            lines.append(f"{found}\t{name}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as hosts:
        os.fchmod(hosts.fileno(), 0o644)
        hosts.write("".join(lines))


def ip_address_of(address: str) -> str | None:
    """An address as ``/etc/hosts`` needs it: an IP address, or a node name (Slurm's NodeAddr may be one,
    or ``host_addresses`` fell back to the names) resolved on the node; None if it cannot be."""
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        pass
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def cgroup_dirs() -> list[str]:
    """The directories of the runner's own cgroups, one per hierarchy (v1 and the unified one), where
    they are mounted (``/proc/self/mountinfo``)."""
    try:
        with open("/proc/self/cgroup") as cgroups:
            own = [line.split(":", 2) for line in cgroups.read().splitlines() if line.count(":") >= 2]
        with open("/proc/self/mountinfo") as mounts:
            mountinfo = mounts.read().splitlines()
    except OSError:
        return []
    found: dict[str, tuple[str, str]] = {}
    for line in mountinfo:
        fields, _, after = line.partition(" - ")
        parts, kind = fields.split(), after.split()
        if len(parts) < 5 or len(kind) < 3 or kind[0] not in ("cgroup", "cgroup2"):
            continue
        key = "" if kind[0] == "cgroup2" else _controllers(kind[2])
        found.setdefault(key, (parts[3], parts[4]))  # (the mount's root in the hierarchy, where it is)
    dirs = []
    for _, controllers, path in own:
        key = ",".join(sorted(controllers.split(","))) if controllers else ""
        if key in found:
            root, mountpoint = found[key]
            inner = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
            dirs.append(os.path.normpath(os.path.join(mountpoint, inner)))
    return dirs


MOUNT_OPTIONS = frozenset(("rw", "ro", "xattr", "clone_children", "noprefix", "cpuset_v2_mode"))


def _controllers(options: str) -> str:
    """A cgroup v1 mount's controllers as ``/proc/self/cgroup`` names them (``cpu,cpuacct``,
    ``name=systemd``), from its super options."""
    names = [o for o in options.split(",") if o not in MOUNT_OPTIONS and not o.startswith("release_agent=")]
    return ",".join(sorted(names))


def hold_in_own_cgroups(name: str) -> list[str]:
    """Keep the container in the runner's own cgroups: the step's, whose processes Slurm signals and kills
    (``proctrack/cgroup`` looks at the step's cgroup alone, not at cgroups below it). Rootless runc makes
    the container a cgroup ``NAME`` below its caller's wherever it may write there, and Slurm hands each
    step's cgroup to its user: so ``NAME`` is made here first, with its ``cgroup.procs`` and ``tasks`` not
    writable, and runc, refused, leaves the container where the runner is (it ignores a rootless
    container's refusals). The cgroups made, to remove once the container is gone."""
    held = []
    for directory in cgroup_dirs():
        if not os.access(directory, os.W_OK):
            continue
        child = os.path.join(directory, name)
        try:
            os.mkdir(child)
        except FileExistsError:
            pass
        except OSError:
            continue
        for entry in ("cgroup.procs", "tasks"):
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(child, entry), 0o444)
        held.append(child)
    return held


def release_cgroups(held: list[str]) -> None:
    for child in held:
        with contextlib.suppress(OSError):
            os.rmdir(child)


def oom_kill_count() -> int | None:
    """How many processes the memory limit of the runner's own cgroup (the step's, which holds the
    container too: ``hold_in_own_cgroups``) has killed so far; None where that is not known. cgroup v1:
    ``memory.oom_control``'s ``oom_kill``; v2: ``memory.events``'s."""
    for directory in cgroup_dirs():
        for name in ("memory.oom_control", "memory.events"):
            try:
                with open(os.path.join(directory, name)) as counts:
                    for line in counts:
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
            except (OSError, ValueError):
                continue
    return None


def container_ending(code: int, kills_before: int | None) -> dict[str, object]:
    """How the container's program ended, as the local back end's containers say it: runc exits as the
    container's process 1 did, and catatonit exits as its program did, 128 + N when signal N ended it;
    that status is the program's exit code (a shell's trap that exits 143 and a SIGTERM that was not
    trapped read alike), but a SIGKILL that the memory limit sent is a kill by signal 9. runc itself
    ended by a signal: that signal."""
    kills_after = oom_kill_count()
    out_of_memory = kills_before is not None and kills_after is not None and kills_after > kills_before
    ended: dict[str, object]
    if code < 0:
        ended = {"exit_code": None, "signal": -code}
    elif code == 128 + signal.SIGKILL and out_of_memory:
        ended = {"exit_code": None, "signal": int(signal.SIGKILL)}
    else:
        ended = {"exit_code": code, "signal": None}
    ended["out_of_memory"] = out_of_memory
    return ended


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
