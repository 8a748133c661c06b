"""What every client command shares: where the server is, who signs, and how answers are printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.markup import escape

from hyperplan.cli import options
from hyperplan.cli.client import (
    ApiError,
    NativeClient,
    Unreachable,
    default_data_dir,
    resolve_credentials,
    resolve_endpoint,
)

if TYPE_CHECKING:
    from hyperplan.cli.sagemaker import SageMakerClient

# Piped output keeps its columns: a table squeezed to 80 characters is unreadable in a log or a file.
_PIPED_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200"))
# No emoji codes: a name such as "run:fire:1" is printed as given (and Rich's emoji table is not loaded).
console = Console(width=_PIPED_WIDTH, emoji=False)
errors = Console(stderr=True, width=_PIPED_WIDTH, emoji=False)


def json_output() -> bool:
    """Whether this command prints JSON (--json, before or after the command's name)."""
    return options.current().as_json


def native_client() -> NativeClient:
    """A signed client for the server the command line names (hyperplan.cli.options)."""
    given = options.current()
    directory = given.data_dir or default_data_dir()
    credentials = resolve_credentials(directory, given.profile)
    if credentials is None:
        profile = given.profile_in_use()
        tried = f"profile {profile!r}" if profile else "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        errors.print(
            f"[red]No credentials[/red] ({escape(tried)}). Set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            f"pass --profile, or point --data-dir at the server's data directory "
            f"(looked in {escape(str(directory / 'credentials'))})."
        )
        raise typer.Exit(2)
    return NativeClient(resolve_endpoint(given.endpoint_url), credentials)


@contextmanager
def reporting_errors() -> Iterator[None]:
    """Server errors print as `Code: message` and exit 1; an unreachable server says where it looked."""
    try:
        yield
    except ApiError as exc:
        _fail(exc.code, exc.message)
    except Unreachable as exc:
        _unreachable(exc.origin, exc.reason)


def _fail(code: Any, message: Any) -> NoReturn:
    errors.print(f"[red]{escape(str(code))}[/red]: {escape(str(message))}")
    raise typer.Exit(1)


def _unreachable(where: str, why: str) -> NoReturn:
    errors.print(
        f"[red]Cannot reach the server at {escape(where)}[/red]: {escape(why)}. Is `hyperplan serve` running?"
    )
    raise typer.Exit(1)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


def emit(value: Any, view: Callable[[Any], RenderableType]) -> None:
    """The answer as JSON with --json; otherwise its view (hyperplan.cli.views) on the console."""
    if json_output():
        print_json(value)
    else:
        console.print(view(value))


def sagemaker_client() -> SageMakerClient:
    """A SageMaker API client for our server: the CLI uses the same API as everyone else."""
    from hyperplan.cli.sagemaker import SageMakerClient

    return SageMakerClient(native_client())


def plain(value: Any) -> Any:
    """A SageMaker answer as JSON can hold it: ISO 8601 UTC times."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
