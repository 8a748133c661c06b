"""Views of buckets: their owners, the grants on them, and what the caller may do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group
from rich.text import Text

from hyperplan.cli.views.base import TableView

ADMINISTRATORS = "administrators"


def owners(bucket: dict[str, Any]) -> str:
    names = [owner["AccountName"] for owner in bucket["Owners"]]
    return ", ".join(names) if names else ADMINISTRATORS


def grants(bucket: dict[str, Any]) -> str:
    return ", ".join(
        f"{'every account' if g['Account'] == '*' else g['AccountName']}: {g['Access']}"
        for g in bucket["Grants"]
    )


@dataclass(frozen=True)
class BucketsTable:
    buckets: list[dict[str, Any]]

    def __rich__(self) -> TableView:
        # Where each is kept (Location, administrators only) is in --json: paths would crowd the table.
        rows = [[b["Name"], b["Kind"], owners(b), grants(b), b["Access"]] for b in self.buckets]
        return TableView("Buckets", ["Bucket", "Kind", "Owners", "Grants", "You may"], rows)


@dataclass(frozen=True)
class BucketChanged:
    """One bucket after a create, grant or revoke."""

    bucket: dict[str, Any]
    what: str

    def __rich__(self) -> Group:
        bucket = self.bucket
        lines = [
            Text.assemble(f"Bucket s3://{bucket['Name']}/ {self.what}; owners: ", (owners(bucket), "bold")),
            Text(f"  grants: {grants(bucket) or 'none'}"),
        ]
        return Group(*lines)
