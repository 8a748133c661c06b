"""Views of container registries and the credentials stored for them (never a password)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text

from hyperplan.cli.views.base import TableView, when


@dataclass(frozen=True)
class RegistriesTable:
    registries: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        rows = [
            [
                r["Host"],
                "http (insecure)" if r["Insecure"] else "https",
                "yes" if r["InFleet"] else "no",
                r.get("Username") or "",
                when(r.get("CredentialsSetAt")),
            ]
            for r in self.registries
        ]
        return TableView(
            "Registries", ["Host", "Protocol", "In fleet file", "Username", "Credentials set"], rows
        )


@dataclass(frozen=True)
class CredentialsSet:
    answer: dict[str, Any]

    def __rich__(self) -> Text:
        return Text(
            f"Stored the credentials of {self.answer['Host']} for user {self.answer['Username']}, the "
            "password sealed under the master key."
        )


@dataclass(frozen=True)
class CredentialsDeleted:
    answer: dict[str, Any]

    def __rich__(self) -> Text:
        return Text(f"Deleted the credentials of {self.answer['Host']}: it is pulled from anonymously now.")
