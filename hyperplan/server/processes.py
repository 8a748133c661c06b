"""`serve --workers N`: N API processes on one listening socket, and this process owning the background work.

This process (the supervisor) opens the store (the migration, the bootstrap and the offering key run here,
once, before any API process starts), binds the port once and hands the listening socket to each child
(inherited descriptor; the kernel spreads the connections over the processes that accept on it). Each
child is `hyperplan serve` again in role `api`: it serves requests and never leads. This process stands
for leader (services/runtime/leadership.py) and, elected, runs the timed events, webhooks, node watcher, job
runner and Slurm reconciler, and carries out the clock moves the children ask for.

Children die with this process: each asks the kernel for SIGTERM when its parent ends (PR_SET_PDEATHSIG)
and checks that its parent is still the one that started it. SIGTERM or Ctrl-C here stops every child
(SIGTERM, then SIGKILL after the grace), then the background work. A child that dies by itself is started
again after a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
CHILD_GRACE = 15.0  # seconds a stopping child has before SIGKILL
PARENT_ENV = "HYPERPLAN_SUPERVISOR_PID"
GATE_ENV = "HYPERPLAN_START_GATE"  # a pipe's read end: the child serves once it reads end of file


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def wait_for_the_gate() -> None:
    """In a child: wait until the supervisor has caught up (run the missed events) before serving; it
    closes the pipe's write end then (or dies, which closes it too)."""
    gate = os.environ.pop(GATE_ENV, None)
    if gate is None:
        return
    fd = int(gate)
    try:
        while os.read(fd, 1):
            pass
    finally:
        os.close(fd)


def die_with_parent() -> None:
    """In a child: SIGTERM when the supervisor ends; exit now if it already has."""
    expected = os.environ.get(PARENT_ENV)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if expected is None:
        return
    if os.getppid() != int(expected):
        os._exit(1)  # the supervisor ended before the request above took effect
    threading.Thread(target=_watch_parent, args=(int(expected),), name="parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    """A second line: should the kernel's signal not end this process (caught at a moment it cannot
    act on), it is sent again when the parent is gone, and the process ends whatever it is doing after
    the grace."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(CHILD_GRACE)
    os._exit(1)


class Supervisor:
    def __init__(self, child_args: Sequence[str], workers: int, fd: int) -> None:
        self.child_args = list(child_args)
        self.workers = workers
        self.fd = fd
        self.children: list[subprocess.Popen[bytes] | None] = [None] * workers
        self.stopping = False

    def _spawn(self, index: int, gate: int | None = None) -> None:
        env = dict(os.environ)
        env[PARENT_ENV] = str(os.getpid())
        passed = [self.fd]
        if gate is not None:
            env[GATE_ENV] = str(gate)
            passed.append(gate)
        self.children[index] = subprocess.Popen(
            [sys.executable, "-m", "hyperplan.cli.main", *self.child_args, "--listen-fd", str(self.fd)],
            pass_fds=passed,
            env=env,
        )

    def start(self) -> int:
        """Start the API processes; they load while this process catches up, and serve once the
        returned descriptor (a pipe's write end) is closed (`open_the_gate`)."""
        read_end, write_end = os.pipe()
        for index in range(self.workers):
            self._spawn(index, gate=read_end)
        os.close(read_end)
        return write_end

    @staticmethod
    def open_the_gate(write_end: int) -> None:
        os.close(write_end)

    def request_stop(self) -> None:
        self.stopping = True  # a plain attribute: safe in a signal handler

    def watch(self) -> None:
        """Until a stop is requested: start again any child that ended."""
        while not self.stopping:
            for index, child in enumerate(self.children):
                if child is not None and child.poll() is not None and not self.stopping:
                    log.error(
                        "API process %d ended (status %s); starting it again", child.pid, child.returncode
                    )
                    time.sleep(1.0)
                    if not self.stopping:
                        self._spawn(index)
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopping = True
        live = [child for child in self.children if child is not None and child.poll() is None]
        for child in live:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + CHILD_GRACE
        for child in live:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("API process %d did not stop in %.0f s; killing it", child.pid, CHILD_GRACE)
                child.kill()
                child.wait()
