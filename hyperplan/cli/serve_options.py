"""`hyperplan serve`'s options, declared once, and what can be made of them before the server's stack loads.

Cheap to import: `hyperplan --help` and every client command load this module; the checks import what they
need when `serve` runs (hyperplan/cli/serving.py runs the rest).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hyperplan.server.limits import ServerLimits

if TYPE_CHECKING:
    from datetime import datetime

    from hyperplan.server.fair_connections import TrustedProxies

# The options, in the order `serve --help` lists them; their defaults are in `serve`'s signature.
HostOpt = Annotated[str, typer.Option(help="Address to listen on.")]
PortOpt = Annotated[int, typer.Option(help="Port to listen on.")]
ServerDataDirOpt = Annotated[
    Path | None,
    typer.Option(help="Data directory (default: $HYPERPLAN_DATA_DIR or ~/.local/share/hyperplan)."),
]
FleetOpt = Annotated[Path | None, typer.Option(help="Fleet file (TOML); default: the embedded demo fleet.")]
ClockOpt = Annotated[str, typer.Option("--clock", help="wall, manual or accelerated.")]
TimeScaleOpt = Annotated[float, typer.Option(help="Service seconds per real second (accelerated clock).")]
ClockStartOpt = Annotated[
    str | None,
    typer.Option(
        help="First instant of the manual or accelerated clock: a date (2026-12-31: midnight UTC) or a date "
        "and time (2026-12-31T23:50, UTC unless a zone such as Z or +02:00 follows); used only by a data "
        "directory that has no service time yet."
    ),
]
MaxBodyBytesOpt = Annotated[
    int,
    typer.Option(
        min=1,
        envvar="HYPERPLAN_MAX_BODY_BYTES",
        help="Largest request body, in bytes; a larger one is answered 413 before it is read.",
    ),
]
HeaderTimeoutOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        envvar="HYPERPLAN_HEADER_TIMEOUT",
        help="Seconds a client has to send a request's headers; then the connection is closed.",
    ),
]
BodyTimeoutOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        envvar="HYPERPLAN_BODY_TIMEOUT",
        help="Seconds a client has to send a request's body after its headers; then 408 and close.",
    ),
]
MaxConnectionsOpt = Annotated[
    int,
    typer.Option(
        min=2,
        envvar="HYPERPLAN_MAX_CONNECTIONS",
        help="Open connections beyond which a new request is answered 503 at once.",
    ),
]
MaxConnectionsPerAddressOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        envvar="HYPERPLAN_MAX_CONNECTIONS_PER_ADDRESS",
        help="Open connections one client address may hold; one more is answered 503 as it opens. "
        "Below --max-connections; default: a quarter of it.",
    ),
]
MaxPendingPerAddressOpt = Annotated[
    int | None,
    typer.Option(
        min=1,
        envvar="HYPERPLAN_MAX_PENDING_PER_ADDRESS",
        help="Of those, connections waiting for a request's headers (new, or idle between requests); "
        "one more is answered 503 as it opens. Default: half of --max-connections-per-address.",
    ),
]
TrustedProxyOpt = Annotated[
    list[str] | None,
    typer.Option(
        envvar="HYPERPLAN_TRUSTED_PROXY",
        help="Address or CIDR block of a reverse proxy whose X-Forwarded-For names the client, for the "
        "caps per address and the audit trail (repeat it, or separate with commas). Default: none.",
    ),
]
S3MaxBodyBytesOpt = Annotated[
    int,
    typer.Option(
        min=1,
        envvar="HYPERPLAN_S3_MAX_BODY_BYTES",
        help="Largest S3 request body (an object or a part), in bytes; streamed to disk, never held.",
    ),
]
S3BodyTimeoutOpt = Annotated[
    float,
    typer.Option(
        min=0.001,
        envvar="HYPERPLAN_S3_BODY_TIMEOUT",
        help="Seconds an S3 request's body may take in all (and --body-timeout without a byte).",
    ),
]
DatabaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        envvar="HYPERPLAN_DATABASE_URL",
        help="The store: postgresql://USER@HOST:PORT/DBNAME (psycopg 3), or sqlite:///PATH; default: "
        "SQLite in DATA_DIR/hyperplan.db. DATA_DIR keeps the key file and local state either way.",
    ),
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        envvar="HYPERPLAN_KEY_FILE",
        help="Master key file that seals the store's secrets (default: DATA_DIR/master.key, made at "
        "the first start). Servers sharing one database name one file. Back it up: without it the "
        "store's access keys and webhook secrets are lost.",
    ),
]
IsolationOpt = Annotated[
    str | None,
    typer.Option(
        envvar="HYPERPLAN_ISOLATION",
        help="users: each account's work runs as its own OS user (needs root); none: everything runs "
        "as the server's user, accounts not isolated. Default: users when run as root, else none.",
    ),
]
WorkDirOpt = Annotated[
    Path | None,
    typer.Option(
        envvar="HYPERPLAN_WORK_DIR",
        help="Where nodes' homes, sandboxes and job trees live, outside the data directory (default: "
        "the fleet file's [backend] work_dir, else /var/lib/hyperplan/work/STORE_ID as root, "
        "DATA_DIR-work otherwise). One store's: another store's server refuses it.",
    ),
]
# No envvar here: HYPERPLAN_RUNTIME comes after the fleet file's [backend] runtime (app.py reads it).
RuntimeOpt = Annotated[
    str | None,
    typer.Option(
        help="podman: each node and job instance runs in a container of its image, walled off and "
        "limited (needs root and Podman); process: as host processes, not contained. Default: the "
        "fleet file's [backend] runtime, else $HYPERPLAN_RUNTIME, else podman when run as root and "
        "Podman is usable, process otherwise. serve installs nothing: podman without what it needs "
        "refuses the start, naming it.",
    ),
]
LogLevelOpt = Annotated[str, typer.Option(help="Server log level.")]
MetricsListenOpt = Annotated[
    str | None,
    typer.Option(
        envvar="HYPERPLAN_METRICS_LISTEN",
        help="HOST:PORT for Prometheus metrics at /metrics, unsigned, apart from the API (default: "
        "off). docs/OPERATIONS.md lists them.",
    ),
]
WorkersOpt = Annotated[
    int,
    typer.Option(
        min=1,
        max=64,
        envvar="HYPERPLAN_WORKERS",
        help="API processes on the one port; more than 1 adds a process that owns the background work "
        "(timed events, webhooks, nodes, jobs). 1: everything in this process.",
    ),
]
LeaderLeaseOpt = Annotated[
    float | None,
    typer.Option(
        min=0.2,
        max=3600,
        envvar="HYPERPLAN_LEADER_LEASE",
        help="Seconds the leader's lease lasts (servers sharing one database elect one leader to run "
        "the background work; another takes over this long after it died). Default 10.",
    ),
]
# Set by `serve --workers N` on the API processes it starts (api_process_args): not the user's to give.
RoleOpt = Annotated[str, typer.Option(hidden=True)]
ListenFdOpt = Annotated[int | None, typer.Option(hidden=True)]


@dataclass(frozen=True)
class ServeOptions:
    """`serve`'s parameters as given, one field each, in its signature's order."""

    host: str
    port: int
    data_dir: Path | None
    fleet: Path | None
    clock_kind: str
    time_scale: float
    clock_start: str | None
    max_body_bytes: int
    header_timeout: float
    body_timeout: float
    max_connections: int
    max_connections_per_address: int | None
    max_pending_per_address: int | None
    trusted_proxy: list[str] | None
    s3_max_body_bytes: int
    s3_body_timeout: float
    database_url: str | None
    key_file: Path | None
    isolation: str | None
    work_dir: Path | None
    runtime: str | None
    log_level: str
    metrics_listen: str | None
    workers: int
    leader_lease: float | None
    role: str
    listen_fd: int | None

    @property
    def shares_metrics(self) -> bool:
        """The parent of `--workers N` with a metrics listener: its API processes count into shared files."""
        return self.metrics_listen is not None and self.workers > 1 and self.role == "all"


@dataclass(frozen=True)
class FrontDoor:
    """What the options say of the server's front door once checked, and the clock's first instant."""

    starts_at: datetime | None  # --clock-start, parsed
    limits: ServerLimits
    proxies: TrustedProxies


@contextmanager
def refusals_exit() -> Iterator[None]:
    """A refusal (HyperplanError) printed as `CODE: message`; the command then exits as on a bad option.
    So is a file or directory the server cannot make or open (a data directory that is a file, a key
    file's directory that does not exist): the operator's to fix, not a bug to trace."""
    from hyperplan.cli.common import errors, failure_line  # literal: "[backend] work_dir" is text, not markup
    from hyperplan.errors import HyperplanError, InternalFailure

    try:
        yield
    except InternalFailure:
        raise
    except HyperplanError as exc:
        errors.print(failure_line(exc.code, exc.message), soft_wrap=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        if exc.filename is None:
            raise
        errors.print(failure_line(f"Cannot use {exc.filename}", exc.strerror), soft_wrap=True)
        raise typer.Exit(2) from None


def share_metrics_between_processes(options: ServeOptions) -> None:
    """`serve --workers N --metrics-listen ...`: every process counts into files of one fresh directory
    (prometheus_client's multiprocess mode, hyperplan/metrics.py), named before any of them imports
    prometheus_client; the API processes inherit it, and the parent's listener adds them up.

    The directory is the data directory's ``metrics/<pid>``: a server killed with SIGKILL cannot remove
    it, so each start removes those of servers that are gone (several servers may share a data
    directory). Called once the front door has refused what it refuses: nothing is made before."""
    import atexit
    import shutil

    from hyperplan.cli.client import default_data_dir

    variable = "PROMETHEUS_MULTIPROC_DIR"  # hyperplan.metrics.MULTIPROC_VARIABLE, not imported: see above
    data_dir = (options.data_dir or default_data_dir()).expanduser()
    if os.environ.get(variable):
        return
    parent = data_dir / "metrics"
    parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    for left in parent.iterdir():
        if not _process_alive(left.name):
            shutil.rmtree(left, ignore_errors=True)
    directory = parent / str(os.getpid())
    directory.mkdir(mode=0o700, exist_ok=True)
    os.environ[variable] = str(directory)
    atexit.register(shutil.rmtree, directory, True)


def _process_alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def check_front_door(options: ServeOptions) -> FrontDoor:
    """The limits and proxies the options set, checked with every refusal that needs nothing but the
    options, before the server's stack is imported."""
    from hyperplan.server.fair_connections import TrustedProxies

    with refusals_exit():
        starts_at = _refuse_early(options)
        limits = ServerLimits(
            options.max_body_bytes,
            options.header_timeout,
            options.body_timeout,
            options.max_connections,
            options.s3_max_body_bytes,
            options.s3_body_timeout,
            options.max_connections_per_address,
            options.max_pending_per_address,
        )
        limits.check()
        proxies = TrustedProxies.parse(options.trusted_proxy or ())
    return FrontDoor(starts_at, limits, proxies)


def _refuse_early(options: ServeOptions) -> datetime | None:
    """The refusals made before the server's stack is imported (seconds of CPU): the same checks the
    application makes again as it opens, with the same messages. Returns --clock-start's instant."""
    from hyperplan.cli.client import default_data_dir
    from hyperplan.cli.common import read_text
    from hyperplan.cli.times import absolute
    from hyperplan.clock import check_clock_options
    from hyperplan.core.runtime_choice import FLAG, check_runtime
    from hyperplan.errors import ValidationError
    from hyperplan.services.accounts import os_users
    from hyperplan.store.urls import check_url

    starts_at = absolute("--clock-start", options.clock_start) if options.clock_start is not None else None
    if options.fleet is not None:
        read_text(options.fleet, "--fleet")  # missing, unreadable or not UTF-8: said before anything starts
    directory = (options.data_dir or default_data_dir()).expanduser()
    if directory.exists() and not directory.is_dir():
        raise ValidationError(f"the data directory {directory} is a file; give a directory with --data-dir")
    check_clock_options(options.clock_kind, starts_at)
    os_users.choose_isolation(options.isolation, os.geteuid())
    if options.runtime is not None:
        check_runtime(options.runtime, FLAG)
    if options.data_dir is not None and options.work_dir is not None:
        os_users.check_work_dir_place(options.work_dir.expanduser(), options.data_dir.expanduser())
    if options.database_url:
        check_url(options.database_url)
    return starts_at


# What an API process of `serve --workers N` is given again, in this order (api_process_args).
_PASSED_ON = (
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
    "runtime",
    "log_level",
    "leader_lease",
)


def api_process_args(options: ServeOptions, data_dir: Path) -> list[str]:
    """`serve`'s arguments for one API process of `serve --workers N`, on the data directory resolved."""
    args = ["serve", "--role", "api", "--workers", "1"]
    for name in _PASSED_ON:
        value = data_dir if name == "data_dir" else getattr(options, name)
        if isinstance(value, list):  # --trusted-proxy: all in one, comma-separated
            value = ",".join(value) or None
        if value is not None:
            flag = "--clock" if name == "clock_kind" else "--" + name.replace("_", "-")
            args += [flag, str(value)]
    return args
