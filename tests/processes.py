"""Processes found by their run mark (hyperplan.backends.layout.MARK_VARIABLE), or by their owner, read
from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hyperplan.backends import procfs
from hyperplan.backends.layout import MARK_VARIABLE


@dataclass(frozen=True)
class MarkedProcess:
    pid: int
    command: str
    mark: str


def owns(prefix: str, mark: str) -> bool:
    """True when `mark` is `prefix` or a mark made below it."""
    return mark == prefix or mark.startswith(prefix + ".")


def marked(prefix: str, spare: frozenset[int] = frozenset()) -> list[MarkedProcess]:
    """Live processes (this one and `spare` aside) whose mark is `prefix` or below it."""
    found = []
    for pid in procfs.snapshot():
        if pid == os.getpid() or pid in spare:
            continue
        mark = procfs.read_environ(pid).get(MARK_VARIABLE, "")
        if owns(prefix, mark):
            found.append(MarkedProcess(pid, _command(pid), mark))
    return found


def kill(processes: Iterable[MarkedProcess]) -> None:
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process.pid, signal.SIGKILL)


def end_marked(prefix: str, timeout: float = 30.0) -> None:
    """SIGKILL every process carrying `prefix` or a mark below it, until none is left."""
    deadline = time.monotonic() + timeout
    while (found := marked(prefix)) and time.monotonic() < deadline:
        kill(found)
        time.sleep(0.1)


def _command(pid: int) -> str:
    try:
        raw = procfs.PROC.joinpath(str(pid), "cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def owned_by(uid: int, zombies: bool = True) -> list[int]:
    """The pids of live processes owned by ``uid`` (the owner of their /proc entry: the effective uid);
    without ``zombies``, those that still run: an exited process its parent has yet to reap (a step's
    child, reaped as its slurmstepd goes) runs nothing and holds nothing but its pid."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            mine = entry.name.isdigit() and entry.stat().st_uid == uid
            if mine and (zombies or not _is_zombie(entry)):
                found.append(int(entry.name))
    return found


def _is_zombie(entry: Path) -> bool:
    stat = (entry / "stat").read_text()
    return stat[stat.rindex(")") + 2 :].startswith("Z")  # the state follows the command's parentheses
