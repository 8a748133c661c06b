"""The client options, declared once on the root command and accepted after any client command too.

`hyperplan --endpoint-url URL plans list` and `hyperplan plans list --endpoint-url URL` mean the same;
given in both places, the one after the command wins. Where a value is missing, the client falls back on
the environment when it needs it (`hyperplan.cli.client.resolve_endpoint`, botocore's profile variables).
"""

from __future__ import annotations

import os
from contextvars import ContextVar
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

PANEL = "Client options"

EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="The server (default: $HYPERPLAN_ENDPOINT_URL, then $AWS_ENDPOINT_URL, then http://127.0.0.1:8080).",
        rich_help_panel=PANEL,
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="AWS profile whose keys sign requests (default: as every AWS tool, $AWS_PROFILE).",
        rich_help_panel=PANEL,
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Data directory whose credentials file is the last resort for keys "
        "(default: $HYPERPLAN_DATA_DIR or ~/.local/share/hyperplan).",
        rich_help_panel=PANEL,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.", rich_help_panel=PANEL)]

# The one time syntax of every time option (hyperplan/cli/times.py reads it), said in each one's help.
TIME_HELP = (
    "A date (2026-12-07: midnight UTC), a date and time (2026-12-07T10:00, UTC unless a zone such as Z or "
    "+02:00 follows), now, or a time from now: +3d, +12h, +30m, +1d12h, -2d (the service clock's now)."
)


@dataclass(frozen=True)
class ClientOptions:
    """What the command line said about where the server is, who signs, and how to print."""

    endpoint_url: str | None = None
    profile: str | None = None
    data_dir: Path | None = None
    as_json: bool = False

    def then(self, later: ClientOptions) -> ClientOptions:
        """These options overridden by those given later on the command line (after the command)."""
        return ClientOptions(
            endpoint_url=later.endpoint_url or self.endpoint_url,
            profile=later.profile or self.profile,
            data_dir=later.data_dir or self.data_dir,
            as_json=later.as_json or self.as_json,
        )

    def profile_in_use(self) -> str | None:
        """The profile botocore will use: the flag, else the AWS profile variables (in botocore's order).

        Only the flag is handed to botocore: a profile named explicitly makes botocore ignore keys in the
        environment, while one from $AWS_PROFILE does not, and the CLI keeps the AWS tools' behaviour.
        """
        return self.profile or os.environ.get("AWS_DEFAULT_PROFILE") or os.environ.get("AWS_PROFILE")


NAMES = tuple(field.name for field in fields(ClientOptions))

# Set while a client command runs, so that the helpers it calls (native_client, emit, ...) read the
# options without every command passing them along.
_running: ContextVar[ClientOptions | None] = ContextVar("hyperplan_client_options", default=None)


def current() -> ClientOptions:
    """The options of the client command being run (the defaults outside one)."""
    return _running.get() or ClientOptions()


class ClientCommand(TyperCommand):
    """A command that talks to the server: it also takes the root's client options after its name."""

    takes_json = True

    def get_params(self, ctx: Any) -> list[Any]:
        root = ctx.find_root().command
        shared = [p for p in root.params if p.name in NAMES and (self.takes_json or p.name != "as_json")]
        return [*super().get_params(ctx), *shared]

    def invoke(self, ctx: Any) -> Any:
        given = ClientOptions(**{name: ctx.params.pop(name) for name in NAMES if name in ctx.params})
        before = ctx.find_object(ClientOptions) or ClientOptions()  # the root's, if it ran
        options = before.then(given)
        if options.as_json and not self.takes_json:
            raise typer.BadParameter(
                "this command prints text; --json does not apply to it", param_hint="--json"
            )
        token = _running.set(options)
        try:
            return super().invoke(ctx)
        finally:
            _running.reset(token)


class TextCommand(ClientCommand):
    """A client command whose output is text (logs, a status line): no --json."""

    takes_json = False


# Help in Click's plain layout: Typer's Rich layout imports Markdown and Pygments, which alone take twice
# as long as importing Typer and Rich (bench/cli.py measures the start of every command).
PLAIN_HELP = None


class ClientTyper(typer.Typer):
    """A group of client commands: each takes the client options (see ClientCommand)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("rich_markup_mode", PLAIN_HELP)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", ClientCommand)
        return super().command(*args, **kwargs)
