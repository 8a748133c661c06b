"""The fleet file's limits on what an account may do: ``[quotas]`` on bookings, and ``[rate_limits]`` on
requests and on execs at once."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from hyperplan.core.exec_limits import DEFAULT_PER_ACCOUNT, DEFAULT_TOTAL, MAX_TOTAL, ExecLimits
from hyperplan.core.fleet import Quotas
from hyperplan.core.fleet_values import REQUIRED, Table
from hyperplan.core.rate_limits import DEFAULT_RATE_LIMITS, RateLimit, RateLimits, RequestClass
from hyperplan.errors import ValidationError

_QUOTA_KEYS = (
    "max_active_plans",
    "max_reserved_instances_per_type",
    "max_reserved_share_per_type",
    "max_reserved_instance_hours_per_30_days",
    "max_on_demand_instances_per_type",
    "max_on_demand_share_per_type",
)


def read_quotas(values: Mapping[str, Any]) -> Quotas:
    table = Table(values, "quotas", _QUOTA_KEYS)
    default = Quotas()
    share = _share(table, "max_reserved_share_per_type")
    on_demand_share = _share(table, "max_on_demand_share_per_type")
    hours, on_demand = (
        table.integer(key, minimum=1) if key in values else None
        for key in ("max_reserved_instance_hours_per_30_days", "max_on_demand_instances_per_type")
    )
    return Quotas(
        max_active_plans=table.integer("max_active_plans", default.max_active_plans, minimum=1),
        max_reserved_instances_per_type=table.integer(
            "max_reserved_instances_per_type", default.max_reserved_instances_per_type, minimum=1
        ),
        max_reserved_share_per_type=share,
        max_reserved_instance_hours_per_30_days=hours,
        max_on_demand_instances_per_type=on_demand,
        max_on_demand_share_per_type=on_demand_share,
    )


def _share(table: Table, key: str) -> float | None:
    share = table.get(key, (int, float), None, "a share such as 0.5")
    if share is not None and not 0 < share <= 1:
        raise table.fail(key, f"{share} is not a share: more than 0, at most 1")
    return None if share is None else float(share)


_RATE_LIMIT_KEYS = (*(c.value for c in RequestClass), "concurrent_exec", "concurrent_exec_total")


def read_rate_limits(values: Mapping[str, Any]) -> RateLimits:
    table = Table(values, "rate_limits", _RATE_LIMIT_KEYS)
    limits = dict(DEFAULT_RATE_LIMITS)
    for request_class in RequestClass:
        entry = table.table(request_class.value)
        if entry is None:
            continue
        path = table.at(request_class.value)
        limit_table = Table(entry, path, ("rate", "burst"))
        rate = limit_table.get("rate", (int, float), REQUIRED, "a number of requests per second")
        burst = limit_table.integer("burst", minimum=1)
        try:
            limits[request_class] = RateLimit(float(rate), burst)
        except ValidationError as error:
            raise ValidationError(f"{path}: {error.message}") from None
    return MappingProxyType(limits)


def read_exec_limits(values: Mapping[str, Any]) -> ExecLimits:
    """``[rate_limits] concurrent_exec`` and ``concurrent_exec_total``: the execs one server process runs
    at once, an account's and every account's."""
    table = Table(values, "rate_limits", _RATE_LIMIT_KEYS)
    total = table.integer("concurrent_exec_total", DEFAULT_TOTAL, minimum=1)
    if total > MAX_TOTAL:
        raise table.fail("concurrent_exec_total", f"{total} is more than {MAX_TOTAL}")
    per_account = table.integer("concurrent_exec", min(DEFAULT_PER_ACCOUNT, total), minimum=1)
    if per_account > total:
        raise table.fail(
            "concurrent_exec", f"{per_account} is more than concurrent_exec_total, {total} (all accounts')"
        )
    return ExecLimits(per_account=per_account, total=total)
