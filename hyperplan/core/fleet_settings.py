"""The fleet file's smaller tables, each one setting of the service: ``[accounts]``, ``[notifications]``,
``[images]``, ``[webhooks]`` and ``[retention]``."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from types import MappingProxyType
from typing import Any

from hyperplan.core.durations import format_duration
from hyperplan.core.fleet import PAYMENT_MODES, Notifications, Retention
from hyperplan.core.fleet_values import Table
from hyperplan.core.id_ranges import (
    DEFAULT_OS_IDS,
    DEFAULT_SUBORDINATE_IDS,
    SUBORDINATE_BLOCK,
    IdRange,
    parse_id_range,
)
from hyperplan.core.webhook_targets import WebhookTargets, parse_networks
from hyperplan.errors import ValidationError

_ACCOUNTS_KEYS = ("default_payment_mode", "os_ids", "subordinate_ids")


def read_payment_mode(values: Mapping[str, Any]) -> str:
    table = Table(values, "accounts", _ACCOUNTS_KEYS)
    mode = table.text("default_payment_mode", "auto")
    if mode not in PAYMENT_MODES:
        raise table.fail("default_payment_mode", f"{mode!r} is not one of {', '.join(PAYMENT_MODES)}")
    return mode


def read_os_ids(values: Mapping[str, Any]) -> IdRange:
    """``[accounts] os_ids = "70000-99999"``: where the uids and gids of accounts' OS users come from."""
    table = Table(values, "accounts", _ACCOUNTS_KEYS)
    if "os_ids" not in values:
        return DEFAULT_OS_IDS
    try:
        return parse_id_range(table.text("os_ids"))
    except ValueError as error:
        raise table.fail("os_ids", str(error)) from None


def read_subordinate_ids(values: Mapping[str, Any]) -> IdRange:
    """``[accounts] subordinate_ids = "FIRST-LAST"``: where each account's block of host ids for its
    containers' user namespaces comes from; room for one block at least, and none of it an OS user's id
    (``os_ids``), which a container's root or daemon would then be on the host."""
    table = Table(values, "accounts", _ACCOUNTS_KEYS)
    given = "subordinate_ids" in values
    try:
        found = parse_id_range(table.text("subordinate_ids")) if given else DEFAULT_SUBORDINATE_IDS
    except ValueError as error:
        raise table.fail("subordinate_ids", str(error)) from None
    if found.size < SUBORDINATE_BLOCK:
        raise table.fail(
            "subordinate_ids",
            f"{found} holds {found.size} ids, fewer than one account's block of {SUBORDINATE_BLOCK}",
        )
    os_ids = read_os_ids(values)
    if found.overlaps(os_ids):
        what = str(found) if given else f"the default, {found},"
        raise table.fail(
            "subordinate_ids",
            f"{what} overlaps os_ids {os_ids}: containers' ids and accounts' users' ids must not meet; "
            "give each a range of its own",
        )
    return found


def read_notifications(values: Mapping[str, Any]) -> Notifications:
    table = Table(values, "notifications", ("start_reminder", "reclaim_reminder"))
    default = Notifications()
    return Notifications(
        start_reminder=table.duration("start_reminder", default.start_reminder),
        reclaim_reminder=table.duration("reclaim_reminder", default.reclaim_reminder),
    )


def read_images(values: Mapping[str, Any]) -> Mapping[str, str]:
    images = {}
    for image, interpreter in values.items():
        if not isinstance(interpreter, str) or not interpreter.startswith("/"):
            raise ValidationError(f"images.{image!r}: give the absolute path of a Python interpreter.")
        images[str(image)] = interpreter
    return MappingProxyType(images)


def read_webhooks(values: Mapping[str, Any]) -> WebhookTargets:
    table = Table(values, "webhooks", ("allowed_networks",))
    listed = table.get("allowed_networks", list, [], "a list of networks such as 10.0.0.0/8")
    try:
        return WebhookTargets(parse_networks(listed, table.at("allowed_networks")))
    except ValueError as error:
        raise ValidationError(str(error)) from None


_RETENTION_KEYS = ("period", "events", "audit", "leases", "metering")
# The shortest each may be: a file or row going within the hour it ended is a mistake, not a policy; the
# metering ledger is compacted by whole UTC days, so its period is at least one.
_AN_HOUR, _A_DAY = (timedelta(hours=1), "an hour"), (timedelta(days=1), "a day")
_SHORTEST = {key: _AN_HOUR for key in _RETENTION_KEYS} | {"metering": _A_DAY}


def read_retention(values: Mapping[str, Any]) -> Retention:
    """``[retention]``: ``period = "30d"``, how long ended work's files stay; ``events``, ``audit``,
    ``leases``, ``metering``, how long those rows stay (metering: hourly lines before they are compacted
    per day). Each one not given: kept for ever."""
    table = Table(values, "retention", _RETENTION_KEYS)
    return Retention(**{key: _retention_period(table, key) for key in _RETENTION_KEYS})


def _retention_period(table: Table, key: str) -> timedelta | None:
    if key not in table.values:
        return None
    period = table.duration(key, timedelta(0))
    shortest, words = _SHORTEST[key]
    if period < shortest:
        raise table.fail(key, f"{format_duration(period)} is shorter than {words}")
    return period
