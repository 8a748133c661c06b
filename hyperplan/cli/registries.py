"""`hyperplan registries`: administrators keep the credentials of the registries training images are
pulled from (the fleet file maps images to them and says which speak plain HTTP; docs/FLEET.md)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Container registries and their credentials (administrators).", no_args_is_help=True)

HostArg = Annotated[str, typer.Argument(help="The registry: HOST or HOST:PORT, as image references name it.")]


def _path(host: str) -> str:
    """The registry's route; HOST is checked first, so a bad one is named rather than sent."""
    from urllib.parse import quote

    from hyperplan.core.image_refs import parse_registry_host
    from hyperplan.errors import ValidationError

    try:
        host = parse_registry_host(host)
    except ValidationError as error:
        raise typer.BadParameter(error.message, param_hint="HOST") from None
    return f"/api/v1/registries/{quote(host, safe='')}/credentials"


def _password_from_stdin() -> str:
    """The whole of standard input, less the line end a shell or `echo` adds (as `docker login` reads it)."""
    try:
        password = sys.stdin.read().removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError:
        raise typer.BadParameter("standard input is not UTF-8 text", param_hint="--password-stdin") from None
    if not password:
        raise typer.BadParameter(
            "standard input is empty: pipe the password in", param_hint="--password-stdin"
        )
    return password


@app.command("set-credentials")
def set_credentials(
    host: HostArg,
    username: Annotated[str, typer.Option("--username", "-u", help="The user (or token name) to log in as.")],
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="Read the password from standard input (required: a password on the command line would "
            "be seen in the process list and the shell's history).",
        ),
    ] = False,
) -> None:
    """Store the credentials a registry is pulled from with; the password is sealed under the master key
    and never shown again. Setting them again replaces them."""
    from hyperplan.cli.views.registries import CredentialsSet

    if not password_stdin:
        raise typer.BadParameter("give the password on standard input", param_hint="--password-stdin")
    path = _path(host)
    password = _password_from_stdin()
    with reporting_errors():
        result = native_client().post(path, {"Username": username, "Password": password})
    emit(result, CredentialsSet)


@app.command("list")
def list_registries() -> None:
    """The registries the fleet file describes or credentials are stored for: plain HTTP or not, and the
    user each is pulled as (never a password)."""
    from hyperplan.cli.views.registries import RegistriesTable

    with reporting_errors():
        result = native_client().get("/api/v1/registries")
    emit(result["Registries"], RegistriesTable)


@app.command("delete-credentials")
def delete_credentials(host: HostArg) -> None:
    """Forget a registry's credentials: its images are pulled anonymously from then on."""
    from hyperplan.cli.views.registries import CredentialsDeleted

    path = _path(host)
    with reporting_errors():
        result = native_client().delete(path)
    emit(result, CredentialsDeleted)
