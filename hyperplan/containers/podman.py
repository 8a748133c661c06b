"""A Podman store of its own, under one directory, configured for the host it runs on.

Every ``podman`` command given :meth:`PodmanStore.environment` finds two files the store writes:

- ``containers.conf`` (``CONTAINERS_CONF``): the OCI runtime this host can use (crun refuses the *hybrid*
  cgroup layout, v1 controllers beside a v2 hierarchy; runc works on every layout), ulimits within the
  host's hard limits (Podman asks for more by default, and where root lacks CAP_SYS_RESOURCE the runtime
  then fails with "setrlimit RLIMIT_NOFILE: Operation not permitted"), and the store's own temporary
  directory and *file* locks. Podman's default locks are one shared-memory segment for every rootful
  store on the host, and a store's first start after boot frees all of them: a second store beside
  root's default one must not share them.
- ``storage.conf`` (``CONTAINERS_STORAGE_CONF``): images and layers under ``DIR/storage``, so root's
  default store (``/var/lib/containers/storage``) is never touched.

Run state (the runroot and the temporary directory: sockets, exit files, locks) lives in a short
directory of its own under ``/run/hyperplan-podman``, named by a hash of DIR. Below a long DIR it would
not work: with DIR 52 characters long, every ``podman run --rm`` took 20 s more to return (the
container's cleanup, run by conmon, failed on the long paths below it, and podman waited for it until
its timeout); with DIR 41 characters long it took 0.2 s. Run state is what Podman's own default keeps
under ``/run`` too: a reboot clears it, and the store sets it up again.

Podman keeps one thing outside: its cache of which blobs a registry already has
(``/var/lib/containers/cache``), shared by every store, which is only ever a hint.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
from pathlib import Path

from hyperplan.containers.host_tools import Refused, tail

# Podman's own defaults, which a container gets unless a hard limit of the host is lower.
NOFILE_DEFAULT = 1_048_576
# Podman 4.3 sets its own RLIMIT_NPROC to 32768 as it starts (seen with strace), and its runtime cannot
# give a container more than that without CAP_SYS_RESOURCE.
NPROC_CEILING = 32_768
COMMAND_TIMEOUT = 600.0
RUN_STATE = Path("/run/hyperplan-podman")  # short paths: see the module's docstring
DISK_IMAGE = ".storage.disk"
"""The image of the store's own file system, beside ``DIR/storage`` (``[backend] podman_store_gb``: the
server makes it, backends/disks.py names it so). Where it is, Podman's database is kept outside that file
system (``DIR/libpod``), so that a tenant who fills it cannot stop Podman recording what it does."""


class PodmanStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers_conf = root / "containers.conf"
        self.storage_conf = root / "storage.conf"
        self.graph = root / "storage"
        self.run_dir = RUN_STATE / hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
        self.tmp = self.run_dir / "tmp"

    def prepare(self) -> None:
        """Write the store's two configuration files (again: the host's limits or runtimes may change)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        static_dir = self.root / "libpod" if (self.root / DISK_IMAGE).exists() else None
        self.containers_conf.write_text(
            containers_conf(choose_runtime(), ulimits(nofile, nproc), self.tmp, static_dir)
        )
        self.storage_conf.write_text(storage_conf(self.graph, self.run_dir))

    def remove(self) -> None:
        """Delete the store: its images and its run state (nothing of it may be running)."""
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def variables(self) -> dict[str, str]:
        """What makes a ``podman`` command use this store: its two configuration files."""
        return {
            "CONTAINERS_CONF": str(self.containers_conf),
            "CONTAINERS_STORAGE_CONF": str(self.storage_conf),
        }

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.variables()}

    def run(self, *arguments: str, timeout: float = COMMAND_TIMEOUT) -> str:
        """``podman ARGUMENTS`` on this store; its standard output. Refused, with what podman said, if it
        fails."""
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
        except subprocess.TimeoutExpired:
            raise Refused(f"{' '.join(command)} did not finish within {timeout:.0f} s") from None
        if result.returncode != 0:
            raise Refused(f"{' '.join(command)} failed:\n{tail(result.stderr or result.stdout)}")
        return result.stdout

    def has_image(self, reference: str) -> bool:
        result = subprocess.run(
            ["podman", "image", "exists", reference], env=self.environment(), capture_output=True, timeout=60
        )
        return result.returncode == 0


def choose_runtime() -> str:
    """crun on a host with cgroup v2 alone (Podman's usual choice there), runc anywhere else."""
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()  # v2 mounted at the top: no v1 beside it
    if unified and shutil.which("crun"):
        return "crun"
    if shutil.which("runc"):
        return "runc"
    raise Refused("no OCI runtime: install runc (apt-get install runc)")


def ulimits(hard_nofile: int, hard_nproc: int) -> list[str]:
    """Podman's ``default_ulimits``: its defaults, lowered to the host's hard limits (soft = hard)."""

    def within(limit: int, wanted: int) -> int:
        return wanted if limit == resource.RLIM_INFINITY else min(limit, wanted)

    nofile = within(hard_nofile, NOFILE_DEFAULT)
    nproc = within(hard_nproc, NPROC_CEILING)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def containers_conf(runtime: str, limits: list[str], tmp_dir: Path, static_dir: Path | None = None) -> str:
    return "\n".join(
        [
            "# Written by hyperplan (hyperplan/containers/podman.py): this host's runtime and limits.",
            "[containers]",
            f"default_ulimits = {json.dumps(limits)}",
            "",
            "[engine]",
            f"runtime = {_toml(runtime)}",
            f"tmp_dir = {_toml(str(tmp_dir))}",
            'lock_type = "file"',  # under tmp_dir: this store's alone
            'events_logger = "file"',
            *([f"static_dir = {_toml(str(static_dir))}"] if static_dir is not None else []),
            "",
        ]
    )


def storage_conf(graph: Path, run_dir: Path) -> str:
    return "\n".join(
        [
            "# Written by hyperplan (hyperplan/containers/podman.py): a store of its own.",
            "[storage]",
            'driver = "overlay"',
            f"graphroot = {_toml(str(graph))}",
            f"runroot = {_toml(str(run_dir))}",
            "",
        ]
    )


def _toml(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string
