"""Nodes and job instances as Podman containers: what the node agent runs to make, enter and end them.

A node (or a sandboxed task's instance) whose spec has a :class:`~hyperplan.backends.base.ContainerSpec`
is one container, and its agent drives it from outside:

- **Made once**, when the agent starts: the pod first (a network namespace of its own with loopback only,
  and the user namespace of the account's subordinate ids: Podman sets both on a pod, for all its
  containers), then the container in it, with the image's file system, its limits, the mounts the spec
  names, ``/etc/hosts`` naming the pod's hosts, the node's published variables read-only at
  :data:`ENV_DIR_INSIDE`, and as process 1 the host's ``catatonit -P``: it only waits and reaps, so that
  the container lives as long as the node, whatever its programs do.
- **Every program is a ``podman exec``** into it (OnCreate, a task, ``clusters exec``), run by the agent
  under the timed-log wrapper as before: the ``podman`` client's output is the program's, its exit status
  the program's (128 + N when signal N ended it). The client and the wrapper run as root on the host with
  the agent's clean environment; the program's variables go through a 0600 file (``--env-file``).
- **Its processes are found by their PID namespace**, not by ancestry: a process is the container's when
  ``/proc/PID/ns/pid`` is the container's, and a task's when its environment also carries
  ``HYPERPLAN_TASK_ID``. Signals go to those alone, never to the clients or conmon (whose death would cut
  the program's output or the container itself), so a SIGTERM reaches the program and its task is over
  only when the program is.
- **Ended** by ``podman rm --force`` (the runtime kills what is left in the container's cgroup), then the
  pod once no container of it is left; both under the pod's lock, so that a job's last instance
  removing the pod never races its next one joining it.

Out of memory: the memory controller counts the kills its limit caused (``oom_kill``); a task that ended
while that count grew ended out of memory.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hyperplan.backends import disks, procfs
from hyperplan.backends.base import BackendError, ContainerSpec, IdMap, Limits, Login, Mount

log = logging.getLogger(__name__)

ENV_DIR_INSIDE = "/run/hyperplan/env"
"""Where a container sees its node's published variables ($HYPERPLAN_ENV_DIR inside)."""
INIT_INSIDE = "/run/hyperplan/init"
TASK_VARIABLE = "HYPERPLAN_TASK_ID"
LABEL_ROOT = "hyperplan.backend-root"
PODMAN_TIMEOUT = 120.0
PULL_TIMEOUT = 1800.0
POD_RM_ATTEMPTS = 5
DEFAULT_STORE_GB = 200
NAME_PREFIX = "hp-"
PULL_LOGIN = "pull-login.json"
"""In a node's directory: the registry login its agent pulls the image with (root's, 0600), until then."""
DISK = "disk"
"""Where a node's disk is mounted in its directory (``backends/disks.py``)."""
DISK_MOUNTS = {"opt-sagemaker": "/opt/sagemaker", "tmp": "/tmp", "var-tmp": "/var/tmp"}
"""The disk's directories and where the container sees them: HyperPod mounts an instance group's
secondary volume at /opt/sagemaker."""
DEFAULT_STORE = Path("/var/lib/hyperplan/podman")
"""Where runtime podman keeps images and containers unless ``[backend] podman_store`` says: a store of
hyperplan's own (``containers/podman.py``), never root's default one."""


def prepare_store(root: Path, size_gb: int | None = None) -> Path:
    """The store at ``root``, its configuration (re)written for this host: its OCI runtime, ulimits; its
    images and containers' layers on a file system of ``size_gb`` of their own (``backends/disks.py``), so
    that what programs write into their containers' own file systems can fill that one, never the host's.
    ``size_gb`` 0: none (a directory of the host's file system); None: :func:`default_store_size`. A store
    made with its own file system keeps it, at the size it was made with. An explicit size that cannot be
    served raises DiskError, saying why."""
    from hyperplan.containers.podman import DISK_IMAGE, PodmanStore

    store = PodmanStore(root)
    if disks.remount(store.graph):
        size_gb = 0  # (mounted as it was made)
    elif size_gb is None:
        size_gb = default_store_size(store.graph)
    if size_gb:
        disk = disks.Disk(store.graph, size_gb * disks.GIB)
        assert disk.image.name == DISK_IMAGE
        problem = disks.unusable()
        if problem is not None:
            raise disks.DiskError(f"the Podman store cannot have a file system of its own: {problem}")
        if store.graph.is_dir() and any(store.graph.iterdir()):
            raise disks.DiskError(
                f"{store.graph} already holds images on the host's file system: remove the store (podman "
                "images go with it) or give another [backend] podman_store"
            )
        disks.attach(disk)
    store.prepare()
    return root


def default_store_size(graph: Path) -> int:
    """A new store's own file system by default: 200 GB, or half the host's free space if that is less (a
    bound above the free space would bound nothing); none where disks cannot be made, or for a store that
    already keeps images on the host's file system (said in the log: it is left as it is)."""
    if disks.unusable() is not None:
        return 0
    if graph.is_dir() and any(graph.iterdir()):
        log.warning(
            "the Podman store %s keeps its images on the host's file system, so what containers write into "
            "their images' file systems can fill it; a new store ([backend] podman_store) gets a file "
            "system of its own",
            graph.parent,
        )
        return 0
    graph.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(graph.parent).free // disks.GIB
    return max(1, min(DEFAULT_STORE_GB, free // 2))


# --- the spec as a record, and back ---------------------------------------------------------------


def spec_record(spec: ContainerSpec | None, store: Path | None) -> dict[str, Any] | None:
    """What a node's record keeps of its container: the spec and the Podman store it runs from."""
    if spec is None:
        return None
    if store is None:
        raise BackendError("this back end has no Podman store: it runs no containers (runtime process)")
    record = asdict(spec)
    record["mounts"] = [{**mount, "source": str(mount["source"])} for mount in record["mounts"]]
    record["hosts"] = list(spec.hosts)
    record["store"] = str(store)
    return record


def spec_of(record: Mapping[str, Any]) -> ContainerSpec:
    return ContainerSpec(
        image=record["image"],
        ids=IdMap(**record["ids"]),
        limits=Limits(**record["limits"]),
        pod=record["pod"],
        hosts=tuple(record["hosts"]),
        endpoint=record["endpoint"],
        mounts=tuple(Mount(Path(m["source"]), m["target"], m["read_only"]) for m in record["mounts"]),
        insecure_registry=record.get("insecure_registry", False),
        disk_bytes=record.get("disk_bytes"),
    )


# --- the running container ------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """A container the agent made: its name and pod, and its process 1 on the host."""

    name: str
    pod: str
    init_pid: int
    init_starttime: int
    pid_namespace: str
    memory_events: str | None
    """The file whose ``oom_kill`` line counts the kills its memory limit caused; None: not found."""


class Podman:
    """``podman`` on one store, for one back end root."""

    def __init__(self, store: Path, backend_root: Path) -> None:
        self.store = store
        self.backend_root = backend_root
        # Names of this root's own: servers sharing a store (their node and job ids may be the same)
        # never take each other's containers or pods.
        self.prefix = f"{NAME_PREFIX}{hashlib.sha256(str(backend_root).encode()).hexdigest()[:8]}-"

    def container_name(self, node_id: str) -> str:
        return self.prefix + node_id

    def pod_name(self, spec: ContainerSpec, node_id: str) -> str:
        return self.prefix + "pod-" + (spec.pod or node_id)

    def environment(self) -> dict[str, str]:
        """The server's PATH and LANG, and the store's variables: nothing else of the caller's."""
        # Imported here: the containers layer is only needed once a container is made.
        from hyperplan.containers.podman import PodmanStore

        clean = {key: os.environ[key] for key in ("PATH", "LANG") if key in os.environ}
        return {**clean, **PodmanStore(self.store).variables()}

    def run(
        self, *arguments: str, check: bool = True, timeout: float = PODMAN_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        command = ["podman", *arguments]
        try:
            result = subprocess.run(
                command,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise BackendError(f"podman {arguments[0]}: {error}") from None
        if check and result.returncode != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise BackendError(f"podman {arguments[0]} failed: {said[-1] if said else result.returncode}")
        return result

    # --- making -----------------------------------------------------------------------------------

    def make(
        self, node_id: str, spec: ContainerSpec, node_dir: Path, env_dir: Path, lock_dir: Path
    ) -> Running:
        """The pod (if it is not there) and the container in it, started; raises BackendError with what
        Podman said."""
        name, pod = self.container_name(node_id), self.pod_name(spec, node_id)
        hosts = node_dir / "hosts"
        hosts.write_text(hosts_file(spec.hosts))
        os.chmod(hosts, 0o644)
        init = shutil.which("catatonit")
        if init is None:
            raise BackendError("catatonit is not installed (apt-get install catatonit): containers need it")
        self._pull_if_missing(spec, node_dir / PULL_LOGIN)
        spec = with_disk(spec, node_dir)
        with pod_lock(lock_dir, pod):
            self.run("rm", "--force", "--time", "0", name, check=False)  # a half-made one from a crash
            if self.run("pod", "exists", pod, check=False).returncode != 0:
                self.run("pod", "create", *self._pod_options(pod, spec))
            self.run("run", "--detach", *self._container_options(name, pod, spec, hosts, env_dir, init))
        return self.inspect(name, pod)

    def _pull_if_missing(self, spec: ContainerSpec, login: Path) -> None:
        """Pull the image unless the store has it, with the login the server left (``write_pull_login``),
        which goes either way."""
        try:
            if self.run("image", "exists", spec.image, check=False).returncode == 0:
                return
            plain = ["--tls-verify=false"] if spec.insecure_registry else []
            auth = ["--authfile", str(login)] if login.exists() else []
            self.run("pull", "--quiet", *plain, *auth, spec.image, timeout=PULL_TIMEOUT)
        finally:
            login.unlink(missing_ok=True)

    def _pod_options(self, pod: str, spec: ContainerSpec) -> list[str]:
        first, size = spec.ids.host_first, spec.ids.size
        return [
            "--name", pod,
            "--label", f"{LABEL_ROOT}={self.backend_root}",
            "--network", "none",
            "--share", "ipc,net,uts",
            "--uidmap", f"0:{first}:{size}",
            "--gidmap", f"0:{first}:{size}",
        ]  # fmt: skip

    def _container_options(
        self, name: str, pod: str, spec: ContainerSpec, hosts: Path, env_dir: Path, init: str
    ) -> list[str]:
        limits = spec.limits
        options = [
            "--name", name,
            "--pod", pod,
            "--label", f"{LABEL_ROOT}={self.backend_root}",
            "--memory", str(limits.memory_bytes),
            "--memory-swap", str(limits.memory_bytes),  # no swap beyond the memory limit
            "--cpus", f"{limits.cpus:.2f}",
            "--pids-limit", str(limits.pids),
            "--volume", f"{hosts}:/etc/hosts:ro",
            "--volume", f"{env_dir}:{ENV_DIR_INSIDE}:ro",
            "--volume", f"{init}:{INIT_INSIDE}:ro",
            "--entrypoint", json.dumps([INIT_INSIDE, "-P"]),
        ]  # fmt: skip
        for mount in spec.mounts:
            options += ["--volume", f"{mount.source}:{mount.target}:{'ro' if mount.read_only else 'rw'}"]
        return [*options, spec.image]

    def inspect(self, name: str, pod: str) -> Running:
        found = self.run("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        pid = int(found) if found.isdigit() else 0
        stat = procfs.read_stat(pid) if pid else None
        if stat is None:
            raise BackendError(f"container {name} is not running")
        return Running(name, pod, pid, stat.starttime, pid_namespace(pid) or "", memory_events(pid))

    def exec_argv(self, name: str, argv: list[str], env_file: Path, workdir: str | None) -> list[str]:
        """The ``podman exec`` command that runs ``argv`` in the container."""
        command = ["podman", "exec", "--env-file", str(env_file)]
        if workdir:
            command += ["--workdir", workdir]
        return [*command, name, *argv]

    # --- ending -----------------------------------------------------------------------------------

    def remove(self, node_id: str, spec: ContainerSpec, lock_dir: Path, node_dir: Path) -> None:
        """The container, with whatever still runs in it, its pod once it holds no other, and its disk."""
        name, pod = self.container_name(node_id), self.pod_name(spec, node_id)
        with pod_lock(lock_dir, pod):
            self.run("rm", "--force", "--time", "0", name, check=False)
            self._remove_pod_if_empty(pod)
        if spec.disk_bytes is not None:
            disks.release_under(node_dir)  # the disk, and what of it was bound into the node's directory

    def _remove_pod_if_empty(self, pod: str) -> None:
        """(Under the pod's lock.) Its infra container is all a pod has once its last container went. (Read
        from the containers' list: a pod whose removal was cut short may no longer answer an inspect.)"""
        listed = self.run("ps", "--all", "--filter", f"pod={pod}", "--format", "{{.IsInfra}}", check=False)
        if "false" in listed.stdout.split():
            return
        for attempt in range(POD_RM_ATTEMPTS):
            # Its /dev/shm is briefly busy while another container on the host is being made (its new
            # mount namespace holds a copy of the host's mounts until it pivots to its root): try again.
            said = self.run("pod", "rm", "--force", "--time", "0", pod, check=False)
            if said.returncode == 0 or "resource busy" not in said.stderr or attempt == POD_RM_ATTEMPTS - 1:
                return
            time.sleep(0.2 * (attempt + 1))

    def strays(self, keep: set[str], lock_dir: Path) -> list[str]:
        """Containers of this root whose node is not in ``keep`` (node ids), and its pods left without
        one: removed. Another root's, sharing the store, are not looked at."""
        label = f"label={LABEL_ROOT}={self.backend_root}"
        names = self.run("ps", "--all", "--format", "{{.Names}}", "--filter", label, check=False).stdout
        removed = []
        for name in names.split():
            if name.startswith(self.prefix) and name[len(self.prefix) :] not in keep:
                self.run("rm", "--force", "--time", "0", name, check=False)
                removed.append(name)
        pods = self.run("pod", "ps", "--format", "{{.Name}}", "--filter", label, check=False).stdout
        for pod in pods.split():
            if pod.startswith(self.prefix):
                with pod_lock(lock_dir, pod):
                    self._remove_pod_if_empty(pod)
        return removed


def with_disk(spec: ContainerSpec, node_dir: Path) -> ContainerSpec:
    """The spec with its disk's directories among its mounts: the disk mounted at ``node_dir/disk`` (made
    on first use), its directories the container root's; and each directory of ``node_dir`` the spec
    mounts (the node's home) moved onto the disk, by binding a directory of the disk onto it, so that
    what the node writes there counts against its disk too. DiskError says why it could not be."""
    if spec.disk_bytes is None:
        return spec
    top = node_dir / DISK
    disks.attach(disks.Disk(top, spec.disk_bytes))
    os.chmod(top, 0o711)
    mounts = []
    for name, target in DISK_MOUNTS.items():
        directory = top / name
        directory.mkdir(exist_ok=True)
        os.chown(directory, spec.ids.host_first, spec.ids.host_first, follow_symlinks=False)
        os.chmod(directory, 0o1777 if target != "/opt/sagemaker" else 0o755)
        mounts.append(Mount(directory, target))
    for mount in spec.mounts:
        if mount.source.parent == node_dir and not disks.is_mounted(mount.source):
            onto = top / f"bound-{mount.source.name}"
            onto.mkdir(exist_ok=True)
            disks.bind(onto, mount.source)
    return dataclasses.replace(spec, mounts=(*spec.mounts, *mounts))


def loopback_source(ids: IdMap) -> str:
    """The loopback address a container's connections to the server come from (its endpoint relay's
    ``--source``): one per block of subordinate ids, so one per account, whose connections the server then
    counts (its per-address share) and records (its audit) as that account's pods', not as the host's.
    Blocks are 65536 ids apart below 2^32, so their first ids' upper 16 bits differ: 127.1.0.0/16 has an
    address for each."""
    block = ids.host_first >> 16
    return f"127.1.{(block >> 8) & 0xFF}.{block & 0xFF}"


def auth_file_text(reference: str, login: Login) -> str:
    """A Podman auth file naming ``reference``'s registry alone, with this login."""
    host = reference.split("/", 1)[0]
    token = base64.b64encode(f"{login.username}:{login.password}".encode()).decode()
    return json.dumps({"auths": {host: {"auth": token}}})


def write_pull_login(node_dir: Path, reference: str, login: Login) -> None:
    """The login the node's agent pulls its image with: a 0600 file of root's in the node's directory
    (which no tenant can read), removed by the agent once its pull is done."""
    path = node_dir / PULL_LOGIN
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(auth_file_text(reference, login))


def hosts_file(names: tuple[str, ...]) -> str:
    """The pod's ``/etc/hosts``: its hosts are its loopback, as every container of it shares one."""
    return "".join(
        [
            "127.0.0.1\tlocalhost\n",
            "::1\tlocalhost ip6-localhost ip6-loopback\n",
            *(f"127.0.0.1\t{name}\n" for name in names),
        ]
    )


@contextlib.contextmanager
def pod_lock(lock_dir: Path, pod: str) -> Iterator[None]:
    lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(lock_dir / f"{pod}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_passable(env: Mapping[str, str]) -> None:
    """Podman's ``--env-file`` holds one ``NAME=VALUE`` a line, so a value cannot hold a line break."""
    for name, value in env.items():
        if "\n" in value or "\r" in value:
            raise BackendError(
                f"variable {name}: a value with a line break cannot be passed into a container"
            )


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    check_passable(env)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("".join(f"{name}={value}\n" for name, value in env.items()))


# --- processes ------------------------------------------------------------------------------------


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def processes(running: Running, task_id: str | None = None) -> set[int]:
    """The container's processes but its process 1 (or, with ``task_id``, those of that task)."""
    if not procfs.is_alive(running.init_pid, running.init_starttime):
        return set()
    found = set()
    for pid in procfs.all_pids():
        if pid == running.init_pid or pid_namespace(pid) != running.pid_namespace:
            continue
        if task_id is None or procfs.read_environ(pid).get(TASK_VARIABLE) == task_id:
            found.add(pid)
    return found


def memory_events(pid: int) -> str | None:
    """The file that counts the kills of the memory limit of ``pid``'s cgroup (v1 or v2)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
            if candidate.exists():
                return str(candidate)
    for line in lines:
        if line.startswith("0::"):
            candidate = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
            if candidate.exists():
                return str(candidate)
    return None


def oom_kills(running: Running | None) -> int:
    if running is None or running.memory_events is None:
        return 0
    try:
        for line in Path(running.memory_events).read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def running_of_file(path: Path) -> Running | None:
    """The container a node's agent recorded, if it made one."""
    try:
        return Running(**json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
