"""`hyperplan users`: an account's owners manage its users, the people of the team."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="Your account's users (owners; administrators with --account).", no_args_is_help=True)

AccountOpt = Annotated[str | None, typer.Option("--account", help="Another account (administrators).")]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="The user's name (IAM's rule: letters, digits, +=,.@_-).")],
    owner: Annotated[bool, typer.Option("--owner", help="Make the user an owner of the account.")] = False,
    account: AccountOpt = None,
) -> None:
    """Create a user with a first access key, and print the key's secret, once."""
    from hyperplan.cli.views.users import NewUser

    body: dict[str, Any] = {"UserName": name, "Owner": owner}
    if account:
        body["Account"] = account
    with reporting_errors():
        created = native_client().post("/api/v1/users", body)
    emit(created, NewUser)


@app.command("list")
def list_users(account: AccountOpt = None) -> None:
    """List the account's users, their role and how many keys each holds."""
    from hyperplan.cli.views.users import UsersTable

    with reporting_errors():
        result = native_client().get("/api/v1/users", account=account)
    emit(result["Users"], UsersTable)


@app.command("delete")
def delete(name: str, account: AccountOpt = None) -> None:
    """Delete a user and their keys. Never the last owner, nor the holder of the last active key."""
    from urllib.parse import quote

    from hyperplan.cli.views.users import UserDeleted

    with reporting_errors():
        result = native_client().call(
            "DELETE", f"/api/v1/users/{quote(name, safe='')}", query={"account": account}
        )
    emit(result, UserDeleted)
