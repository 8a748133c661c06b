"""The fleet file's ``[pricing]`` table: load-based prices (core/pricing.py applies them).

``load_based = true`` turns them on; ``low`` and ``high`` are the multipliers of the pool's price on a day
the pool holds nothing and on a day it is full (defaults 0.8 and 1.5): ``0 < low <= 1 <= high <= 5``, so
that an idle day never costs more than the list price and a full one never less.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from hyperplan.core.fleet import LOAD_PRICE_CEILING, LoadPricing
from hyperplan.core.fleet_values import Table

_KEYS = ("load_based", "low", "high")


def read_pricing(values: Mapping[str, Any]) -> LoadPricing:
    """``[pricing]``, every key optional; a ValidationError names the key that is wrong."""
    table = Table(values, "pricing", _KEYS)
    default = LoadPricing()
    load_based = table.get("load_based", bool, default.load_based, "true or false")
    low = _multiplier(table, "low", default.low)
    high = _multiplier(table, "high", default.high)
    if not Decimal(0) < low <= 1:
        raise table.fail("low", f"{low} is not a multiplier above 0 and at most 1 (an idle day's price)")
    if not 1 <= high <= LOAD_PRICE_CEILING:
        raise table.fail(
            "high", f"{high} is not a multiplier from 1 to {LOAD_PRICE_CEILING} (a full day's price)"
        )
    return LoadPricing(load_based=bool(load_based), low=low, high=high)


def _multiplier(table: Table, key: str, default: Decimal) -> Decimal:
    if key not in table.values:
        return default
    raw = table.get(key, (str, int, float), default, "a multiplier such as 1.5")
    try:
        value = Decimal(str(raw))  # via str(): a TOML float 1.1 must not become 1.1000000000000000888
    except InvalidOperation:
        raise table.fail(key, f"{raw!r} is not a multiplier such as 1.5") from None
    if not value.is_finite():
        raise table.fail(key, f"{raw!r} is not a multiplier such as 1.5")
    return value.quantize(Decimal("0.0001"))
