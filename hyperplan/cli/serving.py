"""`hyperplan serve` once its options passed the early checks (hyperplan/cli/serve_options.py): open the
store, then serve alone, as one API process of `--workers N`, or as their parent.

Imported by `serve` only, after those checks: importing it loads the server's runtime, which every other
command starts without.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from hyperplan.app import AppConfig, Application, default_data_dir
from hyperplan.backends import disks
from hyperplan.backends.layout import MARK_VARIABLE
from hyperplan.cli.common import console, failure_line
from hyperplan.cli.serve_options import FrontDoor, ServeOptions, api_process_args, refusals_exit
from hyperplan.core.runtime_choice import NOT_CONTAINED
from hyperplan.server.app import create_app
from hyperplan.server.serving import serve as serve_app
from hyperplan.services.accounts.os_users import NOT_ISOLATED

if TYPE_CHECKING:
    from datetime import datetime

    from hyperplan.services.runtime.context import ServiceContext

STOPPED = "hyperplan stopped; every acknowledged change is on disk."


def run(options: ServeOptions, front: FrontDoor) -> None:
    """Run the server until SIGTERM or Ctrl-C."""
    _set_up_process(options)
    directory = (options.data_dir or default_data_dir()).expanduser()
    # Every process this server starts inherits the mark (see hyperplan.backends.layout.MARK_VARIABLE).
    os.environ.setdefault(MARK_VARIABLE, f"hp-{secrets.token_hex(8)}")
    application, context, bootstrapped = _open(options, directory, front.starts_at)
    if options.role == "api":
        _serve_api_process(options, front, application, context)
        return
    _announce(options, application, context, directory, bootstrapped)
    if options.workers > 1:
        _supervise(application, options, api_process_args(options, directory))
        console.print(STOPPED)
        return
    _serve_alone(options, front, application, context)


def _set_up_process(options: ServeOptions) -> None:
    """Logging, the last checks of the options, the file mode; an API process dies with its parent."""
    logging.basicConfig(
        level=options.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if options.metrics_listen is not None:
        _check_metrics_listen(options.metrics_listen)
    os.umask(0o077)  # the server's own files (store, keys, records) are its user's alone
    if options.role not in ("all", "api"):
        raise typer.BadParameter(f"--role must be all or api, not {options.role!r}")
    if options.role == "api":
        from hyperplan.server.processes import die_with_parent

        die_with_parent()


def _check_metrics_listen(listen: str) -> None:
    """--metrics-listen's HOST:PORT, refused as a bad option before the store opens."""
    from hyperplan.metrics import parse_listen

    try:
        parse_listen(listen)
    except ValueError as exc:
        console.print(failure_line("ValidationException", exc))
        raise typer.Exit(2) from None


def _open(
    options: ServeOptions, directory: Path, starts_at: datetime | None
) -> tuple[Application, ServiceContext, bool]:
    """The application, opened (the data directory, the fleet file, the migration, the clock) and
    bootstrapped; with whether this start created the administrator."""
    with refusals_exit():
        application = Application(_app_config(options, directory, starts_at))
        context = application.open()
        bootstrapped = application.bootstrap()
    return application, context, bootstrapped


def _app_config(options: ServeOptions, directory: Path, starts_at: datetime | None) -> AppConfig:
    return AppConfig(
        data_dir=directory,
        fleet_path=options.fleet,
        clock=options.clock_kind,
        time_scale=options.time_scale,
        clock_start=starts_at,
        key_file=options.key_file.expanduser() if options.key_file is not None else None,
        database_url=options.database_url,
        isolation=options.isolation,
        work_dir=options.work_dir,
        runtime=options.runtime,
        endpoint=_endpoint(options.host, options.port),
        # The parent of `--workers N` listens for every process; an API process never does.
        metrics_listen=options.metrics_listen if options.role != "api" else None,
        role="background" if options.workers > 1 else options.role,
        leader_lease=options.leader_lease,
    )


def _endpoint(host: str, port: int) -> str:
    """Where this server is reached from the machine itself: a wildcard address is reached on loopback."""
    reached = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return f"[{reached}]:{port}" if ":" in reached else f"{reached}:{port}"


def _serve_api_process(
    options: ServeOptions, front: FrontDoor, application: Application, context: ServiceContext
) -> None:
    """One API process of `serve --workers N`: it answers on its parent's socket once the parent opens
    the gate (the background work caught up)."""
    from hyperplan.server.header_deadline import front_door_protocol
    from hyperplan.server.processes import wait_for_the_gate

    wait_for_the_gate()
    serve_app(
        application.request_stop,
        create_app(context, application, front.limits),
        listen_fd=options.listen_fd,
        host=options.host,
        port=options.port,
        log_level=options.log_level,
        timeout_graceful_shutdown=10,
        http=front_door_protocol(front.limits, front.proxies),
    )


def _announce(
    options: ServeOptions,
    application: Application,
    context: ServiceContext,
    directory: Path,
    bootstrapped: bool,
) -> None:
    """What the operator is told at the start: isolation or containers off, the administrator's keys,
    where to call."""
    credentials = application.credentials_path
    host, port = options.host, options.port
    if not context.settings.isolated:
        print(f"WARNING: {NOT_ISOLATED}", file=sys.stderr, flush=True)
    if not context.settings.contained:
        print(f"WARNING: {NOT_CONTAINED}", file=sys.stderr, flush=True)
    elif context.settings.disk_problem is not None:
        print(f"WARNING: {disks.NOT_BOUNDED}: {context.settings.disk_problem}", file=sys.stderr, flush=True)
    if bootstrapped:
        console.print(f"Created the administrator account; its keys are in {credentials}", markup=False)
    console.print(
        f"hyperplan on http://{host}:{port} (region {context.region}, {context.clock.kind} clock, "
        f"data in {directory}, work in {context.work_dir}, isolation {context.settings.isolation}, "
        f"runtime {context.settings.runtime})\n"
        f"  aws sagemaker list-training-plans --endpoint-url http://{host}:{port} "
        f"(credentials: AWS_SHARED_CREDENTIALS_FILE={credentials} AWS_PROFILE=hyperplan)",
        markup=False,  # paths are text: a directory named "[x]" is printed as it is
    )


def _supervise(application: Application, options: ServeOptions, child_args: list[str]) -> None:
    """This process leads (the background work) and supervises `--workers` API processes on one socket."""
    from hyperplan.server.processes import Supervisor, listening_socket

    host, port = options.host, options.port

    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        console.print(failure_line(f"cannot listen on {host}:{port}", exc.strerror))
        application.stop()
        raise typer.Exit(1) from None
    supervisor = Supervisor(child_args, options.workers, sock.fileno())

    def stop(*_: object) -> None:
        supervisor.request_stop()
        application.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    gate = supervisor.start()  # the API processes load meanwhile, and wait
    try:
        application.start()  # missed events run before any API process answers
        supervisor.open_the_gate(gate)
        if not supervisor.stopping:
            supervisor.watch()
    finally:
        supervisor.stop()
        sock.close()
        application.stop()


def _serve_alone(
    options: ServeOptions, front: FrontDoor, application: Application, context: ServiceContext
) -> None:
    """Everything in this process: the API and the background work."""
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal under the handler that was in
    # place before it started; this one makes that a clean exit, as service managers expect.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        from hyperplan.server.header_deadline import front_door_protocol

        serve_app(
            application.request_stop,
            create_app(context, application, front.limits),
            host=options.host,
            port=options.port,
            log_level=options.log_level,
            timeout_graceful_shutdown=10,
            http=front_door_protocol(front.limits, front.proxies),
        )
    finally:
        console.print(STOPPED)
