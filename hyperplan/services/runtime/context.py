"""What every service works with, built once by the composition root (hyperplan/app.py).

Services depend on this context and on the narrow protocols in it (a `Wake` per background loop, the
clock mover), never on the root or on each other's workers: the root sits above everything, builds
this, builds the workers from it, and owns start and stop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from hyperplan.backends.base import Backend
from hyperplan.backends.images import PodmanImages
from hyperplan.clock import Clock
from hyperplan.core.fleet import Fleet
from hyperplan.services.accounts.audit import RefusedSignatures
from hyperplan.services.accounts.key_cache import KeyCache
from hyperplan.services.runtime.console_sessions import ConsoleSessions
from hyperplan.services.runtime.exec_slots import ExecSlots
from hyperplan.services.runtime.job_work import JobLocks, JobSettings
from hyperplan.services.runtime.live_calendar import LiveCalendar
from hyperplan.services.runtime.rate_limiter import RateLimiter
from hyperplan.services.runtime.shared_state import SharedState
from hyperplan.services.runtime.slurm_state import SlurmState
from hyperplan.store.db import Database
from hyperplan.store.master_key import SecretBox
from hyperplan.worker import LocalWake, Wake


@dataclass(frozen=True)
class Policies:
    """The settings the lifecycle of one plan follows (from the fleet file)."""

    reclaim_lead: timedelta
    start_reminder: timedelta
    reclaim_reminder: timedelta


@dataclass(frozen=True)
class LifecycleContext:
    """What lifecycle changes need besides the session: the live calendar and the fleet's settings."""

    calendar: LiveCalendar
    fleet: Fleet
    # Consumers (cluster groups, jobs) follow a plan: called in the transaction of every change to it.
    consumers: tuple[Callable[[Session, int, datetime], None], ...] = ()

    def plan_changed(self, session: Session, plan_id: int, now: datetime) -> None:
        for follow in self.consumers:
            follow(session, plan_id, now)

    def policies(self, target: str) -> Policies:
        notes = self.fleet.notifications
        return Policies(
            self.fleet.policy.reclaim_lead_for(target), notes.start_reminder, notes.reclaim_reminder
        )


@dataclass(frozen=True)
class Wakes:
    """One wake per background loop; a service notifies one after a commit that made work for it."""

    lifecycle: Wake  # a timed event was scheduled (the timed-event loop, events/loop.py)
    nodes: Wake  # nodes were provisioned or shut down (the node watcher, services/clusters/node_watcher.py)
    jobs: Wake  # a job has work for the runner (services/jobs/job_runner.py)
    webhooks: Wake  # deliveries were queued (the dispatcher, notify/dispatcher.py)

    @classmethod
    def local(cls) -> Wakes:
        return cls(LocalWake(), LocalWake(), LocalWake(), LocalWake())


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    time_scale: float = 1.0  # of the accelerated clock
    # Where nodes' homes, sandboxes and job instance trees live, outside the data directory; None: beside
    # it (DATA_DIR-work), for contexts built without the composition root.
    work_dir: Path | None = None
    isolation: str = (
        "none"  # "users": each account's work runs as its OS user (services/accounts/os_users.py)
    )
    # The Python tenant processes get when the fleet's [images] names none; None: the server's own.
    default_interpreter: str | None = None
    # "podman": tenant work runs in containers; "process": as host processes (core/runtime_choice.py).
    runtime: str = "process"
    # HOST:PORT this server listens on: what a job's container reaches inside at 127.0.0.1:PORT (S3, Logs,
    # the API); None: unknown (a context built without serving), and jobs' containers reach nothing.
    endpoint: str | None = None
    # Why each container's disk (backends/disks.py) cannot be bounded on this host; None: it is (or no
    # container runs, runtime process).
    disk_problem: str | None = None

    @property
    def work_root(self) -> Path:
        return (
            self.work_dir
            if self.work_dir is not None
            else self.data_dir.with_name(self.data_dir.name + "-work")
        )

    @property
    def isolated(self) -> bool:
        return self.isolation == "users"

    @property
    def contained(self) -> bool:
        """Tenant work walled off and limited in containers (runtime podman), not host processes."""
        return self.runtime == "podman"

    @property
    def bounded_disks(self) -> bool:
        """Each job instance's and node's disk a file system of its own size (backends/disks.py)."""
        return self.contained and self.disk_problem is None


# (target) -> how many timed events ran on the way; moves a manual clock (TimedEventLoop.advance_to).
ClockMover = Callable[[datetime], int]

# (the runtime, the buying account's id) -> None, or a ValidationError saying why the account cannot book:
# what a back end needs of an account before a plan is bought for it (the Slurm back end: its OS user).
BookingCheck = Callable[["ServiceContext", str], None]

# (session, runtime, plan id, instances needed, why, now) -> None: an owner's work needs `needed` more of
# the plan's instances than its open segment has free, and some are lent to managed spot training jobs;
# they are taken back (services/jobs/spot.py, installed by app.py, since the clusters package that needs
# it may not import the jobs package).
ReclaimLent = Callable[[Session, "ServiceContext", int, int, str, datetime], None]


def _lends_nothing(
    session: Session, runtime: ServiceContext, plan_id: int, needed: int, why: str, now: datetime
) -> None:
    """Without the spot service installed nothing is ever lent, so nothing is taken back."""


@dataclass(frozen=True)
class ServiceContext:
    settings: Settings
    fleet: Fleet
    db: Database
    clock: Clock
    calendar: LiveCalendar
    lifecycle: LifecycleContext
    backend: Backend
    keys: KeyCache
    offering_key: bytes  # signs offering ids; kept in the store so that every server shares it
    secret_box: SecretBox  # seals and opens the secrets the store keeps (access keys, webhooks)
    wakes: Wakes
    advance_clock: ClockMover
    job_settings: JobSettings
    job_locks: JobLocks
    rate_limiter: RateLimiter = field(default_factory=RateLimiter)  # the store's shared buckets (app.py)
    exec_slots: ExecSlots = field(default_factory=ExecSlots)  # this process's running execs, counted
    slurm: SlurmState | None = None  # the Slurm back end's client and what it last read; None: local
    # The back end's own checks of a buying account (app.py installs them with the back end), so that the
    # generic purchase names no back end.
    booking_checks: tuple[BookingCheck, ...] = ()
    reclaim_lent: ReclaimLent = _lends_nothing
    refusals: RefusedSignatures = field(default_factory=RefusedSignatures)  # refused signatures, counted
    shared: SharedState | None = None  # brings this process's memory up to date with the store
    # The console's sessions as the store records them; the idle timeout from the server's environment.
    console_sessions: ConsoleSessions = field(default_factory=ConsoleSessions.from_environment)
    # The back end's images (runtime podman): what a job's image is pulled with; None: no image is run.
    images: PodmanImages | None = None

    def sync(self) -> None:
        """Before a request relies on what this process keeps in memory (services/runtime/shared_state.py)."""
        if self.shared is not None:
            self.shared.sync()

    @property
    def data_dir(self) -> Path:
        return self.settings.data_dir

    @property
    def work_dir(self) -> Path:
        return self.settings.work_root

    @property
    def region(self) -> str:
        return self.fleet.region

    def arn(self, account_id: str, resource: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{account_id}:{resource}"
