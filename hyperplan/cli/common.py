"""What every client command shares: where the server is, who signs, and how answers are printed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text
from typer import _click as click

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
        raise Failure(
            "No credentials",
            f"({tried}). Set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, pass --profile, or point --data-dir "
            f"at the server's data directory (looked in {directory / 'credentials'}).",
            exit_code=2,
            separator=" ",
        )
    return NativeClient(resolve_endpoint(given.endpoint_url), credentials)


def failure_line(head: Any, rest: Any, separator: str = ": ") -> Text:
    """`head: rest`, the head in red, as one literal line: a message's `[postgres]` or `hp-n[01-04]` is
    text, never Rich markup (a str printed through Rich would lose it)."""
    return Text.assemble((str(head), "red"), separator, str(rest))


class Failure(click.ClickException):
    """What stops a command, printed as one line on stderr (failure_line), no traceback: exit code 2 for a
    mistake in what it was given (found before any request), 1 for a server's refusal or absence."""

    def __init__(self, head: str, message: str, exit_code: int, separator: str = ": ") -> None:
        super().__init__(message)
        self.head = head
        self.exit_code = exit_code
        self.separator = separator

    def show(self, file: Any = None) -> None:
        # soft_wrap: one line however long (a terminal wraps it; a log or a test reads it whole).
        errors.print(failure_line(self.head, self.message, self.separator), soft_wrap=True)


def refused(exc: ApiError) -> Failure:
    """The server's refusal: `Code: message`, exit code 1."""
    return Failure(exc.code, exc.message, exit_code=1)


def unreachable(exc: Unreachable) -> Failure:
    """No answer: where the client looked, and why; exit code 1."""
    return Failure(
        f"Cannot reach the server at {exc.origin}",
        f"{exc.reason}. Is `hyperplan serve` running?",
        exit_code=1,
    )


@contextmanager
def reporting_errors() -> Iterator[None]:
    """Server errors print as `Code: message` and exit 1; an unreachable server says where it looked."""
    try:
        yield
    except ApiError as exc:
        raise refused(exc) from None
    except Unreachable as exc:
        raise unreachable(exc) from None


def read_text(path: Path, option: str) -> str:
    """A file the command line names, as text; one it cannot read is refused naming the option, the file
    and why (a usage error, exit code 2), never a traceback."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(f"{path} is not UTF-8 text (byte {exc.start})", param_hint=option) from None
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc.strerror or exc}", param_hint=option) from None


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
