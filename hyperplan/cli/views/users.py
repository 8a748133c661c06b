"""Views of an account's users and their access keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView, when


def _key_lines(key: dict[str, Any]) -> list[Text]:
    return [
        Text(f"  aws_access_key_id = {key['AccessKeyId']}"),
        Text(f"  aws_secret_access_key = {key['SecretAccessKey']}"),
        Text("The secret is shown once; keep it now.", style="dim"),
    ]


@dataclass(frozen=True)
class NewAccessKey:
    """A new access key with its secret, which the server shows only this once."""

    key: dict[str, Any]

    def __rich__(self) -> Group:
        key = self.key
        return Group(
            Text.assemble(
                "Access key of user ", (key["UserName"], "bold"), f" in account {key['AccountName']}"
            ),
            *_key_lines(key),
        )


@dataclass(frozen=True)
class NewUser:
    """A new user and their first access key, whose secret is shown only this once."""

    created: dict[str, Any]

    def __rich__(self) -> Group:
        user, key = self.created["User"], self.created["AccessKey"]
        role = "an owner" if user["Owner"] else "a user"
        return Group(
            Text.assemble(
                ("User ", ""), (user["UserName"], "bold"), f" is {role} of account {user['AccountName']}"
            ),
            *_key_lines(key),
        )


@dataclass(frozen=True)
class UsersTable:
    users: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                u["UserName"],
                "yes" if u["Owner"] else "",
                u["ActiveKeys"],
                u["InactiveKeys"],
                when(u["CreatedAt"]),
            ]
            for u in self.users
        ]
        account = self.users[0]["AccountName"] if self.users else ""
        return TableView(
            f"Users of {account}".strip(), ["User", "Owner", "Active keys", "Inactive keys", "Created"], rows
        )


@dataclass(frozen=True)
class KeysTable:
    keys: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [[k["AccessKeyId"], k["UserName"], k["Status"], when(k["CreatedAt"])] for k in self.keys]
        return TableView("Access keys", ["Access key id", "User", "Status", "Created"], rows)


@dataclass(frozen=True)
class KeyChanged:
    key: dict[str, Any]
    done: str

    def __rich__(self) -> Text:
        k = self.key
        return Text(f"Access key {k['AccessKeyId']} of user {k['UserName']} {self.done}.")


@dataclass(frozen=True)
class UserDeleted:
    user: dict[str, Any]

    def __rich__(self) -> Text:
        u = self.user
        return Text(f"Deleted user {u['UserName']} of account {u['AccountName']}, and their access keys.")
