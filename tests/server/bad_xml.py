"""Derive bad S3 XML bodies from a valid one, driven by the operation's botocore payload shape.

``bad_documents(shape, valid)`` walks a valid document (ElementTree) alongside the payload's shape and
yields ``(description, body)``: a document that breaks one rule the model states at one place: an
unknown element in each structure, each required member left out, a single member given twice, each
leaf given text its type refuses (a whole number, ``true``/``false``, an enum's value, the model's least
length), a leaf holding an element; and the document's root renamed, and a document cut short.
"""

from __future__ import annotations

import copy
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from xml.etree.ElementTree import Element

from botocore.model import ListShape, Shape, StructureShape

from hyperplan.wire.s3_xml import local_name, member_xml_name

BadDocument = tuple[str, bytes]
Change = Callable[[Element], None]
Changed = tuple[str, tuple[int, ...], Change]  # what, the changed element's place, the change


def bad_documents(shape: Shape, valid: Element) -> Iterator[BadDocument]:
    for description, place, change in _changes(shape, (), valid):
        document = copy.deepcopy(valid)
        change(_at(document, place))
        yield description, ElementTree.tostring(document)
    renamed = copy.deepcopy(valid)
    renamed.tag = renamed.tag.replace(local_name(renamed), "NotTheRoot")
    yield "the root renamed", ElementTree.tostring(renamed)
    yield "a document cut short", ElementTree.tostring(valid)[:-5]


def _at(document: Element, path: tuple[int, ...]) -> Element:
    element = document
    for index in path:
        element = element[index]
    return element


def _tag(parent: Element, name: str) -> str:
    return parent.tag.replace(local_name(parent), name) if parent.tag.startswith("{") else name


def _changes(shape: Shape, path: tuple[int, ...], element: Element) -> Iterator[Changed]:
    where = local_name(element)
    if isinstance(shape, StructureShape):
        yield f"an unknown element in <{where}>", path, lambda e: e.append(Element(_tag(e, "NotAMember")))
        names = {member_xml_name(name, member): (name, member) for name, member in shape.members.items()}
        for index, child in enumerate(element):
            name, member = names[local_name(child)]
            if name in shape.required_members and not _repeats(member):
                yield f"required <{local_name(child)}> left out", path, _remover(index)
            if not _repeats(member):
                yield f"<{local_name(child)}> given twice", path, _doubler(index)
            item = member.member if _repeats(member) else member
            yield from _changes(item, (*path, index), child)
        return
    if isinstance(shape, ListShape):
        for index, child in enumerate(element):
            yield from _changes(shape.member, (*path, index), child)
        return
    yield f"<{where}> holding an element", path, lambda e: e.append(Element(_tag(e, "Inner")))
    for text in _bad_texts(shape):
        yield f"<{where}> = {text!r}", path, _texter(text)


def _repeats(shape: Shape) -> bool:
    return isinstance(shape, ListShape) and bool(shape.serialization.get("flattened"))


def _bad_texts(shape: Shape) -> list[str]:
    kind = shape.type_name
    if kind in ("integer", "long"):
        return ["NaN", "1.5"]
    if kind == "boolean":
        return ["maybe"]
    if kind == "timestamp":
        return ["next tuesday"]
    texts = []
    if shape.enum:
        texts.append("NOT-A-VALUE")
    low = shape.metadata.get("min")
    if low:
        texts.append("x" * (low - 1))
    return texts


def _remover(index: int) -> Change:
    return lambda e: e.remove(e[index])


def _doubler(index: int) -> Change:
    return lambda e: e.insert(index, copy.deepcopy(e[index]))


def _texter(text: str) -> Change:
    def change(element: Element) -> None:
        element.text = text

    return change
