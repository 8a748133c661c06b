"""Whether this host can run tenant work in Podman containers: what is missing, each a short phrase naming
the thing and how to get it (none: usable). The decision itself, with the rule that the server runs as
root, is hyperplan/core/runtime_choice.py's; the server installs nothing, it only says.

Programs are looked for as Podman and ``podman`` itself look for them: on PATH, and ``catatonit`` also in
Podman's helper directories (Debian puts it in /usr/libexec/podman).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from hyperplan.containers.host_tools import Refused
from hyperplan.containers.podman import choose_runtime

MAX_USER_NAMESPACES = Path("/proc/sys/user/max_user_namespaces")
# containers.conf's helper_binaries_dir, as Podman 4 ships it: where it looks for catatonit before PATH.
PODMAN_HELPER_DIRS = (
    Path("/usr/local/libexec/podman"),
    Path("/usr/local/lib/podman"),
    Path("/usr/libexec/podman"),
    Path("/usr/lib/podman"),
)


def podman_problems(max_user_namespaces: Path = MAX_USER_NAMESPACES) -> tuple[str, ...]:
    """What this host lacks for Podman containers: the ``podman`` command, an OCI runtime it can use,
    ``catatonit`` (the containers' init and the pods' pause process), user namespaces."""
    problems = []
    if shutil.which("podman") is None:
        problems.append("the podman command (apt-get install podman)")
    try:
        choose_runtime()  # crun on pure cgroup v2, runc anywhere else: the one this host needs
    except Refused:  # neither crun nor runc: runc works on every cgroup layout
        problems.append("an OCI runtime, runc (apt-get install runc)")
    if not _has_catatonit():
        problems.append("catatonit, Podman's init and pause process (apt-get install catatonit)")
    namespaces = _user_namespaces(max_user_namespaces)
    if namespaces is not None:
        problems.append(namespaces)
    return tuple(problems)


def _has_catatonit() -> bool:
    helpers = any((directory / "catatonit").is_file() for directory in PODMAN_HELPER_DIRS)
    return helpers or shutil.which("catatonit") is not None


def _user_namespaces(max_user_namespaces: Path) -> str | None:
    """None if the kernel lets processes make user namespaces (each container is in one); else why not."""
    try:
        allowed = int(max_user_namespaces.read_text())
    except (OSError, ValueError):
        return f"user namespaces (this kernel has none: {max_user_namespaces} cannot be read)"
    if allowed <= 0:
        return (
            f"user namespaces ({max_user_namespaces} is {allowed}: sysctl -w user.max_user_namespaces=15000)"
        )
    return None
