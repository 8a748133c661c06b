"""The fleet file's ``[spot]`` table: managed spot training's prices, the lenders' share, where a spot job
looks first, and the defaults and bounds of a plan's lending policy (core/spot.py applies them)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from hyperplan.core.durations import format_duration
from hyperplan.core.fleet import (
    SPOT_KILL_GRACE_CEILING,
    SPOT_NOTICE_CEILING,
    SPOT_PREFERENCES,
    SPOT_SPAN_CEILING,
    SpotPolicy,
)
from hyperplan.core.fleet_values import Table

_SPOT_KEYS = (
    "price_fraction", "lender_share", "prefer", "notice", "max_notice", "min_run", "stop_margin",
    "kill_grace",
)  # fmt: skip


def read_spot(values: Mapping[str, Any]) -> SpotPolicy:
    """``[spot]``, every key optional; a ValidationError names the key that is out of its bounds."""
    table = Table(values, "spot", _SPOT_KEYS)
    default = SpotPolicy()
    max_notice = _duration(table, "max_notice", default.max_notice, timedelta(seconds=1), SPOT_NOTICE_CEILING)
    notice = _duration(table, "notice", default.notice, timedelta(seconds=1), max_notice, "max_notice")
    return SpotPolicy(
        price_fraction=_fraction(table, "price_fraction", default.price_fraction, zero_allowed=False),
        lender_share=_fraction(table, "lender_share", default.lender_share, zero_allowed=True),
        prefer=_prefer(table, default.prefer),
        # A plan's notice may be anything up to max_notice, so the fleet's default must be too.
        notice=notice,
        max_notice=max_notice,
        min_run=_duration(table, "min_run", default.min_run, timedelta(0), SPOT_SPAN_CEILING),
        # The default margin must hold the default notice (core/spot.py refuses a plan's policy otherwise).
        stop_margin=_duration(
            table, "stop_margin", default.stop_margin, notice, SPOT_SPAN_CEILING, least_name="notice"
        ),
        kill_grace=_duration(table, "kill_grace", default.kill_grace, timedelta(0), SPOT_KILL_GRACE_CEILING),
    )


def _fraction(table: Table, key: str, default: Decimal, zero_allowed: bool) -> Decimal:
    """A share such as ``0.35`` (a TOML number or string, read as an exact decimal): at most 1, and more
    than 0 unless ``zero_allowed`` (free spot capacity makes no sense; an owner may be credited nothing)."""
    raw = table.get(key, (str, int, float), default, "a share such as 0.35")
    if key not in table.values:
        return default
    try:
        share = Decimal(str(raw))  # via str(): a TOML float 0.35 must not become 0.34999...
    except InvalidOperation:
        raise table.fail(key, f"{raw!r} is not a share such as 0.35") from None
    low = "at least 0" if zero_allowed else "more than 0"
    if not share.is_finite() or share > 1 or share < 0 or (share == 0 and not zero_allowed):
        raise table.fail(key, f"{raw} is not a share: {low}, at most 1")
    return share


def _prefer(table: Table, default: str) -> str:
    prefer = table.text("prefer", default)
    if prefer not in SPOT_PREFERENCES:
        raise table.fail("prefer", f"{prefer!r} is not one of {', '.join(SPOT_PREFERENCES)}")
    return prefer


def _duration(
    table: Table,
    key: str,
    default: timedelta,
    least: timedelta,
    most: timedelta,
    most_name: str | None = None,
    least_name: str | None = None,
) -> timedelta:
    """A duration within [least, most]; ``most_name`` and ``least_name`` name the keys the bounds came
    from, if any."""
    value = table.duration(key, default)
    given = "" if key in table.values else " (the default)"
    if value < least:
        floor = f"{least_name}, {format_duration(least)}" if least_name else format_duration(least)
        raise table.fail(key, f"{format_duration(value)}{given} is shorter than {floor}")
    if value > most:
        limit = f"{most_name}, {format_duration(most)}" if most_name else format_duration(most)
        raise table.fail(key, f"{format_duration(value)}{given} is longer than {limit}")
    return value
