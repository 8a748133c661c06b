"""Model-driven serialization of awsJson1.1 responses and errors.

A handler returns plain Python values (``datetime``, ``Decimal``, ``bytes``, nested dicts and lists);
:func:`serialize_response` walks them alongside the operation's botocore output shape and produces a
JSON-ready dict exactly as botocore's JSON parser expects it. The serializer is deliberately strict:
a member the shape lacks, a value of the wrong type, an enum value the model does not list (but for an
instance type of the fleet's own, wire/fleet_types.py) or a missing required member is a handler bug,
reported as :class:`~hyperplan.errors.InternalFailure` naming the path (``Status``,
``ReservedCapacitySummaries[0].InstanceType``) so tests catch it before a client does.
Members whose value is None are omitted, like botocore omits absent members.
"""

from __future__ import annotations

import base64
import enum
import json
import math
import threading
import weakref
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from botocore.model import ListShape, MapShape, OperationModel, Shape, StringShape, StructureShape

from hyperplan.errors import HyperplanError, InternalFailure
from hyperplan.wire.fleet_types import left_to_the_fleet

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)


def serialize_response(op: OperationModel, result: Mapping[str, Any] | None) -> dict[str, Any]:
    """The JSON-ready body of a successful response to ``op``; raises InternalFailure on handler bugs."""
    shape = op.output_shape
    if shape is None:
        if result:
            raise InternalFailure(
                f"Bad {op.name} response: the operation has no output, got {sorted(result)}"
            )
        return {}
    value = {} if result is None else result
    try:
        serialized = _compiled(shape)(value)
    except _Refused:
        # The walk below does the same checks, and names where the handler's bug is.
        serialized = _serialize(shape, value, _Path(op.name))
    assert isinstance(serialized, dict)
    return serialized


def serialize_error(err: HyperplanError) -> dict[str, str]:
    """The JSON body of an error response.

    botocore's JSON error parser takes the code from ``__type`` (keeping only what follows a ``#``) and
    the message from ``message`` (falling back to ``Message``); boto3 then raises the modelled exception
    class named by the code, e.g. ``client.exceptions.ResourceNotFound``.
    """
    return {"__type": err.code, "message": err.message}


def epoch_seconds(value: datetime) -> int | float:
    """Epoch seconds as botocore's own JSON serializer writes them: an int when whole, else a float.

    Whole microseconds are divided once, so botocore's ``datetime.fromtimestamp`` reads back the same
    microsecond.
    """
    micros = (value - _EPOCH) // _ONE_MICROSECOND
    seconds, remainder = divmod(micros, 1_000_000)
    return seconds if remainder == 0 else micros / 1_000_000


class _Path:
    """The operation and the wire path being serialized, for handler-bug messages. The path's text is
    built only for a bug: each step keeps its parent and its own part, a member name, an index or a key."""

    __slots__ = ("op", "parent", "part")

    def __init__(self, op: str, parent: _Path | None = None, part: str | int | _MapKey | None = None) -> None:
        self.op = op
        self.parent = parent
        self.part = part  # str: a member; int: a list index; None: the root; see entry() for keys

    def member(self, name: str) -> _Path:
        return _Path(self.op, self, name)

    def item(self, index: int) -> _Path:
        return _Path(self.op, self, index)

    def entry(self, key: str) -> _Path:
        return _Path(self.op, self, _MapKey(key))

    @property
    def path(self) -> str:
        parts: list[str] = []
        step: _Path | None = self
        while step is not None and step.part is not None:
            part = step.part
            if isinstance(part, int):
                parts.append(f"[{part}]")
            elif isinstance(part, _MapKey):
                parts.append(f"[{json.dumps(part.key, ensure_ascii=False)}]")
            else:
                parts.append(f".{part}")
            step = step.parent
        return "".join(reversed(parts)).removeprefix(".")

    def bug(self, problem: str) -> InternalFailure:
        path = self.path
        where = f" at {path!r}" if path else ""
        return InternalFailure(f"Bad {self.op} response{where}: {problem}")


class _MapKey:
    """A map's key in a path (written ["key"]), told apart from a member's name (written .Name)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


def _serialize(shape: Shape, value: Any, path: _Path) -> Any:
    serializer = _SERIALIZERS.get(shape.type_name)
    if serializer is None:
        raise path.bug(f"unsupported shape type {shape.type_name!r}")
    return serializer(shape, value, path)


def _got(value: object) -> str:
    return f"got {type(value).__name__} {value!r:.80}"


def _structure(shape: Shape, value: Any, path: _Path) -> Any:
    assert isinstance(shape, StructureShape)
    if shape.is_document_type:
        return value
    if not isinstance(value, Mapping):
        raise path.bug(f"expected a mapping for {shape.name}, {_got(value)}")
    members = shape.members
    result: dict[str, Any] = {}
    for name, item in value.items():
        if name not in members:
            raise path.member(str(name)).bug(f"{shape.name} has no member {name!r}")
        if item is not None:
            member = members[name]
            wire_name = member.serialization.get("name", name)
            result[wire_name] = _serialize(member, item, path.member(wire_name))
    missing = [name for name in shape.required_members if value.get(name) is None]
    if missing:
        raise path.bug(f"required member(s) {', '.join(missing)} of {shape.name} missing")
    if shape.is_tagged_union and len(result) != 1:
        raise path.bug(f"union {shape.name} must have exactly one member set, got {sorted(result)}")
    return result


def _list(shape: Shape, value: Any, path: _Path) -> Any:
    assert isinstance(shape, ListShape)
    # A str or a dict is iterable too, but never what a handler means by a list.
    if not isinstance(value, list | tuple):
        raise path.bug(f"expected a list, {_got(value)}")
    result = []
    for index, item in enumerate(value):
        if item is None:
            raise path.item(index).bug("list items must not be None")
        result.append(_serialize(shape.member, item, path.item(index)))
    return result


def _map(shape: Shape, value: Any, path: _Path) -> Any:
    assert isinstance(shape, MapShape)
    if not isinstance(value, Mapping):
        raise path.bug(f"expected a mapping, {_got(value)}")
    result: dict[str, Any] = {}
    for key, item in value.items():
        wire_key = _string(shape.key, key, path.entry(str(key)))
        if item is None:
            raise path.entry(wire_key).bug("map values must not be None")
        result[wire_key] = _serialize(shape.value, item, path.entry(wire_key))
    return result


def _string(shape: Shape, value: Any, path: _Path) -> Any:
    if isinstance(value, enum.Enum):
        value = value.value  # str() of a (str, Enum) member is "Class.NAME", not its value
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise path.bug(f"money and other decimals must be finite, {_got(value)}")
        value = format(value, "f")  # plain notation: 1E+3 would surprise anyone reading a fee
    if not isinstance(value, str):
        raise path.bug(f"expected a string, {_got(value)}")
    enum_values = shape.enum if isinstance(shape, StringShape) else []
    if enum_values and value not in enum_values and not left_to_the_fleet(shape.name, value):
        raise path.bug(f"{value!r} is not in the {shape.name} enum")
    return value


def _integer(shape: Shape, value: Any, path: _Path) -> Any:
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise path.bug(f"expected an int, {_got(value)}")
    return value


def _float(shape: Shape, value: Any, path: _Path) -> Any:
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise path.bug(f"expected a number, {_got(value)}")
    if not math.isfinite(value):
        raise path.bug(f"JSON has no NaN or infinity, {_got(value)}")
    return value


def _boolean(shape: Shape, value: Any, path: _Path) -> Any:
    if not isinstance(value, bool):
        raise path.bug(f"expected a bool, {_got(value)}")
    return value


def _timestamp(shape: Shape, value: Any, path: _Path) -> Any:
    if not isinstance(value, datetime):
        raise path.bug(f"expected a datetime, {_got(value)}")
    if value.tzinfo is None or value.utcoffset() is None:
        # A naive datetime is ambiguous; the store and the core must hand out aware UTC times.
        raise path.bug(f"naive datetime {value.isoformat()} (must be timezone-aware)")
    return epoch_seconds(value)


def _blob(shape: Shape, value: Any, path: _Path) -> Any:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise path.bug(f"expected bytes, {_got(value)}")
    return base64.b64encode(bytes(value)).decode("ascii")


_SERIALIZERS: dict[str, Callable[[Shape, Any, _Path], Any]] = {
    "structure": _structure,
    "list": _list,
    "map": _map,
    "string": _string,
    "integer": _integer,
    "long": _integer,
    "float": _float,
    "double": _float,
    "boolean": _boolean,
    "timestamp": _timestamp,
    "blob": _blob,
}


# -- the same, compiled: one function per shape, made once -------------------------------------------------
#
# Every response of an operation walks the same shapes: a function per shape, with what it reads of the
# shape looked up once, serialises a search's answer several times faster than the walk above. It checks
# exactly what the walk checks, but keeps no path: at the first problem it gives up (_Refused) and the
# walk runs instead, to report it.


class _Refused(Exception):
    pass


_Compiled = Callable[[Any], Any]
# As long as the shape lives (the server's operation models are cached: wire/model.py).
_compiled_shapes: weakref.WeakKeyDictionary[Shape, _Compiled] = weakref.WeakKeyDictionary()


# One compile at a time, and what it makes is published only once all of it is complete: a recursive
# shape reaches itself through a stand-in that works only once its compile is done, so a thread that
# found a stand-in, or a member function calling one, while another thread was still compiling, failed
# (an IndexError: a 500 on the first concurrent requests of a process).
_compiling = threading.RLock()
_pending: dict[Shape, _Compiled] = {}  # made by the compile under way (this thread's), not yet published


def _compiled(shape: Shape) -> _Compiled:
    found = _compiled_shapes.get(shape)
    if found is not None:
        return found
    with _compiling:
        found = _compiled_shapes.get(shape) or _pending.get(shape)
        if found is not None:
            return found
        outermost = not _pending
        # A recursive shape reaches itself: the stand-in is in place before its members are compiled.
        cell: list[_Compiled] = []
        _pending[shape] = lambda value: cell[0](value)
        try:
            function = _COMPILERS.get(shape.type_name, _compile_refused)(shape)
            cell.append(function)
            _pending[shape] = function
            if outermost:
                _compiled_shapes.update(_pending)
        finally:
            if outermost:
                _pending.clear()
        return function


def _compile_refused(shape: Shape) -> _Compiled:
    def refused(value: Any) -> Any:
        raise _Refused

    return refused


def _compile_structure(shape: Shape) -> _Compiled:
    assert isinstance(shape, StructureShape)
    if shape.is_document_type:
        return lambda value: value
    members = {
        name: (member.serialization.get("name", name), _compiled(member), _kept_as_is(member))
        for name, member in shape.members.items()
    }
    required, union = tuple(shape.required_members), shape.is_tagged_union

    def structure(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Refused
        result: dict[str, Any] = {}
        for name, item in value.items():
            member = members.get(name)
            if member is None:
                raise _Refused
            if item is not None:
                # A plain str or int that its member's function would hand back as it is: no call.
                result[member[0]] = item if type(item) is member[2] else member[1](item)
        for name in required:
            if value.get(name) is None:
                raise _Refused
        if union and len(result) != 1:
            raise _Refused
        return result

    return structure


def _kept_as_is(shape: Shape) -> type | None:
    """The type whose values the shape's compiled function returns unchanged, without a check that
    could refuse them (a string shape with an enum checks its values): None if there is none."""
    if shape.type_name == "string" and not (isinstance(shape, StringShape) and shape.enum):
        return str
    if shape.type_name in ("integer", "long"):
        return int
    return None


def _compile_timestamp(shape: Shape) -> _Compiled:
    def timestamp(value: Any) -> Any:
        if type(value) is datetime and value.tzinfo is UTC:  # the common case first: aware, in UTC
            return epoch_seconds(value)
        try:
            return _timestamp(shape, value, _NOWHERE)
        except InternalFailure:
            raise _Refused from None

    return timestamp


def _compile_list(shape: Shape) -> _Compiled:
    assert isinstance(shape, ListShape)
    item_of = _compiled(shape.member)

    def items(value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise _Refused
        result = []
        for item in value:
            if item is None:
                raise _Refused
            result.append(item_of(item))
        return result

    return items


def _compile_map(shape: Shape) -> _Compiled:
    assert isinstance(shape, MapShape)
    key_of, value_of = _compiled(shape.key), _compiled(shape.value)

    def entries(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Refused
        result: dict[str, Any] = {}
        for key, item in value.items():
            if item is None:
                raise _Refused
            result[key_of(key)] = value_of(item)
        return result

    return entries


def _compile_string(shape: Shape) -> _Compiled:
    enum_values = frozenset(shape.enum) if isinstance(shape, StringShape) else frozenset()

    def string(value: Any) -> Any:
        if type(value) is not str:  # the common case first; the rest as the walk does it
            try:
                return _string(shape, value, _NOWHERE)
            except InternalFailure:
                raise _Refused from None
        if enum_values and value not in enum_values and not left_to_the_fleet(shape.name, value):
            raise _Refused
        return value

    return string


def _compile_checked(check: Callable[[Shape, Any, _Path], Any]) -> Callable[[Shape], _Compiled]:
    def compile_(shape: Shape) -> _Compiled:
        def checked(value: Any) -> Any:
            try:
                return check(shape, value, _NOWHERE)
            except InternalFailure:
                raise _Refused from None

        return checked

    return compile_


def _compile_integer(shape: Shape) -> _Compiled:
    def integer(value: Any) -> Any:
        if type(value) is int:
            return value
        try:
            return _integer(shape, value, _NOWHERE)
        except InternalFailure:
            raise _Refused from None

    return integer


_NOWHERE = _Path("")

_COMPILERS: dict[str, Callable[[Shape], _Compiled]] = {
    "structure": _compile_structure,
    "list": _compile_list,
    "map": _compile_map,
    "string": _compile_string,
    "integer": _compile_integer,
    "long": _compile_integer,
    "float": _compile_checked(_float),
    "double": _compile_checked(_float),
    "boolean": _compile_checked(_boolean),
    "timestamp": _compile_timestamp,
    "blob": _compile_checked(_blob),
}
