"""The endpoint relay: a port on a pod's loopback that leads to the hyperplan endpoint on the host.

A training job's pod is created with ``--network none``: its containers share one network namespace
with only a loopback interface, so they reach neither other pods nor the host. They must still reach the
endpoint (S3, Logs, the API), as SageMaker jobs reach AWS's. The node agent (root, on the host) starts
one relay per container::

    python3 -I -S endpoint_relay.py --netns /proc/PID/ns/net --listen 127.0.0.1:PORT
                                    [--target 127.0.0.1:PORT] [--source ADDRESS]
                                    [--max-connections 64] [--idle-timeout 900]

(:func:`relay_argv` builds that line; ``python3 -m hyperplan.backends.endpoint_relay`` works too, but
imports the ``hyperplan.backends`` package first and needs the interpreter's site-packages.) The relay
enters the namespace, makes its listening socket there, goes back to the host's namespace, and for every
connection it accepts opens one to the target on the host and copies bytes both ways. A socket keeps
the namespace it was made in: one process listens in the pod and connects on the host.

Standard library only, and importing nothing of hyperplan, as ``timedlog.py``: it runs as root, started
with a clean environment and ``-I -S``, so nothing of the tenant's reaches it.

What the starter sees. Standard output gets ``ready`` and a newline (:data:`READY`) once the socket
listens in the pod, and nothing else, ever: the starter waits for that line. A refusal at start (the
namespace is not there or not a network namespace, the port is taken by a socket without
``SO_REUSEPORT`` or by another user's, an address that cannot be used) is one line on standard error
and exit status 1 (2 for a malformed command line), before ``ready``. Afterwards standard error gets a
line when the target refuses or cannot be reached (that client's connection is closed, the relay carries
on; at most one such line per :data:`COMPLAINT_INTERVAL`, counting those held back). SIGTERM or SIGINT
closes the listening socket and every connection and exits with status 0. The relay does not notice
that the pod's processes are gone: its starter ends it.

Sharing a port. The socket is bound with ``SO_REUSEPORT``, so the relays of a job's several containers
in one pod listen on the same port, each for its own container's lifetime; the kernel spreads new
connections over the listeners, and those of a relay that ends go to the others (a connection waiting
in the ending relay's accept queue is reset). The kernel admits to such a group only sockets of the same
effective user: root on the host, never a tenant's process (root in a user namespace is another user on
the host). A tenant's program that takes the port first, with or without the option, makes the relay
refuse to start: the agent starts the relay before the container's program.

Bounds. At most ``--max-connections`` connections at once: beyond it the relay stops accepting, and new
ones wait in the kernel's accept queue (:data:`BACKLOG`, capped by ``net.core.somaxconn``) until one
ends; past that the kernel drops their handshakes and the clients retry or give up. A connection with no
byte moved either way for ``--idle-timeout`` seconds is closed; one whose target has not answered the
connection within :data:`CONNECT_TIMEOUT` (or the idle timeout, if shorter) too. Each direction of a
connection holds at most :data:`BUFFER_BYTES` that its receiver has not taken yet: a slow reader slows
its writer down, nothing piles up.

``--source ADDRESS``: the address the target sees connections come from (another of the host's
loopback addresses, 127.0.0.0/8, for instance), so that a server counting connections per client address
can tell pods apart; by default the kernel chooses (127.0.0.1 towards 127.0.0.1).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import ipaddress
import os
import selectors
import signal
import socket
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

READY = b"ready\n"
"""All the relay ever writes to its standard output: once, when it listens."""

MAX_CONNECTIONS = 64
IDLE_TIMEOUT = 15 * 60.0
CONNECT_TIMEOUT = 10.0
"""How long the target may take to accept a connection (loopback answers at once, or refuses)."""
BUFFER_BYTES = 64 * 1024
"""The most bytes one direction of one connection holds for a receiver that has not taken them."""
BACKLOG = 128
LONGEST_WAIT = 3600.0
COMPLAINT_INTERVAL = 10.0
"""At most one line on standard error per this many seconds about connections the target refused: a
tenant may open connections as fast as it likes, and the relay's standard error is a file on the host."""

STARTUP_REFUSED = 1

CLONE_NEWNET = 0x40000000  # <sched.h>: setns(2) checks that the descriptor is a network namespace

Address = tuple[str, int]


# --- the command line -------------------------------------------------------------------------------


def relay_argv(
    python: str,
    netns: str | os.PathLike[str],
    listen: Address,
    target: Address,
    *,
    source: str | None = None,
    max_connections: int = MAX_CONNECTIONS,
    idle_timeout: float = IDLE_TIMEOUT,
) -> list[str]:
    """The command that starts a relay with ``python``: this file run by path, isolated (``-I -S``), so
    that it imports nothing but the standard library. Start it as root, in a clean environment."""
    argv = [python, "-I", "-S", os.path.abspath(__file__), "--netns", os.fspath(netns)]
    argv += ["--listen", format_address(listen), "--target", format_address(target)]
    if source is not None:
        argv += ["--source", source]
    argv += ["--max-connections", str(max_connections), "--idle-timeout", repr(float(idle_timeout))]
    return argv


def format_address(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> Address:
    """``HOST:PORT``, the host a numeric IP address (``[V6]:PORT`` for IPv6): the relay resolves no
    name, since a resolver would read the host's files or reach a network for the pod's sake."""
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port from 1 to 65535")
    return _numeric_host(host), int(port)


def _numeric_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(f"{host!r} is not a numeric IP address") from None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# --- the listening socket, made in the pod's namespace ----------------------------------------------


class StartupError(Exception):
    """Why the relay cannot start: said on standard error, then exit status 1."""


def _setns(fd: int, nstype: int) -> None:
    """setns(2): os.setns from Python 3.12, libc's through ctypes before."""
    native = getattr(os, "setns", None)
    if native is not None:
        native(fd, nstype)
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def listen_in_namespace(netns: str, listen: Address, backlog: int = BACKLOG) -> socket.socket:
    """A non-blocking socket listening on ``listen`` inside the network namespace ``netns`` (a path such
    as ``/proc/PID/ns/net``); the calling thread is back in its own namespace when this returns or
    raises. Call it before starting any thread: a namespace is entered by one thread, and the relay's
    connections to the target must be made in the host's."""
    home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            there = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as error:
            raise StartupError(f"network namespace {netns}: {error.strerror}") from None
        try:
            try:
                _setns(there, CLONE_NEWNET)
            except OSError as error:
                raise StartupError(f"cannot enter the network namespace {netns}: {error.strerror}") from None
            try:
                return _listener(listen, backlog, netns)
            finally:
                try:
                    _setns(home, CLONE_NEWNET)
                except OSError as error:  # never connect to the target from the pod's namespace
                    raise StartupError(f"cannot return to the host's network namespace: {error}") from None
        finally:
            os.close(there)
    finally:
        os.close(home)


def _listener(listen: Address, backlog: int, netns: str) -> socket.socket:
    sock = socket.socket(_family(listen[0]), socket.SOCK_STREAM)
    try:
        # REUSEADDR: a port whose last connections linger in TIME_WAIT can be listened on again.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(listen)
        sock.listen(backlog)
    except OSError as error:
        sock.close()
        why = error.strerror or str(error)
        if error.errno == errno.EADDRINUSE:
            why += " (a socket without SO_REUSEPORT, or another user's, holds it)"
        raise StartupError(f"cannot listen on {format_address(listen)} in {netns}: {why}") from None
    sock.setblocking(False)
    return sock


def check_source(source: str, target: Address) -> None:
    """StartupError unless connections can come from ``source`` (an address of the host, of the
    target's family)."""
    if _family(source) != _family(target[0]):
        raise StartupError(f"--source {source} and --target {format_address(target)}: not one IP version")
    with socket.socket(_family(source), socket.SOCK_STREAM) as probe:
        try:
            probe.bind((source, 0))
        except OSError as error:
            raise StartupError(f"cannot send from {source}: {error.strerror}") from None


# --- the connections ----------------------------------------------------------------------------------


class Pipe:
    """One direction of a connection: what is read from ``source`` waits here, at most
    :data:`BUFFER_BYTES`, until ``sink`` takes it; the source's end becomes the sink's end of input
    (``shutdown(SHUT_WR)``) once everything before it is passed on, so half-closed connections work."""

    def __init__(self, source: socket.socket, sink: socket.socket) -> None:
        self.source = source
        self.sink = sink
        self.buffer = bytearray()
        self.source_ended = False
        self.sink_ended = False

    def wants_read(self) -> bool:
        return not self.source_ended and len(self.buffer) < BUFFER_BYTES

    def wants_write(self) -> bool:
        return bool(self.buffer)

    def done(self) -> bool:
        return self.sink_ended

    def read(self) -> int:
        """Bytes moved (BlockingIOError when there were none to read after all)."""
        data = self.source.recv(BUFFER_BYTES - len(self.buffer))
        if not data:
            self.source_ended = True
        self.buffer += data
        self._end_when_drained()
        return len(data)

    def write(self) -> int:
        sent = self.sink.send(self.buffer, socket.MSG_NOSIGNAL)
        del self.buffer[:sent]
        self._end_when_drained()
        return sent

    def _end_when_drained(self) -> None:
        if self.source_ended and not self.buffer and not self.sink_ended:
            self.sink_ended = True
            with contextlib.suppress(OSError):  # the sink already gone: nothing more to tell it
                self.sink.shutdown(socket.SHUT_WR)


class Connection:
    """A client's connection accepted in the pod and its own to the target on the host."""

    def __init__(self, client: socket.socket, upstream: socket.socket, now: float) -> None:
        self.client = client
        self.upstream = upstream
        self.connecting = True
        self.outbound = Pipe(client, upstream)
        self.inbound = Pipe(upstream, client)
        self.last_activity = now

    def events_for(self, sock: socket.socket) -> int:
        if self.connecting:  # the client is not read before there is somewhere to put its bytes
            return selectors.EVENT_WRITE if sock is self.upstream else 0
        reading, writing = self.pipes_of(sock)
        read = selectors.EVENT_READ if reading.wants_read() else 0
        return read | (selectors.EVENT_WRITE if writing.wants_write() else 0)

    def pipes_of(self, sock: socket.socket) -> tuple[Pipe, Pipe]:
        """The pipe that reads ``sock`` and the pipe that writes to it."""
        if sock is self.client:
            return self.outbound, self.inbound
        return self.inbound, self.outbound

    def done(self) -> bool:
        return not self.connecting and self.outbound.done() and self.inbound.done()

    def close(self) -> None:
        self.client.close()
        self.upstream.close()


class Complaints:
    """Lines on standard error, at most one per ``interval`` seconds; those held back are counted in
    the next one."""

    def __init__(self, interval: float = COMPLAINT_INTERVAL) -> None:
        self.interval = interval
        self.last: float | None = None
        self.held = 0

    def say(self, message: str, now: float) -> None:
        if self.last is not None and now - self.last < self.interval:
            self.held += 1
            return
        if self.held:
            message += f" ({self.held} more since the last such line)"
        self.last, self.held = now, 0
        say(message)


def say(message: str) -> None:
    with contextlib.suppress(OSError):  # nobody reads our standard error: the relay carries on
        os.write(2, f"endpoint relay: {message}\n".encode(errors="replace"))


# --- the relay ----------------------------------------------------------------------------------------


class Relay:
    """One listening socket's connections, each copied to and from the target, on one thread."""

    _LISTENER = "listener"
    _WAKEUP = "wakeup"

    def __init__(
        self,
        listener: socket.socket,
        target: Address,
        *,
        source: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        self.listener = listener
        self.target = target
        self.source = source
        self.max_connections = max_connections
        self.idle_timeout = idle_timeout
        self.connect_timeout = min(CONNECT_TIMEOUT, idle_timeout)
        self.connections: set[Connection] = set()
        self.selector = selectors.DefaultSelector()
        self.complaints = Complaints()
        self.stopping = False
        self._wakeup_read, self._wakeup_write = socket.socketpair()
        for end in (self._wakeup_read, self._wakeup_write):
            end.setblocking(False)
        self.selector.register(self._wakeup_read, selectors.EVENT_READ, self._WAKEUP)
        self.listening = False

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT end :meth:`serve`; the wakeup descriptor makes a waiting select return."""
        signal.set_wakeup_fd(self._wakeup_write.fileno(), warn_on_full_buffer=False)
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._stop)

    def _stop(self, _number: int, _frame: object) -> None:
        self.stopping = True

    def serve(self) -> None:
        """Relay until stopped, then close everything."""
        try:
            while not self.stopping:
                now = time.monotonic()
                self._close_expired(now)
                self._accept_while_room()
                for key, events in self.selector.select(self._next_expiry(now)):
                    self._on_ready(key.data, key.fileobj, events)  # type: ignore[arg-type]
        finally:
            self.close()

    def close(self) -> None:
        for connection in list(self.connections):
            self._drop(connection)
        self.listener.close()
        with contextlib.suppress(ValueError):  # (not the main thread: no wakeup descriptor was set)
            signal.set_wakeup_fd(-1)
        self.selector.close()
        self._wakeup_read.close()
        self._wakeup_write.close()

    # -- the loop's steps

    def _accept_while_room(self) -> None:
        """Listen while there is room for a connection more; at the bound, new clients wait in the
        kernel's accept queue."""
        room = len(self.connections) < self.max_connections
        if room and not self.listening:
            self.selector.register(self.listener, selectors.EVENT_READ, self._LISTENER)
        elif not room and self.listening:
            self.selector.unregister(self.listener)
        self.listening = room

    def _next_expiry(self, now: float) -> float | None:
        """How long the selector may wait: until the first connection expires (at most an hour, within
        what epoll takes however long the idle timeout is), or for ever without connections."""
        deadlines = [self._deadline(connection) for connection in self.connections]
        return min(max(0.0, min(deadlines) - now), LONGEST_WAIT) if deadlines else None

    def _deadline(self, connection: Connection) -> float:
        limit = self.connect_timeout if connection.connecting else self.idle_timeout
        return connection.last_activity + limit

    def _close_expired(self, now: float) -> None:
        for connection in list(self.connections):
            if now >= self._deadline(connection):
                if connection.connecting:
                    self.complaints.say(f"{format_address(self.target)} did not answer in time", now)
                self._drop(connection)

    def _on_ready(self, data: object, sock: socket.socket, events: int) -> None:
        if data == self._WAKEUP:
            with contextlib.suppress(BlockingIOError):
                while self._wakeup_read.recv(64):
                    pass
        elif data == self._LISTENER:
            self._accept()
        elif isinstance(data, Connection):
            self._move(data, sock, events)

    def _accept(self) -> None:
        while len(self.connections) < self.max_connections:
            try:
                client, _ = self.listener.accept()
            except (BlockingIOError, ConnectionAbortedError):
                return
            except OSError as error:  # out of descriptors, say: the client waits in the queue
                self.complaints.say(f"cannot accept a connection: {error.strerror}", time.monotonic())
                return
            client.setblocking(False)
            self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        now = time.monotonic()
        upstream = socket.socket(_family(self.target[0]), socket.SOCK_STREAM)
        upstream.setblocking(False)
        try:
            if self.source is not None:
                upstream.bind((self.source, 0))
            code = upstream.connect_ex(self.target)
        except OSError as error:
            code = error.errno or 0
        connection = Connection(client, upstream, now)
        if code not in (0, errno.EINPROGRESS):
            self._refused(connection, code, now)
            return
        self.connections.add(connection)
        self._watch(connection)

    def _move(self, connection: Connection, sock: socket.socket, events: int) -> None:
        now = time.monotonic()
        try:
            if connection.connecting:
                code = connection.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    self._refused(connection, code, now)
                    return
                connection.connecting = False
                connection.last_activity = now
            else:
                reading, writing = connection.pipes_of(sock)
                moved = 0
                if events & selectors.EVENT_READ and reading.wants_read():
                    moved += reading.read()
                if events & selectors.EVENT_WRITE and writing.wants_write():
                    moved += writing.write()
                if moved or events & selectors.EVENT_READ:  # an end of input read counts too
                    connection.last_activity = now
        except BlockingIOError:
            pass  # woken for nothing after all
        except OSError:  # reset, or gone: the other side is closed with it
            self._drop(connection)
            return
        if connection.done():
            self._drop(connection)
        else:
            self._watch(connection)

    def _refused(self, connection: Connection, code: int, now: float) -> None:
        self.complaints.say(f"cannot connect to {format_address(self.target)}: {os.strerror(code)}", now)
        self._drop(connection)

    # -- the selector's registrations

    def _watch(self, connection: Connection) -> None:
        for sock in (connection.client, connection.upstream):
            self._want(sock, connection.events_for(sock), connection)

    def _want(self, sock: socket.socket, events: int, connection: Connection) -> None:
        try:
            key = self.selector.get_key(sock)
        except KeyError:
            if events:
                self.selector.register(sock, events, connection)
            return
        if not events:
            self.selector.unregister(sock)
        elif key.events != events:
            self.selector.modify(sock, events, connection)

    def _drop(self, connection: Connection) -> None:
        for sock in (connection.client, connection.upstream):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
        connection.close()
        self.connections.discard(connection)


# --- the program ----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="endpoint_relay", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    parser.add_argument("--netns", required=True, help="the pod's network namespace: /proc/PID/ns/net")
    parser.add_argument("--listen", required=True, type=_address, help="HOST:PORT in the pod")
    parser.add_argument(
        "--target", type=_address, default=("127.0.0.1", 8080), help="HOST:PORT on the host (127.0.0.1:8080)"
    )
    parser.add_argument("--source", type=_host, help="the host address connections to the target come from")
    parser.add_argument("--max-connections", type=_positive_int, default=MAX_CONNECTIONS, help="at once (64)")
    parser.add_argument("--idle-timeout", type=_positive_float, default=IDLE_TIMEOUT, help="seconds (900)")
    return parser


def _address(text: str) -> Address:
    try:
        return parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _host(text: str) -> str:
    try:
        return _numeric_host(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def main(args: Sequence[str] | None = None) -> NoReturn:
    options = _parser().parse_args(args)
    try:
        if options.source is not None:
            check_source(options.source, options.target)
        listener = listen_in_namespace(options.netns, options.listen)
    except StartupError as error:
        say(str(error))
        sys.exit(STARTUP_REFUSED)
    relay = Relay(
        listener,
        options.target,
        source=options.source,
        max_connections=options.max_connections,
        idle_timeout=options.idle_timeout,
    )
    relay.stop_on_signals()  # before "ready": a starter may stop the relay as soon as it has read it
    with contextlib.suppress(OSError):  # a starter that stopped listening still ends the relay itself
        os.write(1, READY)
    relay.serve()
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
