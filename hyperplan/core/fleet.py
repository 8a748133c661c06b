"""The fleet: a region, its availability zones, the pools of instances in them, and the booking policy.

These are the values the rest of the service works with; `hyperplan.core.fleet_file` reads them from a
fleet's TOML text (the embedded demo, ``hyperplan/fleet/demo.toml``, documents every key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import time, timedelta
from decimal import Decimal
from types import MappingProxyType

from hyperplan.core.durations import format_duration
from hyperplan.core.exec_limits import ExecLimits
from hyperplan.core.id_ranges import DEFAULT_OS_IDS, DEFAULT_SUBORDINATE_IDS, IdRange
from hyperplan.core.image_refs import ImageSources, Mapped
from hyperplan.core.instance_types import AWS_INSTANCE_TYPES, InstanceType
from hyperplan.core.rate_limits import DEFAULT_RATE_LIMITS, RateLimits
from hyperplan.core.returns import STRICT, CancellationPolicy
from hyperplan.core.webhook_targets import WebhookTargets

PoolKey = tuple[str, str]
"""(instance type, availability zone name): a pool's identity."""

SERVED_TARGETS = ("training-job", "hyperpod-cluster")
PAYMENT_MODES = ("auto", "budget", "approval")
DEFAULT_COUNTS = (1, 2, 4, 8, 16, 32, 64)
# How a search orders its offerings (core/search.py): "packing" puts first the placement that leaves the
# calendar best able to take later requests; "earliest" is AWS's order (fewest segments, earliest finish,
# lowest price). docs/PLANNING.md compares them.
RANKINGS = ("packing", "earliest")


# -- the model ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AvailabilityZone:
    name: str
    zone_id: str
    subnets: tuple[str, ...]


@dataclass(frozen=True)
class Pool:
    """``instance_count`` instances of one type in one zone; plans may hold at most ``reservable``."""

    instance_type: str
    availability_zone: str
    instance_count: int
    reservable: int
    price_per_instance_hour: Decimal
    currency: str
    # On a Slurm back end: the pool's Slurm nodes (expanded from the fleet file's hostlist), and the
    # node feature they carry (the instance type unless the fleet file says otherwise). Empty, None
    # on the local back end.
    nodes: tuple[str, ...] = ()
    feature: str | None = None
    # What on-demand use pays per instance-hour, metered (services/clusters/metering.py); None: the same as
    # ``price_per_instance_hour`` (docs/DECISIONS.md, "On-demand use").
    on_demand_price: Decimal | None = None
    # The share of an instance's published size (vCPUs, memory) one of its containers may use
    # (core/container_limits.py): 1 where a host is an instance, less where a small host plays a big type.
    limits_scale: float = 1.0
    # The pool's own cancellation policy (``[[pools]] cancellation``, core/fleet_cancellation.py), where
    # it differs from the fleet's; None: the fleet's ``[cancellation]``.
    cancellation: CancellationPolicy | None = None

    @property
    def key(self) -> PoolKey:
        return (self.instance_type, self.availability_zone)

    @property
    def on_demand_price_per_instance_hour(self) -> Decimal:
        return self.price_per_instance_hour if self.on_demand_price is None else self.on_demand_price

    @property
    def on_demand(self) -> int:
        """Instances that plans can never hold."""
        return self.instance_count - self.reservable


BACKEND_KINDS = ("local", "slurm")


@dataclass(frozen=True)
class BackendSettings:
    """Where work runs: ``local`` processes on the server's machine (the default), or a Slurm cluster."""

    kind: str = "local"
    # "podman" or "process" (core/runtime_choice.py); None: unset, so serve --runtime, HYPERPLAN_RUNTIME
    # or the default decides.
    runtime: str | None = None
    # Where images and containers are kept (runtime podman): a Podman store of hyperplan's own, never
    # root's default one; None: /var/lib/hyperplan/podman.
    podman_store: str | None = None
    # The size of a file system of the store's own (runtime podman, backends/disks.py), where images and
    # the containers' own layers are kept; 0: none, the store a directory of the host's file system; None:
    # the default (backends/containers.default_store_size).
    podman_store_gb: int | None = None
    # The image a HyperPod node's container runs (runtime podman): the cluster's "AMI"; None: none, and
    # nodes cannot be provisioned in containers.
    node_image: str | None = None
    # The size of a node's disk (runtime podman: its /opt/sagemaker, /tmp and /var/tmp, backends/disks.py)
    # when its instance group gives no EbsVolumeConfig.VolumeSizeInGB.
    node_disk_gb: int = 100
    slurm_conf: str | None = None  # the cluster's slurm.conf (an absolute path); Slurm only
    partition: str | None = None  # the partition the pools' nodes are in (None: the cluster's default)
    kill_grace: timedelta = timedelta(minutes=2)  # a signalled Slurm job's time before it is killed


def _default_reclaim_lead() -> Mapping[str, timedelta]:
    return MappingProxyType({target: timedelta(minutes=30) for target in SERVED_TARGETS})


@dataclass(frozen=True)
class LoadPricing:
    """``[pricing]``: an offering's price follows how loaded its days are (core/pricing.py), from ``low``
    times the pool's price on an idle day to ``high`` times it on a full one. Off by default: every
    offering costs the pool's price, as on AWS."""

    load_based: bool = False
    low: Decimal = Decimal("0.8")
    high: Decimal = Decimal("1.5")


# The highest a load-based multiplier may go (an offering id carries it in ten-thousandths, under 6.5536).
LOAD_PRICE_CEILING = Decimal(5)


@dataclass(frozen=True)
class BookingPolicy:
    """The rules of what may be booked (docs/DECISIONS.md, "Booking policy"); the defaults follow AWS."""

    lead_time: timedelta = timedelta(minutes=30)
    horizon: timedelta = timedelta(days=56)  # the latest a plan may start, from now
    segment_end: time = time(11, 30)  # UTC; every segment ends at this time of day
    min_days: int = 1
    max_days: int = 182
    allowed_counts: tuple[int, ...] | None = DEFAULT_COUNTS  # None: any count up to the pool's size
    max_segments: int = 2
    max_offerings: int = 3
    offering_validity: timedelta = timedelta(minutes=30)
    ranking: str = "packing"  # one of RANKINGS
    reclaim_lead: Mapping[str, timedelta] = field(default_factory=_default_reclaim_lead, hash=False)

    def reclaim_lead_for(self, target: str) -> timedelta:
        """How long before a segment's end its capacity is taken back from ``target`` consumers."""
        return self.reclaim_lead.get(target, timedelta(minutes=30))


@dataclass(frozen=True)
class BackgroundLoad:
    """Synthetic bookings that keep a demo calendar busy (see :mod:`hyperplan.core.demo_load`).

    Time is cut into cycles of ``cycle_days``; each cycle of each pool opens with a quiet run of
    ``quiet_days`` days with ``quiet_booked`` of the pool booked, then a busy run with ``busy_booked``.
    """

    cycle_days: int = 12
    quiet_days: tuple[int, int] = (5, 7)
    quiet_booked: tuple[float, float] = (0.50, 0.65)
    busy_booked: tuple[float, float] = (0.80, 1.00)
    seed: int = 0


@dataclass(frozen=True)
class Quotas:
    """Per-account limits (AWS: plans per Region, reserved instances per type); generous by default."""

    max_active_plans: int = 1000
    max_reserved_instances_per_type: int = 4096
    # At most this share of a type's reservable instances per account at any instant (None: no share
    # cap). An account given its own max_reserved_instances_per_type is held to that instead.
    max_reserved_share_per_type: float | None = None
    # At most this many reserved instance-hours (all types) in any 30 days (None: no such quota).
    max_reserved_instance_hours_per_30_days: int | None = None
    # On-demand instances of one type one account may hold at any instant (None: no such quota), and at
    # most this share of the type's on-demand instances (None: no share cap). An account given its own
    # max_on_demand_instances_per_type is held to that instead of both.
    max_on_demand_instances_per_type: int | None = None
    max_on_demand_share_per_type: float | None = None


@dataclass(frozen=True)
class Notifications:
    """Lead times of the reminders a plan's owner gets (history events and webhooks)."""

    start_reminder: timedelta = timedelta(hours=1)  # before each segment starts
    reclaim_reminder: timedelta = timedelta(minutes=30)  # before each segment's capacity is taken back


@dataclass(frozen=True)
class Retention:
    """``[retention]``: how long what has ended is kept (docs/OPERATIONS.md, "Retention"); None: for ever,
    each one's default. `period` is the files' (ended jobs' trees and logs, terminated nodes' homes:
    services/orchestration/retention.py); the others are rows of the store
    (services/orchestration/row_retention.py)."""

    period: timedelta | None = None
    # Status events and done timed events of plans that ended longer ago, and other done timed events.
    events: timedelta | None = None
    audit: timedelta | None = None  # audit rows
    leases: timedelta | None = None  # rate-limit buckets (leased from) untouched this long, real time
    # On-demand metering's hourly ledger lines older than this: one line per holder and day instead.
    metering: timedelta | None = None

    @property
    def removes_files(self) -> bool:
        return self.period is not None

    @property
    def removes_rows(self) -> bool:
        return any(p is not None for p in (self.events, self.audit, self.leases, self.metering))


SPOT_PREFERENCES = ("lent", "on-demand")
# The bounds of the [spot] table's durations and of a plan's lending settings (core/spot.py): a notice
# longer than an hour would hold an owner's work back too long to be a promise worth making; a minimum
# run or a stop-lending margin beyond a week is longer than any segment's useful part; the kill itself
# (SIGKILL and the processes gone) takes seconds, so minutes of grace would hide broken promises.
SPOT_NOTICE_CEILING = timedelta(hours=1)
SPOT_SPAN_CEILING = timedelta(days=7)
SPOT_KILL_GRACE_CEILING = timedelta(minutes=5)


@dataclass(frozen=True)
class SpotPolicy:
    """Managed spot training (core/spot.py): what spot capacity costs, what a lending plan's owner earns,
    where a spot job looks first, and the defaults and bounds of a plan's lending policy."""

    price_fraction: Decimal = Decimal("0.35")  # spot price = this x the pool's on-demand price
    lender_share: Decimal = Decimal("0.8")  # a lending plan's owner gets this share of what borrowers paid
    prefer: str = "lent"  # "lent" or "on-demand": where a spot job looks first (SPOT_PREFERENCES)
    notice: timedelta = timedelta(seconds=120)  # a plan's default reclaim notice
    max_notice: timedelta = timedelta(minutes=10)  # the longest notice a plan may set
    min_run: timedelta = timedelta(minutes=5)  # a plan's default minimum borrower run
    stop_margin: timedelta = timedelta(minutes=15)  # a plan's default stop-lending margin
    kill_grace: timedelta = timedelta(seconds=10)  # allowed for the kill itself when a promise is judged


@dataclass(frozen=True)
class DirectoryBucket:
    """A bucket kept as a directory (which must exist) on storage the nodes share. ``accounts`` (names or
    ids) own it; with none, it is the administrators'."""

    path: str
    accounts: tuple[str, ...] = ()


@dataclass(frozen=True)
class S3Bucket:
    """A bucket kept on an S3-compatible endpoint, as ``remote_bucket`` there.

    Credentials come from environment variables named here (preferred: the fleet file holds no secret),
    or are written inline, or, with neither, from the usual AWS chain (AWS_* variables, ~/.aws). Either
    half of the key pair may be given either way; the parser makes sure both halves or neither are.
    """

    endpoint_url: str
    region: str
    remote_bucket: str
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)  # never into logs
    access_key_id_env: str | None = None
    secret_access_key_env: str | None = None
    accounts: tuple[str, ...] = ()  # who owns it (names or ids); none: the administrators


Bucket = DirectoryBucket | S3Bucket
"""Where the fleet file keeps one bucket."""


@dataclass(frozen=True)
class Fleet:
    region: str
    zones: tuple[AvailabilityZone, ...]
    pools: tuple[Pool, ...]
    policy: BookingPolicy = BookingPolicy()
    background_load: BackgroundLoad | None = None
    buckets: Mapping[str, Bucket] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    quotas: Quotas = Quotas()
    # [spot]: managed spot training on lent and on-demand capacity (core/spot.py).
    spot: SpotPolicy = SpotPolicy()
    # [cancellation]: what returning a plan's capacity refunds and its resale credits (core/returns.py);
    # strict (no returns, SageMaker's rule) unless the file says otherwise. A pool may have its own.
    cancellation: CancellationPolicy = STRICT
    # [pricing]: load-based prices (core/pricing.py); off unless the file turns them on.
    pricing: LoadPricing = LoadPricing()
    default_payment_mode: str = "auto"
    # [accounts] os_ids: the uids and gids the server gives the OS users it makes for accounts
    # (core/id_ranges.py); each handed out once, ever.
    os_ids: IdRange = DEFAULT_OS_IDS
    # [accounts] subordinate_ids: each account's containers' block of host ids (a user namespace's
    # 0..65535), each block handed out once, ever (core/id_ranges.py).
    subordinate_ids: IdRange = DEFAULT_SUBORDINATE_IDS
    notifications: Notifications = Notifications()
    webhooks: WebhookTargets = field(default_factory=WebhookTargets)
    # Training image (exact, or a prefix ending in "*") -> the Python that runs its programs.
    images: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # [image_map] and [registries]: the reference each TrainingImage is pulled by, and which registries
    # speak plain HTTP (core/image_refs.py).
    image_sources: ImageSources = field(default_factory=ImageSources, hash=False)
    # [backend] work_dir: where nodes' homes, sandboxes and job trees live (serve --work-dir wins).
    work_dir: str | None = None
    # Request rate limits per account and class (core/rate_limits.py); administrators are exempt.
    rate_limits: RateLimits = field(default_factory=lambda: DEFAULT_RATE_LIMITS, hash=False)
    # [rate_limits] concurrent_exec, concurrent_exec_total: execs at once per server process, an
    # account's and in all (core/exec_limits.py).
    exec_limits: ExecLimits = field(default_factory=ExecLimits)
    backend: BackendSettings = BackendSettings()
    # [retention]: ended jobs' files and terminated nodes' homes (`period`), and rows of the store
    # (events, audit, leases, metering), removed or compacted this long after they ended; kept for ever
    # unless set (services/orchestration/retention.py, row_retention.py).
    retention: Retention = Retention()
    # [instance_types]: the size of each pool's type (and any other the file sizes), the fleet file's
    # figures over AWS's (core/instance_types.py); containers are sized from them.
    instance_types: Mapping[str, InstanceType] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )

    def instance_type(self, name: str) -> InstanceType:
        """The size of instance type `name`: the fleet file's, else AWS's published figures; KeyError if
        neither has any (a fleet read from a file has figures for every pool's type)."""
        found = self.instance_types.get(name) or AWS_INSTANCE_TYPES.get(name)
        if found is None:
            raise KeyError(f"no figures for instance type {name}")
        return found

    def resolve_image(self, uri: str) -> Mapped:
        """The reference a TrainingImage is pulled by (the image map's, else the URI as written); a
        ValidationError says what is wrong with a malformed one."""
        return self.image_sources.resolve(uri)

    def interpreter_for(self, image: str | None) -> str | None:
        """The interpreter the fleet names for `image`: an exact entry first, then the longest prefix."""
        if not image:
            return None
        if image in self.images:
            return self.images[image]
        prefixes = [k for k in self.images if k.endswith("*") and image.startswith(k[:-1])]
        return self.images[max(prefixes, key=len)] if prefixes else None

    def cancellation_for(self, instance_type: str, zone: str) -> CancellationPolicy:
        """The cancellation policy of the pool of ``instance_type`` in ``zone``: its own, else the
        fleet's (also for a pool the fleet no longer has: a plan bought before the file changed)."""
        own = next((pool.cancellation for pool in self.pools if pool.key == (instance_type, zone)), None)
        return own or self.cancellation

    def pools_of_type(self, instance_type: str) -> tuple[Pool, ...]:
        return tuple(pool for pool in self.pools if pool.instance_type == instance_type)

    def pool(self, key: PoolKey) -> Pool:
        """The pool with this key; KeyError if the fleet has none."""
        for pool in self.pools:
            if pool.key == key:
                return pool
        raise KeyError(f"no pool of {key[0]} in {key[1]}")

    def zone(self, name: str) -> AvailabilityZone | None:
        return next((zone for zone in self.zones if zone.name == name), None)

    def zone_of_subnet(self, subnet_id: str) -> AvailabilityZone | None:
        return next((zone for zone in self.zones if subnet_id in zone.subnets), None)

    def reservable_types(self) -> tuple[str, ...]:
        """Instance types that plans can book, sorted."""
        return tuple(sorted({pool.instance_type for pool in self.pools if pool.reservable > 0}))

    def fingerprint(self) -> bytes:
        """4 bytes that change whenever pools, prices or policy change: offerings made under another
        fingerprint are stale. Stable across processes and Python versions (not ``hash()``).

        Kept on the instance once computed (every offering a search signs reads it; a fleet is frozen,
        and a changed fleet is a new instance)."""
        found = self.__dict__.get("_fingerprint")
        if found is None:
            found = hashlib.blake2b(_canonical_text(self).encode(), digest_size=4).digest()
            object.__setattr__(self, "_fingerprint", found)
        return found


def _canonical_text(fleet: Fleet) -> str:
    # In declared order: offering ids name pools by their index, so reordering must change this too.
    pools = [
        f"{p.instance_type}|{p.availability_zone}|{p.instance_count}|{p.reservable}|"
        f"{_plain(p.price_per_instance_hour)}|{p.currency}"
        for p in fleet.pools
    ]
    policy = fleet.policy
    counts = "any" if policy.allowed_counts is None else ",".join(map(str, policy.allowed_counts))
    leads = ",".join(f"{t}={format_duration(d)}" for t, d in sorted(policy.reclaim_lead.items()))
    rules = (
        f"{format_duration(policy.lead_time)}|{format_duration(policy.horizon)}|{policy.segment_end}|"
        f"{policy.min_days}|{policy.max_days}|{counts}|{policy.max_segments}|{policy.max_offerings}|"
        f"{format_duration(policy.offering_validity)}|{leads}"
    )
    return "\n".join([fleet.region, *pools, rules])


def _plain(amount: Decimal) -> str:
    """One spelling per amount, so that "98.3" and "98.30" fingerprint alike."""
    return format(amount.normalize(), "f")
