"""The `hyperplan` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hyperplan.cli.common import console
from hyperplan.cli.lazy import Later, Settings, lazy_root
from hyperplan.cli.options import (
    PLAIN_HELP,
    ClientCommand,
    ClientOptions,
    DataDirOpt,
    EndpointOpt,
    JsonOpt,
    ProfileOpt,
)
from hyperplan.server.limits import ServerLimits

if TYPE_CHECKING:
    from datetime import datetime

# The subcommands but `serve` (below), each imported and built only when used (hyperplan/cli/lazy.py):
# a command line runs one of them.
COMMANDS = {
    "usage": Later("hyperplan.cli.ops", "usage", cls=ClientCommand),
    "backup": Later("hyperplan.cli.backup", "backup"),
    "restore": Later("hyperplan.cli.backup", "restore"),
    "simulate": Later("hyperplan.cli.simulate", "simulate"),
}
GROUPS = {
    "accounts": Later("hyperplan.cli.accounts", "app"),
    "clock": Later("hyperplan.cli.clock", "app"),
    "fleet": Later("hyperplan.cli.fleet", "app"),
    "plans": Later("hyperplan.cli.plans", "app"),
    "invoices": Later("hyperplan.cli.invoices", "app"),
    "clusters": Later("hyperplan.cli.clusters", "app"),
    "jobs": Later("hyperplan.cli.jobs", "app"),
    "webhooks": Later("hyperplan.cli.webhooks", "app"),
    "buckets": Later("hyperplan.cli.buckets", "app"),
    "users": Later("hyperplan.cli.users", "app"),
    "keys": Later("hyperplan.cli.keys", "app"),
    "audit": Later("hyperplan.cli.ops", "audit_app"),
    "admin": Later("hyperplan.cli.ops", "admin_app"),
}
HELP_ORDER = [*COMMANDS, "serve", *GROUPS]  # Typer's: the commands as registered, then the groups
_ROOT = Settings(pretty_exceptions_short=True, rich_markup_mode=PLAIN_HELP, suggest_commands=True)

app = typer.Typer(
    help="hyperplan: bookable accelerator capacity over the SageMaker training-plan API. "
    "Client options go before the command or after it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_short=_ROOT.pretty_exceptions_short,
    rich_markup_mode=_ROOT.rich_markup_mode,
    suggest_commands=_ROOT.suggest_commands,
    cls=lazy_root(_ROOT, {**COMMANDS, **GROUPS}, HELP_ORDER),
)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        console.print(f"hyperplan {version('hyperplan')}", highlight=False)
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
    version: Annotated[
        bool, typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version.")
    ] = False,
) -> None:
    """The client options, before the command (`hyperplan --json plans list`); after it works too."""
    ctx.obj = ClientOptions(endpoint_url, profile, data_dir, as_json)
    if ctx.invoked_subcommand in ("serve", "backup", "restore", "simulate") and ctx.obj != ClientOptions():
        # These have options of their own (--data-dir among them); the client's would be silently ignored.
        raise typer.BadParameter(
            f"client options go with client commands; give {ctx.invoked_subcommand} its own after it"
        )


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Data directory (default: $HYPERPLAN_DATA_DIR or ~/.local/share/hyperplan)."),
    ] = None,
    fleet: Annotated[
        Path | None, typer.Option(help="Fleet file (TOML); default: the embedded demo fleet.")
    ] = None,
    clock_kind: Annotated[str, typer.Option("--clock", help="wall, manual or accelerated.")] = "wall",
    time_scale: Annotated[
        float, typer.Option(help="Service seconds per real second (accelerated clock).")
    ] = 60.0,
    clock_start: Annotated[
        str | None,
        typer.Option(
            help="First instant of the manual or accelerated clock, ISO 8601 with a zone "
            "(e.g. 2026-12-31T23:50:00Z); used only by a data directory that has no service time yet."
        ),
    ] = None,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="HYPERPLAN_MAX_BODY_BYTES",
            help="Largest request body, in bytes; a larger one is answered 413 before it is read.",
        ),
    ] = ServerLimits.max_body_bytes,
    header_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            envvar="HYPERPLAN_HEADER_TIMEOUT",
            help="Seconds a client has to send a request's headers; then the connection is closed.",
        ),
    ] = ServerLimits.header_timeout,
    body_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            envvar="HYPERPLAN_BODY_TIMEOUT",
            help="Seconds a client has to send a request's body after its headers; then 408 and close.",
        ),
    ] = ServerLimits.body_timeout,
    max_connections: Annotated[
        int,
        typer.Option(
            min=2,
            envvar="HYPERPLAN_MAX_CONNECTIONS",
            help="Open connections beyond which a new request is answered 503 at once.",
        ),
    ] = ServerLimits.max_connections,
    max_connections_per_address: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="HYPERPLAN_MAX_CONNECTIONS_PER_ADDRESS",
            help="Open connections one client address may hold; one more is answered 503 as it opens. "
            "Below --max-connections; default: a quarter of it.",
        ),
    ] = None,
    max_pending_per_address: Annotated[
        int | None,
        typer.Option(
            min=1,
            envvar="HYPERPLAN_MAX_PENDING_PER_ADDRESS",
            help="Of those, connections waiting for a request's headers (new, or idle between requests); "
            "one more is answered 503 as it opens. Default: half of --max-connections-per-address.",
        ),
    ] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(
            envvar="HYPERPLAN_TRUSTED_PROXY",
            help="Address or CIDR block of a reverse proxy whose X-Forwarded-For names the client, for the "
            "caps per address and the audit trail (repeat it, or separate with commas). Default: none.",
        ),
    ] = None,
    s3_max_body_bytes: Annotated[
        int,
        typer.Option(
            min=1,
            envvar="HYPERPLAN_S3_MAX_BODY_BYTES",
            help="Largest S3 request body (an object or a part), in bytes; streamed to disk, never held.",
        ),
    ] = ServerLimits.s3_max_body_bytes,
    s3_body_timeout: Annotated[
        float,
        typer.Option(
            min=0.001,
            envvar="HYPERPLAN_S3_BODY_TIMEOUT",
            help="Seconds an S3 request's body may take in all (and --body-timeout without a byte).",
        ),
    ] = ServerLimits.s3_body_timeout,
    database_url: Annotated[
        str | None,
        typer.Option(
            envvar="HYPERPLAN_DATABASE_URL",
            help="The store: postgresql://USER@HOST:PORT/DBNAME (psycopg 3), or sqlite:///PATH; default: "
            "SQLite in DATA_DIR/hyperplan.db. DATA_DIR keeps the key file and local state either way.",
        ),
    ] = None,
    key_file: Annotated[
        Path | None,
        typer.Option(
            envvar="HYPERPLAN_KEY_FILE",
            help="Master key file that seals the store's secrets (default: DATA_DIR/master.key, made at "
            "the first start). Servers sharing one database name one file. Back it up: without it the "
            "store's access keys and webhook secrets are lost.",
        ),
    ] = None,
    isolation: Annotated[
        str | None,
        typer.Option(
            envvar="HYPERPLAN_ISOLATION",
            help="users: each account's work runs as its own OS user (needs root); none: everything runs "
            "as the server's user, accounts not isolated. Default: users when run as root, else none.",
        ),
    ] = None,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="HYPERPLAN_WORK_DIR",
            help="Where nodes' homes, sandboxes and job trees live, outside the data directory (default: "
            "the fleet file's [backend] work_dir, else /var/lib/hyperplan/work/STORE_ID as root, "
            "DATA_DIR-work otherwise). One store's: another store's server refuses it.",
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="Server log level.")] = "info",
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            envvar="HYPERPLAN_METRICS_LISTEN",
            help="HOST:PORT for Prometheus metrics at /metrics, unsigned, apart from the API (default: "
            "off). docs/OPERATIONS.md lists them.",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            envvar="HYPERPLAN_WORKERS",
            help="API processes on the one port; more than 1 adds a process that owns the background work "
            "(timed events, webhooks, nodes, jobs). 1: everything in this process.",
        ),
    ] = 1,
    leader_lease: Annotated[
        float | None,
        typer.Option(
            min=0.2,
            max=3600,
            envvar="HYPERPLAN_LEADER_LEASE",
            help="Seconds the leader's lease lasts (servers sharing one database elect one leader to run "
            "the background work; another takes over this long after it died). Default 10.",
        ),
    ] = None,
    role: Annotated[str, typer.Option(hidden=True)] = "all",
    listen_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run the server until SIGTERM or Ctrl-C."""
    if metrics_listen is not None and workers > 1 and role == "all":
        _share_metrics_between_processes()  # before anything imports prometheus_client
    from rich.markup import escape  # a refusal names "[backend] work_dir" or "[images]": text, not markup

    from hyperplan.errors import HyperplanError
    from hyperplan.server.fair_connections import TrustedProxies

    try:
        starts_at = _refuse_early(clock_kind, clock_start, isolation, data_dir, work_dir, database_url)
        limits = ServerLimits(
            max_body_bytes,
            header_timeout,
            body_timeout,
            max_connections,
            s3_max_body_bytes,
            s3_body_timeout,
            max_connections_per_address,
            max_pending_per_address,
        )
        limits.check()
        proxies = TrustedProxies.parse(trusted_proxy or ())
    except HyperplanError as exc:
        console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}")
        raise typer.Exit(2) from None
    # Imported here, with the runtime: every other command starts without them.
    import logging
    import secrets
    import signal

    from hyperplan.app import AppConfig, Application, default_data_dir
    from hyperplan.backends.layout import MARK_VARIABLE
    from hyperplan.server.app import create_app
    from hyperplan.server.serving import serve as serve_app
    from hyperplan.services.accounts.os_users import NOT_ISOLATED

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if metrics_listen is not None:
        from hyperplan.metrics import parse_listen

        try:
            parse_listen(metrics_listen)
        except ValueError as exc:
            console.print(f"[red]ValidationException[/red]: {exc}")
            raise typer.Exit(2) from None
    os.umask(0o077)  # the server's own files (store, keys, records) are its user's alone
    if role not in ("all", "api"):
        raise typer.BadParameter(f"--role must be all or api, not {role!r}")
    if role == "api":
        from hyperplan.server.processes import die_with_parent

        die_with_parent()
    directory = (data_dir or default_data_dir()).expanduser()
    # Every process this server starts inherits the mark (see hyperplan.backends.layout.MARK_VARIABLE).
    os.environ.setdefault(MARK_VARIABLE, f"hp-{secrets.token_hex(8)}")
    try:
        application = Application(
            AppConfig(
                data_dir=directory,
                fleet_path=fleet,
                clock=clock_kind,
                time_scale=time_scale,
                clock_start=starts_at,
                key_file=key_file.expanduser() if key_file is not None else None,
                database_url=database_url,
                isolation=isolation,
                work_dir=work_dir,
                metrics_listen=metrics_listen if role != "api" else None,
                role="background" if workers > 1 else role,
                leader_lease=leader_lease,
            )
        )
        context = application.open()  # the data directory, the fleet file, the migration, the clock
        bootstrapped = application.bootstrap()
    except HyperplanError as exc:
        console.print(f"[red]{exc.code}[/red]: {escape(exc.message)}")
        raise typer.Exit(2) from None
    credentials = application.credentials_path
    if role == "api":
        from hyperplan.server.app import create_app as create_api
        from hyperplan.server.header_deadline import front_door_protocol as api_protocol
        from hyperplan.server.processes import wait_for_the_gate

        wait_for_the_gate()
        serve_app(
            application.request_stop,
            create_api(context, application, limits),
            listen_fd=listen_fd,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=10,
            http=api_protocol(limits, proxies),
        )
        return
    if not context.settings.isolated:
        print(f"WARNING: {NOT_ISOLATED}", file=sys.stderr, flush=True)
    if bootstrapped:
        console.print(f"Created the administrator account; its keys are in {credentials}")
    console.print(
        f"hyperplan on http://{host}:{port} (region {context.region}, {context.clock.kind} clock, "
        f"data in {directory}, work in {context.work_dir}, isolation {context.settings.isolation})\n"
        f"  aws sagemaker list-training-plans --endpoint-url http://{host}:{port} "
        f"(credentials: AWS_SHARED_CREDENTIALS_FILE={credentials} AWS_PROFILE=hyperplan)"
    )
    if workers > 1:
        _supervise(application, host, port, workers, _api_args({**locals(), "data_dir": directory}))
        console.print("hyperplan stopped; every acknowledged change is on disk.")
        return
    # uvicorn shuts down gracefully on SIGTERM and then re-raises the signal under the handler that was in
    # place before it started; this one makes that a clean exit, as service managers expect.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        from hyperplan.server.header_deadline import front_door_protocol

        app = create_app(context, application, limits)
        serve_app(
            application.request_stop,
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=10,
            http=front_door_protocol(limits, proxies),
        )
    finally:
        console.print("hyperplan stopped; every acknowledged change is on disk.")


def _refuse_early(
    clock_kind: str,
    clock_start: str | None,
    isolation: str | None,
    data_dir: Path | None,
    work_dir: Path | None,
    database_url: str | None,
) -> datetime | None:
    """The refusals that need nothing but the options, made before the server's stack is imported
    (seconds of CPU): the same checks the application makes again as it opens, with the same messages.
    Returns --clock-start's instant."""
    from hyperplan.clock import check_clock_options, parse_instant
    from hyperplan.services.accounts import os_users
    from hyperplan.store.urls import check_url

    starts_at = parse_instant(clock_start) if clock_start is not None else None
    check_clock_options(clock_kind, starts_at)
    os_users.choose_isolation(isolation, os.geteuid())
    if data_dir is not None and work_dir is not None:
        os_users.check_work_dir_place(work_dir.expanduser(), data_dir.expanduser())
    if database_url:
        check_url(database_url)
    return starts_at


def _share_metrics_between_processes() -> None:
    """`serve --workers N --metrics-listen ...`: every process counts into files of one fresh directory
    (prometheus_client's multiprocess mode, hyperplan/metrics.py), named before any of them imports
    prometheus_client; the API processes inherit it, and the parent's listener adds them up."""
    import atexit
    import shutil
    import tempfile

    variable = "PROMETHEUS_MULTIPROC_DIR"  # hyperplan.metrics.MULTIPROC_VARIABLE, not imported: see above
    if not os.environ.get(variable):
        directory = tempfile.mkdtemp(prefix="hyperplan-metrics-")
        os.environ[variable] = directory
        atexit.register(shutil.rmtree, directory, True)


def _api_args(options: dict[str, object]) -> list[str]:
    """`serve`'s arguments for one API process of `serve --workers N`."""
    args = ["serve", "--role", "api", "--workers", "1"]
    for name in (
        "host",
        "port",
        "data_dir",
        "fleet",
        "clock_kind",
        "time_scale",
        "clock_start",
        "max_body_bytes",
        "header_timeout",
        "body_timeout",
        "max_connections",
        "max_connections_per_address",
        "max_pending_per_address",
        "trusted_proxy",
        "s3_max_body_bytes",
        "s3_body_timeout",
        "database_url",
        "key_file",
        "isolation",
        "work_dir",
        "log_level",
        "leader_lease",
    ):
        value = options[name]
        if isinstance(value, list):  # --trusted-proxy: all in one, comma-separated
            value = ",".join(value) or None
        if value is not None:
            flag = "--clock" if name == "clock_kind" else "--" + name.replace("_", "-")
            args += [flag, str(value)]
    return args


def _supervise(application: Any, host: str, port: int, workers: int, child_args: list[str]) -> None:
    """This process leads (the background work) and supervises `workers` API processes on one socket."""
    import signal

    from hyperplan.server.processes import Supervisor, listening_socket

    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        console.print(f"[red]cannot listen on {host}:{port}[/red]: {exc.strerror}")
        application.stop()
        raise typer.Exit(1) from None
    supervisor = Supervisor(child_args, workers, sock.fileno())

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


if __name__ == "__main__":
    app()
