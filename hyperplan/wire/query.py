"""The AWS query protocol, as STS speaks it: a form body in (``Action``, ``Version``, members), XML out.

Only what the served operations need: their inputs have no nested members, so a member is a form field
of its own name; outputs are written from the model's output shape (structures, lists as ``member``
items, scalars), wrapped as the model's ``resultWrapper`` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from botocore.model import OperationModel, Shape

from hyperplan.errors import SerializationError, UnknownOperation


def parse_body(raw: bytes, version: str) -> tuple[str, dict[str, str]]:
    """The operation named by ``Action`` and the other fields; ``Version`` must be the model's."""
    try:
        pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(raw.strip()))
    except (UnicodeDecodeError, ValueError):
        raise SerializationError(
            "The request body is not a form (application/x-www-form-urlencoded)."
        ) from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise SerializationError(f"The parameter {name!r} is given more than once.")
        fields[name] = value
    action = fields.pop("Action", "")
    if not action:
        raise UnknownOperation("The request names no Action.")
    given = fields.pop("Version", None)
    if given != version:
        raise SerializationError(f"Version must be {version!r}, not {given!r}.")
    return action, fields


def render_response(op: OperationModel, payload: Mapping[str, Any], namespace: str, request_id: str) -> str:
    """``<OpResponse><OpResult>...</OpResult><ResponseMetadata>...`` from the (already checked) payload."""
    shape = op.output_shape
    wrapper = (shape.serialization.get("resultWrapper") if shape is not None else None) or f"{op.name}Result"
    inner = _members(shape, payload) if shape is not None else ""
    return (
        f'<{op.name}Response xmlns="{namespace}"><{wrapper}>{inner}</{wrapper}>'
        f"<ResponseMetadata><RequestId>{escape(request_id)}</RequestId></ResponseMetadata></{op.name}Response>"
    )


def _members(shape: Shape, value: Mapping[str, Any]) -> str:
    parts = []
    for name, member in shape.members.items():
        if name in value and value[name] is not None:
            tag = member.serialization.get("name", name)
            parts.append(f"<{tag}>{_value(member, value[name])}</{tag}>")
    return "".join(parts)


def _value(shape: Shape, value: Any) -> str:
    if shape.type_name == "structure":
        return _members(shape, value)
    if shape.type_name == "list":
        item = shape.member
        return "".join(f"<member>{_value(item, entry)}</member>" for entry in value)
    if shape.type_name == "boolean":
        return "true" if value else "false"
    if shape.type_name == "timestamp" and isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return escape(str(value))
