"""The host's side of the container tools: Debian's packages installed when a program is missing, and the
processes a command started, found by the mark it gave them, ended together."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from hyperplan import host_packages

STOP_TIMEOUT = 5.0


class Refused(Exception):
    """Something the command cannot do; its message is printed and the command exits 1."""


# -- packages -------------------------------------------------------------------------------------------


def missing_packages(programs: Mapping[str, str]) -> list[str]:
    """The packages (of ``{package: the program that shows it is installed}``) whose program is absent."""
    return [package for package, program in programs.items() if not shutil.which(program)]


def ensure_packages(programs: Mapping[str, str]) -> list[str]:
    """apt-get install the packages whose program is missing (hyperplan/host_packages.py: one install at a
    time, apt-get update only when it must); the ones it installed."""
    needed = missing_packages(programs)
    if not needed:
        return []
    try:
        host_packages.ensure(needed, why="the container tools run them")
    except host_packages.PackagesRefused as refusal:
        raise Refused(str(refusal)) from None
    still = missing_packages(programs)
    if still:
        raise Refused(
            f"{' '.join(still)} installed, but {' '.join(programs[p] for p in still)} is not on PATH"
        )
    return needed


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if absent) for the block: one command at a time on it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# -- ports ----------------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """Whether a server may listen on 127.0.0.1:``port``. With SO_REUSEADDR, as servers bind (Go's
    listeners, the registry's, do): a plain bind also fails while the port's closed connections linger
    in TIME_WAIT, for a minute after a registry on it stopped; this one fails only while a socket holds
    the port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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
        signalled = pids = marked_processes(variable, value)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + STOP_TIMEOUT
        while pids and time.monotonic() < deadline:
            _reap(pids)
            pids = [pid for pid in pids if carries(pid, variable, value)]
            time.sleep(0.05)
        # One that died between the reaping and the look is a zombie the look no longer counts: reaped now.
        _reap(signalled)
        if not pids:
            return


def _reap(pids: list[int]) -> None:
    """Reap those of ``pids`` that are this process's own children (an `up` in the same process) and ended."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def tail(text: str, lines: int = 8) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def file_tail(path: Path, lines: int = 8) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return ""
