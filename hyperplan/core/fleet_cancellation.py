"""The fleet file's ``[cancellation]`` table and a pool's own ``cancellation``: what a return of a plan's
capacity refunds, and what resale of returned capacity credits (core/returns.py applies them).

Either is a preset's name (``"strict"``, the default: no returns; ``"flexible"``) or a table: a
``preset`` to start from, and any of ``tiers``, ``resale_share``, ``resale_discount``, ``quote_validity``,
``refund_cap`` and ``cap_period`` over it. A table with its own ``tiers`` is named ``custom``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from itertools import pairwise
from typing import Any

from hyperplan.core.durations import MAX_DURATION, format_duration
from hyperplan.core.fleet_values import Table
from hyperplan.core.returns import PRESETS, CancellationPolicy, RefundTier

_KEYS = ("preset", "tiers", "resale_share", "resale_discount", "quote_validity", "refund_cap", "cap_period")
_TIER_KEYS = ("before", "refund")
# A quote holds a refund against a plan that others may be buying around: a day is the most it may.
QUOTE_VALIDITY_CEILING = timedelta(days=1)


def read_cancellation(values: Mapping[str, Any], path: str = "cancellation") -> CancellationPolicy:
    """``[cancellation]`` (every key optional; none: strict); a ValidationError names the key."""
    table = Table(values, path, _KEYS)
    base = _preset(table, table.text("preset", "strict"), "preset")
    tiers = _tiers(table) if "tiers" in table.values else base.tiers
    return replace(
        base,
        name="custom" if "tiers" in table.values else base.name,
        tiers=tiers,
        resale_share=_share(table, "resale_share", base.resale_share, zero_allowed=True),
        resale_discount=_share(table, "resale_discount", base.resale_discount, zero_allowed=True),
        quote_validity=_duration(
            table, "quote_validity", base.quote_validity, most=QUOTE_VALIDITY_CEILING, positive=True
        ),
        refund_cap=_cap(table, base.refund_cap),
        cap_period=_duration(table, "cap_period", base.cap_period, positive=True),
    )


def read_pool_cancellation(pool: Table) -> CancellationPolicy | None:
    """A pool's ``cancellation``: a preset's name or a table like ``[cancellation]``; None: the fleet's."""
    raw = pool.get("cancellation", (str, dict), None, 'a preset ("strict", "flexible") or a table')
    if raw is None:
        return None
    if isinstance(raw, str):
        return _preset(pool, raw, "cancellation")
    return read_cancellation(raw, pool.at("cancellation"))


def _preset(table: Table, name: str, key: str) -> CancellationPolicy:
    if name not in PRESETS:
        raise table.fail(key, f"{name!r} is not a preset (one of: {', '.join(PRESETS)})")
    return PRESETS[name]


def _tiers(table: Table) -> tuple[RefundTier, ...]:
    """``[{before = "7d", refund = 1.0}, ...]``, farthest first; a refund may not grow as a segment's
    start nears (returning later must never pay more)."""
    tiers = []
    for index, values in enumerate(table.tables("tiers")):
        tier = Table(values, table.at(f"tiers[{index}]"), _TIER_KEYS)
        tiers.append(
            RefundTier(
                before=_duration(tier, "before", timedelta(0), required=True),
                fraction=_share(tier, "refund", Decimal(0), zero_allowed=False, required=True),
            )
        )
    ordered = sorted(tiers, key=lambda tier: tier.before, reverse=True)
    for farther, nearer in pairwise(ordered):
        if farther.before == nearer.before:
            raise table.fail(
                "tiers", f"two tiers start {format_duration(nearer.before)} before; one would do"
            )
        if nearer.fraction > farther.fraction:
            raise table.fail(
                "tiers",
                f"the tier {format_duration(nearer.before)} before refunds more than the one "
                f"{format_duration(farther.before)} before; a later return may not refund more",
            )
    return tuple(ordered)


def _share(table: Table, key: str, default: Decimal, zero_allowed: bool, required: bool = False) -> Decimal:
    """A share such as ``0.5`` (a TOML number or text, read as an exact decimal): at most 1, and more
    than 0 unless ``zero_allowed``."""
    if key not in table.values:
        if required:
            raise table.fail(key, "required")
        return default
    raw = table.get(key, (str, int, float), default, "a share such as 0.5")
    try:
        share = Decimal(str(raw))  # via str(): a TOML float 0.35 must not become 0.34999...
    except InvalidOperation:
        raise table.fail(key, f"{raw!r} is not a share such as 0.5") from None
    low = "at least 0" if zero_allowed else "more than 0"
    if not share.is_finite() or share > 1 or share < 0 or (share == 0 and not zero_allowed):
        raise table.fail(key, f"{raw} is not a share: {low}, at most 1")
    return share


def _duration(
    table: Table,
    key: str,
    default: timedelta,
    most: timedelta = MAX_DURATION,
    positive: bool = False,
    required: bool = False,
) -> timedelta:
    """A duration up to ``most``; longer than nothing when ``positive`` (a quote valid for no time, or
    a cap over no period, would be a fleet file's mistake rather than a policy)."""
    if required and key not in table.values:
        raise table.fail(key, "required")
    value = table.duration(key, default)
    if positive and value <= timedelta(0):
        raise table.fail(key, f"{format_duration(value)} is not longer than nothing")
    if value > most:
        raise table.fail(key, f"{format_duration(value)} is longer than {format_duration(most)}")
    return value


def _cap(table: Table, default: Decimal | None) -> Decimal | None:
    """``refund_cap``: an amount such as ``"50000"`` (exact), or ``"none"`` for no cap."""
    if "refund_cap" not in table.values:
        return default
    raw = table.get("refund_cap", (str, int, float), default, 'an amount such as "50000" or "none"')
    if raw == "none":
        return None
    try:
        amount = Decimal(str(raw))  # via str(): a TOML float must not gain binary digits
    except InvalidOperation:
        raise table.fail("refund_cap", f'{raw!r} is not an amount such as "50000" or "none"') from None
    if not amount.is_finite() or amount <= 0:
        raise table.fail("refund_cap", f'{raw} is not a positive amount (or "none")')
    return amount
