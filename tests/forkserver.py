"""Test servers forked from a process that has already imported the slow, inert part of their stack.

A `hyperplan serve` started afresh spends about a second of CPU importing SQLAlchemy, the store's
declarative schema, botocore, uvicorn and Starlette, the same every time; the core tests start dozens of
servers. Each test worker keeps one *fork server*: a process started like any test server (the worker's
interpreter, environment and path) that imports those modules once and then, asked for a server, forks
a child that sets itself up exactly as `subprocess.Popen(args, env=env, stdout=log, stderr=STDOUT,
start_new_session=True)` would have, and runs the `hyperplan` console script's code on those arguments.

What keeps a forked server the same as a fresh one:
- only modules that start no thread and read no environment variable of ours at import are imported
  beforehand (not numpy: OpenBLAS starts threads; not prometheus_client: it reads its multiprocess
  directory at import; not hyperplan's CLI: it reads COLUMNS and the terminal at import); the fork server
  checks before every fork that it has one thread, and a server is started afresh when it does not;
- the child gets the server's own environment, arguments, session, working directory, umask, stdin
  and log as its fds 0, 1 and 2, the signal dispositions the interpreter started with, and a fresh
  random state (the random module reseeds at fork); it closes the fork server's fds before running
  anything, and exits as the interpreter would (non-daemon threads joined, atexit run, streams flushed);
- a start whose environment would change how the interpreter itself starts (a PYTHON* variable other
  than the fork server's) is made afresh.
What differs: servers forked from one fork server share its string hash seed, and the kernel's view
of a forked server's command line and initial environment (/proc/PID/cmdline, /proc/PID/environ) is
the fork server's (so tests/leaks.py would name the test that started the fork server for a leaked
server); its children, which are exec'd, are as ever.

The fork server is the servers' parent: it reaps them and reports each exit status to the test worker,
whose `ForkedProcess` answers `poll`, `wait`, `send_signal`, `kill`, `pid` and `returncode` as a Popen
does. `HYPERPLAN_TEST_FORK=0` turns it off (every server started afresh).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hyperplan.backends.layout import MARK_VARIABLE

ENABLE_VARIABLE = "HYPERPLAN_TEST_FORK"
PRELOAD = (
    "sqlalchemy.orm",
    "sqlalchemy.dialects.sqlite",
    "hyperplan.store.schema",
    "botocore.session",
    "botocore.client",
    "uvicorn",
    "starlette.applications",
)
_HEADER = struct.Struct("!I")
_STARTING_SIGCHLD: Any = signal.SIG_DFL


def _send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        socket.send_fds(sock, [payload], list(fds))
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds sent with it; ConnectionError when the other end has gone."""
    head, fds, _flags, _address = socket.recv_fds(sock, _HEADER.size, 4)
    while len(head) < _HEADER.size:
        more = sock.recv(_HEADER.size - len(head))
        if not more:
            raise ConnectionError("fork server connection closed")
        head += more
    (size,) = _HEADER.unpack(head)
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise ConnectionError("fork server connection closed")
        data += more
    return json.loads(data), list(fds)


# -- the fork server's side -------------------------------------------------------------------------


def _serve(control: socket.socket) -> None:
    """Fork a server for each request; report each child's exit status as it is reaped."""
    import select

    global _STARTING_SIGCHLD
    _STARTING_SIGCHLD = signal.getsignal(signal.SIGCHLD)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd hears of it
    while True:
        ready, _, _ = select.select([control.fileno(), wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(control, {"exit": pid, "status": status})
        if control.fileno() in ready:
            try:
                request, fds = _receive(control)
            except (ConnectionError, OSError):
                return  # the test worker is done
            if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
                _send(control, {"refused": "the fork server has more than one thread"})
            else:
                pid = os.fork()
                if pid == 0:
                    _child(request, fds)
                _send(control, {"pid": pid})
            for fd in fds:
                os.close(fd)


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the server `subprocess.Popen` would have started, then run it."""
    code = 1
    try:
        # The one signal disposition the fork server changed, back as the interpreter set it up.
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, _STARTING_SIGCHLD)
        os.setsid()
        stdin, out = fds
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # as Popen's close_fds: the fork server's, these
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        # sys.stdin, stdout and stderr stay: made by the same interpreter start-up (the same PYTHON*
        # variables) on fds 0, 1 and 2, none of them a terminal, as a fresh server's are.
        code = _run_console_script()
    finally:
        os._exit(code)


def _run_console_script() -> int:
    """What the installed `hyperplan` script does, then what the interpreter does as it exits: the
    exit code from SystemExit, an uncaught exception through sys.excepthook, non-daemon threads
    joined, atexit's functions run, the standard streams flushed."""
    import atexit

    try:
        from hyperplan.cli.main import app

        app()
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return code


def main() -> None:
    # The path a console script starts with: its own directory first, not this repository's.
    sys.path[0] = str(Path(sys.executable).parent)
    for name in PRELOAD:
        __import__(name)
    _serve(socket.socket(fileno=int(sys.argv[1])))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


# -- the test worker's side -------------------------------------------------------------------------


class ForkedProcess:
    """A server forked by the fork server, with the part of Popen's interface the tests use."""

    def __init__(self, server: ForkServer, pid: int, args: Sequence[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._server.pump(0)
            self._settle()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._server.pump(0.05 if left is None else min(left, 0.05))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _settle(self) -> None:
        status = self._server.exits.pop(self.pid, None)
        if status is not None:
            self.returncode = os.waitstatus_to_exitcode(status)


class ForkServer:
    """The test worker's end of its fork server."""

    def __init__(self, env: Mapping[str, str]) -> None:
        ours, theirs = socket.socketpair()
        self.env = dict(env)
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from tests.forkserver import main; main()", str(theirs.fileno())],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # not a terminal, as a server's log is not
            stderr=subprocess.DEVNULL,
            pass_fds=[theirs.fileno()],
            cwd=Path(__file__).resolve().parent.parent,  # where `tests` is found
            # Out of the terminal's process group: a Ctrl-C meant for pytest must not end the process
            # that reaps the servers (it ends when the worker closes its socket, or dies).
            start_new_session=True,
        )
        theirs.close()
        self.sock = ours
        self.exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def fits(self, env: Mapping[str, str]) -> bool:
        """Whether a server with this environment starts the same forked as afresh: the interpreter's
        own variables are the fork server's."""

        def interpreter(values: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in values.items() if k.startswith("PYTHON")}

        return self.process.poll() is None and interpreter(env) == interpreter(self.env)

    def start(self, args: Sequence[str], env: Mapping[str, str], stdout: IO[bytes]) -> ForkedProcess | None:
        """A forked server running `args` (the `hyperplan` script's argv), or None when the fork server
        could not fork one (the caller starts it afresh)."""
        with self._lock:
            mask = os.umask(0o077)
            os.umask(mask)
            request = {"argv": list(args), "env": dict(env), "cwd": os.getcwd(), "umask": mask}
            stdin = 0 if _is_open(0) else os.open(os.devnull, os.O_RDONLY)
            try:
                _send(self.sock, request, [stdin, stdout.fileno()])
                while not self._replies:
                    self._pump_locked(None)
            except OSError:
                return None
            finally:
                if stdin != 0:
                    os.close(stdin)
            reply = self._replies.pop(0)
        if "pid" not in reply:
            return None
        return ForkedProcess(self, int(reply["pid"]), args)

    def pump(self, timeout: float | None) -> None:
        with self._lock:
            self._pump_locked(timeout)

    def _pump_locked(self, timeout: float | None) -> None:
        import select

        ready, _, _ = select.select([self.sock], [], [], timeout)
        while ready:
            message, fds = _receive(self.sock)
            for fd in fds:
                os.close(fd)
            if "exit" in message:
                self.exits[int(message["exit"])] = int(message["status"])
            else:
                self._replies.append(message)
            ready, _, _ = select.select([self.sock], [], [], 0)

    def close(self) -> None:
        """Stop the fork server (the servers it forked are their tests' to stop)."""
        self.sock.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)


_fork_server: ForkServer | None = None


def start_server_process(
    args: Sequence[str], env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes] | ForkedProcess:
    """`hyperplan serve` with these arguments and environment, its output in `log`, in a session of its
    own: forked by this worker's fork server when it can be, else started afresh."""
    global _fork_server
    if os.environ.get(ENABLE_VARIABLE, "1") != "0":
        if _fork_server is None or not _fork_server.fits(env):
            stop_fork_server()
            # Its environment is the server's without our own variables, but for the run mark
            # (tests/leaks.py): one that outlived its run would be found.
            own = {k: v for k, v in env.items() if not k.startswith("HYPERPLAN_")}
            _fork_server = ForkServer({**own, MARK_VARIABLE: os.environ.get(MARK_VARIABLE, "hptest")})
        forked = _fork_server.start(args, env, log) if _fork_server.fits(env) else None
        if forked is not None:
            return forked
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop_fork_server() -> None:
    """The end of a test worker's session (tests/conftest.py)."""
    global _fork_server
    if _fork_server is not None:
        _fork_server.close()
        _fork_server = None
