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
    [spot]       price_fraction, lender_share, prefer = "lent" | "on-demand", notice, max_notice, min_run,
                 stop_margin, kill_grace: managed spot training and plans' lending (core/spot.py)
    [cancellation]  preset = "strict" | "flexible", tiers = [{before = "7d", refund = 1.0}, ...],
                 resale_share, quote_validity, refund_cap, cap_period: what returning
                 a plan's capacity refunds (core/returns.py); a pool may name a preset or table of
                 its own, cancellation = "flexible" (default: strict, no returns); resale_discount:
                 the share off the price of what a search can offer only from returned capacity
    [pricing]    load_based = true | false (default false), low = 0.8, high = 1.5: an offering's price
                 runs from low x the pool's price on idle days to high x on full ones (core/pricing.py)
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
                 and gids of the OS users the server makes for accounts, each handed out once);
                 subordinate_ids = "1073741824-2147418111" (each account's containers' block of 65536
                 host ids, each handed out once; none of it in os_ids)
    [webhooks]   allowed_networks = ["10.20.0.0/16", ...]   non-public networks webhooks may reach
    [images]     <training image or prefix*> = <absolute path of a Python>
    [image_map]  <training image> = <reference>, <prefix*> = <reference prefix*> (the rest appended) or
                 <prefix*> = <reference> (every match to that one): where each image is pulled from
    [registries."<host[:port]>"]  insecure = true | false (plain HTTP; default false)
    [backend]    kind = "local" | "slurm"; runtime = "podman" | "process" (containers or host processes;
                 --runtime wins; unset: decided at start, core/runtime_choice.py; Slurm: process only);
                 work_dir = "/srv/hyperplan-work" (nodes' homes, sandboxes, job trees; --work-dir
                 wins); for Slurm: slurm_conf (absolute path), partition, kill_grace
                 (default "2m"); each pool then names its nodes, nodes = "gpu[01-16]" (a Slurm
                 hostlist; count, if given, must equal their number), and may name their feature
                 (default: its instance type)
    [retention]  period = "30d": ended jobs' trees and logs and terminated nodes' homes are removed this
                 long after they ended; events = "90d", audit = "365d", leases = "1d": those rows of
                 the store removed (events: of plans ended that long ago); metering = "30d": hourly
                 on-demand ledger lines compacted to one per holder and day (each default: kept)
    [instance_types."<type>"]  vcpus, memory_gib, accelerators, accelerator_kind: a type's size, over
                 AWS's published figures (core/instance_types.py); required for a pool's type without them

Each table has its reader: ``fleet_capacity`` (zones, pools, backend), ``fleet_policy`` (policy,
background_load), ``fleet_spot`` (spot), ``fleet_pricing`` (pricing), ``fleet_cancellation``
(cancellation, and a pool's own), ``fleet_buckets``, ``fleet_limits`` (quotas, rate_limits) and
``fleet_settings`` (accounts, notifications, images, webhooks, retention), ``fleet_instance_types``,
``fleet_images`` (image_map, registries); ``fleet_values`` has the checks they share.
"""

from __future__ import annotations

import re
import tomllib

from hyperplan.core.fleet import Fleet
from hyperplan.core.fleet_buckets import read_buckets
from hyperplan.core.fleet_cancellation import read_cancellation
from hyperplan.core.fleet_capacity import (
    CURRENCY,
    CURRENCY_HINT,
    read_backend,
    read_pools,
    read_work_dir,
    read_zones,
)
from hyperplan.core.fleet_images import read_image_sources
from hyperplan.core.fleet_instance_types import read_instance_types
from hyperplan.core.fleet_limits import read_exec_limits, read_quotas, read_rate_limits
from hyperplan.core.fleet_policy import read_background_load, read_policy
from hyperplan.core.fleet_pricing import read_pricing
from hyperplan.core.fleet_settings import (
    read_images,
    read_notifications,
    read_os_ids,
    read_payment_mode,
    read_retention,
    read_subordinate_ids,
    read_webhooks,
)
from hyperplan.core.fleet_spot import read_spot
from hyperplan.core.fleet_values import Table
from hyperplan.errors import ValidationError

_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")


_TOP_KEYS = (
    "region", "currency", "zones", "pools", "policy", "background_load", "quotas", "buckets", "accounts",
    "notifications", "images", "webhooks", "rate_limits", "backend", "retention", "instance_types",
    "image_map", "registries", "spot", "cancellation", "pricing",
)  # fmt: skip


def parse_fleet(text: str) -> Fleet:
    """Read a fleet from TOML text; a ValidationError names the first key that is wrong."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValidationError(f"the fleet file is not valid TOML: {error}") from None
    top = Table(document, "", _TOP_KEYS)
    region = top.text("region", pattern=_REGION, hint=" (such as us-west-2)")
    currency = top.text("currency", "USD", pattern=CURRENCY, hint=CURRENCY_HINT)
    zones = read_zones(top, region)
    backend = read_backend(top.table("backend") or {})
    pools = read_pools(top, zones, currency, backend)
    return Fleet(
        region=region,
        zones=zones,
        pools=pools,
        policy=read_policy(top.table("policy") or {}),
        background_load=read_background_load(top.table("background_load")),
        buckets=read_buckets(top.table("buckets") or {}),
        quotas=read_quotas(top.table("quotas") or {}),
        spot=read_spot(top.table("spot") or {}),
        cancellation=read_cancellation(top.table("cancellation") or {}),
        pricing=read_pricing(top.table("pricing") or {}),
        default_payment_mode=read_payment_mode(top.table("accounts") or {}),
        os_ids=read_os_ids(top.table("accounts") or {}),
        subordinate_ids=read_subordinate_ids(top.table("accounts") or {}),
        notifications=read_notifications(top.table("notifications") or {}),
        images=read_images(top.table("images") or {}),
        image_sources=read_image_sources(top.table("image_map") or {}, top.table("registries") or {}),
        webhooks=read_webhooks(top.table("webhooks") or {}),
        work_dir=read_work_dir(top.table("backend") or {}),
        rate_limits=read_rate_limits(top.table("rate_limits") or {}),
        exec_limits=read_exec_limits(top.table("rate_limits") or {}),
        backend=backend,
        retention=read_retention(top.table("retention") or {}),
        instance_types=read_instance_types(top.table("instance_types") or {}, pools),
    )
