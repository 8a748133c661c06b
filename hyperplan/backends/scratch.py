"""What a deleted account's OS user leaves on a machine: its processes, and its files in the places every
user may write (``/tmp``, ``/var/tmp``, ``/dev/shm``) or under a work directory. Both go before the user
does, so that nothing of it is found by whoever gets its files' owner next (uids are never handed out
again, but a system tool's or a site's may be).

Standard library only, and importing nothing of hyperplan: the local back end calls it in the server, and
the Slurm back end runs this file as a script on each node (``python3 scratch.py UID [DIR ...]``, as
root), where the package may not be installed.

Removal is done the way a hostile tree asks for: the walk never follows a link, never leaves the file
system it started on (it does not enter a mount below its root), and acts on names relative to a
directory it holds open, so a link or a directory swapped in meanwhile leads nowhere; a directory it
cannot read is passed over, never the end of the sweep. Only what the user owns goes: a directory of theirs
that holds someone else's file stays, with that file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
"""Where any user may leave files on a machine."""

KILL_ROUNDS = 50
"""How many times :func:`kill_processes` looks again for processes forked meanwhile (10 ms apart)."""


@dataclass(frozen=True)
class Swept:
    removed: int
    """Files, links and directories removed."""
    kept: int
    """The user's entries that could not be removed (a directory still holding another's file, say)."""


def owned_by(uid: int, proc: str = "/proc") -> set[int]:
    """The pids of every process whose real, effective or saved uid is ``uid``."""
    found: set[int] = set()
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/status", "rb") as status:
                for line in status:
                    if line.startswith(b"Uid:"):
                        if uid in {int(field) for field in line.split()[1:4]}:
                            found.add(int(entry))
                        break
        except (OSError, ValueError):
            continue  # gone meanwhile
    return found


def kill_processes(uid: int) -> int:
    """SIGKILL every process of ``uid`` until none is left (one forking meanwhile is found on the next
    round). Returns how many were signalled. Never for uid 0."""
    if uid == 0:
        raise ValueError("refusing to kill every process of root")
    me = os.getpid()
    signalled: set[int] = set()
    for _ in range(KILL_ROUNDS):
        found = owned_by(uid) - {me}
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        signalled |= found
        time.sleep(0.01)
    return len(signalled)


MAX_DEPTH = 256
"""How deep the walk goes (it holds one descriptor per level): what lies deeper stays, counted as kept."""
DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def remove_owned(uid: int, roots: Iterable[str]) -> Swept:
    """Remove every file, link and directory ``uid`` owns under each of ``roots`` (the roots themselves
    stay), without following a link or crossing into another file system. Never for uid 0."""
    if uid == 0:
        raise ValueError("refusing to remove every file of root")
    removed = kept = 0
    for root in roots:
        try:
            top = os.open(root, DIRECTORY_FLAGS)
        except OSError:
            continue  # not on this machine, or not a directory
        gone, left = _sweep(top, uid, os.fstat(top).st_dev)
        removed, kept = removed + gone, kept + left
    return Swept(removed, kept)


def _sweep(top: int, uid: int, device: int) -> tuple[int, int]:
    """Bottom-up below the open directory ``top`` (closed here), each directory emptied before it is looked
    at, with an explicit stack (a tree as deep as a tenant likes cannot exhaust the interpreter's). A
    directory that cannot be read (going away meanwhile), on another file system (a mount below the root:
    another's business) or deeper than MAX_DEPTH is not entered. (removed, kept)."""
    counts = [0, 0]
    stack: list[tuple[int, list[tuple[str, bool]]]] = [(top, _listing(top))]
    entered: list[str] = []  # the name, in its parent, of each directory on the stack but the top

    def tally(gone: bool | None) -> None:
        if gone is not None:
            counts[0 if gone else 1] += 1

    while stack:
        dirfd, pending = stack[-1]
        if not pending:
            os.close(dirfd)
            stack.pop()
            if stack:
                tally(_remove_if_owned(stack[-1][0], entered.pop(), uid, device, directory=True))
            continue
        name, is_directory = pending.pop()
        if is_directory and len(stack) < MAX_DEPTH:
            child = _open_directory(dirfd, name, device)
            if child is not None:
                stack.append((child, _listing(child)))
                entered.append(name)
                continue
        tally(_remove_if_owned(dirfd, name, uid, device, directory=is_directory))
    return counts[0], counts[1]


def _listing(dirfd: int) -> list[tuple[str, bool]]:
    """The names in an open directory, each with whether it is a directory (not following a link)."""
    found = []
    try:
        with os.scandir(dirfd) as entries:
            for entry in entries:
                try:
                    found.append((entry.name, entry.is_dir(follow_symlinks=False)))
                except OSError:
                    found.append((entry.name, False))
    except OSError:
        return []
    return found


def _open_directory(dirfd: int, name: str, device: int) -> int | None:
    """``name`` in ``dirfd`` opened, if it is a directory on ``device`` (never through a link)."""
    try:
        child = os.open(name, DIRECTORY_FLAGS, dir_fd=dirfd)
    except OSError:
        return None
    try:
        if os.fstat(child).st_dev == device:
            return child
    except OSError:
        pass
    os.close(child)
    return None


def _remove_if_owned(dirfd: int, name: str, uid: int, device: int, *, directory: bool) -> bool | None:
    """True: removed; False: the user's but could not be removed; None: not the user's (or not on
    ``device``)."""
    try:
        info = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return None
    if info.st_uid != uid or info.st_dev != device or stat.S_ISDIR(info.st_mode) != directory:
        return None
    try:
        if directory:
            os.rmdir(name, dir_fd=dirfd)
        else:
            os.unlink(name, dir_fd=dirfd)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    return True


def clear_user(uid: int, roots: Sequence[str] = SCRATCH_DIRS) -> tuple[int, Swept]:
    """Kill every process of ``uid``, then remove its files under ``roots``: (processes killed, swept)."""
    killed = kill_processes(uid)
    return killed, remove_owned(uid, roots)


def main(argv: Sequence[str]) -> int:
    if not argv or not argv[0].isdigit():
        print("usage: scratch.py UID [DIR ...]  (default: /tmp /var/tmp /dev/shm)", file=sys.stderr)
        return 2
    uid = int(argv[0])
    killed, swept = clear_user(uid, list(argv[1:]) or SCRATCH_DIRS)
    print(f"uid {uid}: {killed} processes killed, {swept.removed} entries removed, {swept.kept} kept")
    return 0 if swept.kept == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
