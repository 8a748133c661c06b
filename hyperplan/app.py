"""The composition root: above everything, it builds the service context and the workers, and owns
start and stop.

Nothing imports this module but the entry points (the CLI's `serve`, tests, benchmarks). Services get the
`ServiceContext` (services/runtime/context.py) and narrow protocols in it, never the root; the server gets the
context and this object as its `Lifespan`. There is no global state: build as many applications as you
like, each on its own data directory.

Building one does no I/O. `open()` does the I/O a start needs (the data directory, the fleet file, the
schema's migration, the master key that opens the store's secrets, the service clock, the offering key)
and builds the context and the workers;
`bootstrap()` creates the administrator and its credentials file on a data directory's first start;
`start()` does both if not done, then catches up and starts the workers.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from hyperplan.backends import containers, disks
from hyperplan.backends.base import Backend
from hyperplan.backends.composite import RoutingBackend, holds_work
from hyperplan.backends.images import PodmanImages
from hyperplan.backends.local import LocalBackend
from hyperplan.backends.runtime_choice import podman_problems
from hyperplan.backends.slurm import SlurmBackend
from hyperplan.clock import AcceleratedClock, Anchor, Clock, make_clock, utcnow
from hyperplan.core import runtime_choice
from hyperplan.core.fleet import Fleet
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.runtime_choice import Choice
from hyperplan.errors import StartRefused
from hyperplan.events.loop import EventHandler, TimedEventLoop
from hyperplan.notify.dispatcher import Dispatcher, DispatcherConfig
from hyperplan.services.accounts import accounts, os_users, sealed_secrets, work_root
from hyperplan.services.accounts.key_cache import KeyCache
from hyperplan.services.clusters import cluster_reconcile, metering
from hyperplan.services.clusters.node_watcher import NodeWatcher
from hyperplan.services.jobs import job_deadlines, jobs, spot
from hyperplan.services.jobs.job_runner import JobRunner
from hyperplan.services.orchestration import account_views, adoption, demo_load
from hyperplan.services.orchestration.retention import RetentionWorker
from hyperplan.services.plans import lifecycle, payments, plans, reclaim_warnings, resale
from hyperplan.services.runtime import leadership, slurm_placement
from hyperplan.services.runtime.context import LifecycleContext, ServiceContext, Settings, Wakes
from hyperplan.services.runtime.job_work import JobLocks, JobSettings
from hyperplan.services.runtime.live_calendar import LiveCalendar, columns_not_held
from hyperplan.services.runtime.rate_limiter import RateLimiter, SharedBuckets
from hyperplan.services.runtime.shared_state import SharedState
from hyperplan.services.runtime.slurm_state import SlurmState
from hyperplan.services.slurm import slurm_reservations
from hyperplan.services.slurm.slurm_reservations import ReservationWorker
from hyperplan.slurm.client import SlurmClient
from hyperplan.store import changes, settings
from hyperplan.store.db import Database
from hyperplan.store.master_key import KEY_FILE_NAME, SecretBox
from hyperplan.store.schema import (
    AccessKey,
    Account,
    ClockMove,
    PlanEvent,
    PlanExtension,
    ReservedCapacity,
    ScheduledEvent,
    Setting,
    TrainingPlan,
    User,
    WebhookDelivery,
)
from hyperplan.store.urls import check_url, sqlite_url
from hyperplan.worker import LocalWake

log = logging.getLogger(__name__)

DATA_DIR_ENV = "HYPERPLAN_DATA_DIR"
BOOTSTRAP_KEY_ENV = "HYPERPLAN_BOOTSTRAP_ACCESS_KEY_ID"
BOOTSTRAP_SECRET_ENV = "HYPERPLAN_BOOTSTRAP_SECRET_ACCESS_KEY"

# (work directory) -> the execution back end; tests give one that builds a FakeBackend.
BackendFactory = Callable[[Path], Backend]
LEGACY_BACKEND = "backend"  # DATA_DIR/backend: where versions before the work directory ran their work


def default_data_dir() -> Path:
    configured = os.environ.get(DATA_DIR_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".local" / "share" / "hyperplan"


def read_fleet_text(path: Path | None) -> str:
    if path is None:
        return resources.files("hyperplan.fleet").joinpath("demo.toml").read_text()
    return path.read_text()


def local_backend(work_dir: Path) -> Backend:
    """Real processes, each node and task in a sandbox under the work directory."""
    return LocalBackend(work_dir / "backend")


def with_legacy_work(backend: Backend, old_dir: Path, how: str) -> Backend:
    """A server upgraded from a version that kept its nodes and tasks in OLD_DIR/backend (the data
    directory, before work directories; the shared default work root, before store ids): while any are
    left there, a second local back end over that root adopts them and serves them until they end
    (backends/composite.py); new work goes to ``backend``. ``how`` says, in the log, how they run."""
    legacy_root = old_dir / LEGACY_BACKEND
    if not holds_work(legacy_root):
        return backend
    log.warning(
        "adopting the nodes and tasks a previous version started under %s: %s, until they end; new work "
        "goes to the work directory",
        legacy_root,
        how,
    )
    return RoutingBackend(backend, LocalBackend(legacy_root), legacy_root)


@dataclass(frozen=True)
class AppConfig:
    data_dir: Path
    fleet_path: Path | None = None
    clock: str = "wall"
    time_scale: float = 1.0
    clock_start: datetime | None = None  # a new store's first service instant (manual, accelerated)
    database_url: str | None = None  # None: SQLite in DATA_DIR/hyperplan.db (store/db.py check_url)
    backend: BackendFactory = local_backend
    dispatcher: DispatcherConfig | None = None  # None: the defaults and HYPERPLAN_WEBHOOK_* variables
    # The master key file (store/master_key.py); None: DATA_DIR/master.key. Servers sharing one database
    # name one file.
    key_file: Path | None = None
    # "users" or "none" (services/accounts/os_users.py); None: "users" when run as root, else "none".
    isolation: str | None = None
    # Nodes' homes, sandboxes, job trees; None: the fleet file's [backend] work_dir, else the default
    # (/var/lib/hyperplan/work/STORE_ID as root, DATA_DIR-work otherwise: services/accounts/work_root.py).
    work_dir: Path | None = None
    # "podman" or "process" (serve --runtime); None: the fleet file's [backend] runtime, else
    # $HYPERPLAN_RUNTIME, else podman as root where it is usable, process otherwise (core/runtime_choice.py).
    runtime: str | None = None
    # HOST:PORT the server listens on (serve --host/--port): what jobs' containers reach inside at
    # 127.0.0.1:PORT; None: not serving (a context for a command), and containers reach nothing.
    endpoint: str | None = None
    # The fleet itself, already read (`hyperplan simulate` runs one fleet under several rankings); None:
    # read from fleet_path.
    fleet: Fleet | None = None
    # serve --metrics-listen HOST:PORT: the Prometheus listener (hyperplan/metrics.py); None: none.
    metrics_listen: str | None = None
    # "all": serves and may lead (a server alone, or one of several); "api": serves, never leads (the
    # API processes of `serve --workers N`); "background": may lead, serves nothing (their parent).
    role: str = "all"
    leader_lease: float | None = None  # seconds; None: $HYPERPLAN_LEADER_LEASE or 10

    @property
    def key_path(self) -> Path:
        return self.key_file if self.key_file is not None else self.data_dir / KEY_FILE_NAME


@dataclass(frozen=True)
class Workers:
    events: TimedEventLoop  # the timed-event loop (plans, payments, jobs, the demo load)
    node_watcher: NodeWatcher
    job_runner: JobRunner
    dispatcher: Dispatcher
    reservations: ReservationWorker | None = None  # a Slurm back end's plans <-> reservations
    retention: RetentionWorker | None = None  # ended work's files removed after [retention] period


@dataclass(frozen=True)
class _Preflight:
    """What a start decides and checks before the store opens (Application.open)."""

    isolation: os_users.Isolation
    fleet: Fleet
    slurm: SlurmState | None  # None: the local back end
    work_dir: Path | None  # the work root configured; None: the default, which needs the store's id
    interpreter: str | None  # tenants' Python (os_users.default_interpreter)
    runtime: Choice  # containers or host processes (core/runtime_choice.py)


@dataclass(frozen=True)
class _OpenStore:
    """The store, migrated and unlocked, with the service clock and the work root it owns."""

    db: Database
    box: SecretBox
    clock: Clock
    roots: work_root.WorkRoots


class Application:
    def __init__(self, config: AppConfig) -> None:
        self.config = config
        self.credentials_path = config.data_dir / "credentials"
        self.bootstrapped = False  # True once bootstrap() has created the administrator
        self._context: ServiceContext | None = None
        self._workers: Workers | None = None
        self._bootstrap_done = False
        self._metrics: Any = None  # the metrics listener (hyperplan.metrics.Listener), once started
        self.leadership: leadership.Leadership | None = None
        self._forwarder: leadership.WakeForwarder | None = None

    # -- what the root built ----------------------------------------------------------------------

    @property
    def context(self) -> ServiceContext:
        if self._context is None:
            raise RuntimeError("the application is not open yet: call open() (or start()) first")
        return self._context

    @property
    def workers(self) -> Workers:
        self.context  # noqa: B018  (raises the same error when not open)
        assert self._workers is not None
        return self._workers

    # -- start and stop ---------------------------------------------------------------------------

    def open(self) -> ServiceContext:
        """The I/O of a start, once: data directory, fleet file, migration, master key (sealing any secret
        a store made before kept in plain text), clock, offering key; then the context and the workers are
        built (none of them runs yet). MasterKeyUnavailable if the store's secrets cannot be opened."""
        if self._context is not None:
            return self._context
        config = self.config
        preflight = _preflight(config)
        store = _open_store(config, preflight)
        leader, forwarder, wakes = _leadership(config, store.db)
        _wake_on_commit(store.db, wakes, preflight.slurm)
        events = TimedEventLoop(store.db, store.clock, {}, wake=wakes.lifecycle)
        backend = _backend(config, preflight, store)
        context = self._service_context(preflight, store, backend, wakes, events, leader)
        self._workers = _workers(context, events, config.dispatcher)
        self._wire(leader, context, events)
        self.leadership, self._forwarder = leader, forwarder
        self._context = context
        return context

    def _service_context(
        self,
        preflight: _Preflight,
        store: _OpenStore,
        backend: Backend,
        wakes: Wakes,
        events: TimedEventLoop,
        leader: leadership.Leadership,
    ) -> ServiceContext:
        """What every service is handed (services/runtime/context.py), over the store just opened."""
        db, fleet, slurm = store.db, preflight.fleet, preflight.slurm
        calendar = LiveCalendar(fleet, store.clock.now)
        db.on_bump(changes.CALENDAR, calendar)
        keys = KeyCache()
        return ServiceContext(
            settings=Settings(
                self.config.data_dir,
                self.config.time_scale,
                store.roots.work_dir,
                preflight.isolation.value,
                preflight.interpreter,
                runtime=preflight.runtime.runtime,
                endpoint=self.config.endpoint,
                disk_problem=_disk_problem(preflight),
            ),
            fleet=fleet,
            db=db,
            clock=store.clock,
            calendar=calendar,
            lifecycle=LifecycleContext(
                calendar, fleet, consumers=(self._clusters_follow, self._jobs_follow, self._spot_follows)
            ),
            backend=backend,
            keys=keys,
            offering_key=_offering_key(db),
            secret_box=store.box,
            wakes=wakes,
            advance_clock=lambda target: leader.move_clock(target, events.advance_to),
            job_settings=JobSettings.from_environment(),
            job_locks=JobLocks(),
            slurm=slurm,
            booking_checks=(slurm_placement.check_can_book,) if slurm is not None else (),
            reclaim_lent=spot.reclaim_for_owner,
            shared=SharedState(db, calendar, keys, store.clock, slurm),
            rate_limiter=RateLimiter(store=SharedBuckets(db)),
            images=_images(backend),
        )

    def _wire(self, leader: leadership.Leadership, context: ServiceContext, events: TimedEventLoop) -> None:
        """What the leader does as it takes over and gives up, and which loops it wakes when another
        server's commit made them work."""
        wakes = context.wakes
        leader.wire(
            self._take_over,
            self._give_up,
            events.advance_to if context.clock.kind != "wall" else None,
            {
                changes.EVENTS: wakes.lifecycle,
                changes.WEBHOOKS: wakes.webhooks,
                changes.JOBS: wakes.jobs,
                changes.NODES: wakes.nodes,
            },
        )

    def bootstrap(self) -> bool:
        """On a data directory's first start, create the administrator and write its credentials file.
        True if it did (now or at an earlier call)."""
        context = self.open()
        if not self._bootstrap_done:
            self.bootstrapped = _bootstrap_admin(
                context.db, context.secret_box, context.fleet, self.credentials_path
            )
            if context.settings.isolated:
                made = account_views.ensure_os_users(context)
                if made:
                    log.info("made the OS users of %d account(s)", made)
            self._bootstrap_done = True
        return self.bootstrapped

    def start(self) -> None:
        """Load the calendar and stand for leader (services/runtime/leadership.py): a server alone leads at
        once, and, as leader, catches up on every event missed while it was down and runs the workers."""
        context = self.open()
        self.bootstrap()
        context.calendar.load(context.db)
        plans.compile_ahead(context)  # no request compiles a purchase's statements
        assert self.leadership is not None
        if self.config.metrics_listen and self._metrics is None:
            # Every server that may lead listens (the API processes of --workers count into the shared
            # directory their parent's listener reads: hyperplan/metrics.py).
            self._metrics = _metrics_listener(context, self.config.metrics_listen)
        self.leadership.start()

    def _take_over(self) -> None:
        """This process was elected leader: adopt every node and job task, run what is due, start the
        loops that need one owner."""
        context = self.context
        workers = self.workers
        stored = demo_load.store_initial_load(context)
        if stored:
            log.info("stored %d background bookings held by %r", stored, demo_load.ACCOUNT_NAME)
        if context.slurm is not None:
            slurm_reservations.check_cluster(context.slurm.client, context.fleet)
        assert context.shared is not None
        context.shared.follow_clock()  # the time the last leader moved the manual clock to
        # Before anything else touches the back end, one call with every node and job task the store
        # knows: no orphans, no lost work.
        adoption.adopt_all(context)
        missed = workers.events.run_due(context.clock.now())
        if missed:
            log.info("ran %d lifecycle events missed while the server was down", missed)
        workers.events.start()
        workers.dispatcher.start()
        cluster_reconcile.reconcile_all(context)
        workers.node_watcher.start()
        workers.job_runner.start()  # its first step hands over launches and finishes cut short
        if workers.reservations is not None:
            workers.reservations.start()  # its first pass reconciles Slurm's reservations with the store
        if workers.retention is not None:
            workers.retention.start()  # only when the fleet sets a retention period

    def _give_up(self) -> None:
        """This process lost the lease (it could not renew it in time): its loops stop, so that they never
        run in two places; it stays a candidate, and takes over again (adopting) if elected."""
        workers = self.workers
        workers.events.worker.stop()
        workers.dispatcher.stop()
        workers.node_watcher.stop()
        workers.job_runner.worker.stop()  # its pool stays, for the next term
        if workers.reservations is not None:
            workers.reservations.stop()
        if workers.retention is not None:
            workers.retention.stop()

    def request_stop(self) -> None:
        """Ask the lifecycle loop (and a catch-up or clock move in progress) to end after the event it is
        running. Safe in a signal handler: it sets flags and takes no lock."""
        if self._workers is not None:
            self._workers.events.request_stop()
        if self.leadership is not None:
            self.leadership.request_stop()

    def stop(self) -> None:
        if self._metrics is not None:
            self._metrics.stop()
            self._metrics = None
        if self._context is None or self._workers is None:
            return
        assert self.leadership is not None and self._forwarder is not None
        self.leadership.request_stop()
        self._forwarder.worker.stop()
        self._workers.dispatcher.stop()  # finishes deliveries in flight; before the database closes
        self._workers.events.stop()
        self._workers.node_watcher.stop()
        self._workers.job_runner.stop()
        if self._workers.reservations is not None:
            self._workers.reservations.stop()
        if self._workers.retention is not None:
            self._workers.retention.stop()
        self.leadership.stop()  # hands the lease back: another server need not wait it out
        self._context.backend.close()
        self._context.db.close()

    # -- wiring -----------------------------------------------------------------------------------

    def _clusters_follow(self, session: Session, plan_id: int, now: datetime) -> None:
        cluster_reconcile.reconcile_plan(session, self.context, plan_id, now)

    def _jobs_follow(self, session: Session, plan_id: int, now: datetime) -> None:
        jobs.reconcile_plan(session, self.context, plan_id, now)

    def _spot_follows(self, session: Session, plan_id: int, now: datetime) -> None:
        spot.plan_changed(session, self.context, plan_id, now)  # after the owner's own work was served


def _preflight(config: AppConfig) -> _Preflight:
    """The isolation mode, the data directory, the fleet file, the work root's place and the tenants'
    interpreters: every refusal that needs no store, before it opens."""
    isolation = os_users.choose_isolation(config.isolation, os.geteuid())
    config.data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(config.data_dir, 0o700)  # before anything is written in it
    fleet = config.fleet if config.fleet is not None else parse_fleet(read_fleet_text(config.fleet_path))
    runtime = _runtime(config, fleet, isolation)
    slurm = slurm_state(fleet, isolation)
    configured_work_dir = _work_dir(config, fleet)
    if configured_work_dir is not None:
        os_users.check_work_dir_place(configured_work_dir, config.data_dir)  # before the store opens
    interpreter = os_users.default_interpreter(isolation)
    if isolation is os_users.Isolation.USERS:
        os_users.check_interpreters(dict(fleet.images), interpreter)
    else:
        log.warning("%s", os_users.NOT_ISOLATED)
    return _Preflight(isolation, fleet, slurm, configured_work_dir, interpreter, runtime)


def _disk_problem(preflight: _Preflight) -> str | None:
    """Why containers' disks are not bounded here (None: they are, or no container runs)."""
    if not preflight.runtime.contained:
        return None
    if preflight.slurm is not None:
        return SLURM_DISKS
    return disks.unusable()


SLURM_DISKS = (
    "on the Slurm back end a job's and a node's files live on the work root its nodes share, which the "
    "server does not divide into disks of their own"
)


def _runtime(config: AppConfig, fleet: Fleet, isolation: os_users.Isolation) -> Choice:
    """Containers or host processes: asked by the flag, the fleet file or $HYPERPLAN_RUNTIME, else the
    default; an explicit podman this host cannot serve refuses the start, naming what it lacks."""
    asked = runtime_choice.request(
        config.runtime, fleet.backend.runtime, os.environ.get(runtime_choice.RUNTIME_ENV)
    )
    slurm = fleet.backend.kind == "slurm"
    # A look at PATH and /proc, under a millisecond: looked at even when the answer cannot matter.
    problems = list(podman_problems())
    if isolation is not os_users.Isolation.USERS:  # each account's containers map to ids of its own
        problems.append("isolation mode users (--isolation users), whose accounts own their containers' ids")
    choice = runtime_choice.choose(asked, is_root=os.geteuid() == 0, problems=problems, slurm=slurm)
    if choice.contained:
        log.info("runtime podman: tenant work runs in containers (%s)", choice.why)
        disk_problem = SLURM_DISKS if slurm else disks.unusable()
        if disk_problem is not None:
            log.warning("%s: %s", disks.NOT_BOUNDED, disk_problem)
    else:
        log.warning("%s (%s)", runtime_choice.NOT_CONTAINED, choice.why)
    return choice


def _open_store(config: AppConfig, preflight: _Preflight) -> _OpenStore:
    """The store migrated, its secrets unlocked, the clock loaded and the work root taken; the store
    closed again if any of them is refused."""
    # DATA_DIR/hyperplan.db, or the database at --database-url (DATA_DIR keeps the key file and the
    # server's local state either way).
    db = Database(check_url(config.database_url) if config.database_url else sqlite_url(config.data_dir))
    try:
        db.migrate()
        box = sealed_secrets.unlock(db, config.key_path)
        close_data_dir(config.data_dir)  # the store and key just made, and a store from before
        clock = _load_clock(db, config)
        # Once everything else said yes: the work root, refused if another store's (work_root.py).
        roots = work_root.take(
            db,
            config.data_dir,
            preflight.work_dir,
            preflight.isolation,
            slurm=preflight.slurm is not None,
            local=preflight.slurm is None and config.backend is local_backend,
        )
    except BaseException:
        db.close()
        raise
    return _OpenStore(db, box, clock, roots)


def _leadership(
    config: AppConfig, db: Database
) -> tuple[leadership.Leadership, leadership.WakeForwarder, Wakes]:
    """This server's candidacy for leader, and the loops' wakes: the nodes' and jobs' reach the leader
    wherever the commit was made."""
    lease = config.leader_lease if config.leader_lease is not None else leadership.lease_from_env()
    leader = leadership.Leadership(db, lease=lease, candidate=config.role != "api")
    forwarder = leadership.WakeForwarder(db, leader)
    wakes = Wakes(
        LocalWake(),
        leadership.SharedWake(LocalWake(), changes.NODES, forwarder),
        leadership.SharedWake(LocalWake(), changes.JOBS, forwarder),
        LocalWake(),
    )
    return leader, forwarder, wakes


def _wake_on_commit(db: Database, wakes: Wakes, slurm: SlurmState | None) -> None:
    # Whoever writes a timed event or queues a delivery, the loop that runs it hears of it at commit:
    # in this process by the wake, in the leader by the change counter it watches.
    db.on_insert(ScheduledEvent, wakes.lifecycle.notify)
    db.on_insert(WebhookDelivery, wakes.webhooks.notify)
    count_changes(db)
    if slurm is not None:  # a plan's history grew (paid, started, ended, cancelled...): its reservations
        db.on_insert(PlanEvent, slurm.wake.notify)


def _backend(config: AppConfig, preflight: _Preflight, store: _OpenStore) -> Backend:
    """The execution back end on the work root, adopting what earlier versions left elsewhere."""
    slurm, roots = preflight.slurm, store.roots
    try:
        if slurm is not None and config.backend is local_backend:
            # [backend] kind = "slurm": nodes and job instances are Slurm jobs (backends/slurm.py)
            store_root = podman_store(preflight.fleet) if preflight.runtime.contained else None
            backend: Backend = slurm_backend(roots.work_dir / "slurm", slurm, preflight.fleet, store_root)
        elif preflight.runtime.contained and config.backend is local_backend:
            # runtime podman: every node and job instance a container (backends/containers.py)
            backend = LocalBackend(roots.work_dir / "backend", podman_store=podman_store(preflight.fleet))
        else:
            backend = config.backend(roots.work_dir)
    except BaseException:  # a start refused (the tenants' paths): the store goes with it
        store.db.close()
        raise
    if config.backend is local_backend:
        backend = with_legacy_work(
            backend, config.data_dir, "they run as the server's own user, not isolated"
        )
    if roots.old_root is not None:
        backend = with_legacy_work(backend, roots.old_root, "they run as the accounts' users they ran as")
    return backend


def _workers(
    context: ServiceContext, events: TimedEventLoop, dispatcher_config: DispatcherConfig | None
) -> Workers:
    """The background loops, built on the context; none runs until this server leads."""
    events.handlers.update(event_handlers(context))
    webhooks = Dispatcher(
        context.db,
        context.arn,
        config=dispatcher_config or DispatcherConfig.from_env(),
        targets=context.fleet.webhooks,
        wake=context.wakes.webhooks,
        box=context.secret_box,
    )
    reservations = slurm_reservations.ReservationWorker(context) if context.slurm is not None else None
    return Workers(
        events,
        NodeWatcher(context),
        JobRunner(context),
        webhooks,
        reservations,
        RetentionWorker(context),
    )


def event_handlers(context: ServiceContext) -> dict[str, EventHandler]:
    """Every service's timed events, merged; two services claiming one kind is a bug."""
    merged: dict[str, EventHandler] = {}
    for handlers in (
        lifecycle.event_handlers(context.lifecycle),
        payments.event_handlers(context.lifecycle),
        demo_load.event_handlers(context),
        job_deadlines.event_handlers(context),
        metering.event_handlers(context),
        reclaim_warnings.event_handlers(context),
        spot.event_handlers(context),
        resale.event_handlers(context),
    ):
        clash = merged.keys() & handlers.keys()
        if clash:
            raise RuntimeError(f"two services handle the timed events {sorted(clash)}")
        merged.update(handlers)
    return merged


def count_changes(db: Database) -> None:
    """What each change counter follows (store/changes.py)."""
    # A segment's status as it starts and ends, or a plan's, holds no capacity: only the columns the live
    # calendar reads move its counter, whose every move has each process read all that is held again.
    db.count_changes(ReservedCapacity, changes.CALENDAR, ignoring=columns_not_held(ReservedCapacity))
    db.count_changes(PlanExtension, changes.CALENDAR, ignoring=columns_not_held(PlanExtension))
    db.count_changes(TrainingPlan, changes.PLANS)  # a plan's status: what quotas count
    db.count_changes(AccessKey, changes.KEYS)
    db.count_changes(Account, changes.KEYS, ignoring=("budget",))
    db.count_changes(User, changes.KEYS)
    db.count_changes(Setting, changes.SETTINGS)
    db.count_changes(ScheduledEvent, changes.EVENTS, inserts_only=True)
    db.count_changes(WebhookDelivery, changes.WEBHOOKS, inserts_only=True)
    db.count_changes(ClockMove, changes.CLOCK_MOVES, inserts_only=True)


def slurm_state(fleet: Fleet, isolation: os_users.Isolation) -> SlurmState | None:
    """A Slurm back end's client (None for the local one). It runs every account's work as the
    account's OS user, so isolation mode `none` is refused with it."""
    if fleet.backend.kind != "slurm":
        return None
    if isolation is not os_users.Isolation.USERS:
        raise StartRefused(
            "the Slurm back end ([backend] kind = \"slurm\") runs every account's work as the account's "
            "OS user: isolation mode 'none' is refused with it; run the server as root in mode users"
        )
    assert fleet.backend.slurm_conf is not None  # the fleet file requires it for kind "slurm"
    return SlurmState(SlurmClient(fleet.backend.slurm_conf))


def podman_store(fleet: Fleet) -> Path:
    """The Podman store of runtime podman, its configuration written for this host (runtime, ulimits),
    on a file system of its own when the fleet gives it a size; a start refused when it cannot be."""
    root = Path(fleet.backend.podman_store or containers.DEFAULT_STORE)
    try:
        return containers.prepare_store(root, fleet.backend.podman_store_gb)
    except disks.DiskError as error:
        raise StartRefused(f"[backend] podman_store_gb: {error}") from None


def _images(backend: Backend) -> PodmanImages | None:
    """The images of the back end's Podman store, where it runs containers (a legacy root in front of it
    routes new work to it: backends/composite.py)."""
    local = backend.primary if isinstance(backend, RoutingBackend) else backend
    if isinstance(local, LocalBackend | SlurmBackend) and local.podman is not None:
        return PodmanImages(local.podman)
    return None


def slurm_backend(
    root: Path, slurm: SlurmState, fleet: Fleet, podman_store: Path | None = None
) -> SlurmBackend:
    """The Slurm back end over ``root`` (on the shared work root), sweeping the pools' nodes when an
    account goes; its work in containers of images from ``podman_store`` (runtime podman). Its work runs
    as the accounts' users (mode users): the start is refused when they could not run what every step
    starts with (its interpreter, runner and wrapper; runc and the containers' init)."""
    machines = [node for pool in fleet.pools for node in pool.nodes]
    backend = SlurmBackend(
        root, slurm.client, machines=machines, partition=fleet.backend.partition, podman_store=podman_store
    )
    os_users.check_open_to_tenants(backend.tenant_paths(), "the Slurm back end's step runner")
    return backend


def _work_dir(config: AppConfig, fleet: Fleet) -> Path | None:
    """The work root configured (the flag, else the fleet file); None: the default (work_root.py)."""
    if config.work_dir is not None:
        return config.work_dir.expanduser()
    if fleet.work_dir is not None:
        return Path(fleet.work_dir)
    return None


def close_data_dir(data_dir: Path) -> None:
    """The data directory and everything in it readable by the server's user only: no group or other
    bit on any directory or file (0700, 0600 for the database, credentials, keys...); a store made
    before this rule gets it here. Links are not followed (nor changed)."""
    os.chmod(data_dir, os.stat(data_dir).st_mode & 0o700)
    for parent, directories, files in os.walk(data_dir):
        for name in (*directories, *files):
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if not stat.S_ISLNK(info.st_mode) and info.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(info.st_mode) & 0o700)


def _load_clock(db: Database, config: AppConfig) -> Clock:
    with db.write() as session:
        saved = settings.get_time(session, settings.CLOCK_NOW)
        clock = make_clock(config.clock, saved, config.time_scale, config.clock_start)
        if saved is not None and config.clock_start is not None:
            log.warning(
                "--clock-start %s ignored: this data directory's service clock already reads %s",
                config.clock_start.isoformat(),
                saved.isoformat(),
            )
        if isinstance(clock, AcceleratedClock):
            _share_anchor(session, clock, adopt=config.role == "api")
        if clock.kind != "wall" and (saved is None or clock.now() > saved):
            settings.put_time(session, settings.CLOCK_NOW, clock.now())
    return clock


def _share_anchor(session: Session, clock: AcceleratedClock, *, adopt: bool) -> None:
    """Every process on the store reads the accelerated clock from one anchor (clock.py). A process that
    starts while another is alive (an API process of --workers, always) takes the stored one; the first
    to start anchors the clock where it stopped (the last service time saved) and stores that."""
    record = settings.get_record(session, settings.CLOCK_ANCHOR)
    stored = None if record is None else Anchor.from_record(record)
    if stored is not None and (adopt or leadership.others_alive(session)):
        if stored.scale != clock.scale:
            log.warning(
                "--time-scale %g ignored: the servers running on this store read the clock at %g",
                clock.scale,
                stored.scale,
            )
        clock.follow(stored)
    else:
        settings.put_record(session, settings.CLOCK_ANCHOR, clock.anchor.record())


def _offering_key(db: Database) -> bytes:
    """The key that signs offering ids; kept in the store so that every server shares it."""
    with db.write() as session:
        key = settings.get(session, settings.OFFERING_KEY)
        if key is None:
            key = secrets.token_hex(32)
            settings.put(session, settings.OFFERING_KEY, key)
    return bytes.fromhex(key)


def _bootstrap_admin(db: Database, box: SecretBox, fleet: Fleet, credentials_path: Path) -> bool:
    """Create the administrator on the first start of a data directory. True if it did."""
    with db.write() as session:
        if accounts.has_accounts(session):
            return False
        key = accounts.create_account(
            session,
            accounts.ADMIN_NAME,
            box=box,
            now=utcnow(),
            is_admin=True,
            payment_mode=fleet.default_payment_mode,
            access_key_id=os.environ.get(BOOTSTRAP_KEY_ENV) or None,
            secret_access_key=os.environ.get(BOOTSTRAP_SECRET_ENV) or None,
        )
        accounts.write_credentials_file(credentials_path, key, fleet.region)
    return True


def _metrics_listener(context: ServiceContext, listen: str) -> Any:
    """The Prometheus listener over this process's (or every worker's) instruments and the fleet's state
    read from the store (docs/OPERATIONS.md)."""
    from hyperplan import metrics
    from hyperplan.services.orchestration.fleet_metrics import FleetCollector

    try:
        host, port = metrics.parse_listen(listen)
        listener = metrics.Listener(host, port, metrics.served_registry([FleetCollector(context)]))
    except ValueError as exc:
        raise StartRefused(str(exc)) from None
    except OSError as exc:
        raise StartRefused(f"--metrics-listen {listen}: cannot listen there: {exc}") from None
    log.info("metrics on http://%s:%d/metrics", host, listener.port)
    return listener
