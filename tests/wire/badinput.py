"""Derive invalid request bodies from a valid one, driven by the botocore input shape.

``bad_inputs(op, valid)`` walks a *valid* JSON request body alongside the operation's input shape and
yields ``(description, body, path)`` triples: a body that breaks exactly one rule at one place, and the
wire path (``InstanceGroups[0].InstanceCount``) that the ValidationError message must name. Every
present member gets: removal if required, wrong JSON types, out-of-range numbers, too short/long strings,
lists and maps, a pattern-violating string of legal length, an off-enum value, and an unknown sibling.

Usable from any test (HTTP tests too): only the shape and the valid body go in, plain JSON comes out.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StringShape, StructureShape

from hyperplan.wire.java_regex import compiled_pattern
from hyperplan.wire.validate import TYPE_BOUNDS

BadInput = tuple[str, dict[str, Any], str]

# Above this a too-long string or list would only slow the tests down.
MAX_GENERATED_LENGTH = 100_000
UNKNOWN_MEMBER = "NotAModelledMember"

# Values of the wrong JSON type for each shape type. null is absent, so it is never "wrong".
WRONG_TYPES: dict[str, list[tuple[str, Any]]] = {
    "structure": [("a string", "not-an-object"), ("an array", [])],
    "list": [("a string", "not-a-list"), ("an object", {})],
    "map": [("an array", []), ("a string", "not-a-map")],
    "string": [("a number", 7), ("a boolean", True), ("an array", ["x"])],
    "integer": [("a string", "1"), ("a boolean", True), ("a non-integral number", 1.5)],
    "long": [("a string", "1"), ("a boolean", False), ("a non-integral number", 2.5)],
    "float": [("a string", "1.5"), ("a boolean", True)],
    "double": [("a string", "1.5"), ("a boolean", True)],
    "boolean": [("a string", "true"), ("a number", 1)],
    "timestamp": [("a boolean", True), ("a non-ISO string", "next tuesday"), ("an object", {})],
    "blob": [("a number", 1), ("a non-base64 string", "not base64!")],
}

# Characters tried when looking for a string that a pattern refuses.
PROBES = ["!", " ", "#", "*", "~", "\n", "é", "/", ":", ".", "-", "_", "A", "a", "0", "\x7f"]


class _Delete:
    """Marker: remove the member instead of replacing it."""


DELETE = _Delete()


@dataclass(frozen=True)
class _Change:
    description: str
    location: tuple[str | int, ...]  # keys and indices from the body's root to the changed value
    value: Any  # the new value, or DELETE
    path: str  # the wire path the error must name


def bad_inputs(op: OperationModel, valid: dict[str, Any]) -> Iterator[BadInput]:
    """Yield ``(description, body, expected path)`` for every single-rule violation derivable from
    ``valid``; each body is a fresh deep copy, so callers may mutate it."""
    shape = op.input_shape
    if shape is None:
        return
    for change in _structure_changes(shape, valid, (), ""):
        yield f"{change.path}: {change.description}", _apply(valid, change), change.path


def _apply(valid: dict[str, Any], change: _Change) -> dict[str, Any]:
    body = copy.deepcopy(valid)
    parent: Any = body
    for key in change.location[:-1]:
        parent = parent[key]
    last = change.location[-1]
    if change.value is DELETE:
        del parent[last]
    else:
        parent[last] = change.value
    return body


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _changes(shape: Shape, value: Any, location: tuple[str | int, ...], path: str) -> Iterator[_Change]:
    """All single-rule violations of one present value and of everything nested in it."""
    if isinstance(shape, StructureShape) and shape.is_document_type:
        return  # free-form JSON: nothing is wrong
    for label, wrong in WRONG_TYPES.get(shape.type_name, []):
        yield _Change(f"{shape.type_name} given {label}", location, wrong, path)
    if isinstance(shape, StructureShape):
        yield from _structure_changes(shape, value, location, path)
    elif isinstance(shape, ListShape):
        yield from _list_changes(shape, value, location, path)
    elif isinstance(shape, MapShape):
        yield from _map_changes(shape, value, location, path)
    elif shape.type_name == "string":
        yield from _string_changes(shape, value, location, path)
    elif shape.type_name in ("integer", "long", "float", "double"):
        yield from _number_changes(shape, location, path)


def _structure_changes(
    shape: StructureShape, value: dict[str, Any], location: tuple[str | int, ...], path: str
) -> Iterator[_Change]:
    for name in shape.required_members:
        if name in value:
            yield _Change("required member removed", (*location, name), DELETE, _join(path, name))
    assert UNKNOWN_MEMBER not in shape.members
    yield _Change("unknown member added", (*location, UNKNOWN_MEMBER), "x", _join(path, UNKNOWN_MEMBER))
    for name, item in value.items():
        if item is not None:
            yield from _changes(shape.members[name], item, (*location, name), _join(path, name))


def _list_changes(
    shape: ListShape, value: list[Any], location: tuple[str | int, ...], path: str
) -> Iterator[_Change]:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low and len(value) >= low:
        yield _Change(f"list shorter than {low}", location, value[: low - 1], path)
    if high is not None and value and high < MAX_GENERATED_LENGTH:
        padded = value + [value[0]] * (high + 1 - len(value))
        yield _Change(f"list longer than {high}", location, padded, path)
    for index, item in enumerate(value):
        yield from _changes(shape.member, item, (*location, index), f"{path}[{index}]")


def _map_changes(
    shape: MapShape, value: dict[str, Any], location: tuple[str | int, ...], path: str
) -> Iterator[_Change]:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low and len(value) >= low:
        yield _Change(f"map smaller than {low}", location, dict(list(value.items())[: low - 1]), path)
    if high is not None and value and high < MAX_GENERATED_LENGTH:
        first = next(iter(value.values()))
        padded = dict(value)
        for index in range(high + 1 - len(value)):
            padded[f"extra{index}"] = first  # the size error is named at the map's own path
        yield _Change(f"map larger than {high}", location, padded, path)
    for key, item in value.items():
        entry = f"{path}[{json.dumps(key, ensure_ascii=False)}]"
        yield from _changes(shape.value, item, (*location, key), entry)


def _string_changes(
    shape: Shape, value: str, location: tuple[str | int, ...], path: str
) -> Iterator[_Change]:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low and len(value) >= low:
        yield _Change(f"string shorter than {low}", location, value[: low - 1], path)
    if high is not None and high < MAX_GENERATED_LENGTH:
        filler = value[-1] if value else "a"
        yield _Change(f"string longer than {high}", location, value + filler * (high + 1 - len(value)), path)
    enum = shape.enum if isinstance(shape, StringShape) else []
    if enum:
        yield _Change("value not in the enum", location, _off_enum(value, enum), path)
    violation = pattern_violation(shape, value)
    if violation is not None:
        yield _Change(f"string violating pattern {shape.metadata['pattern']}", location, violation, path)


def _off_enum(value: str, enum: list[str]) -> str:
    # A case change is the most realistic mistake ("active" for "Active").
    for candidate in (value.swapcase(), value.lower(), value + "-not-in-enum"):
        if candidate not in enum:
            return candidate
    raise AssertionError("unreachable: value + suffix cannot be in the enum")


def pattern_violation(shape: Shape, value: str) -> str | None:
    """A string of legal length that the shape's pattern refuses, derived from ``value``; None when the
    pattern accepts everything of that length (``[\\S\\s]*``) or the pattern is not enforced."""
    pattern = shape.metadata.get("pattern")
    compiled = compiled_pattern(pattern) if pattern else None
    if compiled is None:
        return None
    low = shape.metadata.get("min", 0)
    high = shape.metadata.get("max", MAX_GENERATED_LENGTH)
    for candidate in _candidates(value, max(low, 1)):
        if low <= len(candidate) <= high and compiled.fullmatch(candidate) is None:
            return candidate
    return None


def _candidates(value: str, length: int) -> Iterator[str]:
    yield ""
    for probe in PROBES:
        if value:
            yield value[:-1] + probe
            yield probe + value[1:]
        yield value + probe
        yield probe + value
        yield probe * length


def _number_changes(shape: Shape, location: tuple[str | int, ...], path: str) -> Iterator[_Change]:
    implicit = TYPE_BOUNDS.get(shape.type_name, (None, None))
    low = shape.metadata.get("min", implicit[0])
    high = shape.metadata.get("max", implicit[1])
    if low is not None:
        yield _Change(f"number below the minimum {low}", location, low - 1, path)
    if high is not None:
        yield _Change(f"number above the maximum {high}", location, high + 1, path)
