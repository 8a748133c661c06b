"""S3's XML documents read against botocore's shapes, as the REST-XML protocol lays them out.

One walk serves both directions: a request's XML body (DeleteObjects' ``<Delete>``,
CompleteMultipartUpload's parts, CreateBucket's configuration, PutObjectTagging's ``<Tagging>``) is read
into values or refused with the problems found, and a response's body is checked in tests
(wire/s3_responses.py). What the walk enforces is what the model states: each element is a member of its
structure (by the member's XML name; a flattened list's items repeat under the member's name, a
wrapped list's items sit in the list's element under their own name, ``member`` unless the model says),
a member that is not a flattened list appears once, a leaf holds text and no elements, the text is of the
member's type (whole numbers, ``true``/``false``, ISO 8601 times, base64 blobs), strings are within the
model's lengths and enums, numbers within its bounds, and required members are present.

Pure: values in, values and problems out.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from xml.etree.ElementTree import Element

from botocore.model import ListShape, MapShape, Shape, StructureShape
from botocore.utils import parse_timestamp

MAX_DEPTH = 32
"""S3's documents nest a few levels; a deeper one is refused, not walked."""


@dataclass(frozen=True)
class Problem:
    path: str
    message: str
    kind: str = "schema"
    """``schema`` (the document's layout or a type) or ``enum`` / ``length`` / ``range`` (a value)."""

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def local_name(element: Element) -> str:
    return element.tag.rsplit("}", 1)[-1]


def namespace(element: Element) -> str:
    return element.tag[1:].split("}", 1)[0] if element.tag.startswith("{") else ""


def member_xml_name(name: str, shape: Shape) -> str:
    """The element name of a structure's member (botocore's RestXMLParser: a flattened list's items are
    named by the list member's name when it has one)."""
    if isinstance(shape, ListShape) and shape.serialization.get("flattened"):
        item_name = shape.member.serialization.get("name")
        if item_name is not None:
            return str(item_name)
    return str(shape.serialization.get("name", name))


def read(shape: Shape, element: Element, path: str, problems: list[Problem]) -> Any:
    """The value of `element` read as `shape`; what does not fit is added to `problems`."""
    return _read(shape, element, path, problems, 0)


def _read(shape: Shape, element: Element, path: str, problems: list[Problem], depth: int) -> Any:
    if depth > MAX_DEPTH:
        problems.append(Problem(path, "the document nests too deeply"))
        return None
    if isinstance(shape, StructureShape):
        return _structure(shape, element, path, problems, depth)
    if isinstance(shape, ListShape):
        item_name = str(shape.member.serialization.get("name", "member"))
        items = []
        for index, child in enumerate(element):
            if local_name(child) != item_name:
                problems.append(Problem(path, f"<{local_name(child)}> where only <{item_name}> items may be"))
                continue
            items.append(_read(shape.member, child, f"{path}[{index}]", problems, depth + 1))
        _check_length(shape, len(items), path, problems)
        return items
    if isinstance(shape, MapShape):
        problems.append(Problem(path, "a map, which no S3 document served here holds"))
        return None
    if len(element):
        problems.append(Problem(path, f"holds <{local_name(element[0])}> where text is expected"))
        return None
    return leaf(shape, element.text or "", path, problems)


def _structure(
    shape: StructureShape, element: Element, path: str, problems: list[Problem], depth: int
) -> dict[str, Any]:
    by_xml_name = {
        member_xml_name(name, member): name
        for name, member in shape.members.items()
        if not member.serialization.get("xmlAttribute") and member.serialization.get("location") is None
    }
    found: dict[str, list[Element]] = {}
    for child in element:
        name = by_xml_name.get(local_name(child))
        if name is None:
            problems.append(Problem(path or local_name(element), f"unknown element <{local_name(child)}>"))
            continue
        found.setdefault(name, []).append(child)
    value: dict[str, Any] = {}
    for name, children in found.items():
        member = shape.members[name]
        where = f"{path}.{name}" if path else name
        if isinstance(member, ListShape) and member.serialization.get("flattened"):
            items = [
                _read(member.member, child, f"{where}[{index}]", problems, depth + 1)
                for index, child in enumerate(children)
            ]
            _check_length(member, len(items), where, problems)
            value[name] = items
            continue
        if len(children) > 1:
            problems.append(Problem(where, f"<{local_name(children[0])}> appears {len(children)} times"))
        value[name] = _read(member, children[0], where, problems, depth + 1)
    for name in shape.required_members:
        if name not in value:
            where = f"{path}.{name}" if path else name
            problems.append(Problem(where, "is required and missing"))
    return value


def leaf(shape: Shape, text: str, path: str, problems: list[Problem]) -> Any:
    """A scalar's text as its type says (as in an XML body; headers have their own time format)."""
    kind = shape.type_name
    if kind in ("integer", "long"):
        stripped = text.strip()
        digits = stripped[1:] if stripped.startswith("-") else stripped
        if not digits.isdigit():
            problems.append(Problem(path, f"must be a whole number, not {text[:60]!r}"))
            return None
        number = int(stripped)
        low, high = shape.metadata.get("min"), shape.metadata.get("max")
        if (low is not None and number < low) or (high is not None and number > high):
            problems.append(Problem(path, f"{number} is outside {low}..{high}", "range"))
        return number
    if kind == "boolean":
        if text.strip() not in ("true", "false"):
            problems.append(Problem(path, f"must be true or false, not {text[:60]!r}"))
            return None
        return text.strip() == "true"
    if kind == "timestamp":
        return _timestamp(text, path, problems)
    if kind == "blob":
        try:
            return base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            problems.append(Problem(path, "must be base64"))
            return None
    if kind in ("float", "double"):
        try:
            return float(text)
        except ValueError:
            problems.append(Problem(path, f"must be a number, not {text[:60]!r}"))
            return None
    if shape.enum and text not in shape.enum:
        problems.append(Problem(path, f"{text[:60]!r} is not one of {', '.join(shape.enum)}", "enum"))
    _check_length(shape, len(text), path, problems)
    return text


def _timestamp(text: str, path: str, problems: list[Problem]) -> datetime | None:
    try:
        return parse_timestamp(text.strip())
    except (ValueError, TypeError, OverflowError):
        problems.append(Problem(path, f"must be an ISO 8601 time, not {text[:60]!r}"))
        return None


def _check_length(shape: Shape, length: int, path: str, problems: list[Problem]) -> None:
    low, high = shape.metadata.get("min"), shape.metadata.get("max")
    if low is not None and length < low:
        problems.append(Problem(path, f"must hold at least {low} (holds {length})", "length"))
    if high is not None and length > high:
        problems.append(Problem(path, f"must hold at most {high} (holds {length})", "length"))


def summary(problems: Iterable[Problem], shown: int = 5) -> str:
    listed = list(problems)
    text = "; ".join(str(problem) for problem in listed[:shown])
    return text + (f" (and {len(listed) - shown} more)" if len(listed) > shown else "")
