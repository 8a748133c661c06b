"""What Linux's /proc says about processes, read without a library.

The local back end names a process by (pid, start time): the start time (field 22 of
``/proc/PID/stat``, in clock ticks since boot) tells a process from a later one that got the same pid.
Parsers are pure functions; the readers around them return None for a process that is gone or not ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int
    starttime: int

    @property
    def is_zombie(self) -> bool:
        # A zombie has ended; only its exit status waits for its parent. X: dead, being removed.
        return self.state in ("Z", "X")


def parse_stat(text: str) -> ProcStat:
    """Parse one ``/proc/PID/stat`` line. The command name (field 2) may hold spaces and parentheses,
    so the fields are counted from its last closing parenthesis."""
    head, _, tail = text.rpartition(")")
    pid = int(head.split("(", 1)[0])
    fields = tail.split()
    # fields[0] is field 3 of proc(5): state, ppid, pgrp, session, ..., starttime is field 22.
    return ProcStat(
        pid=pid,
        state=fields[0],
        ppid=int(fields[1]),
        pgid=int(fields[2]),
        sid=int(fields[3]),
        starttime=int(fields[19]),
    )


def parse_environ(data: bytes) -> dict[str, str]:
    """Parse ``/proc/PID/environ``: NUL-separated NAME=VALUE entries."""
    env = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def read_stat(pid: int) -> ProcStat | None:
    try:
        return parse_stat((PROC / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_environ(pid: int, having: str | None = None) -> dict[str, str]:
    """A process's environment; with `having` ("NAME=VALUE"), empty unless it holds that very entry,
    without parsing the others' (a sweep over every process of the machine reads them all)."""
    try:
        data = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    if having is not None and b"\0" + having.encode() + b"\0" not in b"\0" + data + b"\0":
        return {}
    return parse_environ(data)


def all_pids() -> list[int]:
    return [int(name) for name in os.listdir(PROC) if name.isdigit()]


def snapshot() -> dict[int, ProcStat]:
    """Every live (not zombie) process, by pid."""
    stats = (read_stat(pid) for pid in all_pids())
    return {stat.pid: stat for stat in stats if stat is not None and not stat.is_zombie}


def starttime_of(pid: int) -> int:
    stat = read_stat(pid)
    if stat is None:
        raise ProcessLookupError(pid)
    return stat.starttime


def is_alive(pid: int, starttime: int) -> bool:
    """True while the process that had this start time runs (a zombie has ended)."""
    stat = read_stat(pid)
    return stat is not None and stat.starttime == starttime and not stat.is_zombie


def descendants(procs: Mapping[int, ProcStat], ancestor: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in procs.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    found: set[int] = set()
    todo = list(children.get(ancestor, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def members(procs: Mapping[int, ProcStat], leader: int, marker: tuple[str, str] | None = None) -> set[int]:
    """The processes of a node whose agent is (or was) ``leader``: its session, its descendants
    (orphans are re-parented to it), and any process whose initial environment carries ``marker``
    (NAME, VALUE), which also finds processes that left the session after the agent died."""
    found = {pid for pid, stat in procs.items() if stat.sid == leader}
    found |= descendants(procs, leader)
    if marker is not None:
        name, value = marker
        found |= {pid for pid in procs if read_environ(pid).get(name) == value}
    found.discard(leader)
    found.discard(os.getpid())
    return found


def send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def kill_until_gone(find: Callable[[], set[int]], reap: Callable[[], None] = lambda: None) -> None:
    """SIGKILL whatever ``find`` returns until it returns nothing: a process may fork while we kill.
    ``reap`` lets a parent collect its children, which would otherwise linger as zombies."""
    for _ in range(200):
        pids = find()
        if not pids:
            return
        send(pids, signal.SIGKILL)
        time.sleep(0.005)
        reap()
