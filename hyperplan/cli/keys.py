"""`hyperplan keys`: a user's own access keys, managed without an administrator (at most two, as IAM)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(
    help="Your access keys: create a second one, switch to it, deactivate and delete the old one.",
    no_args_is_help=True,
)

UserOpt = Annotated[
    str | None, typer.Option("--user", help="Another user of your account (owners and administrators).")
]
AccountOpt = Annotated[str | None, typer.Option("--account", help="Another account (administrators).")]


@app.command("create")
def create(user: UserOpt = None, account: AccountOpt = None) -> None:
    """Create an access key and print its id and secret; the secret is shown this once."""
    from hyperplan.cli.views.users import NewAccessKey

    body: dict[str, Any] = {k: v for k, v in (("UserName", user), ("Account", account)) if v}
    with reporting_errors():
        key = native_client().post("/api/v1/keys", body)
    emit(key, NewAccessKey)


@app.command("list")
def list_keys(user: UserOpt = None, account: AccountOpt = None) -> None:
    """List your access keys (or a user's) with their status; never their secrets."""
    from hyperplan.cli.views.users import KeysTable

    with reporting_errors():
        result = native_client().get("/api/v1/keys", user=user, account=account)
    emit(result["AccessKeys"], KeysTable)


def _change(access_key_id: str, method: str, path: str, done: str) -> None:
    from urllib.parse import quote

    from hyperplan.cli.views.users import KeyChanged

    with reporting_errors():
        result = native_client().call(method, path.format(key=quote(access_key_id, safe="")))
    emit(result, lambda r: KeyChanged(r, done))


@app.command("activate")
def activate(access_key_id: str) -> None:
    """Make an inactive key sign requests again."""
    _change(access_key_id, "POST", "/api/v1/keys/{key}/activate", "activated")


@app.command("deactivate")
def deactivate(access_key_id: str) -> None:
    """Stop a key signing requests, at once; it can be activated again. Never the account's last active
    key."""
    _change(access_key_id, "POST", "/api/v1/keys/{key}/deactivate", "deactivated")


@app.command("delete")
def delete(access_key_id: str) -> None:
    """Delete a key for good. Never the account's last active key."""
    _change(access_key_id, "DELETE", "/api/v1/keys/{key}", "deleted")
