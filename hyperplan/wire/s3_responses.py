"""S3's answers checked against botocore's S3 model: status, headers and XML body (tests, development).

The S3 endpoint writes its XML by hand, so nothing but a check keeps it to the model. With
``HYPERPLAN_CHECK_RESPONSES=1`` in its environment (the test harnesses set it) the endpoint checks every
answer before sending it, and answers 500 InternalError naming the problems instead of one that does not
match (server/s3/endpoint.py); a boto3 client in a test may run the same check on what it receives.

The check, for an operation's successful answer:

- the status is the model's (``responseCode``, 200 unless it says), or 206 for a range of an object;
- every ``x-amz-*`` header is a header member of the output shape (or one of its prefixed maps, as
  ``x-amz-meta-``), or S3's own request ids; a header member's value is of its type;
- the body: none when the output shape has no body member, else an XML document of S3's namespace
  whose every element is a member, of its type, read by wire/s3_xml.py's walk; then botocore's own
  RestXMLParser parses the whole answer and botocore's validator checks the result against the shape.

An error's answer is S3's ``<Error>`` with a Code and a Message (none for a HEAD).
Pure: values in, a list of problems out.
"""

from __future__ import annotations

import email.utils
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from typing import Any

from botocore.model import Shape, StructureShape
from botocore.parsers import RestXMLParser
from botocore.validate import ParamValidator

from hyperplan.wire import s3_model, s3_xml

ENVIRONMENT = "HYPERPLAN_CHECK_RESPONSES"
NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
S3_OWN_HEADERS = frozenset({"x-amz-request-id", "x-amz-id-2"})
PARTIAL = frozenset({"GetObject", "HeadObject"})
"""The operations whose answer is 206 for a range."""


def problems(operation: str, status: int, headers: Mapping[str, str], body: bytes | None) -> list[str]:
    """What in this answer to `operation` the model does not allow; `body` None: not checked (an object's
    bytes, streamed)."""
    folded = {name.lower(): value for name, value in headers.items()}
    if status >= 300:
        return _error_problems(status, body)
    model = s3_model.operation_model(operation)
    found: list[str] = []
    expected = int(model.http.get("responseCode", 200))
    if status != expected and not (status == 206 and operation in PARTIAL and "content-range" in folded):
        found.append(f"status {status}, the model's is {expected}")
    shape = model.output_shape
    found += _header_problems(shape, folded)
    if body is not None:
        found += _body_problems(operation, shape, body)
        if not found and shape is not None and operation != "GetBucketLocation":
            found += _botocore_problems(shape, status, folded, body)
    return found


def _error_problems(status: int, body: bytes | None) -> list[str]:
    if not body:
        return []
    try:
        document = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        return [f"error {status}: the body is not XML ({error})"]
    names = [s3_xml.local_name(child) for child in document]
    found = []
    if s3_xml.local_name(document) != "Error":
        found.append(f"error {status}: the root is <{s3_xml.local_name(document)}>, not <Error>")
    found += [f"error {status}: no <{name}>" for name in ("Code", "Message") if name not in names]
    found += [f"error {status}: <{s3_xml.local_name(c)}> holds elements" for c in document if len(c)]
    return found


def _header_members(shape: StructureShape | None) -> tuple[dict[str, Shape], tuple[str, ...]]:
    exact: dict[str, Shape] = {}
    prefixes: list[str] = []
    for name, member in shape.members.items() if shape is not None else []:
        location = member.serialization.get("location")
        if location == "header":
            exact[str(member.serialization.get("name", name)).lower()] = member
        elif location == "headers":
            prefixes.append(str(member.serialization.get("name", "")).lower())
    return exact, tuple(prefixes)


def _header_problems(shape: StructureShape | None, headers: Mapping[str, str]) -> list[str]:
    exact, prefixes = _header_members(shape)
    found = []
    for name, value in headers.items():
        member = exact.get(name)
        if member is None:
            if name.startswith("x-amz-") and name not in S3_OWN_HEADERS and not name.startswith(prefixes):
                found.append(f"header {name!r} is not a member of the output")
            continue
        problem = _header_value_problem(member, value)
        if problem is not None:
            found.append(f"header {name!r}: {problem}")
    return found


def _header_value_problem(shape: Shape, value: str) -> str | None:
    if shape.type_name == "timestamp":
        try:
            email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return f"{value!r} is not an HTTP date"
        return None
    problems: list[s3_xml.Problem] = []
    s3_xml.leaf(shape, value, "", problems)
    return "; ".join(problem.message for problem in problems) or None


def _body_members(shape: StructureShape | None) -> dict[str, Shape]:
    return {
        name: member
        for name, member in (shape.members.items() if shape is not None else [])
        if member.serialization.get("location") is None
    }


def _body_problems(operation: str, shape: StructureShape | None, body: bytes) -> list[str]:
    payload = shape.serialization.get("payload") if shape is not None else None
    members = _body_members(shape)
    if payload is not None and shape is not None:
        payload_shape = shape.members[payload]
        if payload_shape.type_name != "structure":
            return []  # an object's bytes
        members = {payload: payload_shape}
    if not members:
        return [] if not body.strip() else [f"a body ({len(body)} bytes) where the model has none"]
    if not body.strip():
        return []  # every member absent
    try:
        document = ElementTree.fromstring(body)
    except ElementTree.ParseError as error:
        return [f"the body is not XML ({error})"]
    found = []
    if s3_xml.namespace(document) != NAMESPACE:
        found.append(f"<{s3_xml.local_name(document)}> is not in S3's namespace")
    if operation == "GetBucketLocation":  # the member is the document (botocore reads it by hand too)
        if s3_xml.local_name(document) != "LocationConstraint" or len(document):
            found.append("GetBucketLocation answers one <LocationConstraint> holding text")
        return found
    walked: list[s3_xml.Problem] = []
    if payload is not None and shape is not None:
        s3_xml.read(shape.members[payload], document, payload, walked)
    elif shape is not None:
        s3_xml.read(shape, document, "", walked)  # the walk leaves the header members out
    return found + [str(problem) for problem in walked]


def _botocore_problems(
    shape: StructureShape, status: int, headers: Mapping[str, str], body: bytes
) -> list[str]:
    """botocore's reading of the answer, validated against the shape as botocore validates a request."""
    response: dict[str, Any] = {"status_code": status, "headers": dict(headers), "body": body}
    try:
        parsed = RestXMLParser().parse(response, shape)
    except Exception as error:  # whatever botocore trips on is the problem reported
        return [f"botocore cannot parse the answer: {error!r}"]
    parsed.pop("ResponseMetadata", None)
    report = ParamValidator().validate(parsed, shape)
    return [report.generate_report()] if report.has_errors() else []
