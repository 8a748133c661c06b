"""A training job's request to book its own capacity (issue 49; docs/API.md, "Auto-booked training jobs").

A job may ask for capacity instead of naming a plan: which types it can run on (each with its count),
for how long, in which window, under which price and segment limits, and whether it prefers the
cheapest or the earliest offering. Wire users give it as the tag ``hyperplan:auto-book`` (its value in
the grammar of :func:`parse_tag`, which uses only the characters AWS allows in a tag value); the
native API as a structure (:func:`from_native`). Both become one :class:`AutoBookRequest`, which the
jobs service stores (:meth:`AutoBookRequest.to_json`) and searches with.

Among the offerings a search answers (:class:`Candidate`), :func:`choose` picks the one to book and
:func:`why_none` says, in one sentence, why none would do; :func:`window_can_be_met` says when waiting
is no longer worth it. What depends on the fleet (its types, its counts, its days, its segment limit,
its currency: :func:`check_currency`) is the service's to check; here only the shape and the bounds
that hold on any fleet.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TypeVar

from hyperplan.core.instance_types import INSTANCE_TYPE_NAME
from hyperplan.errors import ValidationError

TAG_KEY = "hyperplan:auto-book"
MAX_TAG_VALUE = 256  # AWS's limit on a tag value
MAX_TYPES = 8
MAX_DAYS = 182  # docs/DECISIONS.md, "Booking policy": a plan lasts 1 to 182 days
MAX_HOURS = MAX_DAYS * 24
MAX_COUNT = 10_000
MAX_SEGMENTS = 100
MAX_WITHIN = timedelta(days=366)
MAX_PRICE_DIGITS = 12  # before the point: up to 999,999,999,999.99
PREFERENCES = ("cheapest", "earliest")
NATIVE_MEMBERS = (
    "InstanceTypes",
    "DurationHours",
    "Within",
    "StartTimeAfter",
    "EndTimeBefore",
    "MaxPrice",
    "Currency",
    "MaxSegments",
    "Prefer",
)
_TYPE_MEMBERS = ("InstanceType", "InstanceCount")
_MAX_TYPE_LENGTH = 64  # as wire/fleet_types.py: AWS's longest is 21 characters
_MAX_TIME_LENGTH = 64
_DAY = timedelta(days=1)
_WHOLE = re.compile(r"[0-9]{1,9}")
_WITHIN = re.compile(r"([0-9]{1,9})([dh])")
_PRICE = re.compile(rf"[0-9]{{1,{MAX_PRICE_DIGITS}}}(?:\.[0-9]{{1,2}})?")
_PRICE_KEY = re.compile(r"max-([a-z]{3})")
_CURRENCY = re.compile(r"[A-Z]{3}")
_TAG_KEYS = ("types", "days", "hours", "within", "max-<currency>", "max-segments", "prefer")
_KEYS_SAID = (
    "the keys are types, days, hours, within, max-<currency> (such as max-usd), max-segments and prefer"
)
_TYPE_RULE = "must be an instance type, ml.FAMILY.SIZE such as ml.p5.48xlarge"
_WITHIN_RULE = f"must be a number of days or hours such as 14d or 36h, at most {MAX_WITHIN.days}d"
_TIME_SHAPE = 'an ISO 8601 time with a zone, such as "2026-12-01T11:30:00Z"'
_PRICE_RULE = f"must be a decimal with at most 2 places and {MAX_PRICE_DIGITS} digits before the point"
_PREFER_RULE = "must be cheapest or earliest"

_T = TypeVar("_T")


class _Rule(Exception):
    """A value broke a rule; the front end (tag or native) says where."""

    def __init__(self, rule: str) -> None:
        super().__init__(rule)
        self.rule = rule


@dataclass(frozen=True)
class TypeWanted:
    instance_type: str
    instance_count: int


@dataclass(frozen=True)
class AutoBookRequest:
    types: tuple[TypeWanted, ...]  # 1..8, in the order given, no type twice
    duration_hours: int  # whole days: DurationHours and hours= round up to a day, as a search does
    within: timedelta | None = None  # from the job's creation
    start_after: datetime | None = None  # absolute, UTC (native only)
    end_before: datetime | None = None  # absolute, UTC (native only)
    max_price: Decimal | None = None
    max_segments: int | None = None
    prefer: str = "cheapest"
    # The currency the price limit was given in (max-usd: "USD"); None: the fleet's, whatever it is.
    currency: str | None = None

    @property
    def days(self) -> int:
        return self.duration_hours // 24

    def window(self, created_at: datetime) -> tuple[datetime | None, datetime | None]:
        """(start after, end before) for a job created at ``created_at``; None: unbounded (the fleet's
        bookable range)."""
        if self.end_before is not None:
            return self.start_after, self.end_before
        end = created_at + self.within if self.within is not None else None
        return self.start_after, end

    def to_native(self) -> dict[str, Any]:
        """The native structure that :func:`from_native` reads back equal."""
        native: dict[str, Any] = {
            "InstanceTypes": [
                {"InstanceType": wanted.instance_type, "InstanceCount": wanted.instance_count}
                for wanted in self.types
            ],
            "DurationHours": self.duration_hours,
            "Prefer": self.prefer,
        }
        optional = {
            "Within": None if self.within is None else _within_text(self.within),
            "StartTimeAfter": None if self.start_after is None else self.start_after.isoformat(),
            "EndTimeBefore": None if self.end_before is None else self.end_before.isoformat(),
            "MaxPrice": None if self.max_price is None else f"{self.max_price:f}",
            "Currency": self.currency,
            "MaxSegments": self.max_segments,
        }
        native.update((name, value) for name, value in optional.items() if value is not None)
        return native

    def to_json(self) -> str:
        return json.dumps(self.to_native(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> AutoBookRequest:
        return from_native(json.loads(text))

    def to_tag(self) -> str:
        """The request in the tag grammar, which :func:`parse_tag` reads back equal. A request with
        absolute times, or a price limit without its currency, has no tag (ValueError)."""
        if self.start_after is not None or self.end_before is not None:
            raise ValueError("a request with StartTimeAfter or EndTimeBefore has no tag form")
        if self.max_price is not None and self.currency is None:
            raise ValueError("a price limit without its currency has no tag form")
        types = "+".join(f"{wanted.instance_type}:{wanted.instance_count}" for wanted in self.types)
        parts = [f"types={types}", f"days={self.days}"]
        if self.within is not None:
            parts.append(f"within={_within_text(self.within)}")
        if self.max_price is not None and self.currency is not None:
            parts.append(f"max-{self.currency.lower()}={self.max_price:f}")
        if self.max_segments is not None:
            parts.append(f"max-segments={self.max_segments}")
        if self.prefer != "cheapest":
            parts.append(f"prefer={self.prefer}")
        return "/".join(parts)


# -- the tag -------------------------------------------------------------------------------------------


def parse_tag(value: str) -> AutoBookRequest:
    """The request a tag value gives: ``key=value`` parts separated by ``/`` (spaces around a part, a
    key or a value are ignored). A ValidationError names the part that is wrong."""
    if not isinstance(value, str) or not value.strip():
        raise _tag_error("the value is empty; it needs at least types=TYPE:COUNT and days=N")
    if len(value) > MAX_TAG_VALUE:
        raise _tag_error(f"the value is {len(value)} characters; a tag value holds at most {MAX_TAG_VALUE}")
    parts = _tag_parts(value)
    types = _tag_value(parts, "types", _tag_types)
    if types is None:
        raise _tag_error("types is required, such as types=ml.p5.48xlarge:8+ml.p4d.24xlarge:16")
    request = AutoBookRequest(
        types=types,
        duration_hours=_tag_duration(parts),
        within=_tag_value(parts, "within", _within),
        max_price=_tag_value(parts, "max-<currency>", _price),
        max_segments=_tag_value(parts, "max-segments", lambda text: _whole_text(text, 1, MAX_SEGMENTS)),
        prefer=_tag_value(parts, "prefer", _prefer) or "cheapest",
        currency=_tag_currency(parts),
    )
    if request.within is not None and request.within <= timedelta(hours=request.duration_hours):
        part = parts["within"][0]
        raise _tag_error(f"part {part!r}: within {_within_too_short(request)}")
    return request


def _tag_error(message: str) -> ValidationError:
    return ValidationError(f"{TAG_KEY}: {message}")


def _tag_parts(value: str) -> dict[str, tuple[str, str, str]]:
    """Each key (the price's as ``max-<currency>``) to (the part as written, its key, its value)."""
    parts: dict[str, tuple[str, str, str]] = {}
    for raw in value.split("/"):
        part = raw.strip()
        if not part:
            raise _tag_error("an empty part: two '/' in a row, or one at either end")
        key, equals, text = (piece.strip() for piece in part.partition("="))
        if not equals:
            raise _tag_error(f"part {part!r}: a part is key=value, such as days=3")
        name = "max-<currency>" if _PRICE_KEY.fullmatch(key) else key
        if name not in _TAG_KEYS:
            raise _tag_error(f"part {part!r}: unknown key {key!r}; {_KEYS_SAID}")
        if name in parts:
            first = parts[name][0]
            what = "a price limit" if name == "max-<currency>" else key
            raise _tag_error(f"part {part!r}: {what} is given twice (first as {first!r})")
        if not text:
            raise _tag_error(f"part {part!r}: {key} has no value")
        parts[name] = (part, key, text)
    return parts


def _tag_value(parts: Mapping[str, tuple[str, str, str]], name: str, read: Callable[[str], _T]) -> _T | None:
    if name not in parts:
        return None
    part, key, text = parts[name]
    try:
        return read(text)
    except _Rule as broken:
        raise _tag_error(f"part {part!r}: {key} {broken.rule}") from None


def _tag_types(text: str) -> tuple[TypeWanted, ...]:
    wanted = []
    for item in text.split("+"):
        name, colon, count = item.partition(":")
        if not item:
            raise _Rule("has an empty type: two '+' in a row, or one at either end")
        if not colon:
            raise _Rule(f"gives {item!r} without its count: TYPE:COUNT, such as ml.p5.48xlarge:8")
        if not _is_type(name):
            raise _Rule(f"gives {name!r}, which {_TYPE_RULE}")
        if not _WHOLE.fullmatch(count) or not 1 <= int(count) <= MAX_COUNT:
            raise _Rule(f"gives {name} the count {count!r}, which {_whole_rule(1, MAX_COUNT)}")
        wanted.append(TypeWanted(name, int(count)))
    return _types(wanted)


def _tag_duration(parts: Mapping[str, tuple[str, str, str]]) -> int:
    if "days" in parts and "hours" in parts:
        both = f"{parts['days'][0]!r} and {parts['hours'][0]!r}"
        raise _tag_error(f"parts {both}: give days or hours, not both")
    days = _tag_value(parts, "days", lambda text: _whole_text(text, 1, MAX_DAYS))
    if days is not None:
        return days * 24
    hours = _tag_value(parts, "hours", lambda text: _whole_text(text, 1, MAX_HOURS))
    if hours is None:
        raise _tag_error("a duration is required: days=N (1 to 182) or hours=N (rounded up to whole days)")
    return _whole_days(hours)


def _tag_currency(parts: Mapping[str, tuple[str, str, str]]) -> str | None:
    if "max-<currency>" not in parts:
        return None
    return parts["max-<currency>"][1].removeprefix("max-").upper()


# -- the native structure ------------------------------------------------------------------------------


def from_native(body: Mapping[str, Any], where: str = "AutoBook") -> AutoBookRequest:
    """The request a native structure gives. A ValidationError names the member that is wrong."""
    if not isinstance(body, Mapping):
        raise ValidationError(f"{where} must be an object with the members {', '.join(NATIVE_MEMBERS)}.")
    _only_members(body, NATIVE_MEMBERS, where)
    request = AutoBookRequest(
        types=_native_types(body.get("InstanceTypes"), f"{where}.InstanceTypes"),
        duration_hours=_whole_days(_required_whole(body, "DurationHours", MAX_HOURS, where)),
        within=_native(body, "Within", where, _within, 'a string such as "14d" or "36h"'),
        start_after=_native(body, "StartTimeAfter", where, _instant, _TIME_SHAPE),
        end_before=_native(body, "EndTimeBefore", where, _instant, _TIME_SHAPE),
        max_price=_native(body, "MaxPrice", where, _price, 'a decimal string such as "40000.00"'),
        max_segments=_native_whole(body, "MaxSegments", MAX_SEGMENTS, where),
        prefer=_native(body, "Prefer", where, _prefer, '"cheapest" or "earliest"') or "cheapest",
        currency=_native(body, "Currency", where, _currency, 'three capital letters such as "USD"'),
    )
    _check_native_window(request, where)
    if request.currency is not None and request.max_price is None:
        raise ValidationError(f"{where}.Currency is the currency of MaxPrice; it means nothing without it.")
    return request


def _only_members(body: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(str(name) for name in body if name not in allowed)
    if unknown:
        named = ", ".join(repr(name) for name in unknown)
        raise ValidationError(f"{where}: unknown member(s) {named}; it takes {', '.join(allowed)}.")


def _native(
    body: Mapping[str, Any], name: str, where: str, read: Callable[[str], _T], shape: str
) -> _T | None:
    """An optional string member, read by ``read``; ``shape`` says what it must be when it is no string."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{where}.{name} must be {shape}, not {_shown(value)}.")
    try:
        return read(value)
    except _Rule as broken:
        raise ValidationError(f"{where}.{name} {broken.rule}, not {_shown(value)}.") from None


def _native_whole(body: Mapping[str, Any], name: str, high: int, where: str) -> int | None:
    """An optional JSON integer from 1 to ``high``: 1.0, "1" and true are not integers."""
    value = body.get(name)
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high
    ):
        raise ValidationError(f"{where}.{name} {_whole_rule(1, high)}, not {_shown(value)}.")
    return value


def _required_whole(body: Mapping[str, Any], name: str, high: int, where: str) -> int:
    value = _native_whole(body, name, high, where)
    if value is None:
        raise ValidationError(f"{where}.{name} is required: it {_whole_rule(1, high)}.")
    return value


def _native_types(value: Any, where: str) -> tuple[TypeWanted, ...]:
    if value is None:
        raise ValidationError(f"{where} is required: a list of {{InstanceType, InstanceCount}}.")
    if not isinstance(value, list):
        raise ValidationError(
            f"{where} must be a list of {{InstanceType, InstanceCount}}, not {_shown(value)}."
        )
    wanted = []
    for index, item in enumerate(value):
        here = f"{where}[{index}]"
        if not isinstance(item, Mapping):
            raise ValidationError(f"{here} must be an object {{InstanceType, InstanceCount}}.")
        _only_members(item, _TYPE_MEMBERS, here)
        name = item.get("InstanceType")
        if not isinstance(name, str) or not _is_type(name):
            raise ValidationError(f"{here}.InstanceType {_TYPE_RULE}, not {_shown(name)}.")
        wanted.append(TypeWanted(name, _required_whole(item, "InstanceCount", MAX_COUNT, here)))
    try:
        return _types(wanted)
    except _Rule as broken:
        raise ValidationError(f"{where} {broken.rule}.") from None


def _check_native_window(request: AutoBookRequest, where: str) -> None:
    start, end, within = request.start_after, request.end_before, request.within
    duration = timedelta(hours=request.duration_hours)
    if within is not None and end is not None:
        raise ValidationError(f"{where}: give Within or EndTimeBefore, not both: each ends the window.")
    if within is not None and within <= duration:
        raise ValidationError(f"{where}.Within {_within_too_short(request)}.")
    if start is not None and end is not None and end - start < duration:
        raise ValidationError(
            f"{where}.EndTimeBefore: {_show(end)} is less than the duration ({_days_said(request.days)}) "
            f"after StartTimeAfter, {_show(start)}; no plan fits between them."
        )


# -- the values both forms share -----------------------------------------------------------------------


def _types(wanted: Sequence[TypeWanted]) -> tuple[TypeWanted, ...]:
    if not 1 <= len(wanted) <= MAX_TYPES:
        raise _Rule(f"must give 1 to {MAX_TYPES} types, not {len(wanted)}")
    seen: set[str] = set()
    for item in wanted:
        if item.instance_type in seen:
            raise _Rule(f"gives {item.instance_type} twice; give each type once, with its count")
        seen.add(item.instance_type)
    return tuple(wanted)


def _is_type(name: str) -> bool:
    return len(name) <= _MAX_TYPE_LENGTH and INSTANCE_TYPE_NAME.fullmatch(name) is not None


def _whole_rule(low: int, high: int) -> str:
    return f"must be a whole number from {low} to {high}"


def _whole_text(text: str, low: int, high: int) -> int:
    if not _WHOLE.fullmatch(text) or not low <= int(text) <= high:
        raise _Rule(_whole_rule(low, high))
    return int(text)


def _whole_days(hours: int) -> int:
    """Hours rounded up to whole days, in hours: a search books whole days (core/search_request.py)."""
    return -(-hours // 24) * 24


def _within(text: str) -> timedelta:
    match = _WITHIN.fullmatch(text)
    if match is None:
        raise _Rule(_WITHIN_RULE)
    amount = int(match[1])
    span = timedelta(days=amount) if match[2] == "d" else timedelta(hours=amount)
    if not timedelta(0) < span <= MAX_WITHIN:
        raise _Rule(_WITHIN_RULE)
    return span


def _within_text(span: timedelta) -> str:
    hours = int(span.total_seconds()) // 3600
    return f"{hours // 24}d" if hours % 24 == 0 else f"{hours}h"


def _within_too_short(request: AutoBookRequest) -> str:
    return (
        f"must be longer than the duration, {_days_said(request.days)}: a plan starts some time after "
        "the job is created"
    )


def _price(text: str) -> Decimal:
    if not _PRICE.fullmatch(text):
        raise _Rule(_PRICE_RULE)
    return Decimal(text)


def _currency(text: str) -> str:
    if not _CURRENCY.fullmatch(text):
        raise _Rule("must be three capital letters, such as USD")
    return text


def _prefer(text: str) -> str:
    if text not in PREFERENCES:
        raise _Rule(_PREFER_RULE)
    return text


def _instant(text: str) -> datetime:
    rule = f"must be {_TIME_SHAPE}"
    if len(text) > _MAX_TIME_LENGTH:
        raise _Rule(rule)
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            raise _Rule(rule)
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: the year 9999 moved into UTC from behind it
        raise _Rule(rule) from None


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 64 else shown[:61] + "..."


def check_currency(request: AutoBookRequest, fleet_currency: str, where: str | None = None) -> None:
    """Refuse a price limit given in another currency than the fleet's (the tag's ``max-<currency>``,
    or ``where``'s ``Currency`` for a native structure)."""
    if request.currency is None or request.currency == fleet_currency:
        return
    if where is not None:
        raise ValidationError(
            f"{where}.Currency: {request.currency} is not this fleet's currency; "
            f"prices are in {fleet_currency}."
        )
    given = f"max-{request.currency.lower()}={request.max_price:f}"
    raise _tag_error(
        f"part {given!r}: this fleet's prices are in {fleet_currency}; "
        f"give the limit as max-{fleet_currency.lower()}"
    )


# -- choosing among offerings --------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    key: str  # opaque: the offering's id
    instance_type: str
    instance_count: int
    segments: int
    start: datetime
    end: datetime
    price: Decimal
    rank: int  # its position in the merged search answer


@dataclass(frozen=True)
class _Refusal:
    kind: str  # one of _KINDS, the first rule the candidate breaks
    text: str


_KINDS = ("type", "window", "segments", "price")


def acceptable(
    candidate: Candidate, request: AutoBookRequest, created_at: datetime | None = None
) -> str | None:
    """None if the request would take the offering, else why not. Without ``created_at`` the window is
    the request's absolute times only (``within`` needs the job's creation)."""
    refusal = _refusal(candidate, request, created_at)
    return None if refusal is None else refusal.text


def choose(
    candidates: Sequence[Candidate], request: AutoBookRequest, created_at: datetime | None = None
) -> Candidate | None:
    """The acceptable offering to book: the cheapest (then the earliest end, then the search's rank), or
    with prefer=earliest the earliest end (then the cheapest, then the rank). None: none is acceptable."""
    fine = [candidate for candidate in candidates if _refusal(candidate, request, created_at) is None]
    if not fine:
        return None
    if request.prefer == "earliest":
        return min(fine, key=lambda candidate: (candidate.end, candidate.price, candidate.rank))
    return min(fine, key=lambda candidate: (candidate.price, candidate.end, candidate.rank))


def why_none(
    candidates: Sequence[Candidate], request: AutoBookRequest, created_at: datetime | None = None
) -> str:
    """Why nothing can be booked, in one sentence without its full stop, for a waiting job's message."""
    if not candidates:
        return f"no offering of {describe(request, created_at)}"
    found = f"{_counted(len(candidates), 'offering')} found"
    refusals = [_refusal(candidate, request, created_at) for candidate in candidates]
    if any(refusal is None for refusal in refusals):
        fine = sum(refusal is None for refusal in refusals)
        return f"{found}, {fine} of them acceptable"
    groups = {
        kind: [c for c, r in zip(candidates, refusals, strict=True) if r is not None and r.kind == kind]
        for kind in _KINDS
    }
    said = [
        (len(group), _group_said(kind, group, request, created_at)) for kind, group in groups.items() if group
    ]
    if len(said) == 1:
        count, phrase = said[0]
        return f"{found}, {'all ' if count > 1 else ''}{phrase}"
    return f"{found}, none acceptable: " + ", ".join(f"{count} {phrase}" for count, phrase in said)


def describe(request: AutoBookRequest, created_at: datetime | None = None) -> str:
    """What the request asks for: "ml.p5.48xlarge x8 or ml.p4d.24xlarge x16 for 3 days before ..."."""
    return f"{_types_said(request)} for {_days_said(request.days)}{_window_said(request, created_at)}"


def _refusal(candidate: Candidate, request: AutoBookRequest, created_at: datetime | None) -> _Refusal | None:
    if TypeWanted(candidate.instance_type, candidate.instance_count) not in request.types:
        offered = f"{candidate.instance_type} x{candidate.instance_count}"
        return _Refusal("type", f"{offered} is not one of the types asked for ({_types_said(request)})")
    start_after, end_before = _bounds(request, created_at)
    if start_after is not None and candidate.start < start_after:
        return _Refusal("window", f"it starts at {_show(candidate.start)}, before {_show(start_after)}")
    if end_before is not None and candidate.end > end_before:
        return _Refusal("window", f"it ends at {_show(candidate.end)}, after {_show(end_before)}")
    if request.max_segments is not None and candidate.segments > request.max_segments:
        return _Refusal(
            "segments", f"it has {candidate.segments} segments, more than max-segments {request.max_segments}"
        )
    if request.max_price is not None and candidate.price > request.max_price:
        return _Refusal("price", f"it costs {candidate.price:,.2f}, above {_limit_said(request)}")
    return None


def _bounds(request: AutoBookRequest, created_at: datetime | None) -> tuple[datetime | None, datetime | None]:
    if created_at is None:
        return request.start_after, request.end_before
    return request.window(created_at)


def _group_said(
    kind: str, group: Sequence[Candidate], request: AutoBookRequest, created_at: datetime | None
) -> str:
    several = len(group) > 1
    if kind == "price":
        cheapest = min(candidate.price for candidate in group)
        return f"above {_limit_said(request)} ({'cheapest ' if several else ''}{cheapest:,.2f})"
    if kind == "segments":
        fewest = min(candidate.segments for candidate in group)
        limit = request.max_segments
        return f"in more segments than max-segments {limit} ({'fewest ' if several else ''}{fewest})"
    if kind == "window":
        return f"outside the window{_window_said(request, created_at)}"
    return f"of other types or counts than {_types_said(request)}"


def _types_said(request: AutoBookRequest) -> str:
    said = [f"{wanted.instance_type} x{wanted.instance_count}" for wanted in request.types]
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"


def _days_said(days: int) -> str:
    return _counted(days, "day")


def _counted(amount: int, unit: str) -> str:
    return f"{amount} {unit}{'' if amount == 1 else 's'}"


def _window_said(request: AutoBookRequest, created_at: datetime | None) -> str:
    start, end = _bounds(request, created_at)
    if end is None and request.within is not None:  # no creation time to count from
        return f"{'' if start is None else f' after {_show(start)}'} within {_within_said(request.within)}"
    if start is not None and end is not None:
        return f" between {_show(start)} and {_show(end)}"
    if start is not None:
        return f" after {_show(start)}"
    return "" if end is None else f" before {_show(end)}"


def _within_said(span: timedelta) -> str:
    text = _within_text(span)
    amount, unit = int(text[:-1]), {"d": "day", "h": "hour"}[text[-1]]
    return f"{_counted(amount, unit)} of the job's creation"


def _limit_said(request: AutoBookRequest) -> str:
    if request.currency is not None:
        return f"max-{request.currency.lower()} {request.max_price:f}"
    return f"the price limit {request.max_price:f}"


def _show(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S}Z"


# -- how long waiting makes sense ----------------------------------------------------------------------


def window_can_be_met(
    request: AutoBookRequest,
    created_at: datetime,
    now: datetime,
    lead: timedelta,
    *,
    segment_end: time | None = None,
) -> bool:
    """Whether a plan of the request's duration that starts no sooner than ``now + lead`` (the fleet's
    lead time) can still end by the window's end. With ``segment_end`` (the fleet's time of day every
    segment ends at, UTC) the earliest end is the first such time after the duration, as a plan that
    starts between two boundaries runs on to the next (docs/DECISIONS.md, "Booking policy")."""
    start_after, end = request.window(created_at)
    if end is None:
        return True
    soonest = now + lead if start_after is None else max(now + lead, start_after)
    finish = soonest + timedelta(hours=request.duration_hours)
    if segment_end is not None:
        finish = _next_boundary(finish, segment_end)
    return finish <= end


NEVER = datetime.min.replace(tzinfo=UTC)
"""What `met_until` answers for a window no plan can meet, whenever it is asked."""


def met_until(
    request: AutoBookRequest,
    created_at: datetime,
    lead: timedelta,
    *,
    segment_end: time | None = None,
) -> datetime | None:
    """The last instant at which ``window_can_be_met`` holds (None: a window without an end always is;
    NEVER: none is), so that a waiting job fails at that moment, not at its next hourly look. A plan
    that starts at the soonest ends in time while that start plus the duration is at most the last
    segment end (``segment_end``'s time of day) not after the window's end."""
    start_after, end = request.window(created_at)
    if end is None:
        return None
    last_end = end if segment_end is None else _last_boundary(end, segment_end)
    latest_start = last_end - timedelta(hours=request.duration_hours)
    if start_after is not None and start_after > latest_start:
        return NEVER
    return latest_start - lead


def _last_boundary(moment: datetime, segment_end: time) -> datetime:
    moment = moment.astimezone(UTC)
    boundary = datetime.combine(moment.date(), segment_end, tzinfo=UTC)
    return boundary if boundary <= moment else boundary - _DAY


def _next_boundary(moment: datetime, segment_end: time) -> datetime:
    moment = moment.astimezone(UTC)
    boundary = datetime.combine(moment.date(), segment_end, tzinfo=UTC)
    return boundary if boundary >= moment else boundary + _DAY
