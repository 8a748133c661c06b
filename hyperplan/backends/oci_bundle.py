"""The OCI runtime configuration of a Slurm task's container: what the server writes, the step runner runs.

On a Slurm node the step runner, as the account's user, starts the task's program in a rootless runc
container (``runc --rootless=true run``). This module makes the configuration (runc's ``config.json``)
that container is made from, as a template the server writes into the task's directory: the step runner
copies it, puts the final environment in (Slurm's variables and the node's published ones are known only
on the node) and runs it. See ``slurm_runner.py``.

The container:

- **Its users**: a user namespace mapping uid and gid 0 inside to the account's uid and gid, and
  nothing else (size 1). The program runs as root inside; outside it is the account's user, with
  nothing more. Rootless runc needs no subordinate ids nor any helper that holds privileges.
- **Its namespaces**: mount, pid, ipc, uts and user of its own; the node's network, unless the spec asks
  for one of its own (then loopback only). No cgroup namespace, no ``cgroupsPath`` and no ``resources``:
  rootless runc then leaves the container in its caller's cgroup, the Slurm step's, whose limits
  (``--mem``, ``--cpus-per-task``) and whose end (``scancel``) hold it.
- **Its file system**: the image's unpacked root, shared by every container of that image and read-only;
  the places the program may write are bind mounts the spec names. Mount targets must exist in the
  root file system (the server makes the mount points when it unpacks an image): rootless runc, root only
  of its own namespace, cannot create them in a root's directory.
- **Its process 1**: the node's static ``catatonit``, bound read-only at :data:`INIT_INSIDE` and run as
  ``catatonit -g -- PROGRAM...``: it reaps orphans, forwards the signals runc passes it to the program's
  process group, and exits as the program did (128 + N when signal N ended it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hyperplan.backends.base import Mount
from hyperplan.backends.layout import write_atomically

INIT_INSIDE = "/run/hyperplan/init"
"""Where the container sees the node's catatonit (bound read-only), its process 1."""
ENV_DIR_INSIDE = "/run/hyperplan/env"
"""Where the container sees its node's published variables (read-only), when the spec binds them."""
TEMPLATE = "oci.json"
"""The server's template in a task's directory."""
OCI_VERSION = "1.0.2"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TEMPLATE_MODE = 0o640

CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_NET_BIND_SERVICE",
    "CAP_SETFCAP",
    "CAP_SETGID",
    "CAP_SETPCAP",
    "CAP_SETUID",
    "CAP_SYS_CHROOT",
)
"""Podman's default set, the one the local back end's containers get: a program written for a container
(an entrypoint that chowns its directories, a tool that drops to its own uid) behaves the same on both
back ends. They are capabilities of the container's user namespace only, which owns nothing of the host:
they act on its own mounts, hostname and processes and on files whose owner is mapped (the account's own),
never on the node's network (the node's namespace, owned by the host's: binding a port below 1024 there is
still refused), nor on the image's files (root's, unmapped: seen as nobody's). runc's rootless default
(AUDIT_WRITE, KILL, NET_BIND_SERVICE) would only make such programs fail where Podman lets them run."""

MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
"""As ``runc spec`` gives them."""
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
"""As ``runc spec`` gives them."""

RESERVED_TARGETS = frozenset(
    ("/", "/proc", "/dev", "/dev/pts", "/dev/shm", "/dev/mqueue", "/sys", INIT_INSIDE)
)
"""What the configuration itself mounts: a spec's mount there would hide or replace it."""


@dataclass(frozen=True)
class OciSpec:
    """One container: its root file system, whose it is, what it runs and what it sees."""

    rootfs: Path
    """The image's unpacked root (shared, read-only, root's)."""
    uid: int
    """The account's user: uid 0 inside maps to it (and to it alone), gid 0 to ``gid``."""
    gid: int
    argv: tuple[str, ...]
    """The program, as seen inside."""
    env: Mapping[str, str]
    """Its environment (the runner adds Slurm's and the published variables)."""
    cwd: str
    """Its working directory, inside."""
    hostname: str
    mounts: tuple[Mount, ...] = ()
    """Binds (``read_only`` honoured). A target must exist in the rootfs or lie under another writable
    mount."""
    own_network: bool = False
    """True: a network namespace of its own, loopback only; False: the node's network."""
    init: Path = Path("/usr/bin/catatonit")
    """The node's (static) catatonit."""

    def __post_init__(self) -> None:
        if self.uid <= 0 or self.gid <= 0:
            raise ValueError(f"uid {self.uid}, gid {self.gid}: a container's user is an account's, not root")
        if not self.argv:
            raise ValueError("a container needs a program to run: argv is empty")
        for name in self.env:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"environment variable {name!r}: a name must be non-empty, without '='")
        check_inside_path(self.cwd, "working directory")
        for mount in self.mounts:
            check_mount_target(mount.target)


def check_inside_path(path: str, what: str) -> None:
    """A path inside the container: absolute, without '..' (runc resolves it inside the root, but a
    configuration says plainly where things are)."""
    parts = PurePosixPath(path)
    if not parts.is_absolute() or ".." in parts.parts:
        raise ValueError(f"{what} {path!r}: must be an absolute path without '..'")


def check_mount_target(target: str) -> None:
    check_inside_path(target, "mount target")
    if str(PurePosixPath(target)) in RESERVED_TARGETS:
        raise ValueError(f"mount target {target!r}: the container's own mounts are there")


def runtime_config(spec: OciSpec) -> dict[str, Any]:
    """The OCI runtime configuration (``config.json``) runc runs for ``spec``: see the module's docstring.

    No ``rlimits``: the program keeps the Slurm step's limits (which Slurm propagates from the submitting
    shell, ``PropagateResourceLimits``): runc's default RLIMIT_NOFILE would lower them, and rootless runc
    cannot raise a hard limit above its own anyway (it would fail to start)."""
    return {
        "ociVersion": OCI_VERSION,
        "process": _process(spec),
        "root": {"path": str(spec.rootfs), "readonly": True},
        "hostname": spec.hostname,
        "mounts": _mounts(spec),
        "linux": _linux(spec),
    }


def _process(spec: OciSpec) -> dict[str, Any]:
    env = dict(spec.env)
    env.setdefault("PATH", DEFAULT_PATH)
    return {
        "terminal": False,
        "user": {"uid": 0, "gid": 0},
        "args": [INIT_INSIDE, "-g", "--", *spec.argv],
        "env": [f"{name}={value}" for name, value in env.items()],
        "cwd": spec.cwd,
        "noNewPrivileges": True,
        "capabilities": {
            "bounding": list(CAPABILITIES),
            "effective": list(CAPABILITIES),
            "permitted": list(CAPABILITIES),
        },
    }


def _mounts(spec: OciSpec) -> list[dict[str, Any]]:
    kernel: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            # No gid=5: the tty group is not mapped in the container's user namespace (rootless).
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            # The container's IPC namespace is its own (its user namespace owns it): rootless may mount it.
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            # Rootless cannot mount a sysfs (that needs the network namespace's owner): the node's, bound.
            "destination": "/sys",
            "type": "bind",
            "source": "/sys",
            "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": INIT_INSIDE,
            "type": "bind",
            "source": str(spec.init),
            "options": ["bind", "ro", "nosuid", "nodev"],
        },
    ]
    return kernel + [_bind(mount) for mount in spec.mounts]


def _bind(mount: Mount) -> dict[str, Any]:
    return {
        "destination": mount.target,
        "type": "bind",
        "source": str(mount.source),
        "options": ["rbind", "ro" if mount.read_only else "rw", "nosuid", "nodev"],
    }


def _linux(spec: OciSpec) -> dict[str, Any]:
    namespaces = ["pid", "ipc", "uts", "mount", "user"]
    if spec.own_network:
        namespaces.append("network")  # runc brings its loopback up, and nothing else
    return {
        "uidMappings": [{"containerID": 0, "hostID": spec.uid, "size": 1}],
        "gidMappings": [{"containerID": 0, "hostID": spec.gid, "size": 1}],
        "namespaces": [{"type": name} for name in namespaces],
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
    }


def write_template(directory: Path, spec: OciSpec) -> Path:
    """:data:`TEMPLATE` in ``directory``, written atomically (a runner starting meanwhile reads the old one
    or the new one whole); its path. The writer's (root's: the server's), 0640, its group the account's:
    its variables are the program's (a job's hyperparameters), the runner's alone to read."""
    path = directory / TEMPLATE
    text = json.dumps(runtime_config(spec), indent=1) + "\n"
    write_atomically(path, text.encode(), TEMPLATE_MODE)
    os.chown(path, -1, spec.gid, follow_symlinks=False)
    return path
