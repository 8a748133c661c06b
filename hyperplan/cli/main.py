"""The `hyperplan` command."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import console
from hyperplan.cli.lazy import Later, Settings
from hyperplan.cli.options import (
    PLAIN_HELP,
    ClientCommand,
    ClientOptions,
    DataDirOpt,
    EndpointOpt,
    JsonOpt,
    ProfileOpt,
)
from hyperplan.cli.root import Root
from hyperplan.cli.serve_options import (
    BodyTimeoutOpt,
    ClockOpt,
    ClockStartOpt,
    DatabaseUrlOpt,
    FleetOpt,
    HeaderTimeoutOpt,
    HostOpt,
    IsolationOpt,
    KeyFileOpt,
    LeaderLeaseOpt,
    ListenFdOpt,
    LogLevelOpt,
    MaxBodyBytesOpt,
    MaxConnectionsOpt,
    MaxConnectionsPerAddressOpt,
    MaxPendingPerAddressOpt,
    MetricsListenOpt,
    PortOpt,
    RoleOpt,
    RuntimeOpt,
    S3BodyTimeoutOpt,
    S3MaxBodyBytesOpt,
    ServeOptions,
    ServerDataDirOpt,
    TimeScaleOpt,
    TrustedProxyOpt,
    WorkDirOpt,
    WorkersOpt,
    check_front_door,
    share_metrics_between_processes,
)
from hyperplan.server.limits import ServerLimits

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
    "registries": Later("hyperplan.cli.registries", "app"),
    "audit": Later("hyperplan.cli.ops", "audit_app"),
    "admin": Later("hyperplan.cli.ops", "admin_app"),
}
# Help lists every subcommand here, in the order of the work: a team's plans and what runs on them, then
# administration, then running a server. The one place that order is kept (tests/cli/test_failures.py).
SECTIONS = {
    "The work": ["plans", "clusters", "jobs", "fleet"],
    "Administration": [
        "accounts", "users", "keys", "buckets", "registries", "invoices", "webhooks", "usage", "audit",
        "admin",
    ],
    "Serving": ["serve", "clock", "simulate", "backup", "restore"],
}  # fmt: skip
_ROOT = Settings(pretty_exceptions_short=True, rich_markup_mode=PLAIN_HELP, suggest_commands=True)


class HyperplanRoot(Root):
    later = {**COMMANDS, **GROUPS}
    settings = _ROOT
    sections = SECTIONS


app = typer.Typer(
    help="hyperplan: bookable accelerator capacity over the SageMaker training-plan API. "
    "Client options go before the command or after it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_short=_ROOT.pretty_exceptions_short,
    rich_markup_mode=_ROOT.rich_markup_mode,
    suggest_commands=_ROOT.suggest_commands,
    cls=HyperplanRoot,
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
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8080,
    data_dir: ServerDataDirOpt = None,
    fleet: FleetOpt = None,
    clock_kind: ClockOpt = "wall",
    time_scale: TimeScaleOpt = 60.0,
    clock_start: ClockStartOpt = None,
    max_body_bytes: MaxBodyBytesOpt = ServerLimits.max_body_bytes,
    header_timeout: HeaderTimeoutOpt = ServerLimits.header_timeout,
    body_timeout: BodyTimeoutOpt = ServerLimits.body_timeout,
    max_connections: MaxConnectionsOpt = ServerLimits.max_connections,
    max_connections_per_address: MaxConnectionsPerAddressOpt = None,
    max_pending_per_address: MaxPendingPerAddressOpt = None,
    trusted_proxy: TrustedProxyOpt = None,
    s3_max_body_bytes: S3MaxBodyBytesOpt = ServerLimits.s3_max_body_bytes,
    s3_body_timeout: S3BodyTimeoutOpt = ServerLimits.s3_body_timeout,
    database_url: DatabaseUrlOpt = None,
    key_file: KeyFileOpt = None,
    isolation: IsolationOpt = None,
    work_dir: WorkDirOpt = None,
    runtime: RuntimeOpt = None,
    log_level: LogLevelOpt = "info",
    metrics_listen: MetricsListenOpt = None,
    workers: WorkersOpt = 1,
    leader_lease: LeaderLeaseOpt = None,
    role: RoleOpt = "all",
    listen_fd: ListenFdOpt = None,
) -> None:
    """Run the server until SIGTERM or Ctrl-C."""
    options = ServeOptions(**locals())  # first: the parameters, and nothing else yet
    front = check_front_door(options)  # before the server's stack is imported: a refusal comes at once
    if options.shares_metrics:  # once no refusal is left to make: it makes a directory
        share_metrics_between_processes(options)  # before anything imports prometheus_client
    from hyperplan.cli.serving import run  # the server's runtime: every other command starts without it

    run(options, front)


if __name__ == "__main__":
    app()
