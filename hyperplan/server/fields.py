"""What enters through the native API, checked where it enters.

Every native handler reads its body, path and query through these parsers, so each value is of the
right type and inside its range before a service sees it, and a refusal is a ValidationException that
names the field and says what it may be. The body itself is parsed here too, with limits on nesting and
size, so no request can make the parser recurse or the store overflow. docs/API.md lists the limits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from hyperplan.errors import SerializationError, ValidationError

MAX_BODY_DEPTH = 32
"""Arrays and objects nested deeper than this are refused before they are parsed."""
MAX_BODY_MEMBERS = 10_000
"""Object members and array items, counted over the whole body."""
MAX_NUMBER_LENGTH = 100
"""Characters of one JSON number: enough for any real value, too few to make int() or Decimal() slow."""
MAX_TEXT_LENGTH = 1024
"""The default for free-text fields (reasons, names that are looked up)."""
MAX_ROW_ID = 2**31 - 1
"""Ids are INTEGER primary keys: 64 bits on SQLite, 32 on PostgreSQL; the narrower range on both (a
larger id cannot even be compared with PostgreSQL's column)."""
_SHOWN = 64  # characters of a refused value echoed back in a message

# A JSON string (also an unterminated one, to the end of the text) or a bracket. The string alternative
# always matches from a quote, so the scan is linear whatever the body holds.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)
_DIGITS = re.compile(r"[0-9]+")
_PLAIN_DECIMAL = re.compile(r"([0-9]+)(?:\.([0-9]+))?")


# -- the body ------------------------------------------------------------------------------------------


def json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object ({} for an empty body), or a SerializationException."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SerializationError(f"The request body is not UTF-8: {exc}.") from None
    _check_depth(text)
    try:
        body = json.loads(text, parse_int=_json_int, parse_float=_json_decimal, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SerializationError(f"The request body is not valid JSON: {exc}.") from None
    if not isinstance(body, dict):
        raise SerializationError("The request body must be a JSON object.")
    _check_members(body)
    return body


def _check_depth(text: str) -> None:
    """Refuse deep nesting before json.loads sees it: the parser recurses once per level."""
    depth = 0
    for token in _TOKEN.finditer(text):
        bracket = token.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_BODY_DEPTH:
                raise SerializationError(
                    f"The request body nests arrays and objects more than {MAX_BODY_DEPTH} levels deep."
                )
        elif bracket in ("]", "}"):
            depth -= 1


def _check_members(body: dict[str, Any]) -> None:
    """Count every member and item, and refuse strings the store cannot hold (unpaired surrogates)."""
    count = 0
    pending: list[dict[str, Any] | list[Any]] = [body]
    while pending:
        value = pending.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            count += 1
            if count > MAX_BODY_MEMBERS:
                raise SerializationError(
                    f"The request body has more than {MAX_BODY_MEMBERS} members and items in all."
                )
            for part in (key, item):
                if isinstance(part, str) and not _is_unicode(part):
                    raise SerializationError(
                        f"The request body holds a string with an unpaired surrogate ({_shown(part)})."
                    )
            if isinstance(item, dict | list):
                pending.append(item)


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_int(text: str) -> int:
    if len(text) > MAX_NUMBER_LENGTH:
        raise SerializationError(f"The request body has a number of more than {MAX_NUMBER_LENGTH} digits.")
    return int(text)


def _json_decimal(text: str) -> Decimal:
    """Fractions stay exact (and never become inf); no native field takes one, so they are refused by
    the field's own check with its name."""
    if len(text) > MAX_NUMBER_LENGTH:
        raise SerializationError(
            f"The request body has a number of more than {MAX_NUMBER_LENGTH} characters."
        )
    try:
        return Decimal(text)
    except InvalidOperation:
        raise SerializationError(f"The request body has a number out of any range: {_shown(text)}.") from None


def _no_constant(text: str) -> Any:
    raise SerializationError(f"{text} is not a JSON number; the request body must be strict JSON.")


def only_members(body: Mapping[str, Any], allowed: Collection[str], where: str = "The request body") -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        takes = f"takes {', '.join(sorted(allowed))}" if allowed else "takes no members"
        raise ValidationError(f"{where}: unknown member(s) {', '.join(map(_shown, unknown))}; it {takes}.")


# -- body fields ---------------------------------------------------------------------------------------


def text(
    body: Mapping[str, Any], name: str, *, required: bool = True, max_length: int = MAX_TEXT_LENGTH
) -> str | None:
    value = _present(body, name, required)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string of 1 to {max_length} characters.")
    if not value or len(value) > max_length:
        raise ValidationError(
            f"{name} must be a string of 1 to {max_length} characters, not one of {len(value)}."
        )
    return value


def required_text(body: Mapping[str, Any], name: str, *, max_length: int = MAX_TEXT_LENGTH) -> str:
    value = text(body, name, max_length=max_length)
    assert value is not None
    return value


def boolean(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise ValidationError(f"{name} must be true or false.")
    return value


def whole(
    body: Mapping[str, Any], name: str, low: int, high: int, *, required: bool = False, within: str = ""
) -> int | None:
    """A JSON integer in low..high; 1.0, "1" and true are not integers. `within` names the object that
    holds the member, for the message ("Quotas")."""
    value = _present(body, name, required)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        shown = f"{within}.{name}" if within else name
        raise ValidationError(f"{shown} must be a whole number from {low} to {high}, not {_shown(value)}.")
    return value


def money(
    body: Mapping[str, Any], name: str, *, maximum: Decimal, places: int, currency: str
) -> Decimal | None:
    """A plain decimal string from 0 to `maximum` with at most `places` decimal places ("2500.00"): a
    string so that no float rounds it, plain so that no exponent or sign gets past a reader."""
    value = body.get(name)
    if value is None:
        return None
    rule = (
        f"{name} must be a decimal string from 0 to {maximum} {currency} with at most {places} decimal "
        f'places, such as "2500.00"'
    )
    if not isinstance(value, str):
        raise ValidationError(f"{rule}, not {_shown(value)}.")
    match = _PLAIN_DECIMAL.fullmatch(value) if len(value) <= MAX_NUMBER_LENGTH else None
    if match is None or len(match[2] or "") > places or Decimal(value) > maximum:
        raise ValidationError(f"{rule}, not {_shown(value)}.")
    return Decimal(value)


def text_list(body: Mapping[str, Any], name: str, *, max_items: int, max_length: int) -> list[str]:
    """A required non-empty list of strings without NUL characters (they end a C string: an argv)."""
    value = _present(body, name, True)
    rule = f"{name} must be a list of 1 to {max_items} strings of at most {max_length} characters"
    if not isinstance(value, list) or not 1 <= len(value) <= max_items:
        raise ValidationError(f"{rule}.")
    for index, item in enumerate(value):
        if not isinstance(item, str) or len(item) > max_length or "\0" in item:
            raise ValidationError(f"{rule}, without NUL characters; {name}[{index}] is not.")
    return value


def members(body: Mapping[str, Any], name: str, allowed: Collection[str]) -> Mapping[str, Any]:
    """An optional nested object with only the named members ({} when absent)."""
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError(f"{name} must be an object with the members {', '.join(sorted(allowed))}.")
    only_members(value, allowed, name)
    return value


def _present(body: Mapping[str, Any], name: str, required: bool) -> Any:
    value = body.get(name)
    if value is None and required:
        raise ValidationError(f"{name} is required.")
    return value


# -- path and query ------------------------------------------------------------------------------------


def row_id(value: str, name: str) -> int:
    """An id in a path: decimal digits within the column's range."""
    if not _DIGITS.fullmatch(value) or len(value) > len(str(MAX_ROW_ID)) or not 1 <= int(value) <= MAX_ROW_ID:
        raise ValidationError(f"{name} must be a whole number from 1 to {MAX_ROW_ID}, not {_shown(value)}.")
    return int(value)


def query_whole(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value) or len(value) > len(str(high)) or not low <= int(value) <= high:
        raise ValidationError(f"{name} must be a whole number from {low} to {high}, not {_shown(value)}.")
    return int(value)


def query_text(query: Mapping[str, str], name: str, *, max_length: int = MAX_TEXT_LENGTH) -> str | None:
    value = query.get(name)
    if value is not None and len(value) > max_length:
        raise ValidationError(f"{name} must be at most {max_length} characters, not {len(value)}.")
    return value or None


def _shown(value: Any) -> str:
    """A refused value as a message shows it: repr, cut short."""
    shown = str(value) if isinstance(value, Decimal) else repr(value)
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."
