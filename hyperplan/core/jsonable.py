"""One conversion of nested values to what `json.dumps` takes: mappings, sequences, times and exact money."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any


def iso_time(moment: datetime) -> str:
    return moment.isoformat()


def zulu_time(moment: datetime) -> str:
    """ISO 8601 with a Z for UTC, as the native API writes times."""
    return moment.isoformat().replace("+00:00", "Z")


def jsonable(value: Any, time_text: Callable[[datetime], str] = iso_time) -> Any:
    """`value` with every datetime written by `time_text` (ISO 8601 by default, the form stored requests
    have always had), mappings as dicts, tuples as lists and Decimals as text, so that money stays exact."""
    if isinstance(value, datetime):
        return time_text(value)
    if isinstance(value, Mapping):
        return {key: jsonable(item, time_text) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item, time_text) for item in value]
    if hasattr(value, "as_integer_ratio") and not isinstance(value, int | float | bool):
        return str(value)  # Decimal
    return value
