"""Serving the app under uvicorn, with a stop signal that reaches the lifecycle loop at once.

uvicorn's signal handler only sets a flag. Its main loop reads the flag every 0.1 s; its shutdown then
waits (up to the graceful timeout) for the requests in progress and only then runs the lifespan's
shutdown, which stops the runtime. Two kinds of work never see that flag:

- a clock move that is running a long catch-up in the threadpool: anyio's worker threads are not
  daemons, so the process cannot exit before the move returns, whatever uvicorn cancels;
- the catch-up of missed events in ``Runtime.start()``, which runs inside the lifespan's startup,
  before uvicorn looks at the flag at all.

So the handler here also asks the scheduler to stop. Both check between two events: the event in
progress commits, the rest stay pending, and the server stops within one event's time.
"""

from __future__ import annotations

import contextlib
import sys
from types import FrameType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.config import STARTUP_FAILURE

from hyperplan.runtime import Runtime


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, runtime: Runtime) -> None:
        super().__init__(config)
        self.runtime = runtime

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.runtime.scheduler.request_stop()  # safe here: sets a flag and takes no lock
        super().handle_exit(sig, frame)


def serve(runtime: Runtime, app: Starlette, **options: Any) -> None:
    """``uvicorn.run(app, **options)`` for one process without reload, with the stop signal above."""
    server = _Server(uvicorn.Config(app, **options), runtime)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: uvicorn re-raises it once it has shut down
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # the port was taken, or the startup failed: as uvicorn.run exits
