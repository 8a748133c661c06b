"""The fleet file: a fleet declared in TOML, read into `hyperplan.core.fleet`'s values.

A fleet is declared in TOML (the embedded demo, ``hyperplan/fleet/demo.toml``, documents every key).
:func:`parse_fleet` reads the text (reading the file is the caller's job) and checks everything it can;
each complaint is a :class:`~hyperplan.errors.ValidationError` that names the TOML key path, such as
``pools[2].reservable: 20 is more than the pool's count, 16``.

In brief::

    region = "us-west-2"
    currency = "USD"                     # default for every pool
    [[zones]]    name, zone_id, subnets
    [[pools]]    instance_type, zone, count, reservable (default: count), price_per_instance_hour, currency,
                 on_demand_price_per_instance_hour (default: price_per_instance_hour)
    [policy]     lead_time, horizon, segment_end, min_days, max_days, allowed_counts, max_segments,
                 max_offerings, offering_validity, ranking, [policy.reclaim_lead] <target> = duration
    [background_load]  cycle_days, quiet_days, quiet_booked, busy_booked, seed     (optional)
    [quotas]     max_active_plans, max_reserved_instances_per_type, max_reserved_share_per_type,
                 max_reserved_instance_hours_per_30_days, max_on_demand_instances_per_type,
                 max_on_demand_share_per_type
    [rate_limits]  search, purchase, read, write: each { rate = per second, burst = requests };
                 concurrent_exec (an account's execs at once, default 8), concurrent_exec_total (all
                 accounts', default 64): per server process
    [buckets]    <bucket name> = <directory>, or { path = <directory>, accounts = [...] }, or
                 [buckets.<bucket name>] endpoint_url, region, bucket, access_key_id_env,
                 secret_access_key_env (or access_key_id, secret_access_key), accounts
                 (accounts: the names or ids of the accounts that own it; none: administrators)
    [accounts]   default_payment_mode = "auto" | "budget" | "approval"; os_ids = "70000-99999" (the uids
                 and gids of the OS users the server makes for accounts, each handed out once)
    [webhooks]   allowed_networks = ["10.20.0.0/16", ...]   non-public networks webhooks may reach
    [images]     <training image or prefix*> = <absolute path of a Python>
    [backend]    kind = "local" | "slurm"; work_dir = "/srv/hyperplan-work" (nodes' homes, sandboxes, job
                 trees; --work-dir wins); for Slurm: slurm_conf (absolute path), partition, kill_grace
                 (default "2m"); each pool then names its nodes, nodes = "gpu[01-16]" (a Slurm
                 hostlist; count, if given, must equal their number), and may name their feature
                 (default: its instance type)
    [retention]  period = "30d": ended jobs' trees and logs and terminated nodes' homes are removed this
                 long after they ended (default: kept)
"""

from __future__ import annotations

import re
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from datetime import time, timedelta
from decimal import Decimal, InvalidOperation
from types import MappingProxyType
from typing import Any

from hyperplan.core.buckets import bucket_name_problem
from hyperplan.core.durations import format_duration, parse_duration
from hyperplan.core.exec_limits import DEFAULT_PER_ACCOUNT, DEFAULT_TOTAL, MAX_TOTAL, ExecLimits
from hyperplan.core.fleet import (
    BACKEND_KINDS,
    PAYMENT_MODES,
    RANKINGS,
    SERVED_TARGETS,
    AvailabilityZone,
    BackendSettings,
    BackgroundLoad,
    BookingPolicy,
    Bucket,
    DirectoryBucket,
    Fleet,
    Notifications,
    Pool,
    Quotas,
    S3Bucket,
)
from hyperplan.core.hostlist import expand
from hyperplan.core.id_ranges import DEFAULT_OS_IDS, IdRange, parse_id_range
from hyperplan.core.rate_limits import DEFAULT_RATE_LIMITS, RateLimit, RateLimits, RequestClass
from hyperplan.core.webhook_targets import WebhookTargets, parse_networks
from hyperplan.errors import ValidationError

_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
_ZONE_ID = re.compile(r"[a-z0-9]+-az\d+")
_SUBNET = re.compile(r"subnet-[0-9a-f]{8,17}")
_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9-]+")
_CURRENCY = re.compile(r"[A-Z]{3}")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_S3_REGION = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
_ACCOUNT = re.compile(r"[a-z0-9](-?[a-z0-9]){0,62}")  # an account's name, or its twelve-digit id
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CURRENCY_HINT = " (three capital letters, such as USD)"
_FEATURE = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION = re.compile(r"[A-Za-z0-9_-]+")


# -- reading TOML ------------------------------------------------------------------------------------

_REQUIRED: Any = object()


class _Table:
    """One TOML table being read. It knows its key path, so that every complaint can name the key."""

    def __init__(self, values: Mapping[str, Any], path: str, allowed: Iterable[str]) -> None:
        self.values = values
        self.path = path
        allowed = tuple(allowed)
        for key in values:
            if key not in allowed:
                raise ValidationError(f"{self.at(key)}: unknown key (expected one of: {', '.join(allowed)})")

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, message: str) -> ValidationError:
        return ValidationError(f"{self.at(key)}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any, kind_name: str) -> Any:
        if key not in self.values:
            if default is _REQUIRED:
                raise self.fail(key, "required")
            return default
        value = self.values[key]
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.fail(key, f"{value!r} is not {kind_name}")
        if not isinstance(value, kind):
            raise self.fail(key, f"{value!r} is not {kind_name}")
        return value

    def text(
        self, key: str, default: Any = _REQUIRED, pattern: re.Pattern[str] | None = None, hint: str = ""
    ) -> str:
        value: str = self.get(key, str, default, "a string")
        if pattern is not None and key in self.values and not pattern.fullmatch(value):
            raise self.fail(key, f"{value!r} is not a valid {key.replace('_', ' ')}{hint}")
        return value

    def integer(self, key: str, default: Any = _REQUIRED, minimum: int = 0) -> int:
        value: int = self.get(key, int, default, "a whole number")
        if value < minimum:
            raise self.fail(key, f"{value} is less than {minimum}")
        return value

    def duration(self, key: str, default: timedelta) -> timedelta:
        text = self.get(key, str, default, 'a duration string such as "30m"')
        if key not in self.values:
            return default
        try:
            return parse_duration(text)
        except ValidationError as error:
            raise self.fail(key, error.message) from None

    def money(self, key: str) -> Decimal:
        raw = self.get(key, (str, int, float), _REQUIRED, 'an amount such as "98.32"')
        try:
            amount = Decimal(str(raw))  # via str(): a TOML float 98.32 must not become 98.31999...
        except InvalidOperation:
            raise self.fail(key, f"{raw!r} is not an amount") from None
        if not amount.is_finite() or amount <= 0:
            raise self.fail(key, f"{raw} is not a positive amount")
        return amount

    def table(self, key: str) -> Mapping[str, Any] | None:
        return self.get(key, dict, None, "a table")

    def tables(self, key: str) -> list[Mapping[str, Any]]:
        values = self.get(key, list, [], "an array of tables")
        for index, value in enumerate(values):
            if not isinstance(value, dict):
                raise ValidationError(f"{self.at(key)}[{index}]: {value!r} is not a table")
        return values

    def pair(self, key: str, default: tuple[Any, Any], read: type) -> tuple[Any, Any]:
        """A ``[low, high]`` range."""
        if key not in self.values:
            return default
        value = self.values[key]
        if not (isinstance(value, list) and len(value) == 2 and all(_is(item, read) for item in value)):
            raise self.fail(key, f"{value!r} is not a [low, high] pair of numbers")
        low, high = (read(item) for item in value)
        if low > high:
            raise self.fail(key, f"{low} is more than {high}")
        return (low, high)


def _is(value: Any, read: type) -> bool:
    kinds: tuple[type, ...] = (int, float) if read is float else (int,)
    return isinstance(value, kinds) and not isinstance(value, bool)


_TOP_KEYS = (
    "region", "currency", "zones", "pools", "policy", "background_load", "quotas", "buckets", "accounts",
    "notifications", "images", "webhooks", "rate_limits", "backend", "retention",
)  # fmt: skip


def parse_fleet(text: str) -> Fleet:
    """Read a fleet from TOML text; a ValidationError names the first key that is wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValidationError(f"the fleet file is not valid TOML: {error}") from None
    top = _Table(document, "", _TOP_KEYS)
    region = top.text("region", pattern=_REGION, hint=" (such as us-west-2)")
    currency = top.text("currency", "USD", pattern=_CURRENCY, hint=_CURRENCY_HINT)
    zones = _zones(top, region)
    backend = _backend(top.table("backend") or {})
    pools = _pools(top, zones, currency, backend)
    return Fleet(
        region=region,
        zones=zones,
        pools=pools,
        policy=_policy(top.table("policy") or {}),
        background_load=_background_load(top.table("background_load")),
        buckets=_buckets(top.table("buckets") or {}),
        quotas=_quotas(top.table("quotas") or {}),
        default_payment_mode=_payment_mode(top.table("accounts") or {}),
        os_ids=_os_ids(top.table("accounts") or {}),
        notifications=_notifications(top.table("notifications") or {}),
        images=_images(top.table("images") or {}),
        webhooks=_webhooks(top.table("webhooks") or {}),
        work_dir=_work_dir(top.table("backend") or {}),
        rate_limits=_rate_limits(top.table("rate_limits") or {}),
        exec_limits=_exec_limits(top.table("rate_limits") or {}),
        backend=backend,
        retention=_retention(top.table("retention") or {}),
    )


def _retention(values: Mapping[str, Any]) -> timedelta | None:
    """``[retention] period = "30d"``: how long ended work's files stay (none given: for ever)."""
    table = _Table(values, "retention", ("period",))
    if "period" not in values:
        return None
    period = table.duration("period", timedelta(0))
    if period < timedelta(hours=1):
        raise table.fail("period", f"{format_duration(period)} is shorter than an hour")
    return period


def _zones(top: _Table, region: str) -> tuple[AvailabilityZone, ...]:
    raw = top.tables("zones")
    if not raw:
        raise top.fail("zones", "a fleet needs at least one [[zones]] entry")
    zones = tuple(
        _zone(_Table(values, f"zones[{i}]", ("name", "zone_id", "subnets")), region)
        for i, values in enumerate(raw)
    )
    _refuse_repeats("zones", [(z.name,) for z in zones], "name")
    _refuse_repeats("zones", [(z.zone_id,) for z in zones], "zone_id")
    subnets = [subnet for zone in zones for subnet in zone.subnets]
    for subnet in subnets:
        if subnets.count(subnet) > 1:
            raise ValidationError(f"zones: subnet {subnet} is declared more than once")
    return zones


def _zone(table: _Table, region: str) -> AvailabilityZone:
    name = table.text("name")
    if not re.fullmatch(re.escape(region) + r"[a-z]", name):
        raise table.fail("name", f"{name!r} is not a zone of region {region} (such as {region}a)")
    subnets = table.get("subnets", list, [], "a list of subnet ids")
    for index, subnet in enumerate(subnets):
        if not isinstance(subnet, str) or not _SUBNET.fullmatch(subnet):
            raise table.fail(f"subnets[{index}]", f"{subnet!r} is not a subnet id such as subnet-0a1b2c3d")
    zone_id = table.text("zone_id", pattern=_ZONE_ID, hint=" (such as usw2-az1)")
    return AvailabilityZone(name=name, zone_id=zone_id, subnets=tuple(subnets))


_POOL_KEYS = (
    "instance_type", "zone", "count", "reservable", "price_per_instance_hour", "currency", "nodes",
    "feature", "on_demand_price_per_instance_hour",
)  # fmt: skip


def _pools(
    top: _Table, zones: tuple[AvailabilityZone, ...], currency: str, backend: BackendSettings
) -> tuple[Pool, ...]:
    zone_names = [zone.name for zone in zones]
    pools = tuple(
        _pool(_Table(values, f"pools[{i}]", _POOL_KEYS), zone_names, currency, backend)
        for i, values in enumerate(top.tables("pools"))
    )
    if not pools:
        raise top.fail("pools", "a fleet needs at least one [[pools]] entry")
    _refuse_repeats("pools", [pool.key for pool in pools], "instance_type and zone")
    for index, pool in enumerate(pools):
        if pool.currency != pools[0].currency:
            raise ValidationError(
                f"pools[{index}].currency: {pool.currency} differs from {pools[0].currency} of pools[0]; "
                "a fleet charges in one currency"
            )
    first_pool: dict[str, int] = {}
    for index, pool in enumerate(pools):
        for node in pool.nodes:
            if node in first_pool:
                raise ValidationError(f"pools[{index}].nodes: {node} is already in pools[{first_pool[node]}]")
            first_pool[node] = index
    return pools


def _pool(table: _Table, zone_names: list[str], currency: str, backend: BackendSettings) -> Pool:
    instance_type = table.text("instance_type", pattern=_INSTANCE_TYPE, hint=" (such as ml.p5.48xlarge)")
    zone = table.text("zone")
    if zone not in zone_names:
        raise table.fail("zone", f"{zone!r} is not declared in [[zones]] ({', '.join(zone_names)})")
    nodes, feature = _pool_nodes(table, backend, instance_type)
    if nodes and "count" in table.values:
        count = table.integer("count", minimum=1)
        if count != len(nodes):
            raise table.fail("count", f"{count} differs from the {len(nodes)} nodes the pool names")
    else:
        count = len(nodes) if nodes else table.integer("count", minimum=1)
    reservable = table.integer("reservable", count)
    if reservable > count:
        raise table.fail("reservable", f"{reservable} is more than the pool's count, {count}")
    return Pool(
        instance_type=instance_type,
        availability_zone=zone,
        instance_count=count,
        reservable=reservable,
        price_per_instance_hour=table.money("price_per_instance_hour"),
        currency=table.text("currency", currency, pattern=_CURRENCY, hint=_CURRENCY_HINT),
        nodes=nodes,
        feature=feature,
        on_demand_price=(
            table.money("on_demand_price_per_instance_hour")
            if "on_demand_price_per_instance_hour" in table.values
            else None
        ),
    )


def _pool_nodes(
    table: _Table, backend: BackendSettings, instance_type: str
) -> tuple[tuple[str, ...], str | None]:
    """A Slurm pool's nodes (its hostlist, expanded) and feature; none on the local back end."""
    if backend.kind != "slurm":
        for key in ("nodes", "feature"):
            if key in table.values:
                raise table.fail(key, 'only for a Slurm back end ([backend] kind = "slurm")')
        return (), None
    hostlist = table.text("nodes")
    try:
        nodes = expand(hostlist)
    except ValidationError as error:
        raise table.fail("nodes", error.message) from None
    repeated = sorted({node for node in nodes if nodes.count(node) > 1})
    if repeated:
        raise table.fail("nodes", f"{', '.join(repeated)} named more than once")
    feature = table.text("feature", instance_type, pattern=_FEATURE, hint=" (letters, digits, . _ -)")
    return nodes, feature


_BACKEND_KEYS = ("kind", "work_dir", "slurm_conf", "partition", "kill_grace")
_SLURM_KEYS = ("slurm_conf", "partition", "kill_grace")


def _backend(values: Mapping[str, Any]) -> BackendSettings:
    """``[backend]``: where work runs. The Slurm keys are refused on the local back end."""
    table = _Table(values, "backend", _BACKEND_KEYS)
    default = BackendSettings()
    kind = table.text("kind", default.kind)
    if kind not in BACKEND_KINDS:
        raise table.fail("kind", f"{kind!r} is not one of {', '.join(BACKEND_KINDS)}")
    if kind != "slurm":
        for key in _SLURM_KEYS:
            if key in table.values:
                raise table.fail(key, 'only for a Slurm back end (kind = "slurm")')
        return BackendSettings(kind=kind)
    slurm_conf = table.text("slurm_conf")
    if not slurm_conf.startswith("/"):
        raise table.fail("slurm_conf", f"{slurm_conf!r} is not an absolute path")
    kill_grace = table.duration("kill_grace", default.kill_grace)
    if kill_grace <= timedelta(0):
        raise table.fail("kill_grace", "must be longer than zero")
    return BackendSettings(
        kind=kind,
        slurm_conf=slurm_conf,
        partition=table.text("partition", None, pattern=_PARTITION, hint=" (letters, digits, _ -)"),
        kill_grace=kill_grace,
    )


def _refuse_repeats(path: str, keys: list[tuple[str, ...]], what: str) -> None:
    first_index: dict[tuple[str, ...], int] = {}
    for index, key in enumerate(keys):
        if key in first_index:
            raise ValidationError(
                f"{path}[{index}]: same {what} as {path}[{first_index[key]}] ({' in '.join(key)})"
            )
        first_index[key] = index


_POLICY_KEYS = (
    "lead_time", "horizon", "segment_end", "min_days", "max_days", "allowed_counts", "max_segments",
    "max_offerings", "offering_validity", "ranking", "reclaim_lead",
)  # fmt: skip


def _policy(values: Mapping[str, Any]) -> BookingPolicy:
    table = _Table(values, "policy", _POLICY_KEYS)
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
        max_segments=table.integer("max_segments", default.max_segments, minimum=1),
        max_offerings=table.integer("max_offerings", default.max_offerings, minimum=1),
        offering_validity=table.duration("offering_validity", default.offering_validity),
        ranking=_ranking(table, default.ranking),
        reclaim_lead=_reclaim_lead(table.table("reclaim_lead") or {}),
    )


def _ranking(table: _Table, default: str) -> str:
    ranking = table.text("ranking", default)
    if ranking not in RANKINGS:
        raise table.fail("ranking", f"{ranking!r} is not one of {', '.join(RANKINGS)}")
    return ranking


def _segment_end(table: _Table, default: time) -> time:
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


def _allowed_counts(table: _Table, default: tuple[int, ...] | None) -> tuple[int, ...] | None:
    raw = table.get("allowed_counts", (list, str), default, 'a list of counts or "any"')
    if raw == "any" or raw is None:
        return None
    if isinstance(raw, str) or not raw:
        raise table.fail("allowed_counts", f'{raw!r} is not a list of counts or "any"')
    for index, count in enumerate(raw):
        if not _is(count, int) or count < 1:
            raise table.fail(f"allowed_counts[{index}]", f"{count!r} is not a positive whole number")
    return tuple(sorted(set(raw)))


def _reclaim_lead(values: Mapping[str, Any]) -> Mapping[str, timedelta]:
    table = _Table(values, "policy.reclaim_lead", SERVED_TARGETS)
    leads = {target: table.duration(target, timedelta(minutes=30)) for target in SERVED_TARGETS}
    return MappingProxyType(leads)


_BACKGROUND_KEYS = ("cycle_days", "quiet_days", "quiet_booked", "busy_booked", "seed")


def _background_load(values: Mapping[str, Any] | None) -> BackgroundLoad | None:
    if values is None:
        return None
    table = _Table(values, "background_load", _BACKGROUND_KEYS)
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


def _fractions(table: _Table, key: str, default: tuple[float, float]) -> tuple[float, float]:
    low, high = table.pair(key, default, float)
    if low < 0.0 or high > 1.0:
        raise table.fail(key, f"{[low, high]} must lie within 0 .. 1")
    return (low, high)


def _buckets(values: Mapping[str, Any]) -> Mapping[str, Bucket]:
    buckets: dict[str, Bucket] = {}
    for name, value in values.items():
        problem = bucket_name_problem(name)
        if problem is not None:
            raise ValidationError(f"buckets.{name}: not a valid bucket name: {problem}")
        if isinstance(value, dict) and "path" in value:
            if "endpoint_url" in value:
                raise ValidationError(
                    f"buckets.{name}: give path (a directory) or endpoint_url (an S3-compatible endpoint), "
                    "not both"
                )
            table = _Table(value, f"buckets.{name}", ("path", "accounts"))
            path = table.text("path")
            if not path:
                raise table.fail("path", "is empty; give the bucket's directory")
            buckets[name] = DirectoryBucket(path, _bucket_accounts(table))
        elif isinstance(value, dict):  # a directory's table has a path; any other is an endpoint's
            buckets[name] = _s3_bucket(_Table(value, f"buckets.{name}", _S3_BUCKET_KEYS), name)
        elif isinstance(value, str) and value:
            buckets[name] = DirectoryBucket(value)
        else:
            raise ValidationError(
                f"buckets.{name}: {value!r} is not a directory or a table with a path or an endpoint_url"
            )
    return MappingProxyType(buckets)


def _bucket_accounts(table: _Table) -> tuple[str, ...]:
    """The accounts (names or twelve-digit ids) that own a bucket; none listed: the administrators."""
    listed = table.get("accounts", list, [], "a list of account names or ids")
    if "accounts" in table.values and not listed:
        raise table.fail("accounts", "is empty; leave it out for a bucket only administrators use")
    seen: set[str] = set()
    for index, account in enumerate(listed):
        where = f"accounts[{index}]"
        if account == "*":
            raise table.fail(
                where,
                "'*' cannot own a bucket; share it read-only with every account through "
                '`hyperplan buckets grant BUCKET "*"`',
            )
        if not isinstance(account, str) or not _ACCOUNT.fullmatch(account):
            raise table.fail(where, f"{account!r} is not an account name or a twelve-digit account id")
        if account in seen:
            raise table.fail(where, f"{account!r} is listed twice")
        seen.add(account)
    return tuple(listed)


_S3_BUCKET_KEYS = (
    "endpoint_url", "region", "bucket", "access_key_id", "secret_access_key", "access_key_id_env",
    "secret_access_key_env", "accounts",
)  # fmt: skip


def _s3_bucket(table: _Table, name: str) -> S3Bucket:
    access_key_id, access_key_id_env = _credential(table, "access_key_id")
    secret_access_key, secret_access_key_env = _credential(table, "secret_access_key")
    has_key_id = access_key_id is not None or access_key_id_env is not None
    has_secret = secret_access_key is not None or secret_access_key_env is not None
    # Half a key pair is refused here: the client would otherwise fail later, on the first transfer.
    if has_key_id and not has_secret:
        raise table.fail("secret_access_key_env", "required with access_key_id (or secret_access_key)")
    if has_secret and not has_key_id:
        raise table.fail("access_key_id_env", "required with secret_access_key (or access_key_id)")
    return S3Bucket(
        endpoint_url=_endpoint_url(table),
        region=table.text("region", "us-east-1", pattern=_S3_REGION, hint=" (such as us-east-1)"),
        remote_bucket=table.text("bucket", name, pattern=_BUCKET, hint=" (3-63 of a-z 0-9 . -)"),
        access_key_id=access_key_id,
        secret_access_key=secret_access_key,
        access_key_id_env=access_key_id_env,
        secret_access_key_env=secret_access_key_env,
        accounts=_bucket_accounts(table),
    )


def _endpoint_url(table: _Table) -> str:
    url = table.text("endpoint_url")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise table.fail("endpoint_url", f"{url!r} is not an http:// or https:// URL")
    if parts.username is not None or parts.password is not None:
        raise table.fail("endpoint_url", "credentials go in access_key_id_env and secret_access_key_env")
    if parts.query or parts.fragment:
        raise table.fail("endpoint_url", f"{url!r} has a query or fragment, which an endpoint cannot")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise table.fail("endpoint_url", f"{url!r} has an invalid port") from None
    return url


def _credential(table: _Table, key: str) -> tuple[str | None, str | None]:
    """One half of the key pair: (inline value, environment variable name); at most one of them."""
    if key in table.values and f"{key}_env" in table.values:
        raise table.fail(key, f"give {key} or {key}_env, not both")
    inline = table.text(key, None)
    if inline is not None and not inline:
        raise table.fail(key, "is empty")
    variable = table.text(f"{key}_env", None)
    if variable is not None and not _ENV_NAME.fullmatch(variable):
        raise table.fail(f"{key}_env", f"{variable!r} is not an environment variable name")
    return inline, variable


_QUOTA_KEYS = (
    "max_active_plans",
    "max_reserved_instances_per_type",
    "max_reserved_share_per_type",
    "max_reserved_instance_hours_per_30_days",
    "max_on_demand_instances_per_type",
    "max_on_demand_share_per_type",
)


def _quotas(values: Mapping[str, Any]) -> Quotas:
    table = _Table(values, "quotas", _QUOTA_KEYS)
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


def _share(table: _Table, key: str) -> float | None:
    share = table.get(key, (int, float), None, "a share such as 0.5")
    if share is not None and not 0 < share <= 1:
        raise table.fail(key, f"{share} is not a share: more than 0, at most 1")
    return None if share is None else float(share)


_RATE_LIMIT_KEYS = (*(c.value for c in RequestClass), "concurrent_exec", "concurrent_exec_total")


def _rate_limits(values: Mapping[str, Any]) -> RateLimits:
    table = _Table(values, "rate_limits", _RATE_LIMIT_KEYS)
    limits = dict(DEFAULT_RATE_LIMITS)
    for request_class in RequestClass:
        entry = table.table(request_class.value)
        if entry is None:
            continue
        path = table.at(request_class.value)
        limit_table = _Table(entry, path, ("rate", "burst"))
        rate = limit_table.get("rate", (int, float), _REQUIRED, "a number of requests per second")
        burst = limit_table.integer("burst", minimum=1)
        try:
            limits[request_class] = RateLimit(float(rate), burst)
        except ValidationError as error:
            raise ValidationError(f"{path}: {error.message}") from None
    return MappingProxyType(limits)


def _exec_limits(values: Mapping[str, Any]) -> ExecLimits:
    """``[rate_limits] concurrent_exec`` and ``concurrent_exec_total``: the execs one server process runs
    at once, an account's and every account's."""
    table = _Table(values, "rate_limits", _RATE_LIMIT_KEYS)
    total = table.integer("concurrent_exec_total", DEFAULT_TOTAL, minimum=1)
    if total > MAX_TOTAL:
        raise table.fail("concurrent_exec_total", f"{total} is more than {MAX_TOTAL}")
    per_account = table.integer("concurrent_exec", min(DEFAULT_PER_ACCOUNT, total), minimum=1)
    if per_account > total:
        raise table.fail(
            "concurrent_exec", f"{per_account} is more than concurrent_exec_total, {total} (all accounts')"
        )
    return ExecLimits(per_account=per_account, total=total)


def _images(values: Mapping[str, Any]) -> Mapping[str, str]:
    images = {}
    for image, interpreter in values.items():
        if not isinstance(interpreter, str) or not interpreter.startswith("/"):
            raise ValidationError(f"images.{image!r}: give the absolute path of a Python interpreter.")
        images[str(image)] = interpreter
    return MappingProxyType(images)


def _work_dir(values: Mapping[str, Any]) -> str | None:
    table = _Table(values, "backend", _BACKEND_KEYS)
    work_dir: str | None = table.get("work_dir", str, None, "an absolute directory path")
    if work_dir is not None and (not work_dir.startswith("/") or "\0" in work_dir):
        raise table.fail("work_dir", f"{work_dir!r} is not an absolute directory path")
    return work_dir


def _webhooks(values: Mapping[str, Any]) -> WebhookTargets:
    table = _Table(values, "webhooks", ("allowed_networks",))
    listed = table.get("allowed_networks", list, [], "a list of networks such as 10.0.0.0/8")
    try:
        return WebhookTargets(parse_networks(listed, table.at("allowed_networks")))
    except ValueError as error:
        raise ValidationError(str(error)) from None


def _notifications(values: Mapping[str, Any]) -> Notifications:
    table = _Table(values, "notifications", ("start_reminder", "reclaim_reminder"))
    default = Notifications()
    return Notifications(
        start_reminder=table.duration("start_reminder", default.start_reminder),
        reclaim_reminder=table.duration("reclaim_reminder", default.reclaim_reminder),
    )


_ACCOUNTS_KEYS = ("default_payment_mode", "os_ids")


def _payment_mode(values: Mapping[str, Any]) -> str:
    table = _Table(values, "accounts", _ACCOUNTS_KEYS)
    mode = table.text("default_payment_mode", "auto")
    if mode not in PAYMENT_MODES:
        raise table.fail("default_payment_mode", f"{mode!r} is not one of {', '.join(PAYMENT_MODES)}")
    return mode


def _os_ids(values: Mapping[str, Any]) -> IdRange:
    """``[accounts] os_ids = "70000-99999"``: where the uids and gids of accounts' OS users come from."""
    table = _Table(values, "accounts", _ACCOUNTS_KEYS)
    if "os_ids" not in values:
        return DEFAULT_OS_IDS
    try:
        return parse_id_range(table.text("os_ids"))
    except ValueError as error:
        raise table.fail("os_ids", str(error)) from None
