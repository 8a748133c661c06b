"""Whole servers inside the test process: the rule tests' fast home.

An :class:`InProcessServer` is the application `hyperplan serve` builds (the runtime over a real SQLite
file in the test's directory, the HTTP app with its limits, uvicorn with the header-deadline protocol),
with two parts swapped for ones a test can drive: the back end is :class:`FakeBackend` over a
:class:`FakeWorld` (nothing is started; the world says what processes do), and the service clock is the
manual one, starting at tests.harness.SERVER_START unless the test picks another instant. It serves real
HTTP on a loopback port from a thread of this process, so boto3, the `aws` CLI and our `hyperplan`
CLI talk to it exactly as to a real server; it has the interface of tests.harness.Server, so a test
moves here by changing its fixture.

What stays on real servers (tests.harness.Server): the seed's walkthroughs, the wire protocol, crashes,
restarts and kills, real node and job processes, the SDK, and the front door's socket limits.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from hyperplan.app import BOOTSTRAP_KEY_ENV, BOOTSTRAP_SECRET_ENV, AppConfig, Application
from hyperplan.backends.base import Backend
from hyperplan.backends.fake import FakeBackend, FakeWorld
from hyperplan.server.app import create_app
from hyperplan.server.header_deadline import front_door_protocol
from hyperplan.server.limits import ServerLimits
from hyperplan.wire.s3_responses import ENVIRONMENT as CHECK_RESPONSES
from tests.harness import ADMIN, SERVER_START, Server
from tests.postgres import default_database_url

LOGGERS = ("hyperplan", "uvicorn.error")  # what `hyperplan serve --log-level warning` writes to its log
STOP_TIMEOUT = 30.0  # seconds a stopping server may take before the test fails for it


def build_application(
    config: AppConfig, backend: Backend, limits: ServerLimits
) -> tuple[Application, Starlette]:
    """The application as `hyperplan serve` composes it, over the given back end (the one place tests
    compose it)."""
    application = Application(replace(config, backend=lambda _work_dir: backend))
    return application, create_app(application.open(), application, limits)


@contextmanager
def environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """os.environ with `values` set (None: removed), restored after: the settings a server reads from
    its environment (job graces, webhook retries, the exec output limit...), for one in-process server."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set(name, value)


def _set(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


class Templates:
    """Data directories as a first start leaves them, made once per fleet and start instant and copied
    for each new server. A first start on the demo fleet stores weeks of background bookings (seconds
    of work), the same every time: a copy gives each test the same real store at a fraction of it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[tuple[str, str], Path] = {}

    def fill(self, server: InProcessServer) -> None:
        """Copy the template of `server`'s first start into its (new) data directory."""
        key = (str(server.fleet), server.clock_start.isoformat() if server.clock_start else "")
        template = self._made.get(key)
        if template is None:
            template = self.root / f"t{len(self._made)}"
            first = InProcessServer(
                data_dir=template, fleet=server.fleet, clock_start=server.clock_start, world=FakeWorld()
            )
            first.start().stop()
            self._made[key] = template
        shutil.copytree(template, server.data_dir)


class _LogRecorder(logging.Handler):
    """The server's log, warnings and worse with their tracebacks, as `server.log()` reads it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@dataclass(eq=False)
class InProcessServer(Server):
    """A server in this process over the fake back end. `env` holds the environment settings it reads
    (they are in os.environ from start() to stop(), so two in-process servers with different settings
    must not run at once); `world` is the machine its back end runs on, and outlives a restart."""

    env: Mapping[str, str] = field(default_factory=dict)
    world: FakeWorld = field(default_factory=FakeWorld)
    time_scale: float = 60.0  # service seconds per real second, for the accelerated clock
    limits: ServerLimits = field(default_factory=ServerLimits)
    templates: Templates | None = None  # where a new manual-clock data directory may be copied from
    role: str = "all"  # "api": serves but never leads (one of several processes on one store)
    runtime: Application | None = None
    _uvicorn: uvicorn.Server | None = None
    _thread: threading.Thread | None = None
    _env_scope: Any = None
    _log: _LogRecorder = field(default_factory=_LogRecorder)

    @property
    def backend(self) -> FakeBackend:
        """The running server's back end: drive its tasks and nodes from the test."""
        assert self.runtime is not None, "the server is not running"
        backend = self.runtime.context.backend
        assert isinstance(backend, FakeBackend)
        return backend

    def start(self, timeout: float = 60) -> InProcessServer:
        assert self._thread is None, "already running"
        if self.database_url is None:
            self.database_url = default_database_url()  # None unless HYPERPLAN_TEST_STORE=postgres
        if self._copies_a_template():
            assert self.templates is not None
            self.templates.fill(self)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # S3's answers are checked against botocore's model before they are sent (wire/s3_responses.py).
        settings: dict[str, str | None] = {CHECK_RESPONSES: "1", **self.env}
        if self.bootstrap:
            settings |= {BOOTSTRAP_KEY_ENV: ADMIN.access_key, BOOTSTRAP_SECRET_ENV: ADMIN.secret_key}
        else:
            settings |= {BOOTSTRAP_KEY_ENV: None, BOOTSTRAP_SECRET_ENV: None}
        self._env_scope = environment(settings)
        self._env_scope.__enter__()
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self._log)
        try:
            self._start(timeout)
        except BaseException:
            self._release()
            raise
        return self

    def _copies_a_template(self) -> bool:
        new = not self.data_dir.exists() or not any(self.data_dir.iterdir())
        fresh = self.clock == "manual" and self.bootstrap and self.database_url is None
        return new and self.templates is not None and fresh

    def _start(self, timeout: float) -> None:
        config = AppConfig(
            data_dir=self.data_dir,
            fleet_path=self.fleet,
            clock=self.clock,
            time_scale=self.time_scale,
            clock_start=self.clock_start if self.clock != "wall" else None,
            isolation="none",  # CI runs as root, where the default would be mode users
            work_dir=self.work_dir,
            database_url=self.database_url,
            role=self.role,
        )
        self.runtime, app = build_application(config, FakeBackend(self.world), self.limits)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self.port = int(listener.getsockname()[1])
        self._uvicorn = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                timeout_graceful_shutdown=10,
                http=front_door_protocol(self.limits),
                proxy_headers=False,  # X-Forwarded-For counts from --trusted-proxy alone (none here)
            )
        )
        server = self._uvicorn
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [listener]}, name=f"inprocess-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                listener.close()
                raise RuntimeError("the in-process server did not start (its lifespan failed?)")
            time.sleep(0.01)

    def stop(self) -> int:
        """A graceful stop, as on SIGTERM: requests in progress finish, then the runtime stops."""
        assert self._uvicorn is not None and self._thread is not None and self.runtime is not None
        self.runtime.request_stop()  # as the real server's signal handler does
        self._uvicorn.should_exit = True
        self._thread.join(STOP_TIMEOUT)
        alive = self._thread.is_alive()
        self._release()
        if alive:
            raise RuntimeError(f"the in-process server did not stop within {STOP_TIMEOUT}s")
        return 0

    def _release(self) -> None:
        self._uvicorn = None
        self._thread = None
        self.runtime = None
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self._log)
        if self._env_scope is not None:
            scope, self._env_scope = self._env_scope, None
            scope.__exit__(None, None, None)

    def kill(self) -> None:
        raise NotImplementedError("a crash needs a real process: use tests.harness.Server")

    def close(self) -> None:
        if self._thread is not None:
            self.stop()

    def restart(self) -> InProcessServer:
        """A clean restart over the same data directory and the same world (the processes go on)."""
        if self._thread is not None:
            self.stop()
        return self.start()

    def log(self) -> str:
        return "\n".join(self._log.lines)


__all__ = ["SERVER_START", "InProcessServer", "Templates", "build_application", "environment"]
