"""Timed logs: each line a process writes, with the time it was written, and the wrapper that records them.

Standard library only, and importing nothing of hyperplan: the wrapper runs wherever work runs (a
local node agent execs it; a Slurm job step can run it as ``python3 -m hyperplan.backends.timedlog``
or as a plain script file, ``python3 timedlog.py``)::

    timedlog.py (--log PATH | --log-fd N) [--stdout PATH] [--stderr PATH]
                [--run-as UID:GID] [--cwd DIR] [--env-fd N] -- PROGRAM [ARG ...]

It runs PROGRAM with its standard output and error on pipes of its own, copies every byte unchanged to
its own standard output and error (or to ``--stdout``/``--stderr``), and appends one record per line to
the timed log. It exits as PROGRAM did (the same code, or killed by the same signal), once the pipes
are drained, so whoever waits for it sees the last line recorded before the end.

The timed log: one record per line of output, appended, never rewritten::

    SECONDS.MICROS SP STREAM SP TEXT LF

``SECONDS.MICROS`` is the wall-clock time (Unix epoch, UTC, six decimals) at which the wrapper read the
line's first byte from the pipe: when the program wrote it, give or take the pipe's scheduling, never a
file's mtime. ``STREAM`` is ``o`` (standard output) or ``e`` (standard error). ``TEXT`` is the line's
bytes without its newline, as written (no decoding; it never holds LF). A line longer than
:data:`MAX_LINE` bytes is cut into several records; a last line without a newline is recorded when the
pipe closes, and a partial line left waiting :data:`IDLE_FLUSH` seconds is recorded as it stands (a
progress bar that never ends its line still shows). Each record is written whole with one ``write`` to
a file opened ``O_APPEND``, so a reader sees whole records, or at worst a last one still being written,
which :func:`read_records` leaves for the next read. A reader's cursor is a byte offset in this file.

Signals. PROGRAM runs in the wrapper's process group (and session), so a signal sent to the group
reaches it directly, exactly as if it ran alone: that is how every back end signals work (the local
agent signals a task's process group; Slurm signals every process of a step). The wrapper itself ignores
the catchable signals that end a process (TERM, INT, HUP, QUIT, USR1, USR2, ALRM, PIPE) so that it
outlives PROGRAM and records its last lines; SIGKILL ends both. It does not pass a signal on itself:
one sent to the group already reached PROGRAM, and passing it again would deliver it twice (a handler
counting SIGTERMs would see two). A signal meant for PROGRAM alone goes to the group, or to PROGRAM's
pid. PROGRAM starts with default dispositions, but for signals the wrapper found ignored (``nohup``).

``--run-as UID:GID`` (the wrapper started as root): PROGRAM drops to that user and group for good, with
no supplementary groups, before it changes to ``--cwd`` and runs; the wrapper keeps writing the logs it
was given, which that user cannot reach.

``--env-fd N``: PROGRAM's whole environment, a JSON object of strings read from descriptor N (then
closed). The wrapper itself keeps the environment it was started with, which its starter builds: the
tenant's variables (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``GCONV_PATH`` and the like, which the dynamic
loader and libc obey before any line of Python runs) reach only PROGRAM's ``execve``, after the change
of user, where they can do no more than the user could. Without it PROGRAM inherits the wrapper's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import resource
import select
import signal
import stat
import sys
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

MAX_LINE = 64 * 1024
"""The most bytes of text one record holds; longer lines are cut."""

IDLE_FLUSH = 1.0
"""A partial line waiting this many seconds for its newline is recorded as it stands."""

DRAIN_AFTER_EXIT = 1.0
"""Once PROGRAM has exited, how long the wrapper waits for its pipes to close (a process it left behind
may hold them) while nothing more comes."""

STDOUT_TAG = b"o"
STDERR_TAG = b"e"

_ENDING_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)
_IGNORED = (*_ENDING_SIGNALS, signal.SIGPIPE)

_RECORD = re.compile(rb"([0-9]{1,12})\.([0-9]{6}) ([oe]) ")


# --- writing ------------------------------------------------------------------------------------------


def record(micros: int, tag: bytes, text: bytes) -> bytes:
    """One record of the timed log (``text`` without a newline)."""
    seconds, fraction = divmod(micros, 1_000_000)
    return b"%d.%06d %s %s\n" % (seconds, fraction, tag, text)


def now_micros() -> int:
    return time.time_ns() // 1000


class LineCutter:
    """One stream's bytes cut into records, each stamped with the time its line's first byte came."""

    def __init__(self, tag: bytes) -> None:
        self.tag = tag
        self.pending = bytearray()
        self.since: int | None = None
        self.cut_at_cap = False

    def feed(self, data: bytes, micros: int) -> list[bytes]:
        records: list[bytes] = []
        start = 0
        while start < len(data):
            if self.cut_at_cap and data[start : start + 1] == b"\n":
                start += 1  # the newline of a line already recorded in pieces
                self.cut_at_cap = False
                continue
            self.cut_at_cap = False
            if self.since is None:
                self.since = micros
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            room = MAX_LINE - len(self.pending)
            if end - start >= room and (newline < 0 or end - start > room):
                self.pending += data[start : start + room]
                start += room
                records.append(self._cut())
                self.cut_at_cap = True
                continue
            self.pending += data[start:end]
            if newline < 0:
                break
            start = newline + 1
            records.append(self._cut())
        return records

    def waiting_since(self) -> int | None:
        return self.since

    def flush(self) -> list[bytes]:
        return [] if self.since is None else [self._cut()]

    def _cut(self) -> bytes:
        assert self.since is not None
        line = record(self.since, self.tag, bytes(self.pending))
        self.pending.clear()
        self.since = None
        return line


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError as error:
            if error.errno in (errno.EPIPE, errno.EBADF):
                return  # nobody reads that side any more: the others still count
            raise
        view = view[written:]


# --- reading ------------------------------------------------------------------------------------------


READ_BUDGET = 4 * 1024 * 1024
"""What one :func:`read_records` call may go through, in bytes, each line counting at least
:data:`LINE_COST`: a log of damaged, empty or giant lines (a tenant's program may write anything into its
own log on the Slurm back end) costs each read this much at most; the cursor moves past what was
skipped, so the next read goes on from there."""
LINE_COST = 64

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_records(
    path: str | os.PathLike[str], cursor: int = 0, limit: int = 1000, max_bytes: int | None = None
) -> tuple[list[tuple[int, str, bytes]], int]:
    """Up to ``limit`` records from byte offset ``cursor``: (epoch microseconds, ``"o"`` or ``"e"``,
    text), and the cursor after the last one read. With ``max_bytes``, the read also stops once the
    texts it returns hold that many bytes (the record that reaches it is the last): it holds at most
    ``max_bytes`` and one record. A record still being written is left for later; a missing file reads
    as empty. A damaged record (not of the format) is skipped.

    The log may be a tenant's (the Slurm back end's runner writes it as the account's user): it is
    opened without following a link and without waiting on a FIFO, anything but a regular file with one
    name reads as empty, and one call reads at most :data:`READ_BUDGET` bytes."""
    records: list[tuple[int, str, bytes]] = []
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:  # missing, or a symbolic link (ELOOP): nothing to read
        return records, cursor
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        return records, cursor
    budget = READ_BUDGET
    room = max_bytes
    with os.fdopen(fd, "rb") as log:
        log.seek(cursor)
        while len(records) < limit and budget > 0 and (room is None or room > 0):
            line = log.readline(MAX_LINE + 64)
            budget -= max(LINE_COST, len(line))
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:  # no newline where one must be: skip to the next
                    cursor += len(line)
                    continue
                break  # the end, or a record still being written
            cursor += len(line)
            match = _RECORD.match(line)
            if match is None:
                continue
            micros = int(match[1]) * 1_000_000 + int(match[2])
            text = line[match.end() : -1]
            records.append((micros, match[3].decode(), text))
            if room is not None:
                room -= len(text)
    return records, cursor


# --- the wrapper --------------------------------------------------------------------------------------


def run(
    argv: Sequence[str],
    *,
    log_fd: int,
    stdout_fd: int = 1,
    stderr_fd: int = 2,
    prepare: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """Run ``argv`` (in ``env``, or the wrapper's own environment) with its output timed into ``log_fd``;
    return its wait status once it has ended and its pipes are drained (or have been quiet
    :data:`DRAIN_AFTER_EXIT` after its exit)."""
    ignored_before = {sig for sig in _IGNORED if signal.getsignal(sig) == signal.SIG_IGN}
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    die_with = _death_signal_setter()  # loaded here: the child may be a user who cannot read the library
    pid = os.fork()
    if pid == 0:
        _exec(argv, out_write, err_write, ignored_before, prepare, die_with, env)
    os.close(out_write)
    os.close(err_write)
    streams = {out_read: (stdout_fd, LineCutter(STDOUT_TAG)), err_read: (stderr_fd, LineCutter(STDERR_TAG))}
    status: int | None = None
    last_activity = 0.0  # after the exit: when the pipes last gave something
    while streams:
        timeout = 0.2 if status is None else max(0.0, last_activity + DRAIN_AFTER_EXIT - time.monotonic())
        try:
            ready, _, _ = select.select(list(streams), [], [], timeout)
        except InterruptedError:
            ready = []
        micros = now_micros()
        out: list[bytes] = []
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except InterruptedError:
                continue
            sink, cutter = streams[fd]
            if not data:
                out += cutter.flush()
                os.close(fd)
                del streams[fd]
                continue
            _write_all(sink, data)
            out += cutter.feed(data, micros)
            last_activity = time.monotonic()
        for _sink, cutter in streams.values():
            since = cutter.waiting_since()
            if since is not None and micros - since >= IDLE_FLUSH * 1_000_000:
                out += cutter.flush()
        if out:
            _write_all(log_fd, b"".join(out))
        if status is None:
            status = _reaped(pid)
            if status is not None:
                last_activity = time.monotonic()
        elif time.monotonic() - last_activity >= DRAIN_AFTER_EXIT:
            break  # it left a process holding its pipes: what that one writes is no longer its output
    for fd, (_sink, cutter) in streams.items():
        rest = cutter.flush()
        if rest:
            _write_all(log_fd, b"".join(rest))
        os.close(fd)
    return _wait(pid) if status is None else status


def _reaped(pid: int) -> int | None:
    try:
        found, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if found == pid else None


def _wait(pid: int) -> int:
    while True:
        try:
            return os.waitpid(pid, 0)[1]
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0


def _death_signal_setter() -> Callable[[int], None]:
    """What makes the program die with the wrapper (it ignores every catchable signal, so only SIGKILL
    ends it): a wrapper killed with its parent (the Slurm step runner of a node's batch script) leaves no
    program behind, unlogged and outside the work Slurm tracks. Linux only; elsewhere nothing happens."""
    if not sys.platform.startswith("linux"):
        return lambda _parent: None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda _parent: None

    def die_with(parent: int) -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)  # the wrapper died before the setting took effect

    return die_with


_PR_SET_PDEATHSIG = 1


def _exec(
    argv: Sequence[str],
    out: int,
    err: int,
    ignored_before: set[signal.Signals],
    prepare: Callable[[], None] | None,
    die_with: Callable[[int], None],
    env: dict[str, str] | None = None,
) -> NoReturn:
    """In the forked child: the pipes on 1 and 2, the wrapper's own descriptors closed, default signal
    dispositions (but for those the wrapper found ignored: a ``nohup`` holds), then ``prepare`` (the
    user, the directory) and exec, in ``env`` when given (its PATH finds the program)."""
    try:
        for sig in (*_IGNORED, signal.SIGXFSZ):
            # Python itself ignores SIGPIPE and SIGXFSZ: never pass that on.
            keep = sig in ignored_before and sig not in (signal.SIGPIPE, signal.SIGXFSZ)
            signal.signal(sig, signal.SIG_IGN if keep else signal.SIG_DFL)
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        wrapper = os.getppid()
        if prepare is not None:
            prepare()
        die_with(wrapper)  # after prepare: a change of user clears the setting
        if env is None:
            os.execvp(argv[0], list(argv))
        os.execvpe(argv[0], list(argv), env)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.write(2, f"hyperplan: cannot start {argv[0]!r}: {error}\n".encode())
    os._exit(127)


def drop_privileges(uid: int, gid: int, name: str = "") -> None:
    """Become ``uid``:``gid`` for good: no supplementary groups, then the group, then the user (real,
    effective and saved ids alike), and check that there is no way back."""
    who = name or f"{uid}:{gid}"
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    same = (uid,) * 3 == os.getresuid() and (gid,) * 3 == os.getresgid()
    if not same or os.getgroups() not in ([], [gid]):
        raise PermissionError(f"the switch to {who} did not take")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise PermissionError(f"still able to become root after switching to {who}")


def end_as(status: int) -> NoReturn:
    """Leave the way the program did: its exit code, or killed by its signal (without a core file)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)  # (SIGKILL has no handler to reset)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
            os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


MAX_ENV_BYTES = 4 * 1024 * 1024
"""The most an ``--env-fd`` environment may hold: more than execve takes (ARG_MAX) on Linux."""


def read_env(fd: int) -> dict[str, str]:
    """The environment given on descriptor ``fd`` (a JSON object of strings), which is then closed.
    ValueError when it is not one, or holds a name execve cannot carry."""
    chunks: list[bytes] = []
    size = 0
    with contextlib.suppress(OSError):  # a pipe cannot seek: it is read from where it is
        os.lseek(fd, 0, os.SEEK_SET)
    try:
        while chunk := os.read(fd, 1 << 16):
            size += len(chunk)
            if size > MAX_ENV_BYTES:
                raise ValueError(f"the environment on descriptor {fd} is over {MAX_ENV_BYTES} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    value = json.loads(b"".join(chunks) or b"{}")
    if not isinstance(value, dict):
        raise ValueError("the environment must be a JSON object")
    for name, text in value.items():
        if not isinstance(text, str) or not name or "=" in name or "\0" in name or "\0" in text:
            raise ValueError(f"environment variable {name!r}: a name without '=' or NUL, a string value")
    return value


def _open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)


def main(args: Sequence[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(
        prog="timedlog", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--log", help="the timed log, appended to (made 0600 if new)")
    where.add_argument("--log-fd", type=int, help="an open descriptor to append the timed log to")
    parser.add_argument("--stdout", help="where the program's output goes unchanged (default: ours)")
    parser.add_argument("--stderr", help="where the program's error output goes unchanged (default: ours)")
    parser.add_argument("--run-as", help="UID:GID the program runs as (the wrapper started as root)")
    parser.add_argument("--cwd", help="the program's working directory (entered as the --run-as user)")
    parser.add_argument(
        "--env-fd", type=int, help="a descriptor to read the program's whole environment from (JSON)"
    )
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- PROGRAM [ARG ...]")
    options = parser.parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser.error("name the program to run after --")
    run_as: tuple[int, int] | None = None
    if options.run_as is not None:
        uid, _, gid = options.run_as.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            parser.error(f"--run-as must be UID:GID in numbers, not {options.run_as!r}")
        run_as = (int(uid), int(gid))
    try:
        env = read_env(options.env_fd) if options.env_fd is not None else None
    except (OSError, ValueError) as error:
        parser.error(f"--env-fd {options.env_fd}: {error}")
    log_fd = options.log_fd if options.log_fd is not None else _open_append(options.log)
    stdout_fd = _open_append(options.stdout) if options.stdout else 1
    stderr_fd = _open_append(options.stderr) if options.stderr else 2

    def prepare() -> None:
        if run_as is not None:
            drop_privileges(*run_as)
        if options.cwd:
            os.chdir(options.cwd)

    end_as(run(argv, log_fd=log_fd, stdout_fd=stdout_fd, stderr_fd=stderr_fd, prepare=prepare, env=env))


if __name__ == "__main__":
    main(sys.argv[1:])
