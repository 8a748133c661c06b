"""Serving the app under uvicorn, with a stop signal that reaches the lifecycle loop at once.

uvicorn's signal handler only sets a flag. Its main loop reads the flag every 0.1 s; its shutdown then
waits (up to the graceful timeout) for the requests in progress and only then runs the lifespan's
shutdown, which stops the runtime. Two kinds of work never see that flag:

- a clock move that is running a long catch-up in the threadpool: anyio's worker threads are not
  daemons, so the process cannot exit before the move returns, whatever uvicorn cancels;
- the catch-up of missed events in the application's ``start()``, which runs inside the lifespan's startup,
  before uvicorn looks at the flag at all.

So the handler here also asks the lifecycle loop to stop (``request_stop``, from the composition root).
Both check between two events: the event in progress commits (with those of its batch before it), the
rest stay pending, and the server stops within one event's time.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.config import LOG_LEVELS, STARTUP_FAILURE


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, request_stop: Callable[[], None]) -> None:
        super().__init__(config)
        self.request_stop = request_stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.request_stop()  # safe here: sets flags and takes no lock
        super().handle_exit(sig, frame)


SWITCH_INTERVAL = 0.001
"""Seconds a thread may keep the GIL once another asks for it (Python's default: 0.005). A request takes
the GIL again after each wait for the store; behind a thread that computes (the event loop parsing and
signing, a pool thread checking a purchase) it waited up to the whole interval each time. Two servers on
one PostgreSQL, buy only, alternated pairs with the machine slow: more purchases per second in 8 of 9
pairs (one by 1/s) and less server CPU per purchase in 7 of 9 (by 3% and 18% on average over the two
sets of pairs)."""

COLLECTOR_THRESHOLDS = (50_000, 20, 10)
"""The cyclic collector's thresholds in the serving process (Python's default: 700, 10, 10). A young
collection comes every `first` net new objects; objects alive at two of them move to the oldest
generation, and once those newcomers reach a quarter of it, a full collection walks the whole heap
with the GIL held, stopping every request in progress. Under a purchase load, a request's own objects
(its session, rows, answer) are alive for a few milliseconds: at every 700 objects many of them were
caught alive and promoted, which brought a full collection every second or two, 80-200 ms each on the
bench's 1x store (a gc callback in the server, 8 clients buying on PostgreSQL: two in each 480-purchase
phase). At 50,000 a young collection comes about 70 times less often, finds a request's objects
gone, and takes 10-40 ms (most near 12); the same phases ran no full collection. Four alternated rounds
of that phase gave a purchase p99 of 132, 152, 127 and 126 ms against 167, 163, 160 and 199 ms with
the default (the host slow); the lifecycle loop's lag was no worse (10x store, two runs each). Not
frozen (`gc.freeze`): that was tried, and the lag rose with it (git history)."""


def serve(
    request_stop: Callable[[], None],
    app: Starlette,
    *,
    listen_fd: int | None = None,
    **options: Any,
) -> None:
    """``uvicorn.run(app, **options)`` for one process without reload; the stop signal also calls
    `request_stop`, which must be safe in a signal handler. `listen_fd`: accept on this inherited
    listening socket (serve --workers) instead of binding host and port."""
    if _above_info(options.get("log_level")):
        # Its lines would be dropped anyway; without a handler uvicorn does not even compute their parts.
        options.setdefault("access_log", False)
    # The protocol (header_deadline.front_door_protocol) reads X-Forwarded-For from --trusted-proxy alone.
    # uvicorn's own reading of it trusts loopback unless told otherwise, so any local process (a tenant's
    # job on a local node, say) could name any client, for the connection caps and the audit trail alike.
    options.setdefault("proxy_headers", False)
    sys.setswitchinterval(SWITCH_INTERVAL)
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    server = _Server(uvicorn.Config(app, **options), request_stop)
    # The socket's own family (uvicorn's `fd` option would take any descriptor for a unix socket).
    sockets = [socket.socket(fileno=listen_fd)] if listen_fd is not None else None
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn re-raises it once it has shut down
        server.run(sockets=sockets)
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # the port was taken, or the startup failed: as uvicorn.run exits


def _above_info(level: object) -> bool:
    """Whether uvicorn's access log (at info) is off at this log level."""
    if isinstance(level, str):
        return LOG_LEVELS.get(level.lower(), logging.INFO) > logging.INFO
    return isinstance(level, int) and level > logging.INFO
