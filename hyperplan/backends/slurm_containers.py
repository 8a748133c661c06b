"""The Slurm back end's containers: a node's programs and a job instance in their image, on the nodes.

A node or sandboxed task whose spec has a :class:`~hyperplan.backends.base.ContainerSpec` runs each of its
programs (OnCreate, a task, an instance) as a rootless runc container that its step runner starts inside
the ordinary Slurm step or batch script (``slurm_runner.py``, container mode), so Slurm's cgroup holds the
container (``--mem``, ``scancel``) as it held the processes:

- **the image** is pulled by the server into its Podman store and unpacked once on the work root every
  node mounts (``slurm_images.py``); work is submitted only once its image is there, and a node or task
  whose image cannot be had fails, saying why;
- **the container**: its root file system the unpacked image, read-only and root's; root inside is the
  account's user outside (one id mapped); its own mount, PID, IPC and UTS namespaces; the node's network
  (instances of one job reach each other across nodes by host name, through an ``/etc/hosts`` the runner
  writes), or, for a job with ``EnableNetworkIsolation`` (a spec without ``endpoint``), a network of its
  own with loopback only; the host's ``catatonit`` as process 1 (``oci_bundle.py``);
- **what it may write**: the binds the spec names (a job's ``/opt/ml``) and directories of the node's or
  task's own, the account's user's, on the work root: a node keeps its ``/root`` (home), ``/opt/sagemaker``,
  ``/tmp`` and ``/var/tmp`` across its programs; an instance has its ``/root``, ``/tmp`` and ``/var/tmp``;
- **the records**: the server writes the container's description (``container.json``, root's) when the
  work is made, and the runtime configuration's template (``oci.json``, root's) once the image is
  unpacked; the runner adds the variables only known on the node and runs it. The task's directory, where
  the runner writes how the program ended, is never mounted into the container.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hyperplan.backends import oci_bundle
from hyperplan.backends.base import ENV_DIR_VARIABLE, ContainerSpec, Mount, RunAs
from hyperplan.backends.layout import inherited_mark, make_dir, write_atomically
from hyperplan.backends.slurm_images import SlurmImages
from hyperplan.backends.slurm_submit import write_runner_spec

HOME_INSIDE = "/root"
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside: the image's programs, never the server's PATH (a host's directories)."""
NODE_DIRS = {"home": HOME_INSIDE, "opt-sagemaker": "/opt/sagemaker", "tmp": "/tmp", "var-tmp": "/var/tmp"}
"""A node's own directories and where its containers see them: what it keeps between its programs."""
TASK_DIRS = {"home": HOME_INSIDE, "tmp": "/tmp", "var-tmp": "/var/tmp"}
"""A sandboxed task's (a job instance's) own directories beside the binds its spec names."""
DESCRIPTION = "container.json"
"""In a node's ``oncreate/`` or a task's directory: the container to run (root's), until its template."""
HOST_FILES = ("/etc/resolv.conf",)
"""Host files a container on the node's network reads: the node's name servers."""


def runc_program() -> str:
    """The runc the nodes run: where this host has it (a site installs it at the same path on every
    node, docs/SLURM.md)."""
    return shutil.which("runc") or "/usr/sbin/runc"


def init_program() -> Path:
    """The static ``catatonit`` bound into every container as its process 1 (the same path on the nodes)."""
    return Path(shutil.which("catatonit") or "/usr/bin/catatonit")


def record(spec: ContainerSpec | None) -> dict[str, Any] | None:
    """What a node's or task's record keeps of its container: a second provision or run must match it."""
    if spec is None:
        return None
    return {
        "image": spec.image,
        "hosts": list(spec.hosts),
        "endpoint": spec.endpoint,
        "mounts": [[str(m.source), m.target, m.read_only] for m in spec.mounts],
        "insecure_registry": spec.insecure_registry,
    }


def inside_env(env_extra: Mapping[str, str], task_id: str | None = None) -> dict[str, str]:
    """The environment a container's program starts with, before Slurm's and the published variables
    (which the runner adds): the image's PATH, root's home, the published variables' directory inside."""
    env = {
        "PATH": IMAGE_PATH,
        "LANG": "C.UTF-8",
        "HOME": HOME_INSIDE,
        "USER": "root",
        "LOGNAME": "root",
        ENV_DIR_VARIABLE: oci_bundle.ENV_DIR_INSIDE,
        **inherited_mark(),
        **env_extra,
    }
    if task_id is not None:
        env["HYPERPLAN_TASK_ID"] = task_id
    return env


def own_dirs(directory: Path, names: Mapping[str, str], run_as: RunAs) -> list[Mount]:
    """The directories ``names`` under ``directory`` (made if missing, the user's, 0700: root's inside),
    as binds at their targets."""
    mounts = []
    for name, target in names.items():
        path = directory / name
        make_dir(path, 0o700)
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
        mounts.append(Mount(path, target))
    return mounts


def _describe(
    directory: Path,
    container: Mapping[str, Any],
    run_as: RunAs,
    program: tuple[Sequence[str], Mapping[str, str], str],
    hostname: str,
    mounts: Sequence[Mount],
    env_dir: Path,
    hosts_file: Path | None = None,
) -> None:
    """Write the container a program runs in (``container.json``, root's 0600): ``container`` is its
    :func:`record`; ``program`` its argv, environment and working directory inside; ``mounts`` the node's
    or task's own directories; ``hosts_file`` the ``/etc/hosts`` the runner writes (a job's instance),
    else the node's own. Everything but the unpacked image's path, which :func:`ready` adds."""
    argv, env, cwd = program
    own_network = container["endpoint"] is None
    binds = [
        *mounts,
        *(Mount(Path(source), target, read_only) for source, target, read_only in container["mounts"]),
        Mount(env_dir, oci_bundle.ENV_DIR_INSIDE, read_only=True),
    ]
    if hosts_file is not None:
        binds.append(Mount(hosts_file, "/etc/hosts", read_only=True))
    elif not own_network:
        binds += [Mount(Path(name), name, read_only=True) for name in ("/etc/hosts",) if Path(name).exists()]
    if not own_network:
        binds += [Mount(Path(name), name, read_only=True) for name in HOST_FILES if Path(name).exists()]
    description = {
        "image": container["image"],
        "insecure": bool(container["insecure_registry"]),
        "uid": run_as.uid,
        "gid": run_as.gid,
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd,
        "hostname": hostname,
        "mounts": [[str(m.source), m.target, m.read_only] for m in binds],
        "own_network": own_network,
    }
    write_atomically(directory / DESCRIPTION, json.dumps(description).encode(), 0o600)


def _runner_block(directory: Path, name: str, hosts: bool, run_as: RunAs) -> dict[str, Any]:
    """What ``run.json`` tells the runner of its container (``slurm_runner.py``): the template, its own
    directories for the final configuration and runc's state (the user's, 0700), the container's name and,
    for a job's instance, the ``/etc/hosts`` it writes with the job's hosts' addresses."""
    for own in ("bundle", "runc"):
        make_dir(directory / own, 0o700)
        os.chown(directory / own, run_as.uid, run_as.gid, follow_symlinks=False)
    if hosts:
        hosts_file = directory / "hosts"
        write_atomically(hosts_file, b"127.0.0.1\tlocalhost\n", 0o644)
        os.chown(hosts_file, run_as.uid, run_as.gid, follow_symlinks=False)
    return {
        "template": str(directory / oci_bundle.TEMPLATE),
        "bundle": str(directory / "bundle"),
        "state": str(directory / "runc"),
        "name": name,
        "runc": runc_program(),
        "hosts": str(directory / "hosts") if hosts else None,
    }


def lay_out(
    directory: Path,
    container: Mapping[str, Any],
    run_as: RunAs,
    program: tuple[Sequence[str], Mapping[str, str], str],
    hostname: str,
    own: Sequence[Mount],
    env_dir: Path,
    name: str,
    hosts: bool = False,
    log_dir: Path | None = None,
) -> None:
    """Everything a program's container needs in ``directory`` before its image is unpacked: the
    container's description (root's), the runner's own directories and its ``run.json`` (the user's).
    ``container`` is its :func:`record`; ``program`` its argv, environment and working directory inside;
    ``own`` the node's or task's own directories; ``name`` the container's; with ``hosts`` (a job's
    instance) the runner writes its ``/etc/hosts`` (the job's hosts by address), else it is the node's;
    ``log_dir``: where the program's output goes, if not ``directory/out`` (a node's on_reclaim.sh)."""
    hosts_file = directory / "hosts" if hosts else None
    _describe(directory, container, run_as, program, hostname, own, env_dir, hosts_file)
    block = _runner_block(directory, name, hosts, run_as)
    argv, env, cwd = program
    write_runner_spec(directory, list(argv), env, cwd, run_as, env_dir, block, log_dir)


def ready(directory: Path, images: SlurmImages) -> bool | str:
    """Whether the container described in ``directory`` can run: True once its template is written (its
    image unpacked), False while the image is being made, the words of the problem when it cannot be."""
    if (directory / oci_bundle.TEMPLATE).exists():
        return True
    description = _description(directory)
    if description is None:
        return True  # no container: host processes
    image = description["image"]
    rootfs = images.rootfs(image)
    if rootfs is None:
        problem = images.problem(image)
        if problem is None:
            images.prepare(image, None, bool(description["insecure"]))  # (again, after a restart)
        return problem or False
    spec = oci_bundle.OciSpec(
        rootfs=rootfs,
        uid=int(description["uid"]),
        gid=int(description["gid"]),
        argv=tuple(description["argv"]),
        env=description["env"],
        cwd=description["cwd"],
        hostname=description["hostname"],
        mounts=tuple(Mount(Path(source), target, ro) for source, target, ro in description["mounts"]),
        own_network=bool(description["own_network"]),
        init=init_program(),
    )
    oci_bundle.write_template(directory, spec)  # (the runner's alone to read)
    return True


def node_mounts(directory: Path) -> list[Mount]:
    """A node's own directories (:func:`own_dirs`, made at its provision) as its containers bind them:
    for a program started later (its on_reclaim.sh), without touching what its user owns by now."""
    return [Mount(directory / name, target) for name, target in NODE_DIRS.items()]


def inside(path: Path, home: Path) -> str:
    """A path under a node's home on the host, as its containers see it."""
    return str(Path(HOME_INSIDE) / path.relative_to(home))


def _description(directory: Path) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = json.loads((directory / DESCRIPTION).read_bytes())
    except FileNotFoundError:
        return None
    return found
