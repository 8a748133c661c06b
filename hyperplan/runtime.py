"""The composition root: one object that owns the store, the fleet, the clock and the lifecycle loop.

Everything the server, the scheduler and the handlers share is reached from here, so there is no
global state: tests build as many runtimes as they like, each on its own data directory.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from hyperplan.backends.base import Backend
from hyperplan.backends.local import LocalBackend
from hyperplan.clock import Clock, ManualClock, make_clock, utcnow
from hyperplan.core.fleet import Fleet, parse_fleet
from hyperplan.notify.dispatcher import Dispatcher, DispatcherConfig
from hyperplan.scheduler import DueEvent, EventHandler, Scheduler
from hyperplan.services import accounts
from hyperplan.services.capacity import LiveCalendar
from hyperplan.services.key_cache import KeyCache
from hyperplan.services.lifecycle import LifecycleContext
from hyperplan.store import settings
from hyperplan.store.db import Database, after_commit, sqlite_url

if TYPE_CHECKING:
    from hyperplan.services.clusters import NodeWatcher
    from hyperplan.services.job_runner import JobRunner

log = logging.getLogger(__name__)

DATA_DIR_ENV = "HYPERPLAN_DATA_DIR"
BOOTSTRAP_KEY_ENV = "HYPERPLAN_BOOTSTRAP_ACCESS_KEY_ID"
BOOTSTRAP_SECRET_ENV = "HYPERPLAN_BOOTSTRAP_SECRET_ACCESS_KEY"


def default_data_dir() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "share" / "hyperplan"


def read_fleet_text(path: Path | None) -> str:
    if path is None:
        return resources.files("hyperplan.fleet").joinpath("demo.toml").read_text()
    return path.read_text()


@dataclass(frozen=True)
class RuntimeConfig:
    data_dir: Path
    fleet_path: Path | None = None
    clock: str = "wall"
    time_scale: float = 1.0
    clock_start: datetime | None = None  # a new store's first service instant (manual, accelerated)
    database_url: str | None = None


class Runtime:
    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.fleet: Fleet = parse_fleet(read_fleet_text(config.fleet_path))
        self.db = Database(config.database_url or sqlite_url(self.data_dir))
        self.db.migrate()
        self.credentials_path = self.data_dir / "credentials"
        self.bootstrapped = self._bootstrap_admin()
        self.clock: Clock = self._make_clock()
        self.offering_key = self._offering_key()
        self.keys = KeyCache()
        self.calendar = LiveCalendar(self.fleet)
        self.lifecycle = LifecycleContext(
            self.calendar, self.fleet, consumers=(self._clusters_follow, self._jobs_follow)
        )
        self.backend: Backend = LocalBackend(self.data_dir / "backend")
        self.node_watcher = self._node_watcher()
        self.job_runner = self._job_runner()
        self.scheduler = Scheduler(self.db, self.clock, self._event_handlers())
        self.dispatcher = Dispatcher(
            self.db, self.arn, config=DispatcherConfig.from_env(), targets=self.fleet.webhooks
        )

    @property
    def region(self) -> str:
        return self.fleet.region

    def arn(self, account_id: str, resource: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{account_id}:{resource}"

    # -- start and stop ---------------------------------------------------------------------------

    def start(self) -> None:
        """Catch up on every event missed while the server was down, then run the loop."""
        self._start_background_load()
        self.calendar.load(self.db)
        from hyperplan.services import adoption, clusters, job_runner

        # Before anything else touches the back end, one call with every node and job task the store
        # knows: no orphans, no lost work.
        adoption.adopt_all(self)
        missed = self.scheduler.run_due(self.clock.now())
        if missed:
            log.info("ran %d lifecycle events missed while the server was down", missed)
        self.scheduler.start()
        self.dispatcher.start()
        clusters.reconcile_all(self)
        self.node_watcher.start()
        job_runner.resume(self)  # launches and finishes cut short by the last stop
        self.job_runner.start()

    def stop(self) -> None:
        self.dispatcher.stop()  # finishes deliveries in flight; before the database closes
        self.scheduler.stop()
        self.node_watcher.stop()
        self.job_runner.stop()
        self.backend.close()
        self.db.close()

    # -- construction -----------------------------------------------------------------------------

    def _bootstrap_admin(self) -> bool:
        """Create the administrator on the first start of a data directory. True if it did."""
        now = utcnow()
        with self.db.write() as session:
            if accounts.has_accounts(session):
                return False
            key = accounts.create_account(
                session,
                accounts.ADMIN_NAME,
                now=now,
                is_admin=True,
                payment_mode=self.fleet.default_payment_mode,
                access_key_id=os.environ.get(BOOTSTRAP_KEY_ENV) or None,
                secret_access_key=os.environ.get(BOOTSTRAP_SECRET_ENV) or None,
            )
            accounts.write_credentials_file(self.credentials_path, key, self.region)
        return True

    def _make_clock(self) -> Clock:
        with self.db.write() as session:
            saved = settings.get_time(session, settings.CLOCK_NOW)
            clock = make_clock(self.config.clock, saved, self.config.time_scale, self.config.clock_start)
            if saved is not None and self.config.clock_start is not None:
                log.warning(
                    "--clock-start %s ignored: this data directory's service clock already reads %s",
                    self.config.clock_start.isoformat(),
                    saved.isoformat(),
                )
            if clock.kind != "wall":
                settings.put_time(session, settings.CLOCK_NOW, clock.now())
        return clock

    def _start_background_load(self) -> None:
        """On the first start of a demo fleet, store its load; later top-ups are timed events."""
        from hyperplan.services import background

        if self.fleet.background_load is None:
            return
        with self.db.write() as session:
            if not background.is_scheduled(session):
                added = background.top_up(self, session, self.clock.now())
                log.info("stored %d background bookings held by %r", len(added), background.ACCOUNT_NAME)

    def _clusters_follow(self, session: Session, plan_id: int, now: datetime) -> None:
        from hyperplan.services import clusters

        clusters.reconcile_plan(session, self, plan_id, now)

    def _jobs_follow(self, session: Session, plan_id: int, now: datetime) -> None:
        from hyperplan.services import jobs

        jobs.reconcile_plan(session, self, plan_id, now)

    def _job_runner(self) -> JobRunner:
        from hyperplan.services.job_runner import JobRunner

        return JobRunner(self)

    def _node_watcher(self) -> NodeWatcher:
        from hyperplan.services.clusters import NodeWatcher

        return NodeWatcher(self)

    def _offering_key(self) -> bytes:
        """The key that signs offering ids; kept in the store so that every server shares it."""
        with self.db.write() as session:
            key = settings.get(session, settings.OFFERING_KEY)
            if key is None:
                key = secrets.token_hex(32)
                settings.put(session, settings.OFFERING_KEY, key)
        return bytes.fromhex(key)

    def _event_handlers(self) -> dict[str, EventHandler]:
        from hyperplan.services import background, jobs, lifecycle, payments

        def segment_changed(session: Session, event: DueEvent) -> None:
            # At its due time, not when the loop got to it: the history says when things happened.
            lifecycle.on_segment_event(
                session, self.lifecycle, event.kind, event.subject, event.payload, event.due_at
            )

        def payment_deadline(session: Session, event: DueEvent) -> None:
            invoice = int(event.payload["invoice"])
            payments.on_deadline(session, self.lifecycle, event.subject, invoice, event.due_at)

        def top_up_background(session: Session, event: DueEvent) -> None:
            added = background.top_up(self, session, self.clock.now())
            # The calendar learns of them only once this transaction commits.
            after_commit(
                session, lambda: self.calendar.book([(s.pool_key, s.start, s.end, s.count) for s in added])
            )

        def job_deadline(session: Session, event: DueEvent) -> None:
            jobs.on_limit(session, self, event.kind, event.subject, event.payload, event.due_at)

        return {
            lifecycle.SEGMENT_START: segment_changed,
            lifecycle.SEGMENT_RECLAIM: segment_changed,
            lifecycle.SEGMENT_END: segment_changed,
            lifecycle.START_REMINDER: segment_changed,
            lifecycle.RECLAIM_REMINDER: segment_changed,
            lifecycle.PAYMENT_DEADLINE: payment_deadline,
            background.TOP_UP: top_up_background,
            jobs.PENDING_LIMIT: job_deadline,
            jobs.MAX_RUNTIME: job_deadline,
        }

    @property
    def manual_clock(self) -> ManualClock | None:
        return self.clock if isinstance(self.clock, ManualClock) else None
