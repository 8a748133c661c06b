"""botocore's S3 model: the operations S3's endpoint serves, their query and header members and their
XML bodies checked.

S3 is REST-XML: an operation's input arrives in its path, query string, headers and (for a few) an XML
body. Every query-string and header member of the operation's input shape that the request carries is
checked here against its shape (a whole number, a boolean, one of the enum's values, a length), so a bad
value is a 400 InvalidArgument naming the member and the rule, never a surprise further in. An XML body
is read against the shape of the operation's payload member (wire/s3_xml.py): a document that is not
well-formed, whose root is not the payload's element, or that holds what the shape does not, is S3's
400 MalformedXML naming what is wrong.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from functools import cache, lru_cache
from typing import Any

import botocore.session
from botocore.model import OperationModel, ServiceModel, Shape

from hyperplan.errors import InvalidArgument, MalformedXML
from hyperplan.wire import s3_xml
from hyperplan.wire.s3_xml import Problem

MALFORMED = "The XML you provided was not well-formed or did not validate against our published schema"


@lru_cache(maxsize=1)
def service_model() -> ServiceModel:
    return botocore.session.get_session().get_service_model("s3")


@cache
def operation_model(name: str) -> OperationModel:
    return service_model().operation_model(name)


@cache
def _located(name: str) -> tuple[tuple[str, str, str, Shape], ...]:
    """(member, location, location name in lower case for headers, shape) of the operation's input."""
    shape = operation_model(name).input_shape
    found = []
    for member, member_shape in shape.members.items() if shape is not None else []:
        location = member_shape.serialization.get("location")
        if location in ("querystring", "header"):
            where = member_shape.serialization.get("name", member)
            found.append((member, location, where.lower() if location == "header" else where, member_shape))
    return tuple(found)


def check_request(name: str, query: Mapping[str, str], headers: Mapping[str, str]) -> None:
    """Refuse the first query or header member whose value its shape does not allow."""
    for member, location, where, shape in _located(name):
        value = (query if location == "querystring" else headers).get(where)
        if value is None:
            continue
        problem = _problem(shape, value)
        if problem is not None:
            place = "query parameter" if location == "querystring" else "header"
            raise InvalidArgument(f"{name}: {member} (the {place} {where!r}) {problem}; got {value[:100]!r}.")


def _problem(shape: Shape, value: str) -> str | None:
    kind = shape.type_name
    if kind in ("integer", "long"):
        text = value.strip()
        if not (text.isdigit() or (text.startswith("-") and text[1:].isdigit())):
            return "must be a whole number"
        number = int(text)
        low = shape.metadata.get("min")
        if low is not None and number < low:
            return f"must be at least {low}"
        return None
    if kind == "boolean":
        return None if value.strip().lower() in ("true", "false") else "must be true or false"
    if kind == "string":
        enum = shape.enum
        if enum and value not in enum:
            return "must be one of " + ", ".join(enum)
        low = shape.metadata.get("min")
        if low is not None and len(value) < low:
            return f"must be at least {low} characters long"
        high = shape.metadata.get("max")
        if high is not None and len(value) > high:
            return f"must be at most {high} characters long"
    return None


def payload(name: str) -> tuple[str, Shape] | None:
    """The operation's XML body member (name, shape), if it takes one (a structure, not a blob)."""
    shape = operation_model(name).input_shape
    member = shape.serialization.get("payload") if shape is not None else None
    if shape is None or member is None or shape.members[member].type_name != "structure":
        return None
    return member, shape.members[member]


def read_body(name: str, raw: bytes) -> tuple[dict[str, Any] | None, list[Problem]]:
    """The operation's XML body read against its payload's shape: (value, problems); (None, []) for an
    empty body (whether one is required is the caller's: S3 answers each operation in its own words).
    A body that is not XML is MalformedXML at once."""
    found = payload(name)
    if found is None or not raw.strip():
        return None, []
    member, shape = found
    try:
        document = ElementTree.fromstring(raw)
    except ElementTree.ParseError as error:
        raise MalformedXML(f"{MALFORMED}: {error}.") from None
    root = str(shape.serialization.get("name", member))
    if s3_xml.local_name(document) != root:
        raise MalformedXML(
            f"{MALFORMED}: {name} takes a <{root}> document, not <{s3_xml.local_name(document)}>."
        )
    problems: list[Problem] = []
    value = s3_xml.read(shape, document, root, problems)
    return value, problems


def refuse(name: str, problems: list[Problem]) -> None:
    """MalformedXML naming the body's problems, if there are any."""
    if problems:
        raise MalformedXML(f"{MALFORMED}: {name}: {s3_xml.summary(problems)}.")
