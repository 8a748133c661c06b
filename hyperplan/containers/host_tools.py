"""The host's side of the container tools: Debian's packages installed when a program is missing, and the
processes a command started, found by the mark it gave them, ended together."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

INSTALL_LOCK = Path("/run/lock/hyperplan-containers-install.lock")
APT_TIMEOUT = 900.0
STOP_TIMEOUT = 5.0


class Refused(Exception):
    """Something the command cannot do; its message is printed and the command exits 1."""


# -- packages -------------------------------------------------------------------------------------------


def missing_packages(programs: Mapping[str, str]) -> list[str]:
    """The packages (of ``{package: the program that shows it is installed}``) whose program is absent."""
    return [package for package, program in programs.items() if not shutil.which(program)]


def ensure_packages(programs: Mapping[str, str]) -> list[str]:
    """apt-get install the packages whose program is missing; the ones it installed.

    One install at a time (several commands may run at once, as test workers do), and apt-get waits for
    dpkg's lock rather than failing while something else installs; apt-get update only if the install
    fails without it (a machine's package lists may be old, and updating them costs seconds).
    """
    if not missing_packages(programs):
        return []
    if os.geteuid() != 0:
        names = " ".join(missing_packages(programs))
        raise Refused(f"{names} not installed; as root this command installs them (apt-get install {names})")
    INSTALL_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        missing = missing_packages(programs)
        if not missing:
            return []
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        wait = ["-o", "DPkg::Lock::Timeout=600"]
        command = ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", *missing]
        result = _apt(command, env, missing)
        if result.returncode != 0:
            update = _apt(["apt-get", *wait, "update", "-q"], env, missing)
            result = _apt(command, env, missing)
            if result.returncode != 0:
                said = (update.stderr + result.stdout + result.stderr).strip().splitlines()
                raise Refused(f"could not install {' '.join(missing)} with apt-get:\n" + "\n".join(said[-8:]))
    still = missing_packages(programs)
    if still:
        raise Refused(f"apt-get installed {' '.join(missing)}, but {' '.join(programs[p] for p in still)} "
                      "is still not on PATH")  # fmt: skip
    return missing


def _apt(command: list[str], env: dict[str, str], packages: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
    except FileNotFoundError:
        raise Refused(f"apt-get not found: install {' '.join(packages)} by hand") from None
    except subprocess.TimeoutExpired:
        raise Refused(f"{' '.join(command)} did not finish within {APT_TIMEOUT / 60:.0f} minutes") from None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if absent) for the block: one command at a time on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- ports ----------------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- marked processes -----------------------------------------------------------------------------------


def carries(pid: int, variable: str, value: str) -> bool:
    """The process lives (not a zombie) and has ``variable=value`` in its environment."""
    proc = Path(f"/proc/{pid}")
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return f"{variable}={value}".encode() in (proc / "environ").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False


def marked_processes(variable: str, value: str) -> list[int]:
    """Every live process but this one that carries ``variable=value``."""
    pids = [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
    return [pid for pid in pids if pid != os.getpid() and carries(pid, variable, value)]


def end_marked(variable: str, value: str) -> None:
    """SIGTERM every process carrying the mark, then SIGKILL what is still there a few seconds later."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = marked_processes(variable, value)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT
        while pids and time.monotonic() < deadline:
            for pid in pids:  # this process's own children (an `up` in the same process) are reaped here
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(pid, os.WNOHANG)
            pids = [pid for pid in pids if carries(pid, variable, value)]
            time.sleep(0.05)
        if not pids:
            return


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def file_tail(path: Path, lines: int = 8) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return ""
