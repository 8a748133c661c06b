"""The tables. Rows are plain records; rules live in hyperplan.core and hyperplan.services."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from hyperplan.store.types import DecimalString, UTCDateTime


class Base(DeclarativeBase):
    pass


# The predicates of the partial indexes (0031), written as the reads that use them write theirs: each
# database uses a partial index only for a query whose WHERE states (or implies) its predicate.
LIVE_PLAN = "status NOT IN ('Expired', 'Failed')"
"""A plan that counts against its account's quota (services/plans/quotas.py active_plans)."""
HOLDING_EXTENSION_SQLITE = "holds_capacity IS 1"
HOLDING_EXTENSION_POSTGRESQL = "holds_capacity IS true"
"""An extension that holds its capacity itself, as SQLAlchemy writes `holds_capacity.is_(True)`."""
SEGMENT_LENGTH = '("end" - start)'
"""A segment's length in the store's microseconds, as ix_rc_length holds it and the reads that use it
write it (store/purchase_reads.py _longest_segment)."""


class Setting(Base):
    """Small named values the service keeps: the clock, the offering signing key."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[str] = mapped_column(String(12), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    payment_mode: Mapped[str] = mapped_column(String(16), default="auto")
    budget: Mapped[Decimal] = mapped_column(DecimalString, default=Decimal("0"))
    # Per-account quotas; None means the fleet file's default.
    max_active_plans: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_reserved_instances_per_type: Mapped[int | None] = mapped_column(Integer, nullable=True)
    max_reserved_instance_hours_per_30_days: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The OS user the account's work runs as in isolation mode `users` (services/accounts/os_users.py): `hp-`
    # and the id when the server made it (os_user_made: removed with the account), or one an administrator
    # named. None: not known yet (an account made in mode `none` gets its user at the next `users` start).
    os_user: Mapped[str | None] = mapped_column(String(32), nullable=True)
    os_user_made: Mapped[bool] = mapped_column(server_default=false())
    # Deleted accounts stay, keys revoked, for the invoices, ledger entries and plans that name them.
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # An administrator's overrides of the fleet's request rate limits, as JSON: {"search": {"rate": 2.0,
    # "burst": 10}, ...}; None: the fleet's for every class (services/accounts.rate_limit_overrides).
    rate_limits: Mapped[str | None] = mapped_column(Text, nullable=True)
    # On-demand instances of one type at any instant (services/plans/quotas.py); None: the fleet's quota.
    max_on_demand_instances_per_type: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Hours before each segment's reclaim time at which the account is warned, as JSON: [24, 1]; None: the
    # default (core/reclaim_warnings.DEFAULT_LEAD_HOURS); [] : no warnings.
    reclaim_warning_hours: Mapped[str | None] = mapped_column(Text, nullable=True)


class OsIdBlock(Base):
    """OS ids the server handed to an account (services/accounts/os_ids.py): `kind` "user" is the uid of the
    OS user it made for the account, which is its group's gid too. Rows are never deleted, not even with
    the account, so that no id is handed out twice (core/id_ranges.py)."""

    __tablename__ = "os_id_blocks"
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    first: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    allocated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AccessKey(Base):
    __tablename__ = "access_keys"
    access_key_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    # A Fernet token under the master key (hyperplan/store/master_key.py); plain text only in a store
    # made before secrets were sealed, until the server's start step seals it (secret_sealed false).
    secret_access_key: Mapped[str] = mapped_column(String(512))
    secret_sealed: Mapped[bool] = mapped_column(server_default=false())
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Deleted (`keys delete`, a user's or an account's deletion): the row stays, so that an id is never
    # given twice and the audit trail can name it.
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # The user who holds the key (services/accounts/users.py); None only in a store not yet migrated to 0013.
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True, index=True)
    # Active or Inactive, as IAM's: an inactive key signs nothing until it is activated again.
    status: Mapped[str] = mapped_column(String(8), server_default="Active")


class TrainingPlan(Base):
    __tablename__ = "training_plans"
    __table_args__ = (
        UniqueConstraint("account_id", "name"),
        # A purchase counts the account's active plans by status, over those plans only (0020).
        Index("ix_plan_account_status", "account_id", "status"),
        # The plans that count against the quota, and nothing else: the quota's count (a purchase's,
        # a search's) reads an account's live plans, never the expired ones of its past (0031).
        Index(
            "ix_plan_account_live",
            "account_id",
            "status",
            sqlite_where=text(LIVE_PLAN),
            postgresql_where=text(LIVE_PLAN),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    name: Mapped[str] = mapped_column(String(64))
    # An offering is bought once: the id is remembered even when the plan later fails.
    offering_id: Mapped[str] = mapped_column(String(256), unique=True)
    target: Mapped[str] = mapped_column(String(32))
    instance_type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    status_message: Mapped[str] = mapped_column(Text, default="")
    upfront_fee: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ReservedCapacity(Base):
    """One segment of a plan: `count` instances of one pool from `start` to `end`."""

    __tablename__ = "reserved_capacities"
    __table_args__ = (
        UniqueConstraint("plan_id", "ordinal"),
        # Covering: a purchase reads a pool's holdings from the index alone (0020).
        Index(
            "ix_rc_pool_time",
            *("instance_type", "availability_zone", "start", "end", "holds_capacity", "released_at", "count"),
        ),
        # A type's segments by end (0031): what a pool holds over a window, and what an account holds of
        # a type, is what ends after the window's start (a segment is held no later than its end:
        # released_at is before it), so the range `end > low` reads the window's and the future's
        # segments of the type, never its past (ix_rc_pool_time's range `start < high` read all of it).
        # Covering, the plan's id included: the account's are kept by a look at each one's plan.
        Index(
            "ix_rc_type_end",
            *("instance_type", "end", "availability_zone", "start", "holds_capacity", "released_at"),
            *("count", "plan_id"),
        ),
        # Segments of every type by end (0031): an account's holdings of every type (the instance-hours
        # quota), what is held from an instant on (the live calendar), the open segments.
        Index(
            "ix_rc_end",
            *("end", "instance_type", "availability_zone", "start", "holds_capacity", "released_at"),
            *("count", "plan_id"),
        ),
        # Segments by length (0031): the longest, read from the index's last entry, bounds the ends a
        # window's holdings can have (end < window end + longest), so that the ranges by end above read
        # what overlaps the window, not every segment booked after it.
        Index("ix_rc_length", text(SEGMENT_LENGTH)),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime)
    status: Mapped[str] = mapped_column(String(16))
    # False once the plan failed or was cancelled before the segment began: it holds nothing.
    holds_capacity: Mapped[bool] = mapped_column(default=True)
    # Set when a cancellation gives back the rest of an open segment: capacity is held until then.
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ScheduledEvent(Base):
    """A timed transition. The lifecycle loop runs due rows in (due_at, id) order, once each."""

    __tablename__ = "scheduled_events"
    __table_args__ = (Index("ix_event_pending", "done", "due_at", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    due_at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(256), default="", index=True)
    payload: Mapped[str] = mapped_column(Text, default="{}")
    done: Mapped[bool] = mapped_column(default=False)
    ran_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Invoice(Base):
    """The upfront fee of a plan (or, later, an extension), and how it was settled."""

    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    extension_id: Mapped[int | None] = mapped_column(ForeignKey("plan_extensions.id"), nullable=True)
    amount: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    status: Mapped[str] = mapped_column(String(16))  # Pending, Paid, Rejected, Failed
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    due_at: Mapped[datetime] = mapped_column(UTCDateTime)
    settled_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")


class LedgerEntry(Base):
    """An append-only line of an account's money: payments, budget grants."""

    __tablename__ = "ledger_entries"
    # A day's lines read by date: the metering compaction, the usage report's payments (0032).
    __table_args__ = (Index("ix_ledger_at", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    invoice_id: Mapped[int | None] = mapped_column(ForeignKey("invoices.id"), nullable=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    amount: Mapped[Decimal] = mapped_column(DecimalString)  # negative: money out of the budget
    budget_after: Mapped[Decimal] = mapped_column(DecimalString)
    description: Mapped[str] = mapped_column(Text)


class PlanEvent(Base):
    """A plan's append-only history: what happened, when (service time), and what a person should know."""

    __tablename__ = "plan_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    # The user whose request made the event (a purchase, a cancellation, an approval); None for what the
    # service did by itself (a segment's start, a payment deadline). services/accounts/acting.py.
    actor_user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)


class CapacityClaim(Base):
    """Instances of a plan's open segment held by one consumer (an instance group, a training job).

    The single record of who uses a plan's capacity: the plan's InUse and Available counters are
    derived from the claims not yet released.
    """

    __tablename__ = "capacity_claims"
    __table_args__ = (Index("ix_claim_open", "plan_id", "released_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"))
    reserved_capacity_id: Mapped[int] = mapped_column(ForeignKey("reserved_capacities.id"))
    consumer: Mapped[str] = mapped_column(String(256))  # e.g. "cluster-group:<id>", "training-job:<id>"
    count: Mapped[int] = mapped_column(Integer)
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PlanExtension(Base):
    """An extension bought for a plan: more days at its end, same pool and count.

    While unpaid it holds its capacity itself (`holds_capacity`); once paid, the plan's last reserved
    capacity ends at `end` instead, and this row is the record of the purchase.
    """

    __tablename__ = "plan_extensions"
    __table_args__ = (
        # Only the extensions that hold capacity themselves (unpaid ones: a few at any time), by pool and
        # end: a purchase's holdings read them from here, not from every extension ever bought (0031).
        Index(
            "ix_ext_holding",
            *("instance_type", "availability_zone", "end"),
            sqlite_where=text(HOLDING_EXTENSION_SQLITE),
            postgresql_where=text(HOLDING_EXTENSION_POSTGRESQL),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    offering_id: Mapped[str] = mapped_column(String(256), unique=True)
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime)
    upfront_fee: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    payment_status: Mapped[str] = mapped_column(String(16))  # Pending, Paid, Failed
    extended_at: Mapped[datetime] = mapped_column(UTCDateTime)
    holds_capacity: Mapped[bool] = mapped_column(default=True)


class ExtensionPolicy(Base):
    """A plan's automatic extension (services/plans/extension_policy.py): up to `max_days` in all, each
    extension at most `max_price` (None: any price the budget allows)."""

    __tablename__ = "extension_policies"
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), primary_key=True)
    max_days: Mapped[int] = mapped_column(Integer)
    max_price: Mapped[Decimal | None] = mapped_column(DecimalString, nullable=True)
    currency: Mapped[str] = mapped_column(String(3))
    days_bought: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ExtensionAttempt(Base):
    """One try of a plan's extension policy, written before it buys (so a crash never buys twice for one
    warning: the unique key) and finished with its outcome."""

    __tablename__ = "extension_attempts"
    __table_args__ = (UniqueConstraint("plan_id", "segment_end", "lead_hours"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    segment_end: Mapped[datetime] = mapped_column(UTCDateTime)  # the end it tried to move
    lead_hours: Mapped[int] = mapped_column(Integer)
    bought: Mapped[bool] = mapped_column(default=False)
    message: Mapped[str] = mapped_column(Text)


class LendingPolicy(Base):
    """A plan's lending of its idle instances to managed spot training jobs of other accounts
    (services/plans/lending.py, core/spot.py). A plan without a row lends nothing (mode ``none``)."""

    __tablename__ = "lending_policies"
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), primary_key=True)
    notice_seconds: Mapped[int] = mapped_column(Integer)  # a borrower's notice before it is killed
    min_run_seconds: Mapped[int] = mapped_column(
        Integer
    )  # a borrower runs this long before a foreseen reclaim
    stop_margin_seconds: Mapped[int] = mapped_column(Integer)  # no loan starts this close to a reclaim time
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SpotRun(Base):
    """One attempt of a managed spot training job on the instances it ran on: lent by a plan (`plan_id`)
    or the pool's free on-demand capacity (`plan_id` None). Written when the attempt is placed, ended when
    its instances are given back, then settled: the borrower charged per second at the spot price and the
    lending plan's owner credited its share, each a ledger line (services/jobs/spot_money.py)."""

    __tablename__ = "spot_runs"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt"),
        Index("ix_spot_runs_plan_open", "plan_id", "ended_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)  # the borrower
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("training_plans.id"), nullable=True)
    reserved_capacity_id: Mapped[int | None] = mapped_column(
        ForeignKey("reserved_capacities.id"), nullable=True
    )
    owner_account_id: Mapped[str | None] = mapped_column(ForeignKey("accounts.id"), nullable=True, index=True)
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    # The spot price (the fleet's fraction of the pool's on-demand price) and the owner's share, at the start.
    price_per_instance_hour: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    lender_share: Mapped[Decimal] = mapped_column(DecimalString, default=Decimal("0"))
    # The notice promised when the run started (the plan's policy then; 0 on on-demand capacity): a
    # policy changed or removed later never shortens it.
    notice_seconds: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A reclaim: why ("owner-job", "owner-group", "segment-end", "plan-ended", "lending-off", on Slurm
    # "on-demand-taken": its on-demand node taken by a reservation), when the
    # owner asked, the deadline promised (asked + notice, or earlier at a segment's reclaim time), and
    # when the owner had the instances again (the run's end).
    reclaim_reason: Mapped[str] = mapped_column(String(32), default="")
    reclaim_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    reclaim_deadline: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    charged: Mapped[Decimal] = mapped_column(DecimalString, default=Decimal("0"))
    credited: Mapped[Decimal] = mapped_column(DecimalString, default=Decimal("0"))
    settled: Mapped[bool] = mapped_column(default=False)


class ReturnQuote(Base):
    """What returning part of a plan would give back and refund (services/plans/returns.py), valid until
    `valid_until` (service time) and only while the plan is as it was (`fingerprint`: its segments then).
    Used once: `used_at`."""

    __tablename__ = "return_quotes"
    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # rq-<random>, what the caller names
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    scope: Mapped[str] = mapped_column(Text)  # JSON: {"Kind": plan|segment|instances|tail, ...}
    windows: Mapped[str] = mapped_column(Text)  # JSON: the windows returned (pool, start, end, count)
    refund: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    fingerprint: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    valid_until: Mapped[datetime] = mapped_column(UTCDateTime)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class PlanReturn(Base):
    """A return carried out: the quote it followed, what it refunded, and the instance-hours it gave
    back (the plan's refundable value is what it paid over every instance-hour it ever held)."""

    __tablename__ = "plan_returns"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    quote_id: Mapped[str] = mapped_column(ForeignKey("return_quotes.id"), unique=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    scope: Mapped[str] = mapped_column(Text)
    instance_hours: Mapped[float] = mapped_column(Float)
    refund: Mapped[Decimal] = mapped_column(DecimalString)
    currency: Mapped[str] = mapped_column(String(3))
    # Where the refund went: "ledger" (money back: a ledger line, and a budget grew), "invoice reduced"
    # or "invoice cancelled" (the plan's invoice still awaited approval: less to pay), "nothing".
    settled: Mapped[str] = mapped_column(String(24), default="nothing")


class ReturnedWindow(Base):
    """Capacity a return gave back to the calendar: `count` instances of a pool over [start, end). The
    instance-hours of it a later booking needed (the pool had no other free instance then) are resold,
    and the returning account credited its share for each, once (services/plans/resale.py)."""

    __tablename__ = "returned_windows"
    __table_args__ = (Index("ix_returned_windows_pool", "instance_type", "availability_zone", "end"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    return_id: Mapped[int] = mapped_column(ForeignKey("plan_returns.id"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"))
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime)
    count: Mapped[int] = mapped_column(Integer)
    # What the returning account paid per instance-hour of it, and its resale share (the policy's, then).
    price_per_instance_hour: Mapped[Decimal] = mapped_column(DecimalString)
    resale_share: Mapped[Decimal] = mapped_column(DecimalString)


class Resale(Base):
    """Instances of a returned window a later plan's segment needed over [start, end): resold, and the
    returning account credited `credited` for them (never more in all than it paid for the plan)."""

    __tablename__ = "resales"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    window_id: Mapped[int] = mapped_column(ForeignKey("returned_windows.id"), index=True)
    buyer_plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    start: Mapped[datetime] = mapped_column(UTCDateTime)
    end: Mapped[datetime] = mapped_column(UTCDateTime)
    count: Mapped[int] = mapped_column(Integer)
    credited: Mapped[Decimal] = mapped_column(DecimalString)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Its credit is in the returning account's ledger (services/plans/resale.py settles it in a
    # transaction of its own, which takes that account's lock first, never under a purchase's pools').
    settled: Mapped[bool] = mapped_column(default=False)


class RegistryCredential(Base):
    """The user name and password a container runtime logs in to one registry with (`hyperplan registries
    set-credentials`; services/accounts/registry_credentials.py). The password is a Fernet token under the
    master key, as the access keys' secrets are."""

    __tablename__ = "registry_credentials"
    host: Mapped[str] = mapped_column(String(255), primary_key=True)  # HOST[:PORT], lower-cased
    username: Mapped[str] = mapped_column(String(255))
    password: Mapped[str] = mapped_column(Text)  # sealed
    set_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Webhook(Base):
    """A URL that receives an account's plan events, signed with the webhook's own secret."""

    __tablename__ = "webhooks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(512))  # sealed, as AccessKey.secret_access_key
    secret_sealed: Mapped[bool] = mapped_column(server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class WebhookDelivery(Base):
    """One plan event for one webhook; delivered in order per (webhook, plan), retried with backoff.

    `next_attempt_at` is real time: retries wait on the receiver, not on the service clock.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_delivery_queue", "delivered_at", "webhook_id", "plan_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id"))
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"))
    plan_event_id: Mapped[int] = mapped_column(ForeignKey("plan_events.id"))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_error: Mapped[str] = mapped_column(Text, default="")
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Cluster(Base):
    """A HyperPod-style cluster: instance groups of nodes, each group on a plan or on on-demand capacity."""

    __tablename__ = "clusters"
    __table_args__ = (UniqueConstraint("account_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    cluster_id: Mapped[str] = mapped_column(String(12), unique=True)  # the ARN's last part
    status: Mapped[str] = mapped_column(String(16))
    failure_message: Mapped[str] = mapped_column(Text, default="")
    settings: Mapped[str] = mapped_column(Text, default="{}")  # VpcConfig, Orchestrator, ... as given (JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class InstanceGroup(Base):
    __tablename__ = "instance_groups"
    __table_args__ = (UniqueConstraint("cluster_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # creation order
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    target_count: Mapped[int] = mapped_column(Integer)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("training_plans.id"), nullable=True, index=True)
    availability_zone: Mapped[str] = mapped_column(String(64))
    spec: Mapped[str] = mapped_column(Text)  # the ClusterInstanceGroupSpecification as given (JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class InstanceGroupPlan(Base):
    """A further plan of an instance group, beside its primary one (`InstanceGroup.plan_id`, the wire's
    TrainingPlanArn): the group may run up to its target across all of them (docs/DECISIONS.md)."""

    __tablename__ = "instance_group_plans"
    __table_args__ = (UniqueConstraint("group_id", "plan_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # the order added
    group_id: Mapped[int] = mapped_column(ForeignKey("instance_groups.id"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    added_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ClusterNode(Base):
    """One instance of a group. `backend_id` names it to the execution back end, recorded before it acts."""

    __tablename__ = "cluster_nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("clusters.id"), index=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("instance_groups.id"), index=True)
    instance_id: Mapped[str] = mapped_column(String(32), unique=True)
    backend_id: Mapped[str] = mapped_column(String(64), unique=True)
    hostname: Mapped[str] = mapped_column(String(128))
    availability_zone: Mapped[str] = mapped_column(String(64))
    on_plan: Mapped[bool] = mapped_column(default=False)
    # The plan whose capacity it runs on now, one of its group's plans; None on demand, or once it ended.
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("training_plans.id"), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(24))  # Pending, Running, Failure, ShuttingDown, Terminated
    message: Mapped[str] = mapped_column(Text, default="")
    launched_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class TrainingJob(Base):
    """A training job: on a plan's capacity (queued until it has room) or on the pool's on-demand capacity.

    `attempt` counts the runs it was given (one per segment it ran in); `attempt_state` says where the
    current one is ("" before the first; core/jobs.py AttemptState and its lifecycle).
    Pending and running time are kept as closed seconds plus the start of the open stretch.
    """

    __tablename__ = "training_jobs"
    __table_args__ = (UniqueConstraint("account_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # queue order
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(63))
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("training_plans.id"), nullable=True, index=True)
    instance_type: Mapped[str] = mapped_column(String(64))
    instance_count: Mapped[int] = mapped_column(Integer)
    availability_zone: Mapped[str | None] = mapped_column(String(64), nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    secondary_status: Mapped[str] = mapped_column(String(24))
    status_message: Mapped[str] = mapped_column(Text, default="")
    failure_reason: Mapped[str] = mapped_column(Text, default="")
    stop_reason: Mapped[str] = mapped_column(String(16), default="")
    request: Mapped[str] = mapped_column(Text)  # the CreateTrainingJob request as given (JSON)
    # The reference its TrainingImage resolved to through the fleet's image map at creation
    # (core/image_refs.py); None for a job without a TrainingImage, or made before revision 0023.
    resolved_image: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The digest of the image its instances last ran in (runtime podman: pulled at launch); None without
    # one (runtime process, or made before revision 0024).
    image_digest: Mapped[str | None] = mapped_column(String(160), nullable=True)
    model_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    attempt_state: Mapped[str] = mapped_column(String(16), default="")
    # The plan whose capacity its current (or last) attempt holds: `plan_id` or one of its further plans.
    attempt_plan_id: Mapped[int | None] = mapped_column(
        ForeignKey("training_plans.id"), nullable=True, index=True
    )
    segment_end: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    pending_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    pending_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    running_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    running_since: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    training_start_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    training_end_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A job that books its own capacity (services/jobs/auto_booking.py): its request as JSON
    # (core/auto_book.py AutoBookRequest.to_json); None for a job that names its plan or runs on demand.
    auto_book: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The name of the plan it books, recorded before the purchase, so that a booking cut short between
    # buying and linking finds its plan again instead of buying twice; None until it has chosen one.
    # Once it is linked, `plan_id` is that plan and `instance_type`/`instance_count` are the plan's (the
    # request's ResourceConfig, as sent, stays in `request`).
    auto_book_plan: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # Managed spot training (services/jobs/spot.py): its wait bound, and the plan whose idle instances its
    # current attempt borrows (None: on-demand capacity, or not running).
    spot: Mapped[bool] = mapped_column(default=False, server_default=false())
    max_wait_seconds: Mapped[int | None] = mapped_column(Integer, nullable=True)
    lent_plan_id: Mapped[int | None] = mapped_column(ForeignKey("training_plans.id"), nullable=True)


class TrainingJobPlan(Base):
    """A further plan a training job may run on, beside the one it names (`TrainingJob.plan_id`, the
    wire's TrainingPlanArn): it runs on whichever has capacity first (docs/DECISIONS.md)."""

    __tablename__ = "training_job_plans"
    __table_args__ = (UniqueConstraint("job_id", "plan_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)  # the order added
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("training_plans.id"), index=True)
    added_at: Mapped[datetime] = mapped_column(UTCDateTime)


class TrainingJobTransition(Base):
    """One entry of a job's SecondaryStatusTransitions: a secondary status, from when to when, and why."""

    __tablename__ = "training_job_transitions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    status: Mapped[str] = mapped_column(String(24))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")


class TrainingJobInstance(Base):
    """One instance of one attempt of a job: a back-end task (`task_id`), recorded before it is run."""

    __tablename__ = "training_job_instances"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "host"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(16))  # algo-1, algo-2, ...
    task_id: Mapped[str] = mapped_column(String(128), unique=True)
    root: Mapped[str] = mapped_column(Text)  # the instance's /opt/ml
    # Recorded (not yet run), Running, Exited, Killed, Lost, NotStarted (the attempt ended before it ran)
    state: Mapped[str] = mapped_column(String(16), index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Its container's memory limit had a process of it killed before it ended (runtime podman).
    out_of_memory: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class StatusEvent(Base):
    """One status change of a cluster, node, reserved capacity, invoice or plan extension (plans and jobs
    keep theirs in plan_events and training_job_transitions): written by `services.status.change`.

    `entity_id` is the row's id in the table its `entity_kind` names; the history outlives the row."""

    __tablename__ = "status_events"
    __table_args__ = (Index("ix_status_event_entity", "entity_kind", "entity_id", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    entity_kind: Mapped[str] = mapped_column(String(32))
    entity_id: Mapped[int] = mapped_column(Integer)
    from_status: Mapped[str] = mapped_column(String(24))
    to_status: Mapped[str] = mapped_column(String(24))
    at: Mapped[datetime] = mapped_column(UTCDateTime)  # service time
    message: Mapped[str] = mapped_column(Text, default="")


class BucketOwner(Base):
    """The account whose request created a directory bucket under the default root (hyperplan/core/
    bucket_rights.py). A bucket with no row here is the administrators', or the fleet file's accounts'."""

    __tablename__ = "bucket_owners"
    bucket: Mapped[str] = mapped_column(String(63), primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)  # service time


class BucketGrant(Base):
    """A right an administrator gave on a bucket: `read` or `write`, to one account (its id) or, read,
    to every account (`grantee` "*")."""

    __tablename__ = "bucket_grants"
    __table_args__ = (UniqueConstraint("bucket", "grantee"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    bucket: Mapped[str] = mapped_column(String(63))
    grantee: Mapped[str] = mapped_column(String(12), index=True)
    access: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)  # service time


class OnDemandMeter(Base):
    """One holder of on-demand instances (a cluster node, or one attempt of a training job without a
    plan), metered per started instance-hour of service time (services/clusters/metering.py): `hours_charged`
    counts the hours already in the ledger, so a restart or a repeated event never charges one twice.
    `ended_at` is set when the holder gives its instances back; `closed` once every hour it started is
    charged."""

    __tablename__ = "on_demand_meters"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    holder: Mapped[str] = mapped_column(String(64), unique=True)  # node:<instance id>, job:<id>:<attempt>
    name: Mapped[str] = mapped_column(Text)  # what the ledger names: the node or the job
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    price_per_instance_hour: Mapped[Decimal] = mapped_column(DecimalString)  # the pool's, at the start
    currency: Mapped[str] = mapped_column(String(3))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)  # service time
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    hours_charged: Mapped[int] = mapped_column(Integer, default=0)
    charged: Mapped[Decimal] = mapped_column(DecimalString, default=Decimal("0"))
    closed: Mapped[bool] = mapped_column(default=False, index=True)


class User(Base):
    """A person of an account's team: signs with at most two access keys of their own (as IAM allows a
    user). Owners manage the account's users; the account's first user is one. A deleted user's row
    stays (deleted_at), for the plan events and audit records that name them; a live user's name is
    unique in its account."""

    __tablename__ = "users"
    __table_args__ = (
        Index(
            "ux_users_live_name",
            "account_id",
            "name",
            unique=True,
            sqlite_where=text("deleted_at IS NULL"),
            postgresql_where=text("deleted_at IS NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    is_owner: Mapped[bool] = mapped_column(server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class AuditEvent(Base):
    """One administrator action or security-relevant event (services/accounts/audit.py): who (the account,
    user and key that signed; none for the service itself), when (service time, and the wall time it was
    written), from where (the request's remote address), what (an action name, the account it concerns,
    its target and what changed, as JSON). Written only by services, never changed through the API."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_at", "at", "id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)  # service time
    wall_at: Mapped[datetime] = mapped_column(UTCDateTime)  # real time, whatever the service clock says
    action: Mapped[str] = mapped_column(String(48))
    actor_account_id: Mapped[str | None] = mapped_column(String(12), nullable=True, index=True)
    actor_account_name: Mapped[str] = mapped_column(String(64), default="")
    actor_user_name: Mapped[str] = mapped_column(String(64), default="")
    access_key_id: Mapped[str] = mapped_column(String(128), default="")
    remote_address: Mapped[str] = mapped_column(String(64), default="")
    # The account the action concerns (its id), for `audit list --account`; None: the fleet's.
    account_id: Mapped[str | None] = mapped_column(String(12), nullable=True, index=True)
    target: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[str] = mapped_column(Text, default="{}")  # JSON: what changed


class ResourceTag(Base):
    """A tag on a training plan, cluster or training job (AddTags, ListTags, DeleteTags, `Tags` at
    create), by the resource's ARN; the account is the resource's."""

    __tablename__ = "resource_tags"
    resource_arn: Mapped[str] = mapped_column(String(256), primary_key=True)
    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[str] = mapped_column(String(256), default="")
    account_id: Mapped[str] = mapped_column(String(12), index=True)


class EndedNodeUsage(Base):
    """What a deleted cluster's node held, kept when the cluster's rows go
    (services/clusters/node_watcher.py): the usage report (services/plans/usage.py) counts it like a node that
    is still listed."""

    __tablename__ = "ended_node_usage"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(12), index=True)
    cluster_id: Mapped[str] = mapped_column(String(32))  # the cluster's public id (its ARN's)
    instance_type: Mapped[str] = mapped_column(String(64))
    availability_zone: Mapped[str] = mapped_column(String(64))
    launched_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    backend_id: Mapped[str] = mapped_column(String(64), default="")  # what retention forgets, then ""
    # On a plan's capacity (counted with the plan's claims) or on demand, as the node was (0025).
    on_plan: Mapped[bool] = mapped_column(server_default=false())


class ChangeCounter(Base):
    """How many times one kind of shared state changed (store/changes.py): a process that saw another
    value than the row's reloads what it keeps of that state."""

    __tablename__ = "change_counters"
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


class Lease(Base):
    """A named lease held by one process until `expires_at` (real time): the leader's, and each live
    process's presence (services/runtime/leadership.py)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RateBucket(Base):
    """One account's token bucket for one class of request, shared by every process on the store
    (services/runtime/rate_limiter.py): `tokens` as counted at `counted_at` (real time, seconds since the
    epoch)."""

    __tablename__ = "rate_buckets"
    account_id: Mapped[str] = mapped_column(String(12), primary_key=True)
    request_class: Mapped[str] = mapped_column(String(16), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    counted_at: Mapped[float] = mapped_column(Float)


class ClockMove(Base):
    """A manual clock's advance or set asked of the leader by another process; `done` once it ran."""

    __tablename__ = "clock_moves"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    target: Mapped[datetime] = mapped_column(UTCDateTime)
    done: Mapped[bool] = mapped_column(server_default=false())
    events_run: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class ConsoleSession(Base):
    """A console session signed in and not yet ended (services/runtime/console_sessions.py): its cookie is
    valid only while this row exists. Sign-out and a deactivated key delete it; a sign-in removes every row
    past its idle end or its absolute end. Times are real wall time, never the service clock."""

    __tablename__ = "console_sessions"
    # The SHA-256 of the cookie's nonce (hex): the store never holds what the forms' CSRF tokens are
    # made from.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    access_key_id: Mapped[str] = mapped_column(String(128), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)  # written at most every minute or so
    idle_ends_at: Mapped[datetime] = mapped_column(UTCDateTime)  # last seen plus the idle timeout
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)  # sign-in plus the session's lifetime
