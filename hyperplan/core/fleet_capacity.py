"""The fleet file's capacity: ``[[zones]]``, ``[[pools]]`` and the ``[backend]`` their work runs on.

A pool's keys depend on the back end (a Slurm pool names its nodes), so the back end is read first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from hyperplan.core.fleet import BACKEND_KINDS, AvailabilityZone, BackendSettings, Pool
from hyperplan.core.fleet_cancellation import read_pool_cancellation
from hyperplan.core.fleet_values import Table, refuse_repeats
from hyperplan.core.hostlist import expand
from hyperplan.core.image_refs import parse_image
from hyperplan.core.runtime_choice import RUNTIMES
from hyperplan.errors import ValidationError

_ZONE_ID = re.compile(r"[a-z0-9]+-az\d+")
_SUBNET = re.compile(r"subnet-[0-9a-f]{8,17}")
_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9-]+\.[a-z0-9-]+")
CURRENCY = re.compile(r"[A-Z]{3}")
CURRENCY_HINT = " (three capital letters, such as USD)"
_FEATURE = re.compile(r"[A-Za-z0-9._-]+")
_PARTITION = re.compile(r"[A-Za-z0-9_-]+")


def read_zones(top: Table, region: str) -> tuple[AvailabilityZone, ...]:
    raw = top.tables("zones")
    if not raw:
        raise top.fail("zones", "a fleet needs at least one [[zones]] entry")
    zones = tuple(
        _zone(Table(values, f"zones[{i}]", ("name", "zone_id", "subnets")), region)
        for i, values in enumerate(raw)
    )
    refuse_repeats("zones", [(z.name,) for z in zones], "name")
    refuse_repeats("zones", [(z.zone_id,) for z in zones], "zone_id")
    subnets = [subnet for zone in zones for subnet in zone.subnets]
    for subnet in subnets:
        if subnets.count(subnet) > 1:
            raise ValidationError(f"zones: subnet {subnet} is declared more than once")
    return zones


def _zone(table: Table, region: str) -> AvailabilityZone:
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
    "feature", "on_demand_price_per_instance_hour", "limits_scale", "cancellation",
)  # fmt: skip


def read_pools(
    top: Table, zones: tuple[AvailabilityZone, ...], currency: str, backend: BackendSettings
) -> tuple[Pool, ...]:
    zone_names = [zone.name for zone in zones]
    pools = tuple(
        _pool(Table(values, f"pools[{i}]", _POOL_KEYS), zone_names, currency, backend)
        for i, values in enumerate(top.tables("pools"))
    )
    if not pools:
        raise top.fail("pools", "a fleet needs at least one [[pools]] entry")
    refuse_repeats("pools", [pool.key for pool in pools], "instance_type and zone")
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


def _pool(table: Table, zone_names: list[str], currency: str, backend: BackendSettings) -> Pool:
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
        currency=table.text("currency", currency, pattern=CURRENCY, hint=CURRENCY_HINT),
        nodes=nodes,
        feature=feature,
        on_demand_price=(
            table.money("on_demand_price_per_instance_hour")
            if "on_demand_price_per_instance_hour" in table.values
            else None
        ),
        limits_scale=_limits_scale(table),
        cancellation=read_pool_cancellation(table),
    )


def _limits_scale(table: Table) -> float:
    """The share of the type's size a container of the pool gets (core/container_limits.py): (0, 1]."""
    value = table.get("limits_scale", (int, float), 1.0, "a number such as 0.01")
    if not 0 < value <= 1:
        raise table.fail("limits_scale", f"{value} is not above 0 and at most 1")
    return float(value)


def _pool_nodes(
    table: Table, backend: BackendSettings, instance_type: str
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


BACKEND_KEYS = (
    "kind", "runtime", "podman_store", "podman_store_gb", "node_image", "node_disk_gb", "work_dir",
    "slurm_conf", "partition", "kill_grace",
)  # fmt: skip


_SLURM_KEYS = ("slurm_conf", "partition", "kill_grace")
MAX_DISK_GB = 16_384  # the largest EBS volume


def read_backend(values: Mapping[str, Any]) -> BackendSettings:
    """``[backend]``: where work runs. The Slurm keys are refused on the local back end."""
    table = Table(values, "backend", BACKEND_KEYS)
    default = BackendSettings()
    kind = table.text("kind", default.kind)
    if kind not in BACKEND_KINDS:
        raise table.fail("kind", f"{kind!r} is not one of {', '.join(BACKEND_KINDS)}")
    runtime = _runtime(table)
    podman_store = table.get("podman_store", str, None, "an absolute directory path")
    if podman_store is not None and (not podman_store.startswith("/") or "\0" in podman_store):
        raise table.fail("podman_store", f"{podman_store!r} is not an absolute directory path")
    node_image = table.text("node_image", None)
    if node_image is not None:
        try:
            parse_image(node_image)
        except ValidationError as error:
            raise table.fail("node_image", error.message) from None
    node_disk_gb = table.get("node_disk_gb", int, default.node_disk_gb, "a whole number of GB")
    if not 1 <= node_disk_gb <= MAX_DISK_GB:
        raise table.fail("node_disk_gb", f"{node_disk_gb} is not from 1 to {MAX_DISK_GB} (GB)")
    store_gb = table.get("podman_store_gb", int, None, "a whole number of GB")
    if store_gb is not None and not 0 <= store_gb <= MAX_DISK_GB:
        raise table.fail("podman_store_gb", f"{store_gb} is not from 0 to {MAX_DISK_GB} (GB)")
    if kind != "slurm":
        for key in _SLURM_KEYS:
            if key in table.values:
                raise table.fail(key, 'only for a Slurm back end (kind = "slurm")')
        return BackendSettings(
            kind=kind,
            runtime=runtime,
            podman_store=podman_store,
            podman_store_gb=store_gb,
            node_image=node_image,
            node_disk_gb=node_disk_gb,
        )
    slurm_conf = table.text("slurm_conf")
    if not slurm_conf.startswith("/"):
        raise table.fail("slurm_conf", f"{slurm_conf!r} is not an absolute path")
    kill_grace = table.duration("kill_grace", default.kill_grace)
    if kill_grace <= timedelta(0):
        raise table.fail("kill_grace", "must be longer than zero")
    return BackendSettings(
        kind=kind,
        runtime=runtime,
        podman_store=podman_store,
        podman_store_gb=store_gb,
        node_image=node_image,
        slurm_conf=slurm_conf,
        partition=table.text("partition", None, pattern=_PARTITION, hint=" (letters, digits, _ -)"),
        kill_grace=kill_grace,
    )


def _runtime(table: Table) -> str | None:
    """``runtime = "podman" | "process"`` (core/runtime_choice.py); unset: None, decided at start."""
    runtime: str | None = table.text("runtime", None)
    if runtime is not None and runtime not in RUNTIMES:
        raise table.fail("runtime", f"{runtime!r} is not one of {', '.join(RUNTIMES)}")
    return runtime


def read_work_dir(values: Mapping[str, Any]) -> str | None:
    table = Table(values, "backend", BACKEND_KEYS)
    work_dir: str | None = table.get("work_dir", str, None, "an absolute directory path")
    if work_dir is not None and (not work_dir.startswith("/") or "\0" in work_dir):
        raise table.fail("work_dir", f"{work_dir!r} is not an absolute directory path")
    return work_dir
