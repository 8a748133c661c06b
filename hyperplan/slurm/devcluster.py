"""A real Slurm cluster on this host, for development and tests: ``slurm-dev-cluster up|down|status DIR``.

``up`` installs Debian's ``slurm-wlm`` and ``munge`` when missing (apt-get, as root), writes
``DIR/slurm.conf``, ``DIR/gres.conf`` and ``DIR/cgroup.conf`` for one controller and eight nodes on this
host (one slurmd per node, each on its own port; fake GPUs through gres; the instance type as each node's
feature; Slurm's cgroup plugins enforcing each step's memory), starts
munged (unless the system's answers), slurmctld and the slurmd daemons, waits until every node is idle,
writes ``DIR/fleet.toml`` and prints one line, ``export SLURM_CONF=DIR/slurm.conf``. When the cluster is
already up it changes nothing and prints the same line. ``down`` stops every process it started;
``status`` exits 0 when the cluster is up, 3 when it is not. ``restart-controller DIR`` restarts
slurmctld on its saved state; ``kill-node DIR NODE`` SIGKILLs one node's slurmd (a crash) and
``start-node DIR NODE`` starts it again. All state lives under DIR, which other users must be able to
reach (the accounts' users read slurm.conf and talk to munge).

Every daemon carries ``HP_SLURM_DEV_CLUSTER=DIR`` in its environment (so do the slurmstepd processes
it forks), and ``down`` ends any process that carries it: nothing started here outlives ``down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hyperplan import host_packages
from hyperplan.core.hostlist import compress

MARK_VARIABLE = "HP_SLURM_DEV_CLUSTER"
PARTITION = "hp"
NOT_UP = 3
PACKAGES = ("slurm-wlm", "munge", "runc", "catatonit")
# Slurm and munge; runc and catatonit for the nodes' containers (backends/slurm_containers.py).
SYSTEM_MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
# What `up` runs: installing PACKAGES puts them on PATH.
TOOLS = ("slurmctld", "slurmd", "munged", "scontrol", "sinfo", "sbatch", "runc", "catatonit")
UP_TIMEOUT = 60.0
SLURMD_TIMEOUT = 10  # seconds: see slurm_conf
STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class NodeType:
    instance_type: str
    gpu: str  # the gres type
    gpus: int
    cpus: int
    memory_mb: int  # declared (config_overrides): at least the type's catalogue memory
    price: str
    limits_scale: float  # the pool's: each instance's memory limit, about 1 GiB (small enough to reach)


TYPES = (
    NodeType("ml.p5.48xlarge", "h100", 8, 192, 2_100_000, "98.32", 0.0005),
    NodeType("ml.g5.12xlarge", "a10g", 4, 48, 200_000, "7.09", 0.005),
)
NODES_PER_TYPE = 4
NODES = tuple(f"hp-n{i:02d}" for i in range(1, NODES_PER_TYPE * len(TYPES) + 1))


def type_of(node: str) -> NodeType:
    return TYPES[(NODES.index(node)) // NODES_PER_TYPE]


class Refused(Exception):
    """Something the command cannot do; its message is printed and the command exits 1."""


def main(argv: list[str]) -> int:
    node_commands = ("kill-node", "start-node")
    valid = (len(argv) == 2 and argv[0] in ("up", "down", "status", "restart-controller")) or (
        len(argv) == 3 and argv[0] in node_commands
    )
    if not valid:
        print(
            "usage: slurm-dev-cluster up|down|status|restart-controller DIR\n"
            "       slurm-dev-cluster kill-node|start-node DIR NODE",
            file=sys.stderr,
        )
        return 2
    command, directory = argv[0], Path(argv[1]).absolute()
    try:
        if command == "status":
            return 0 if is_up(directory) else NOT_UP
        if os.geteuid() != 0:
            raise Refused(f"slurm-dev-cluster {command} must run as root (it starts Slurm's daemons)")
        if command == "down":
            down(directory)
            return 0
        if command == "restart-controller":
            restart_controller(directory)
            return 0
        if command == "kill-node":
            kill_node(directory, argv[2])
            return 0
        if command == "start-node":
            start_node(directory, argv[2])
            return 0
        print(up(directory))
        return 0
    except Refused as refusal:
        print(f"slurm-dev-cluster {command}: {refusal}", file=sys.stderr)
        return 1


# -- layout ------------------------------------------------------------------------------------------


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "slurm.conf"
        self.gres = root / "gres.conf"
        self.cgroup = root / "cgroup.conf"  # slurmd reads it beside slurm.conf
        self.fleet = root / "fleet.toml"
        self.run = root / "run"
        self.daemons = self.run / "daemons.json"  # {name: pid} of what `up` started
        self.log = root / "log"
        self.state = root / "state"
        self.spool = root / "spool"
        self.dev = root / "dev"
        self.munge = root / "munge"
        self.munge_socket = self.munge / "munge.socket"

    def environment(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), "TZ": "UTC", MARK_VARIABLE: str(self.root)}

    def export_line(self) -> str:
        return f"export SLURM_CONF={self.conf}"


def check_reachable(directory: Path) -> None:
    """Refuse a directory other users cannot reach: every ancestor needs o+x (pytest's are 0700)."""
    for path in [*reversed(directory.parents), directory]:
        if not path.exists():
            continue
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise Refused(
                f"{directory} is not reachable by other users: {path} has mode {stat.S_IMODE(mode):04o} "
                "(each directory above it needs o+x, as the accounts' users read slurm.conf and talk to "
                "munge there); choose a directory such as one made with mkdtemp under /tmp and chmod 0711"
            )


# -- status ------------------------------------------------------------------------------------------


def recorded(layout: Layout) -> dict[str, int]:
    try:
        return {str(k): int(v) for k, v in json.loads(layout.daemons.read_text()).items()}
    except (OSError, ValueError):
        return {}


def is_ours(pid: int, layout: Layout) -> bool:
    """The process lives and was started for this directory (a pid may have been reused): it carries
    the directory's mark, or, where its environment cannot be read (`status` as another user), names
    the directory on its command line, as every daemon `up` starts does."""
    proc = Path(f"/proc/{pid}")
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        try:
            return f"{MARK_VARIABLE}={layout.root}".encode() in (proc / "environ").read_bytes().split(b"\0")
        except PermissionError:
            return str(layout.root).encode() in (proc / "cmdline").read_bytes()
    except (OSError, IndexError):
        return False


def is_up(directory: Path) -> bool:
    layout = Layout(directory)
    daemons = recorded(layout)
    expected = {"slurmctld", *NODES}
    if not expected <= set(daemons) or not all(is_ours(pid, layout) for pid in daemons.values()):
        return False
    return _ping(layout)


def _ping(layout: Layout) -> bool:
    try:
        result = subprocess.run(
            ["scontrol", "ping"], env=layout.environment(), capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and " is UP" in result.stdout


# -- up ----------------------------------------------------------------------------------------------


def up(directory: Path) -> str:
    layout = Layout(directory)
    check_reachable(directory)
    if is_up(directory):
        return layout.export_line()
    down(directory)  # a partial cluster is stopped and brought up anew
    install()
    spools = [layout.spool / node for node in NODES]  # slurmd wants its spool directory to exist
    for path in (layout.root, layout.run, layout.log, layout.state, layout.spool, layout.dev, *spools):
        if not path.exists():
            path.mkdir(parents=True)
            path.chmod(0o755)  # whatever the umask: the accounts' users read slurm.conf here
    daemons: dict[str, int] = {}
    try:
        munge_socket = None if _system_munge_answers() else _start_munged(layout, daemons)
        ports = free_ports(1 + len(NODES))
        _make_fake_gpus(layout)
        layout.conf.write_text(slurm_conf(layout, ports, munge_socket))
        layout.gres.write_text(gres_conf(layout))
        layout.cgroup.write_text(cgroup_conf(_cgroup_plugin()))
        daemons["slurmctld"] = _start(layout, ["slurmctld", "-D", "-c", "-f", str(layout.conf)], "slurmctld")
        _save(layout, daemons)
        _wait(lambda: _ping(layout), layout, "slurmctld to answer")
        for node in NODES:
            daemons[node] = _start(layout, ["slurmd", "-D", "-f", str(layout.conf), "-N", node], node)
        _save(layout, daemons)
        _wait(lambda: _all_idle(layout), layout, "every node to be idle")
        layout.fleet.write_text(fleet_toml(layout))
    except BaseException:
        _save(layout, daemons)
        down(directory)
        raise
    return layout.export_line()


def install() -> None:
    """apt-get install slurm-wlm and munge when a tool is missing (hyperplan/host_packages.py)."""
    if _installed():
        return
    try:
        host_packages.ensure(PACKAGES, why="slurm-dev-cluster runs Slurm's daemons and munged")
    except host_packages.PackagesRefused as refusal:
        raise Refused(str(refusal)) from None
    if not _installed():
        absent = " ".join(tool for tool in TOOLS if not shutil.which(tool))
        raise Refused(f"{' and '.join(PACKAGES)} installed, but {absent} is not on PATH")


def _installed() -> bool:
    return all(shutil.which(tool) for tool in TOOLS)


def free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _system_munge_answers() -> bool:
    if not SYSTEM_MUNGE_SOCKET.exists():
        return False
    try:
        return subprocess.run(["munge", "-n"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_munged(layout: Layout, daemons: dict[str, int]) -> Path:
    layout.munge.mkdir(mode=0o755, exist_ok=True)
    os.chmod(layout.munge, 0o755)  # the socket must be reachable by the accounts' users
    key = layout.munge / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    daemons["munged"] = _start(
        layout,
        [
            "munged", "--foreground", "--force", f"--socket={layout.munge_socket}", f"--key-file={key}",
            f"--pid-file={layout.munge / 'munged.pid'}", f"--log-file={layout.log / 'munged.log'}",
            f"--seed-file={layout.munge / 'munged.seed'}",
        ],
        "munged",
    )  # fmt: skip
    _save(layout, daemons)
    _wait(layout.munge_socket.exists, layout, "munged's socket")
    return layout.munge_socket


def _make_fake_gpus(layout: Layout) -> None:
    """Character devices that gres can hand out (major 195, NVIDIA's): nothing opens them."""
    for index in range(max(t.gpus for t in TYPES)):
        device = layout.dev / f"nvidia{index}"
        if not device.exists():
            os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(195, index))


def _start(layout: Layout, command: list[str], name: str) -> int:
    with open(layout.log / f"{name}.out", "ab") as out:
        process = subprocess.Popen(
            command,
            env=layout.environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.returncode = 0  # never waited for here (the daemon outlives this command): no warning
    return process.pid


def _save(layout: Layout, daemons: dict[str, int]) -> None:
    layout.run.mkdir(parents=True, exist_ok=True)
    layout.daemons.write_text(json.dumps(daemons))


def _wait(condition: object, layout: Layout, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + UP_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            logs = sorted(layout.log.glob("*.log"))
            tails = "".join(
                f"\n--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-5:])
                for log in logs
            )
            raise Refused(f"gave up after {UP_TIMEOUT:.0f} s waiting for {what}{tails}")
        time.sleep(0.2)


def _all_idle(layout: Layout) -> bool:
    result = subprocess.run(
        ["sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %t"],
        env=layout.environment(),
        capture_output=True,
        text=True,
        timeout=10,
    )
    states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
    return result.returncode == 0 and set(states) == set(NODES) and set(states.values()) == {"idle"}


def slurm_conf(layout: Layout, ports: list[int], munge_socket: Path | None) -> str:
    controller = socket.gethostname().split(".")[0]
    lines = [
        "# Written by slurm-dev-cluster up: one controller and eight slurmd on this host.",
        "ClusterName=hpdev",
        f"SlurmctldHost={controller}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        *([f"AuthInfo=socket={munge_socket}"] if munge_socket else []),
        f"StateSaveLocation={layout.state}",
        f"SlurmdSpoolDir={layout.spool}/%n",
        f"SlurmctldPidFile={layout.run}/slurmctld.pid",
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log}/slurmctld.log",
        f"SlurmdLogFile={layout.log}/slurmd-%n.log",
        "SlurmdParameters=config_overrides",  # nodes declare more CPUs and memory than this host has
        # Slurm's cgroups hold every step (a detached process cannot escape its job) and its memory
        # limit (cgroup.conf). With several slurmd on one host each makes its own cgroup root
        # (slurm_<node>), so they do not collide.
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup",
        # Those roots are named after the node alone, so two dev clusters on one host (a test run's
        # workers) share slurm_hp-n01/uid_U/: their job ids must differ, or one cluster's job_N/ is the
        # other's, and ending a step there kills the other's processes. The controller's port is free
        # while it runs, so no other cluster has it: its job ids are 1000 of its own (they wrap).
        f"FirstJobId={ports[0] * 1000}",
        f"MaxJobId={ports[0] * 1000 + 999}",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=1024",
        "SchedulerParameters=sched_interval=5,bf_interval=5",
        # A cancelled job's processes that ignore SIGTERM are killed this long after it (default 30 s).
        "KillWait=1",
        # A node whose slurmd stops answering is DOWN after this long (default 300 s); slurmctld pings
        # every node each third of it. Short, so that a test can see a killed slurmd's node go DOWN.
        f"SlurmdTimeout={SLURMD_TIMEOUT}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "MailProg=/bin/true",
        "ReturnToService=2",
        "GresTypes=gpu",
    ]
    for node, port in zip(NODES, ports[1:], strict=True):
        kind = type_of(node)
        lines.append(
            f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={kind.cpus} "
            f"RealMemory={kind.memory_mb} Gres=gpu:{kind.gpu}:{kind.gpus} Feature={kind.instance_type} "
            "State=UNKNOWN"
        )
    lines.append(f"PartitionName={PARTITION} Nodes=ALL Default=YES DefaultTime=60 MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


CGROUP_V2_ONLY = Path("/sys/fs/cgroup/cgroup.controllers")  # present where the unified hierarchy is all


def _cgroup_plugin() -> str:
    """cgroup/v1 on a v1 or hybrid host (v1 controllers, as this project's machines have); cgroup/v2 on
    a host with the unified hierarchy alone (Slurm 22.05 wants slurmd under systemd there: not tried)."""
    return "cgroup/v2" if CGROUP_V2_ONLY.exists() else "cgroup/v1"


def cgroup_conf(plugin: str) -> str:
    """Memory alone is constrained: the nodes declare 48-192 CPUs this host lacks (no cpuset to bind
    to), their GPUs are fake devices, and the host has no swap to bound."""
    lines = [
        "# Written by slurm-dev-cluster up: each step's memory is its limit (--mem); a step past it is",
        "# killed by the kernel and Slurm reports OUT_OF_MEMORY.",
        f"CgroupPlugin={plugin}",
        "CgroupAutomount=no",
        "ConstrainRAMSpace=yes",
        "ConstrainSwapSpace=no",
        "ConstrainCores=no",
        "ConstrainDevices=no",
    ]
    return "\n".join(lines) + "\n"


def gres_conf(layout: Layout) -> str:
    lines = [
        "# Written by slurm-dev-cluster up: fake GPUs (character devices nothing opens).",
        "AutoDetect=off",
    ]
    for kind in TYPES:
        nodes = compress(node for node in NODES if type_of(node) is kind)
        files = f"{layout.dev}/nvidia[0-{kind.gpus - 1}]"
        lines.append(f"NodeName={nodes} Name=gpu Type={kind.gpu} File={files}")
    return "\n".join(lines) + "\n"


def fleet_toml(layout: Layout) -> str:
    lines = [
        "# Written by slurm-dev-cluster up: a fleet on the dev cluster's nodes.",
        'region = "us-west-2"',
        "",
        "[backend]",
        'kind = "slurm"',
        f'slurm_conf = "{layout.conf}"',
        f'partition = "{PARTITION}"',
        'kill_grace = "2m"',
        "",
        "[[zones]]",
        'name = "us-west-2a"',
        'zone_id = "usw2-az1"',
    ]
    for kind in TYPES:
        nodes = compress(node for node in NODES if type_of(node) is kind)
        lines += [
            "",
            "[[pools]]",
            f'instance_type = "{kind.instance_type}"',
            'zone = "us-west-2a"',
            f'nodes = "{nodes}"',
            f'feature = "{kind.instance_type}"',
            f'price_per_instance_hour = "{kind.price}"',
            f"limits_scale = {kind.limits_scale}",
        ]
    return "\n".join(lines) + "\n"


# -- restart-controller ------------------------------------------------------------------------------


def restart_controller(directory: Path) -> None:
    """Stop slurmctld and start it again on its saved state (without ``-c``), as after a controller's
    restart or crash: reservations and jobs come back from StateSaveLocation."""
    layout = Layout(directory)
    daemons = recorded(layout)
    pid = daemons.get("slurmctld")
    if pid is None or not is_ours(pid, layout):
        raise Refused(f"slurmctld of {directory} is not running: bring the cluster up first")
    _stop([pid], layout)
    _stop([p for p in _marked(layout) if _program(p) == b": slurmscriptd"], layout)
    daemons["slurmctld"] = _start(layout, ["slurmctld", "-D", "-f", str(layout.conf)], "slurmctld")
    _save(layout, daemons)
    _wait(lambda: _ping(layout), layout, "slurmctld to answer")


def _program(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return b""


# -- kill-node, start-node ----------------------------------------------------------------------------


def kill_node(directory: Path, node: str) -> None:
    """SIGKILL one node's slurmd, as a crash would: its job steps (their slurmstepd) carry on, and
    slurmctld marks the node DOWN once it has not answered for ``SlurmdTimeout``."""
    layout = Layout(directory)
    pid = recorded(layout).get(_node_name(node))
    if pid is None or not is_ours(pid, layout):
        raise Refused(f"the slurmd of {node} is not running")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while is_ours(pid, layout) and time.monotonic() < deadline:
        _reap([pid])
        time.sleep(0.05)


def start_node(directory: Path, node: str) -> None:
    """Start one node's slurmd again (after ``kill-node``); it registers with slurmctld on its own."""
    layout = Layout(directory)
    daemons = recorded(layout)
    name = _node_name(node)
    if "slurmctld" not in daemons or not is_ours(daemons["slurmctld"], layout):
        raise Refused(f"slurmctld of {directory} is not running: bring the cluster up first")
    if name in daemons and is_ours(daemons[name], layout):
        raise Refused(f"the slurmd of {node} is running already")
    daemons[name] = _start(layout, ["slurmd", "-D", "-f", str(layout.conf), "-N", name], name)
    _save(layout, daemons)


def _node_name(node: str) -> str:
    if node not in NODES:
        raise Refused(f"no node {node} in the dev cluster (its nodes: {compress(NODES)})")
    return node


# -- down --------------------------------------------------------------------------------------------


def down(directory: Path) -> None:
    """Stop every process started for `directory`: jobs first, then slurmd, slurmctld, munged."""
    layout = Layout(directory)
    daemons = {name: pid for name, pid in recorded(layout).items() if is_ours(pid, layout)}
    if "slurmctld" in daemons and layout.conf.exists():
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run(
                ["scancel", "--full", f"--partition={PARTITION}"],
                env=layout.environment(),
                capture_output=True,
                timeout=10,
            )
    nodes = [pid for name, pid in daemons.items() if name not in ("slurmctld", "munged")]
    _stop(nodes, layout)
    _stop([pid for name, pid in daemons.items() if name == "slurmctld"], layout)
    _stop(_marked(layout, spare={daemons.get("munged", -1)}), layout)  # slurmstepd, jobs
    _stop([pid for name, pid in daemons.items() if name == "munged"], layout)
    _stop(_marked(layout), layout)
    _remove_job_cgroups(layout)
    with contextlib.suppress(FileNotFoundError):
        layout.daemons.unlink()


CGROUPS = Path("/sys/fs/cgroup")


def _remove_job_cgroups(layout: Layout) -> None:
    """The cgroups of this cluster's jobs that Slurm left (a job still running when its slurmd was
    stopped): those of its own job ids alone (see ``slurm_conf``: other clusters share the roots), the
    deepest first; rmdir removes only a cgroup that no process is in."""
    ids = _job_ids(layout)
    if ids is None:
        return
    jobs = [job for job in CGROUPS.glob("*/slurm_*/uid_*/job_*") if job.name[4:].isdigit()]
    for job in jobs:
        if int(job.name[4:]) in ids:
            inner = sorted((d for d in job.rglob("*") if d.is_dir()), key=lambda d: len(d.parts))
            for directory in [*reversed(inner), job]:
                with contextlib.suppress(OSError):
                    directory.rmdir()


def _job_ids(layout: Layout) -> range | None:
    """The job ids slurm.conf gives this cluster (FirstJobId to MaxJobId); None without them."""
    try:
        lines = layout.conf.read_text().splitlines()
        settings = dict(line.split("=", 1) for line in lines if line.startswith(("FirstJobId=", "MaxJobId=")))
        return range(int(settings["FirstJobId"]), int(settings["MaxJobId"]) + 1)
    except (OSError, KeyError, ValueError):
        return None


def _marked(layout: Layout, spare: set[int] | frozenset[int] = frozenset()) -> list[int]:
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if pid != os.getpid() and pid not in spare and is_ours(pid, layout)]


def _stop(pids: list[int], layout: Layout) -> None:
    """SIGTERM, then SIGKILL for what is still there after a while (a slurmd that cannot reach its
    controller ignores SIGTERM)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(is_ours(pid, layout) for pid in pids) and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.05)
    for pid in pids:
        if is_ours(pid, layout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_TIMEOUT
    while any(is_ours(pid, layout) for pid in pids) and time.monotonic() < deadline:
        _reap(pids)
        time.sleep(0.05)


def _reap(pids: list[int]) -> None:
    """Collect those that are this process's own children (started by an `up` in the same process)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
