"""Model-driven validation of awsJson1.1 request bodies.

:func:`parse_request` walks a decoded request body alongside the operation's botocore input shape and
checks everything the model states: known members only, required members, JSON types, numeric ranges,
string/list/map lengths, enums, patterns and union (exactly-one-member) structures. All problems are
collected (the first :data:`MAX_ERRORS` are reported) into one :class:`~hyperplan.errors.ValidationError`
whose message names each member by its path as written on the wire, for example::

    2 validation errors detected: Value '0' at 'InstanceGroups[0].ThreadsPerCore' failed to satisfy
    constraint: Member must have value greater than or equal to 1; Value null at 'ClusterName' failed to
    satisfy constraint: Member is required and must not be null

Paths: structure members are joined with ``.``, list items are ``[i]`` and map values are
``["key"]`` (the key JSON-quoted, because label keys such as ``a.b/c`` contain dots and slashes).

One exception to the model: an instance type outside AWS's list (of a training plan, a training job or
a HyperPod instance group) goes on to the service when it is spelt as an instance type, since which
types exist is the fleet's to say (wire/fleet_types.py).

Patterns in the model are written for Java's ``java.util.regex``: `hyperplan.wire.java_regex` compiles
them for Python.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StringShape, StructureShape

from hyperplan.errors import SerializationError, ValidationError
from hyperplan.wire.fleet_types import left_to_the_fleet
from hyperplan.wire.java_regex import compiled_pattern

log = logging.getLogger(__name__)

MAX_ERRORS = 10
# Recursive shapes (e.g. SearchExpression.SubExpressions) would let a deep body exhaust the stack.
MAX_DEPTH = 64
# Implicit bounds of the Java integer types behind the model's integer and long shapes.
TYPE_BOUNDS: dict[str, tuple[int, int]] = {
    "integer": (-(2**31), 2**31 - 1),
    "long": (-(2**63), 2**63 - 1),
}


# --------------------------------------------------------------------------------------------- body


def decode_body(raw: bytes) -> object:
    """Decode a request body; an empty body is an empty object, as the AWS SDKs send for no input."""
    if not raw.strip():
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SerializationError("request body is not valid UTF-8") from None
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        # JSONDecodeError is a ValueError; RecursionError comes from absurdly deep nesting.
        raise SerializationError(f"request body is not valid JSON: {exc}") from None


def _reject_constant(name: str) -> object:
    # NaN and Infinity are not JSON, although Python's json module accepts them by default.
    raise ValueError(f"{name} is not a valid JSON value")


# One decoder for every body: json.loads with an option builds a new one per call, a quarter of its cost.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def parse_request(op: OperationModel, body: object) -> dict[str, Any]:
    """Validate ``body`` against ``op``'s input shape; return a converted copy or raise ValidationError.

    Timestamps become timezone-aware UTC datetimes and blobs become bytes; everything else is returned as
    given. Members sent as JSON null are treated as absent and left out. The input is never mutated.
    """
    if not isinstance(body, dict):
        raise SerializationError("request body must be a JSON object")
    shape = op.input_shape
    report = _Report()
    if shape is None:
        for key in body:
            report.add(f"Unknown member {key!r} in {op.name} (the operation takes no input)")
        report.raise_if_any()
        return {}
    result = _check_structure(shape, body, _Where("", report, 0))
    report.raise_if_any()
    return result


# ---------------------------------------------------------------------------------------- reporting


class _Report:
    """Collects error messages; keeps the first MAX_ERRORS but counts them all."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_ERRORS:
            self.messages.append(message)

    def raise_if_any(self) -> None:
        if not self.count:
            return
        noun = "error" if self.count == 1 else "errors"
        shown = "" if self.count <= len(self.messages) else f" (showing the first {len(self.messages)})"
        raise ValidationError(f"{self.count} validation {noun} detected{shown}: " + "; ".join(self.messages))


class _Where:
    """Where in the body the walk is: the wire path, the shared report and the nesting depth."""

    __slots__ = ("depth", "path", "report")

    def __init__(self, path: str, report: _Report, depth: int) -> None:
        self.path = path
        self.report = report
        self.depth = depth

    def member(self, name: str) -> _Where:
        return _Where(f"{self.path}.{name}" if self.path else name, self.report, self.depth + 1)

    def item(self, index: int) -> _Where:
        return _Where(f"{self.path}[{index}]", self.report, self.depth + 1)

    def entry(self, key: str) -> _Where:
        return _Where(f"{self.path}[{json.dumps(key, ensure_ascii=False)}]", self.report, self.depth + 1)

    def fail(self, value: object, shape: Shape | None, constraint: str) -> None:
        shown = _show(value, shape)
        self.report.add(f"Value {shown} at '{self.path}' failed to satisfy constraint: {constraint}")


def _show(value: object, shape: Shape | None) -> str:
    """Render a value for a message: AWS-style single quotes, truncated, and sensitive values hidden."""
    if value is None:
        return "null"
    if shape is not None and shape.metadata.get("sensitive"):
        return "'***'"
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    if len(text) > 64:
        text = text[:61] + "..."
    return f"'{text}'"


def json_type(value: object) -> str:
    """The JSON type name of a decoded value, for 'got ...' in type errors."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


# ------------------------------------------------------------------------------------ the shape walk


def _check(shape: Shape, value: Any, where: _Where) -> Any:
    """Validate one non-null value and return it converted; on errors the return value is unused."""
    if where.depth > MAX_DEPTH:
        where.fail(value, shape, f"Member must not be nested more than {MAX_DEPTH} levels deep")
        return None
    checker = _CHECKERS.get(shape.type_name)
    if checker is None:
        # A new shape type in a botocore upgrade: refuse loudly rather than let it through unchecked.
        where.fail(value, shape, f"Member has unsupported shape type {shape.type_name!r}")
        return None
    return checker(shape, value, where)


def _check_structure(shape: Shape, value: Any, where: _Where) -> Any:
    assert isinstance(shape, StructureShape)
    if shape.is_document_type:
        return value  # free-form JSON by definition
    if not isinstance(value, dict):
        where.fail(value, shape, f"Member must be an object, got {json_type(value)}")
        return None
    by_wire_name = _wire_names(shape)
    result: dict[str, Any] = {}
    for key, item in value.items():
        name = by_wire_name.get(key)
        if name is None:
            where.report.add(f"Unknown member {where.member(key).path!r} in {shape.name}")
        elif item is not None:
            result[name] = _check(shape.members[name], item, where.member(key))
    for name in shape.required_members:
        if name not in result:  # absent or null; a present-but-invalid member was reported already
            member = shape.members[name]
            where.member(member.serialization.get("name", name)).fail(
                None, member, "Member is required and must not be null"
            )
    if shape.is_tagged_union and len(result) != 1:
        given = ", ".join(sorted(result)) or "none"
        where.fail(value, shape, f"Union must have exactly one member set, got {len(result)} ({given})")
    return result


def _wire_names(shape: StructureShape) -> dict[str, str]:
    """A structure's member names by the names its members have on the wire, worked out once per shape
    (the model's shapes live as long as the process; botocore's are compared by identity)."""
    found = _WIRE_NAMES.get(shape)
    if found is None:
        found = {m.serialization.get("name", name): name for name, m in shape.members.items()}
        if len(_WIRE_NAMES) >= 10_000:  # shapes made afresh (not the cached models'): bounded all the same
            _WIRE_NAMES.clear()
        _WIRE_NAMES[shape] = found
    return found


_WIRE_NAMES: dict[StructureShape, dict[str, str]] = {}


def _check_list(shape: Shape, value: Any, where: _Where) -> Any:
    assert isinstance(shape, ListShape)
    if not isinstance(value, list):
        where.fail(value, shape, f"Member must be an array, got {json_type(value)}")
        return None
    _check_length(shape, value, len(value), where)
    result = []
    for index, item in enumerate(value):
        if item is None:
            where.item(index).fail(None, shape.member, "List items must not be null")
        else:
            result.append(_check(shape.member, item, where.item(index)))
    return result


def _check_map(shape: Shape, value: Any, where: _Where) -> Any:
    assert isinstance(shape, MapShape)
    if not isinstance(value, dict):
        where.fail(value, shape, f"Member must be an object, got {json_type(value)}")
        return None
    _check_length(shape, value, len(value), where)
    result: dict[str, Any] = {}
    for key, item in value.items():
        for problem in _string_problems(shape.key, key):
            where.fail(key, shape.key, "Map key " + problem.removeprefix("Member "))
        if item is None:
            where.entry(key).fail(None, shape.value, "Map values must not be null")
        else:
            result[key] = _check(shape.value, item, where.entry(key))
    return result


def _check_string(shape: Shape, value: Any, where: _Where) -> Any:
    if not isinstance(value, str):
        where.fail(value, shape, f"Member must be a string, got {json_type(value)}")
        return None
    for problem in _string_problems(shape, value):
        where.fail(value, shape, problem)
    return value


def _string_problems(shape: Shape, value: str) -> list[str]:
    """Length, enum and pattern violations of a string (also used for map keys)."""
    problems = _length_problems(shape, len(value))
    enum = shape.enum if isinstance(shape, StringShape) else []
    if enum and value not in enum and not left_to_the_fleet(shape.name, value):
        problems.append(f"Member must satisfy enum value set: [{', '.join(enum)}]")
    pattern = shape.metadata.get("pattern")
    if pattern and not problems:
        compiled = compiled_pattern(pattern)
        # Only checked once the length is right: a too-long string rarely needs a second complaint.
        if compiled is not None and compiled.fullmatch(value) is None:
            problems.append(f"Member must satisfy regular expression pattern: {pattern}")
    return problems


def _check_length(shape: Shape, value: Any, length: int, where: _Where) -> None:
    for problem in _length_problems(shape, length):
        where.fail(value, shape, problem)


def _length_problems(shape: Shape, length: int) -> list[str]:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low is not None and length < low:
        return [f"Member must have length greater than or equal to {low}"]
    if high is not None and length > high:
        return [f"Member must have length less than or equal to {high}"]
    return []


def _check_integer(shape: Shape, value: Any, where: _Where) -> Any:
    # bool is a subclass of int in Python, but true is not a number in JSON.
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 is the integer 3 in JSON; Jackson (AWS's parser) reads it so too.
    if isinstance(value, bool) or not isinstance(value, int):
        kind = "a non-integral number" if isinstance(value, float) else json_type(value)
        where.fail(value, shape, f"Member must be an integer, got {kind}")
        return None
    low, high = TYPE_BOUNDS[shape.type_name]
    _check_range(shape, value, where, low, high)
    return value


def _check_float(shape: Shape, value: Any, where: _Where) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        where.fail(value, shape, f"Member must be a number, got {json_type(value)}")
        return None
    if not math.isfinite(value):
        where.fail(value, shape, "Member must be a finite number")
        return None
    _check_range(shape, value, where, None, None)
    return value


def _check_range(shape: Shape, value: float, where: _Where, low: float | None, high: float | None) -> None:
    # The model's own bounds win; the type's implicit bounds only apply where the model has none.
    low = shape.metadata.get("min", low)
    high = shape.metadata.get("max", high)
    if low is not None and value < low:
        where.fail(value, shape, f"Member must have value greater than or equal to {low}")
    elif high is not None and value > high:
        where.fail(value, shape, f"Member must have value less than or equal to {high}")


def _check_boolean(shape: Shape, value: Any, where: _Where) -> Any:
    if not isinstance(value, bool):
        where.fail(value, shape, f"Member must be a boolean, got {json_type(value)}")
        return None
    return value


def _check_timestamp(shape: Shape, value: Any, where: _Where) -> Any:
    parsed = parse_timestamp(value)
    if parsed is None:
        where.fail(
            value, shape, f"Member must be a timestamp (epoch seconds or ISO 8601), got {json_type(value)}"
        )
    return parsed


def parse_timestamp(value: object) -> datetime | None:
    """Epoch seconds (what botocore sends on the JSON protocol) or an ISO 8601 string, as aware UTC."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return None  # NaN, infinities and dates outside datetime's range
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
            # A timestamp without an offset is read as UTC, the only zone the wire protocol knows.
            return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        except (ValueError, OverflowError):  # OverflowError: the year 9999 in a zone behind UTC
            return None
    return None


def _check_blob(shape: Shape, value: Any, where: _Where) -> Any:
    if not isinstance(value, str):
        where.fail(value, shape, f"Member must be a base64-encoded string, got {json_type(value)}")
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        where.fail(value, shape, "Member must be valid base64")
        return None
    _check_length(shape, value, len(data), where)
    return data


_CHECKERS: dict[str, Callable[[Shape, Any, _Where], Any]] = {
    "structure": _check_structure,
    "list": _check_list,
    "map": _check_map,
    "string": _check_string,
    "integer": _check_integer,
    "long": _check_integer,
    "float": _check_float,
    "double": _check_float,
    "boolean": _check_boolean,
    "timestamp": _check_timestamp,
    "blob": _check_blob,
}


def check_output(op: OperationModel, body: object) -> dict[str, Any]:
    """Check a JSON response body against ``op``'s output shape, with the same rules as requests.

    Tests use it on every answer their clients receive, so that a handler cannot send what the model
    lacks without a test noticing.
    """
    shape = op.output_shape
    if shape is None:
        if body not in ({}, None):
            raise ValidationError(f"{op.name} has no output, but the response holds {body!r}")
        return {}
    if not isinstance(body, dict):
        raise ValidationError(f"{op.name} response is not a JSON object")
    report = _Report()
    result = _check_structure(shape, body, _Where("", report, 0))
    report.raise_if_any()
    return result
