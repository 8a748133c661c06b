"""How the fleet file's readers read a TOML table: each value checked for its kind and range, and each
complaint a ``ValidationError`` that names the key path (``pools[2].reservable: ...``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from hyperplan.core.durations import parse_duration
from hyperplan.errors import ValidationError

REQUIRED: Any = object()  # the default of a key that has none: its absence is the complaint


class Table:
    """One TOML table being read. It knows its key path, so that every complaint can name the key."""

    def __init__(self, values: Mapping[str, Any], path: str, allowed: Iterable[str]) -> None:
        self.values = values
        self.path = path
        allowed = tuple(allowed)
        for key in values:
            if key not in allowed:
                raise ValidationError(f"{self.at(key)}: unknown key (expected one of: {', '.join(allowed)})")

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> ValidationError:
        return ValidationError(f"{self.at(key)}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any, kind_name: str) -> Any:
        if key not in self.values:
            if default is REQUIRED:
                raise self.fail(key, "required")
            return default
        value = self.values[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"{value!r} is not {kind_name}")
        if not isinstance(value, kind):
            raise self.fail(key, f"{value!r} is not {kind_name}")
        return value

    def text(
        self, key: str, default: Any = REQUIRED, pattern: re.Pattern[str] | None = None, hint: str = ""
    ) -> str:
        value: str = self.get(key, str, default, "a string")
        if pattern is not None and key in self.values and not pattern.fullmatch(value):
            raise self.fail(key, f"{value!r} is not a valid {key.replace('_', ' ')}{hint}")
        return value

    def integer(self, key: str, default: Any = REQUIRED, minimum: int = 0) -> int:
        value: int = self.get(key, int, default, "a whole number")
        if value < minimum:
            raise self.fail(key, f"{value} is less than {minimum}")
        return value

    def duration(self, key: str, default: timedelta) -> timedelta:
        text = self.get(key, str, default, 'a duration string such as "30m"')
        if key not in self.values:
            return default
        try:
            return parse_duration(text)
        except ValidationError as error:
            raise self.fail(key, error.message) from None

    def money(self, key: str) -> Decimal:
        raw = self.get(key, (str, int, float), REQUIRED, 'an amount such as "98.32"')
        try:
            amount = Decimal(str(raw))  # via str(): a TOML float 98.32 must not become 98.31999...
        except InvalidOperation:
            raise self.fail(key, f"{raw!r} is not an amount") from None
        if not amount.is_finite() or amount <= 0:
            raise self.fail(key, f"{raw} is not a positive amount")
        return amount

    def table(self, key: str) -> Mapping[str, Any] | None:
        return self.get(key, dict, None, "a table")

    def tables(self, key: str) -> list[Mapping[str, Any]]:
        values = self.get(key, list, [], "an array of tables")
        for index, value in enumerate(values):
            if not isinstance(value, dict):
                raise ValidationError(f"{self.at(key)}[{index}]: {value!r} is not a table")
        return values

    def pair(self, key: str, default: tuple[Any, Any], read: type) -> tuple[Any, Any]:
        """A ``[low, high]`` range."""
        if key not in self.values:
            return default
        value = self.values[key]
        if not (isinstance(value, list) and len(value) == 2 and all(is_number(item, read) for item in value)):
            raise self.fail(key, f"{value!r} is not a [low, high] pair of numbers")
        low, high = (read(item) for item in value)
        if low > high:
            raise self.fail(key, f"{low} is more than {high}")
        return (low, high)


def is_number(value: Any, read: type) -> bool:
    """A TOML number ``read`` accepts: a whole number for ``int``, either kind for ``float``; TOML's
    booleans are never numbers, though Python counts them as ints."""
    kinds: tuple[type, ...] = (int, float) if read is float else (int,)
    return isinstance(value, kinds) and not isinstance(value, bool)


def refuse_repeats(path: str, keys: list[tuple[str, ...]], what: str) -> None:
    """Name the first entry of the array ``path`` whose key was already an earlier entry's."""
    first_index: dict[tuple[str, ...], int] = {}
    for index, key in enumerate(keys):
        if key in first_index:
            raise ValidationError(
                f"{path}[{index}]: same {what} as {path}[{first_index[key]}] ({' in '.join(key)})"
            )
        first_index[key] = index
