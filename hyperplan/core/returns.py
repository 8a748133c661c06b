"""Giving a plan's capacity back: the fleet's cancellation policy, what a return does to a plan's segments,
and what it refunds (issue 53; docs/FLEET.md "Cancellation policy").

Pure rules, no store and no clock: the service (services/plans/returns.py) reads the plan's segments,
asks :func:`plan_return` what a scope would change, prices it with :func:`refund` and :func:`capped`,
and quotes it under the segments' :func:`fingerprint`, so that a quote whose plan changed is refused.

Time is cut at the fleet's daily boundary (``policy.segment_end``, 11:30 UTC by default), as searches
cut it: every segment ends on one, and the calendar never holds half a day of a started segment for
nobody. So a segment that has started can only give back what lies after the next boundary, and a tail
starts on a boundary. What has started earns no refund (the tiers count up to a segment's start); its
returned part may still be resold, and the resale credit (core/resale.py) pays the returning account.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, Decimal

from hyperplan.errors import ValidationError

DAY = timedelta(days=1)
SCOPE_KINDS = ("plan", "segment", "instances", "tail")
# A refund's share is rounded to this many places before it meets the price: instance-hours reach the
# rules as floats, and a whole plan returned at 100% must refund exactly what was paid, not a cent less.
_SHARE_PLACES = Decimal(10) ** -12


# -- the policy --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RefundTier:
    """At least ``before`` ahead of a segment's start, ``fraction`` of the returned part's value is
    refunded."""

    before: timedelta
    fraction: Decimal


@dataclass(frozen=True)
class CancellationPolicy:
    """What a return refunds and what resale of returned capacity credits; the fleet's, or a pool's own.

    ``tiers`` are kept farthest first (the fleet file's reader sorts them); with none, nothing can be
    returned, which is SageMaker's rule and the default (``strict``)."""

    name: str = "strict"
    tiers: tuple[RefundTier, ...] = ()
    resale_share: Decimal = Decimal(0)  # share of the resold instance-hours' value credited to the seller
    # Share off the price of the instance-days a search can offer only from returned capacity
    # (core/pricing.py); 0: returned capacity sells at the usual price.
    resale_discount: Decimal = Decimal(0)
    quote_validity: timedelta = timedelta(minutes=10)
    refund_cap: Decimal | None = None  # the most refunded to one account per cap_period (None: no cap)
    cap_period: timedelta = timedelta(days=30)

    @property
    def allows_returns(self) -> bool:
        return bool(self.tiers)

    def fraction_at(self, now: datetime, segment_start: datetime) -> Decimal:
        """The share refunded for a part of a segment starting at ``segment_start`` returned at ``now``:
        the richest tier whose lead time is met; nothing once the segment has started."""
        lead = segment_start - now
        if lead <= timedelta(0):
            return Decimal(0)
        met = [tier.fraction for tier in self.tiers if lead >= tier.before]
        return max(met, default=Decimal(0))

    def describe(self) -> str:
        """One line a person reads, shown with every offering and plan."""
        if not self.tiers:
            return f"No returns ({self.name})"
        ordered = sorted(self.tiers, key=lambda tier: tier.before, reverse=True)
        parts = [_tier_words(tier, first=index == 0) for index, tier in enumerate(ordered)]
        last = ordered[-1].before
        parts.append("nothing once started" if last == timedelta(0) else "nothing later")
        line = ", ".join(parts)
        if self.resale_share:
            line += f"; {_percent(self.resale_share)} of resold instance-hours credited"
        if self.resale_discount:
            line += f"; returned capacity offered {_percent(self.resale_discount)} off"
        if self.refund_cap is not None:
            line += f"; at most {_plain(self.refund_cap)} refunded per account in {_words(self.cap_period)}"
        return line

    def as_json(self) -> dict[str, object]:
        """The policy as machines read it (native API answers); amounts and shares as exact text."""
        return {
            "Name": self.name,
            "Tiers": [
                {"BeforeSeconds": int(tier.before.total_seconds()), "Fraction": _plain(tier.fraction)}
                for tier in sorted(self.tiers, key=lambda tier: tier.before, reverse=True)
            ],
            "ResaleShare": _plain(self.resale_share),
            "ResaleDiscount": _plain(self.resale_discount),
            "QuoteValiditySeconds": int(self.quote_validity.total_seconds()),
            "RefundCap": None if self.refund_cap is None else _plain(self.refund_cap),
            "CapPeriodSeconds": int(self.cap_period.total_seconds()),
            "Description": self.describe(),
        }


STRICT = CancellationPolicy()
FLEXIBLE = CancellationPolicy(
    name="flexible",
    tiers=(RefundTier(timedelta(days=7), Decimal(1)), RefundTier(timedelta(0), Decimal("0.5"))),
    resale_share=Decimal("0.5"),
)
PRESETS = {"strict": STRICT, "flexible": FLEXIBLE}


def _tier_words(tier: RefundTier, first: bool) -> str:
    """One tier in words: the first names what it counts from ("before a segment starts"), the rest
    lean on it ("before", "its start")."""
    if first:
        amount = "Full refund" if tier.fraction == 1 else f"{_percent(tier.fraction)} refunded"
    else:
        amount = "full" if tier.fraction == 1 else _percent(tier.fraction)
    if tier.before == timedelta(0):
        when = "a segment's start" if first else "its start"
    else:
        when = f"{_words(tier.before)} before" + (" a segment starts" if first else "")
    return f"{amount} up to {when}"


def _percent(fraction: Decimal) -> str:
    return f"{_plain(fraction * 100)}%"


def _plain(amount: Decimal) -> str:
    """One spelling per amount: "0.5", not "0.50" or "5E-1"."""
    return format(amount.normalize(), "f")


def _words(length: timedelta) -> str:
    """A lead time as a person says it: "7 days", "1 day 12 hours", "30 minutes"."""
    minutes = int(length // timedelta(minutes=1))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    parts = [
        f"{amount} {unit}{'s' if amount != 1 else ''}"
        for amount, unit in ((days, "day"), (hours, "hour"), (minutes, "minute"))
        if amount
    ]
    return " ".join(parts) or f"{int(length.total_seconds())} seconds"


# -- what a return does ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """A plan's segment as the rules see it: ``count`` instances of one pool from ``start`` to ``end``."""

    ordinal: int
    instance_type: str
    availability_zone: str
    count: int
    start: datetime
    end: datetime


@dataclass(frozen=True)
class Scope:
    """What to return: the whole ``plan``; a ``segment``; ``instances`` of a segment; or a segment's
    ``tail`` from ``start`` (a boundary; None: the first boundary after now inside the segment)."""

    kind: str
    ordinal: int | None = None
    instances: int | None = None
    start: datetime | None = None


@dataclass(frozen=True)
class Window:
    """Capacity given back to the calendar: ``count`` instances of one pool from ``start`` to ``end``."""

    instance_type: str
    availability_zone: str
    start: datetime
    end: datetime
    count: int

    def instance_hours(self) -> float:
        return self.count * (self.end - self.start).total_seconds() / 3600


@dataclass(frozen=True)
class ReturnPlan:
    """What a scope does to a plan's segments now: the segments after it (a segment cut at a boundary
    keeps its ordinal; K instances from a started segment split it at the next boundary, the later part
    a new segment numbered after the last), the windows given back (never before now), and each
    window's refund fraction."""

    kept: tuple[Segment, ...]
    windows: tuple[Window, ...]
    refund_fraction_by_window: tuple[Decimal, ...]


@dataclass(frozen=True)
class _Change:
    """One segment's part of a return: what replaces it (nothing, itself changed, or two parts) and
    the window it gives back."""

    replacement: tuple[Segment, ...]
    window: Window


def plan_return(
    segments: Sequence[Segment],
    scope: Scope,
    now: datetime,
    segment_end: time,
    allowed_counts: Sequence[int] | None,
    policy: CancellationPolicy,
) -> ReturnPlan:
    """What ``scope`` returns of ``segments`` at ``now``; a ValidationError says why it cannot.

    ``allowed_counts`` are the fleet's (None: any count); a partial return must leave one of them."""
    if not policy.allows_returns:
        raise ValidationError(f"this fleet's cancellation policy, {policy.name}, allows no returns")
    if scope.kind not in SCOPE_KINDS:
        raise ValidationError(f"{scope.kind!r} is not a return scope (one of: {', '.join(SCOPE_KINDS)})")
    if scope.kind == "plan":
        changes = _whole_plan(segments, now, segment_end)
    else:
        segment = _named_segment(segments, scope)
        change = _one_segment(segment, scope, now, segment_end, allowed_counts, _next_ordinal(segments))
        changes = {segment.ordinal: change}
    ordered = sorted(changes.items())
    return ReturnPlan(
        kept=_kept(segments, changes),
        windows=tuple(change.window for _, change in ordered),
        refund_fraction_by_window=tuple(
            policy.fraction_at(now, _segment_of(segments, ordinal).start) for ordinal, _ in ordered
        ),
    )


def _kept(segments: Sequence[Segment], changes: dict[int, _Change]) -> tuple[Segment, ...]:
    """The plan's segments with each changed one replaced, in ordinal order."""
    kept = [
        part
        for segment in segments
        for part in (changes[segment.ordinal].replacement if segment.ordinal in changes else (segment,))
    ]
    return tuple(sorted(kept, key=lambda segment: segment.ordinal))


def _whole_plan(segments: Sequence[Segment], now: datetime, segment_end: time) -> dict[int, _Change]:
    """Every segment: whole if it has not started, from the next boundary if it has."""
    changes = {}
    for segment in segments:
        change = _from_now(segment, now, segment_end)
        if change is not None:
            changes[segment.ordinal] = change
    if not changes:
        raise ValidationError(
            "nothing left to return: every segment has ended or is in its last day (a started segment "
            "gives back only what follows its next boundary)"
        )
    return changes


def _one_segment(
    segment: Segment,
    scope: Scope,
    now: datetime,
    segment_end: time,
    allowed_counts: Sequence[int] | None,
    next_ordinal: int,
) -> _Change:
    if segment.end <= now:
        raise ValidationError(f"segment {segment.ordinal} has ended: nothing left to return")
    if scope.kind == "segment":
        change = _from_now(segment, now, segment_end)
        if change is None:
            raise ValidationError(_last_day(segment, now, segment_end))
        return change
    if scope.kind == "instances":
        return _instances(segment, scope.instances, now, segment_end, allowed_counts, next_ordinal)
    return _tail(segment, scope.start, now, segment_end)


def _from_now(segment: Segment, now: datetime, segment_end: time) -> _Change | None:
    """The segment whole if it has not started; else its part after the next boundary (the kept part
    ends there); None when nothing of it can be given back."""
    if segment.start > now:
        return _Change(replacement=(), window=_window(segment, segment.start, segment.end, segment.count))
    cut = next_boundary(now, segment_end)
    if cut >= segment.end:
        return None
    return _cut_at(segment, cut)


def _cut_at(segment: Segment, cut: datetime) -> _Change:
    return _Change(
        replacement=(replace(segment, end=cut),),
        window=_window(segment, cut, segment.end, segment.count),
    )


def _instances(
    segment: Segment,
    instances: int | None,
    now: datetime,
    segment_end: time,
    allowed_counts: Sequence[int] | None,
    next_ordinal: int,
) -> _Change:
    """K of a segment's instances: a segment not started keeps the rest; a started one keeps its count
    up to the next boundary and a new segment holds the rest after it."""
    if instances is None or not 1 <= instances <= segment.count:
        raise ValidationError(
            f"instances: {instances} is not between 1 and segment {segment.ordinal}'s count, {segment.count}"
        )
    left = segment.count - instances
    if left and allowed_counts is not None and left not in allowed_counts:
        allowed = ", ".join(str(count) for count in allowed_counts if count < segment.count)
        raise ValidationError(
            f"instances: returning {instances} of segment {segment.ordinal}'s {segment.count} would leave "
            f"{left}, a count the fleet does not allow (it allows {allowed or 'none below it'}, or all "
            f"{segment.count} returned)"
        )
    if segment.start > now:
        rest = (replace(segment, count=left),) if left else ()
        return _Change(replacement=rest, window=_window(segment, segment.start, segment.end, instances))
    cut = next_boundary(now, segment_end)
    if cut >= segment.end:
        raise ValidationError(_last_day(segment, now, segment_end))
    later = (replace(segment, ordinal=next_ordinal, start=cut, count=left),) if left else ()
    return _Change(
        replacement=(replace(segment, end=cut), *later),
        window=_window(segment, cut, segment.end, instances),
    )


def _tail(segment: Segment, start: datetime | None, now: datetime, segment_end: time) -> _Change:
    """The segment from a boundary after now and after its own start (it keeps what lies before)."""
    if start is None:
        start = next_boundary(max(now, segment.start), segment_end)
        if start >= segment.end:
            raise ValidationError(_last_day(segment, now, segment_end))
        return _cut_at(segment, start)
    if start.tzinfo is None:
        raise ValidationError(f"from: {start.isoformat()} names no time zone (give UTC)")
    if not on_boundary(start, segment_end):
        raise ValidationError(
            f"from: {_when(start)} is not on a segment boundary ({segment_end.strftime('%H:%M')} UTC)"
        )
    if start <= now:
        raise ValidationError(f"from: {_when(start)} is not after now ({_when(now)})")
    if not segment.start < start < segment.end:
        raise ValidationError(
            f"from: {_when(start)} is not inside segment {segment.ordinal} ({_when(segment.start)} to "
            f"{_when(segment.end)}); to return all of it, return the segment"
        )
    return _cut_at(segment, start)


def _last_day(segment: Segment, now: datetime, segment_end: time) -> str:
    return (
        f"nothing left to return: segment {segment.ordinal} has started and ends at its next boundary, "
        f"{_when(min(segment.end, next_boundary(now, segment_end)))}"
    )


def _named_segment(segments: Sequence[Segment], scope: Scope) -> Segment:
    if scope.ordinal is None:
        raise ValidationError(f"a {scope.kind} return names a segment")
    for segment in segments:
        if segment.ordinal == scope.ordinal:
            return segment
    known = ", ".join(str(segment.ordinal) for segment in segments)
    raise ValidationError(f"segment: the plan has no segment {scope.ordinal} (it has {known or 'none'})")


def _segment_of(segments: Sequence[Segment], ordinal: int) -> Segment:
    return next(segment for segment in segments if segment.ordinal == ordinal)


def _next_ordinal(segments: Sequence[Segment]) -> int:
    return max((segment.ordinal for segment in segments), default=0) + 1


def _window(segment: Segment, start: datetime, end: datetime, count: int) -> Window:
    return Window(segment.instance_type, segment.availability_zone, start, end, count)


def next_boundary(moment: datetime, segment_end: time) -> datetime:
    """The first boundary (``segment_end`` UTC) strictly after ``moment``."""
    utc = moment.astimezone(UTC)
    boundary = datetime.combine(utc.date(), segment_end, tzinfo=UTC)
    while boundary <= utc:
        boundary += DAY
    return boundary


def on_boundary(moment: datetime, segment_end: time) -> bool:
    utc = moment.astimezone(UTC)
    return (utc - datetime.combine(utc.date(), segment_end, tzinfo=UTC)) % DAY == timedelta(0)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


# -- what it is worth --------------------------------------------------------------------------------


def refund(paid: Decimal, held_instance_hours: float, plan: ReturnPlan, places: int) -> Decimal:
    """The refund for ``plan``: each window is worth ``paid`` x its instance-hours / every instance-hour
    the plan ever held, refunded at its fraction; the sum rounded down to ``places`` (the currency's
    minor unit), never more than was paid."""
    if held_instance_hours <= 0 or paid <= 0:
        return Decimal(0).quantize(Decimal(10) ** -places)
    weighted = sum(
        (_exact_instance_hours(window) * fraction
         for window, fraction in zip(plan.windows, plan.refund_fraction_by_window, strict=True)),
        Decimal(0),
    )  # fmt: skip
    share = (weighted / Decimal(repr(held_instance_hours))).quantize(_SHARE_PLACES, ROUND_HALF_EVEN)
    amount = (paid * share).quantize(Decimal(10) ** -places, ROUND_DOWN)
    return min(amount, paid)


def _exact_instance_hours(window: Window) -> Decimal:
    microseconds = (window.end - window.start) // timedelta(microseconds=1)
    return Decimal(window.count * microseconds) / Decimal(3_600_000_000)


def capped(refund: Decimal, refunded_in_period: Decimal, policy: CancellationPolicy) -> Decimal:
    """The part of ``refund`` within the account's cap, given what it was refunded in the period."""
    if policy.refund_cap is None:
        return refund
    room = max(policy.refund_cap - refunded_in_period, Decimal(0))
    return min(refund, room)


def fingerprint(segments: Sequence[Segment]) -> str:
    """The segments as they are, hashed: a quote made under another fingerprint is stale."""
    lines = [
        f"{s.ordinal}|{s.instance_type}|{s.availability_zone}|{s.count}|"
        f"{s.start.astimezone(UTC).isoformat()}|{s.end.astimezone(UTC).isoformat()}"
        for s in sorted(segments, key=lambda s: s.ordinal)
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
