"""Reading files that a tenant's process may have written, or replaced, without being fooled by them.

The server runs as root. On the Slurm back end the step runner writes a task's records and logs in a
directory the account's OS user owns (``out/``), so the program can swap any of them for a symbolic link
to a server secret, a hard link to one, a FIFO (an ``open`` that never returns), a device or a file of
many gigabytes. Every read of such a file goes through :func:`open_regular`: no link followed
(``O_NOFOLLOW``), no wait on a FIFO (``O_NONBLOCK``), a regular file with one name only, and a cap on
what is read. What is refused is a :class:`Refused` that says why, in words a user can be shown; the
caller decides what it means (the local back end's files are the server's own and pass the same checks).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(Exception):
    """The file is there but is not one the server reads: the message says what it is instead."""


def open_regular(path: Path) -> int | None:
    """A descriptor of ``path`` if it is a regular file with a single name; None if there is none.
    Raises :class:`Refused` for a link, a FIFO, a socket, a device, a directory or a hard link (a second
    name of a file elsewhere: the tenant could have linked one it cannot read, where the kernel allows)."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as error:
        if os.path.islink(path):
            raise Refused(f"{path.name} is a symbolic link") from None
        raise Refused(f"{path.name} cannot be opened: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Refused(f"{path.name} is {_kind(info.st_mode)}, not a regular file")
        if info.st_nlink > 1:
            raise Refused(f"{path.name} has {info.st_nlink} names (a hard link)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(path: Path, limit: int) -> bytes | None:
    """The whole of a regular file of at most ``limit`` bytes; None if there is none. Never reads more
    than ``limit + 1`` bytes, whatever the file's size."""
    fd = open_regular(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as source:
        data = source.read(limit + 1)
    if len(data) > limit:
        raise Refused(f"{path.name} is larger than {limit} bytes")
    return data


def read_at(path: Path, offset: int, limit: int) -> bytes:
    """Up to ``limit`` bytes of a log from ``offset``; nothing if it is missing or refused (a log
    replaced by a link or a FIFO reads as empty: nothing of what it points to is ever read)."""
    try:
        fd = open_regular(path)
    except Refused:
        return b""
    if fd is None:
        return b""
    with os.fdopen(fd, "rb") as source:
        source.seek(offset)
        return source.read(limit)


def tail(path: Path, limit: int = 2000) -> str:
    """The end of a log, for a status message; a refused one is named as such, never read."""
    try:
        fd = open_regular(path)
    except Refused as refused:
        return f"[not read: {refused}]"
    if fd is None:
        return ""
    with os.fdopen(fd, "rb") as log:
        with contextlib.suppress(OSError):
            log.seek(max(0, log.seek(0, os.SEEK_END) - limit))
        return log.read(limit).decode(errors="replace").strip()


def exists(path: Path) -> bool:
    """Whether something is at ``path`` (a mark file), without following a link or opening anything."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISSOCK: "a socket",
        stat.S_ISDIR: "a directory",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def lifecycle_argv(script: Path, args: Sequence[str]) -> list[str]:
    """How to run a lifecycle script copied from object storage, where scripts lose their mode bits: one
    with a #! line is made executable and run as it asks; any other runs under sh. It must be a file of
    the copy itself (no path through a symbolic link), opened as :func:`open_regular` opens. Raises
    :class:`Refused` saying why it cannot be run."""
    if script.resolve() != script:
        raise Refused("is a symbolic link or lies under one; it must be a file of the lifecycle source")
    fd = open_regular(script)
    if fd is None:
        raise Refused("not found in the lifecycle source")
    with os.fdopen(fd, "rb") as source:
        if source.read(2) == b"#!":
            os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o100)
            return [str(script), *args]
    return ["/bin/sh", str(script), *args]
