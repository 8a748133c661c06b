"""Pieces every view uses: a titled table and the way times are shown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.table import Table
from rich.text import Text


@dataclass(frozen=True)
class TableView:
    """A table with a title on its left; empty cells for missing values. Every cell and the title are
    literal text: a node list such as hp-n[01-04] or a message naming [backend] is printed as it is, where
    a str would be read as Rich markup and lose its brackets."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]

    def __rich__(self) -> Table:
        table = Table(title=Text(self.title), title_justify="left")
        for column in self.columns:
            table.add_column(Text(column))
        for row in self.rows:
            table.add_row(*(Text("" if cell is None else str(cell)) for cell in row))
        return table


def when(value: Any, *, seconds: bool = False) -> str:
    """A time as a person reads it in a table: UTC, to the minute (or second)."""
    if not isinstance(value, datetime):
        return "" if value is None else str(value)
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC" if seconds else "%Y-%m-%d %H:%M UTC")


def last_part(arn: str) -> str:
    """The name at the end of an ARN (or the text itself)."""
    return arn.rsplit("/", 1)[-1]
