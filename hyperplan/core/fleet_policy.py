"""The fleet file's booking policy: ``[policy]`` (what a plan may be, and how offerings are found and
ranked) and ``[background_load]`` (synthetic bookings that keep a demo calendar busy)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import time, timedelta
from types import MappingProxyType
from typing import Any

from hyperplan.core.durations import format_duration
from hyperplan.core.fleet import RANKINGS, SERVED_TARGETS, BackgroundLoad, BookingPolicy
from hyperplan.core.fleet_values import Table, is_number

_POLICY_KEYS = (
    "lead_time", "horizon", "segment_end", "min_days", "max_days", "allowed_counts", "max_segments",
    "max_offerings", "offering_validity", "ranking", "reclaim_lead",
)  # fmt: skip


def read_policy(values: Mapping[str, Any]) -> BookingPolicy:
    table = Table(values, "policy", _POLICY_KEYS)
    default = BookingPolicy()
    min_days = table.integer("min_days", default.min_days, minimum=1)
    max_days = table.integer("max_days", default.max_days, minimum=min_days)
    lead_time = table.duration("lead_time", default.lead_time)
    horizon = table.duration("horizon", default.horizon)
    if horizon <= lead_time:
        raise table.fail("horizon", f"{format_duration(horizon)} is not later than the lead time")
    return BookingPolicy(
        lead_time=lead_time,
        horizon=horizon,
        segment_end=_segment_end(table, default.segment_end),
        min_days=min_days,
        max_days=max_days,
        allowed_counts=_allowed_counts(table, default.allowed_counts),
        max_segments=_max_segments(table, default.max_segments),
        max_offerings=table.integer("max_offerings", default.max_offerings, minimum=1),
        offering_validity=table.duration("offering_validity", default.offering_validity),
        ranking=_ranking(table, default.ranking),
        reclaim_lead=_reclaim_lead(table.table("reclaim_lead") or {}),
    )


# An offering id carries each segment in 12 bytes and must stay within SageMaker's 256 characters.
MOST_SEGMENTS = 10


def _max_segments(table: Table, default: int) -> int:
    value = table.integer("max_segments", default, minimum=1)
    if value > MOST_SEGMENTS:
        raise table.fail("max_segments", f"{value} is more than {MOST_SEGMENTS} (an offering id's room)")
    return value


def _ranking(table: Table, default: str) -> str:
    ranking = table.text("ranking", default)
    if ranking not in RANKINGS:
        raise table.fail("ranking", f"{ranking!r} is not one of {', '.join(RANKINGS)}")
    return ranking


def _segment_end(table: Table, default: time) -> time:
    """``"11:30"`` or a TOML local time; on a half hour, because capacity is counted in 30-minute slots."""
    raw = table.get("segment_end", (str, time), default, 'a time of day such as "11:30"')
    if isinstance(raw, str):
        match = re.fullmatch(r"(\d{1,2}):(\d{2})", raw)
        if match is None or int(match[1]) > 23 or int(match[2]) > 59:
            raise table.fail("segment_end", f'{raw!r} is not a time of day such as "11:30"')
        raw = time(int(match[1]), int(match[2]))
    if raw.minute % 30 or raw.second or raw.microsecond or raw.tzinfo is not None:
        raise table.fail("segment_end", f"{raw} is not on the hour or half hour (UTC, no offset)")
    return raw


def _allowed_counts(table: Table, default: tuple[int, ...] | None) -> tuple[int, ...] | None:
    raw = table.get("allowed_counts", (list, str), default, 'a list of counts or "any"')
    if raw == "any" or raw is None:
        return None
    if isinstance(raw, str) or not raw:
        raise table.fail("allowed_counts", f'{raw!r} is not a list of counts or "any"')
    for index, count in enumerate(raw):
        if not is_number(count, int) or count < 1:
            raise table.fail(f"allowed_counts[{index}]", f"{count!r} is not a positive whole number")
    return tuple(sorted(set(raw)))


def _reclaim_lead(values: Mapping[str, Any]) -> Mapping[str, timedelta]:
    table = Table(values, "policy.reclaim_lead", SERVED_TARGETS)
    leads = {target: table.duration(target, timedelta(minutes=30)) for target in SERVED_TARGETS}
    return MappingProxyType(leads)


_BACKGROUND_KEYS = ("cycle_days", "quiet_days", "quiet_booked", "busy_booked", "seed")


def read_background_load(values: Mapping[str, Any] | None) -> BackgroundLoad | None:
    if values is None:
        return None
    table = Table(values, "background_load", _BACKGROUND_KEYS)
    default = BackgroundLoad()
    cycle_days = table.integer("cycle_days", default.cycle_days, minimum=2)
    quiet_days = table.pair("quiet_days", default.quiet_days, int)
    if quiet_days[0] < 1 or quiet_days[1] >= cycle_days:
        raise table.fail("quiet_days", f"{list(quiet_days)} must lie within 1 .. cycle_days - 1")
    return BackgroundLoad(
        cycle_days=cycle_days,
        quiet_days=quiet_days,
        quiet_booked=_fractions(table, "quiet_booked", default.quiet_booked),
        busy_booked=_fractions(table, "busy_booked", default.busy_booked),
        seed=table.integer("seed", default.seed),
    )


def _fractions(table: Table, key: str, default: tuple[float, float]) -> tuple[float, float]:
    low, high = table.pair(key, default, float)
    if low < 0.0 or high > 1.0:
        raise table.fail(key, f"{[low, high]} must lie within 0 .. 1")
    return (low, high)
