"""The spot scheduler (services/jobs/spot.py) on a real store: where waiting spot jobs are placed (a plan's
idle instances, the pool's free on-demand capacity, per the fleet's ``[spot] prefer``), and how lent
instances are taken back (an owner's cluster group growing, lending turned off, the stop-lending point,
a plan that fails), with the owner's work getting the instances only once the borrower's tasks are gone.
A loop of random steps checks that no plan is ever lent above its capacity.

The application runs in this process over the fake back end (nothing is started) and the manual clock.
The fake world's clock is the service clock, so a task's SIGKILL at a reclaim's deadline happens when the
test moves the clock there; every task ignores SIGTERM, so a borrower's instances come back only when
the test ends its tasks or its deadline's SIGKILL does. The job runner's watcher brings ended tasks into
the store on its own thread: tests wait (real time, woken at once) for what it does, never for service
time. tests/server/test_spot_training.py tells the same story end to end, with real processes."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from signal import SIGTERM
from typing import Any

import pytest
from sqlalchemy import select

from hyperplan.app import AppConfig, Application
from hyperplan.backends.base import EXPIRATION_VARIABLE, TaskRef
from hyperplan.backends.fake import FakeBackend, FakeWorld, Program
from hyperplan.clock import Clock
from hyperplan.core.jobs import WAITING, AttemptState
from hyperplan.core.search_request import SearchRequest
from hyperplan.core.status import NodeStatus
from hyperplan.errors import ResourceLimitExceeded, ValidationError
from hyperplan.services.accounts import accounts
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.clusters import clusters
from hyperplan.services.clusters.cluster_request import ClusterSpec, ClusterUpdate
from hyperplan.services.jobs import job_records, jobs, spot
from hyperplan.services.jobs.job_request import TrainingJobSpec
from hyperplan.services.orchestration import clock, drain
from hyperplan.services.plans import capacity_claims, lending, loans, on_demand, payments, plans
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.storage import bucket_rights
from hyperplan.store.schema import (
    Cluster,
    ClusterNode,
    LendingPolicy,
    PlanEvent,
    ReservedCapacity,
    ScheduledEvent,
    SpotRun,
    TrainingJob,
    TrainingPlan,
)
from tests.harness import SERVER_START, unisolated

P5 = "ml.p5.48xlarge"
ZONE = "us-west-2a"
SUBNET = "subnet-00000000000000a01"
JOBS, CLUSTERS = "training-job", "hyperpod-cluster"
MINUTE = timedelta(minutes=1)
NOTICE = timedelta(seconds=120)  # the fleet's default notice (no [spot] table sets another)
# Longer than any test runs its clock: no job ends by its limits meanwhile.
RUNTIME = {"MaxRuntimeInSeconds": 3 * 86_400}
SPOT_RUNTIME = {**RUNTIME, "MaxWaitTimeInSeconds": 3 * 86_400}


def _fleet(reservable: int, on_demand: int, prefer: str = "lent") -> str:
    """One pool of p5 in one zone: `reservable` instances plans may reserve, `on_demand` more for
    on-demand work (a spot job's free on-demand capacity); the [spot] table's defaults but `prefer`."""
    return f"""
region = "us-west-2"
currency = "USD"
[[zones]]
name = "{ZONE}"
zone_id = "usw2-az1"
subnets = ["{SUBNET}"]
[[pools]]
instance_type = "{P5}"
zone = "{ZONE}"
count = {reservable + on_demand}
reservable = {reservable}
price_per_instance_hour = "40.00"
[policy]
allowed_counts = "any"
[spot]
prefer = "{prefer}"
"""


class ServiceTime:
    """The fake world's clock: the service's manual clock, in seconds (0 until the application has one),
    so that a SIGKILL due `notice` seconds after a reclaim comes when the test moves the clock there."""

    def __init__(self) -> None:
        self.clock: Clock | None = None

    def __call__(self) -> float:
        return self.clock.now().timestamp() if self.clock is not None else 0.0


@dataclass(frozen=True)
class Service:
    """The running application and its accounts: the plan's owner, two borrowers, the administrator."""

    runtime: ServiceContext
    world: FakeWorld
    owner: Caller
    borrower: Caller
    other_borrower: Caller
    admin: Caller

    @property
    def backend(self) -> FakeBackend:
        backend = self.runtime.backend
        assert isinstance(backend, FakeBackend)
        return backend


@dataclass(frozen=True)
class Plan:
    """A plan of the owner's, as the tests name it, with its one segment."""

    arn: str
    id: int
    name: str
    target: str
    segment: ReservedCapacity


def _account(runtime: ServiceContext, name: str, mode: str = "auto", budget: str | None = None) -> Caller:
    """An account with a bucket of its own (`NAME-data`) for its jobs' output."""
    with runtime.db.write() as session:
        key = accounts.create_account(
            session, name, box=runtime.secret_box, now=runtime.clock.now(), payment_mode=mode
        )
        if budget is not None:
            payments.update_account(
                session, name, mode=None, budget=Decimal(budget), add_budget=None, now=runtime.clock.now()
            )
    caller = Caller(key.account_id, name, False, key.access_key_id)
    bucket_rights.create_bucket(runtime, caller, f"{name}-data")
    return caller


def _admin(runtime: ServiceContext) -> Caller:
    with runtime.db.read() as session:
        admin = accounts.list_accounts(session)[0]
    return Caller(admin.id, admin.name, True, "test")


def _start(tmp_path: Path, fleet_text: str) -> Iterator[Service]:
    fleet_path = tmp_path / "fleet.toml"
    fleet_path.write_text(fleet_text)
    service_time = ServiceTime()
    world = FakeWorld(clock=service_time)
    application = Application(
        AppConfig(
            data_dir=tmp_path / "data",
            fleet_path=fleet_path,
            clock="manual",
            clock_start=SERVER_START,
            backend=lambda _work_dir: FakeBackend(world, task=Program.runs(on_term=None)),
            **unisolated(tmp_path / "data"),
        )
    )
    application.start()
    try:
        runtime = application.context
        service_time.clock = runtime.clock
        yield Service(
            runtime,
            world,
            owner=_account(runtime, "vision"),
            borrower=_account(runtime, "speech"),
            other_borrower=_account(runtime, "audio"),
            admin=_admin(runtime),
        )
    finally:
        application.stop()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[[str], Service]]:
    """Starts the application on a fleet file's text (one per test); stopped after the test."""
    running: list[Iterator[Service]] = []

    def start_on(fleet_text: str) -> Service:
        started = _start(tmp_path, fleet_text)
        running.append(started)
        return next(started)

    yield start_on
    for started in running:
        next(started, None)  # its `finally` stops the application


@pytest.fixture
def lent_only(start: Callable[[str], Service]) -> Service:
    """A pool of 4 that plans may reserve whole: a spot job runs only on instances a plan lends."""
    return start(_fleet(reservable=4, on_demand=0))


# -- plans, the clock, jobs, clusters ------------------------------------------------------------------


def _buy(service: Service, name: str, count: int, target: str) -> Plan:
    """A one-day plan of the owner's, from the first offering."""
    runtime, owner = service.runtime, service.owner
    offering = plans.search(runtime, owner, SearchRequest(P5, count, 24, target, None, None))[0]
    arn = plans.create(runtime, owner, name, offering.offering_id)
    with runtime.db.read() as session:
        plan = session.scalars(
            select(TrainingPlan).where(TrainingPlan.account_id == owner.account_id, TrainingPlan.name == name)
        ).one()
        segment = session.scalars(select(ReservedCapacity).where(ReservedCapacity.plan_id == plan.id)).one()
    return Plan(arn, plan.id, name, target, segment)


def _reclaim_at(service: Service, plan: Plan) -> datetime:
    """The segment's reclaim time for the plan's own work: the latest a borrower may hold its instances."""
    return plan.segment.end - service.runtime.fleet.policy.reclaim_lead_for(plan.target)


def _set_clock(service: Service, moment: datetime) -> None:
    """The manual clock moved, every event due on the way run (as `hyperplan clock set` does)."""
    clock.set_time(service.runtime, moment.isoformat())


def _now(service: Service) -> datetime:
    return service.runtime.clock.now()


def _request(
    caller: Caller, name: str, count: int, *, spot_job: bool = False, plan: Plan | None = None
) -> TrainingJobSpec:
    resources: dict[str, Any] = {"InstanceType": P5, "InstanceCount": count}
    if plan is not None:
        resources["TrainingPlanArn"] = plan.arn
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/training",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python", "train.py"],
        },
        "OutputDataConfig": {"S3OutputPath": f"s3://{caller.account_name}-data/output"},
        "ResourceConfig": resources,
        "StoppingCondition": SPOT_RUNTIME if spot_job else RUNTIME,
    }
    if spot_job:
        request["EnableManagedSpotTraining"] = True
    return TrainingJobSpec.from_wire(request)


def _spot_job(service: Service, caller: Caller, name: str, count: int) -> None:
    jobs.create(service.runtime, caller, _request(caller, name, count, spot_job=True))
    _settle(service)


def _plan_job(service: Service, name: str, count: int, plan: Plan) -> None:
    """A job of the owner's on its plan."""
    jobs.create(service.runtime, service.owner, _request(service.owner, name, count, plan=plan))
    _settle(service)


def _job(service: Service, caller: Caller, name: str) -> TrainingJob:
    with service.runtime.db.read() as session:
        return job_records.get(session, service.runtime, caller, name)


def _runs(service: Service, job: TrainingJob | None = None) -> list[SpotRun]:
    """The job's spot runs (every run, without one), oldest first."""
    query = select(SpotRun).order_by(SpotRun.id)
    if job is not None:
        query = query.where(SpotRun.job_id == job.id)
    with service.runtime.db.read() as session:
        return list(session.scalars(query))


def _task_ids(service: Service, job: TrainingJob) -> list[str]:
    """The back-end tasks of the job's current attempt."""
    with service.runtime.db.read() as session:
        return [instance.task_id for instance in job_records.instances_of(session, job.id, job.attempt)]


def _live_tasks(service: Service, job: TrainingJob) -> list[str]:
    return [
        task_id
        for task_id in _task_ids(service, job)
        if task_id in service.world.tasks and not service.backend.task_status(task_id).state.is_final()
    ]


def _end_tasks(service: Service, job: TrainingJob) -> None:
    """The job's processes exit (as a borrower that saved its checkpoint does), and the store learns it."""
    for task_id in _live_tasks(service, job):
        service.backend.complete(task_id, 0)
    _settle(service)


def _wait(service: Service, check: Callable[[], Any], timeout: float = 20) -> Any:
    """Real time, for the runner's and the node watcher's threads (woken at once): never service time."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        service.runtime.wakes.jobs.notify()
        service.runtime.wakes.nodes.notify()
        time.sleep(0.02)
    return value


def _quiet(service: Service) -> bool:
    """Nothing of the jobs' is under way: no attempt launching or ending, none running whose tasks have
    all ended (the watcher has yet to see it)."""
    with service.runtime.db.read() as session:
        attempts = list(session.scalars(select(TrainingJob).where(TrainingJob.attempt_state != "")))
    for job in attempts:
        if job.attempt_state in (AttemptState.LAUNCHING, AttemptState.ENDING):
            return False
        if job.attempt_state == AttemptState.RUNNING and not _live_tasks(service, job):
            return False
    return True


def _settle(service: Service) -> None:
    assert _wait(service, lambda: _quiet(service)), "the jobs did not settle"


def _cluster(name: str, plan: Plan, count: int) -> dict[str, Any]:
    return {
        "ClusterName": name,
        "InstanceGroups": [
            {
                "InstanceGroupName": "workers",
                "InstanceType": P5,
                "InstanceCount": count,
                "ExecutionRole": "arn:aws:iam::123456789012:role/cluster",
                "TrainingPlanArn": plan.arn,
            }
        ],
        "VpcConfig": {"SecurityGroupIds": ["sg-0123456789abcdef0"], "Subnets": [SUBNET]},
    }


def _nodes(service: Service, cluster: str, status: NodeStatus | None = None) -> int:
    """The cluster's nodes in `status`; without one, those not gone (Pending, Running, ShuttingDown)."""
    which = ClusterNode.status == status if status else ClusterNode.status != NodeStatus.TERMINATED
    with service.runtime.db.read() as session:
        found = session.scalars(
            select(ClusterNode.id)
            .join(Cluster, Cluster.id == ClusterNode.cluster_id)
            .where(Cluster.name == cluster, which)
        )
        return len(found.all())


def _claimed(service: Service, plan: Plan) -> int:
    """The plan's instances its owner's work holds (capacity claims)."""
    with service.runtime.db.read() as session:
        return capacity_claims.in_use(session, plan.id, plan.segment.id)


def _lent(service: Service, plan: Plan) -> int:
    with service.runtime.db.read() as session:
        return loans.lent(session, plan.id, plan.segment.id)


def _reclaim_events(service: Service, plan: Plan) -> list[str]:
    with service.runtime.db.read() as session:
        return list(
            session.scalars(
                select(PlanEvent.message)
                .where(PlanEvent.plan_id == plan.id, PlanEvent.kind == "lending.reclaim")
                .order_by(PlanEvent.id)
            )
        )


def _reclaim(run: SpotRun) -> tuple[str, datetime | None, datetime | None]:
    """Why the run was taken back, when that was asked, and its deadline."""
    return run.reclaim_reason, run.reclaim_requested_at, run.reclaim_deadline


def _expiry(moment: datetime) -> str:
    """The expiry variable's value for a deadline: epoch seconds."""
    return str(int(moment.replace(tzinfo=UTC).timestamp()))


def _assert_told(service: Service, job: TrainingJob, deadline: datetime) -> None:
    """Every task of the job got SIGTERM once, with the expiry variable published as the deadline."""
    tasks = _task_ids(service, job)
    assert tasks
    for task_id in tasks:
        assert service.backend.signals_of(task_id) == [SIGTERM], task_id
        assert service.backend.published_env(TaskRef(task_id))[EXPIRATION_VARIABLE] == _expiry(deadline)


# -- an owner's cluster group takes its instances back ---------------------------------------------------


def test_a_growing_cluster_group_takes_its_lent_instances_back_and_gets_nodes_only_once_they_are_free(
    lent_only: Service,
) -> None:
    service, runtime = lent_only, lent_only.runtime
    plan = _buy(service, "vision-plan", 4, CLUSTERS)
    _set_clock(service, plan.segment.start + MINUTE)
    clusters.create(runtime, service.owner, ClusterSpec.from_wire(_cluster("vision", plan, 2)))
    assert _wait(service, lambda: _nodes(service, "vision", NodeStatus.RUNNING) == 2)
    lending.set_policy(runtime, service.owner, plan.name)  # the fleet's defaults: 120 s of notice

    # The two instances the group does not use are lent to another account's spot job.
    _spot_job(service, service.borrower, "sweep", 2)
    job = _job(service, service.borrower, "sweep")
    assert (job.secondary_status, job.lent_plan_id) == ("Training", plan.id)
    [run] = _runs(service, job)
    assert (run.plan_id, run.count, run.owner_account_id) == (plan.id, 2, service.owner.account_id)
    assert run.ended_at is None

    # The owner grows its group to the whole plan: the borrower gets its notice.
    _set_clock(service, _now(service) + 10 * MINUTE)
    asked = _now(service)
    clusters.update(runtime, service.owner, ClusterUpdate.from_wire(_cluster("vision", plan, 4)))
    [run] = _runs(service, job)
    assert _reclaim(run) == ("owner-group", asked, asked + NOTICE)
    interrupted = _job(service, service.borrower, "sweep")
    assert interrupted.secondary_status == "SpotInterrupted"
    assert interrupted.status_message.startswith("Interrupted: the instances it borrowed are going back")
    _assert_told(service, interrupted, asked + NOTICE)

    # Within the notice the borrower's processes (which ignore SIGTERM) still run: the group waits.
    _set_clock(service, asked + NOTICE - timedelta(seconds=1))
    _settle(service)
    assert _live_tasks(service, interrupted)
    assert (_nodes(service, "vision"), _claimed(service, plan), _lent(service, plan)) == (2, 2, 2)
    assert _runs(service, job)[0].ended_at is None

    # At the deadline they are killed; the instances are the owner's, and the group grows onto them.
    _set_clock(service, asked + NOTICE)
    assert _wait(service, lambda: _nodes(service, "vision") == 4), _nodes(service, "vision")
    [run] = _runs(service, job)
    assert run.ended_at == asked + NOTICE
    assert (_claimed(service, plan), _lent(service, plan)) == (4, 0)
    assert _reclaim_events(service, plan) == [
        "Took back 2 instance(s) lent to managed spot training for a cluster instance group of the plan's: "
        "notice 120 s, the plan had them after 120 s (within the promise)."
    ]
    # The borrower waits again: nothing is idle, and the pool has no on-demand instances.
    _settle(service)
    waiting = _job(service, service.borrower, "sweep")
    assert (waiting.secondary_status, waiting.lent_plan_id) == ("Pending", None)
    assert len(_runs(service, job)) == 1


# -- where a spot job runs -------------------------------------------------------------------------------


def _free_on_demand(service: Service) -> int:
    [pool] = service.runtime.fleet.pools_of_type(P5)
    with service.runtime.db.read() as session:
        return on_demand.free(session, pool)


def _held_on_demand(service: Service, caller: Caller) -> int:
    """What the account's on-demand quota counts of it."""
    with service.runtime.db.read() as session:
        return on_demand.held_by_account(session, caller.account_id, P5)


def test_preferring_on_demand_a_spot_job_takes_free_on_demand_capacity_first_and_lent_instances_after(
    start: Callable[[str], Service],
) -> None:
    service = start(_fleet(reservable=4, on_demand=4, prefer="on-demand"))
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    lending.set_policy(service.runtime, service.owner, plan.name)
    assert _free_on_demand(service) == 4

    # The plan's 4 idle instances are lendable, yet the first spot job runs on demand.
    _spot_job(service, service.borrower, "first", 3)
    first = _job(service, service.borrower, "first")
    [run] = _runs(service, first)
    assert (first.secondary_status, first.lent_plan_id) == ("Training", None)
    assert (run.plan_id, run.owner_account_id) == (None, None)  # on demand: nobody's plan, nobody credited
    assert (_free_on_demand(service), _lent(service, plan)) == (1, 0)
    assert _held_on_demand(service, service.borrower) == 3  # the account's on-demand quota counts it

    # The next does not fit the one on-demand instance left: it borrows the plan's, which no on-demand
    # count sees.
    _spot_job(service, service.other_borrower, "second", 2)
    second = _job(service, service.other_borrower, "second")
    [run] = _runs(service, second)
    assert (second.secondary_status, second.lent_plan_id, run.plan_id) == ("Training", plan.id, plan.id)
    assert (_free_on_demand(service), _lent(service, plan)) == (1, 2)
    assert _held_on_demand(service, service.other_borrower) == 0

    # Once the first gives its instances back, they are on-demand capacity again.
    _end_tasks(service, first)
    assert _job(service, service.borrower, "first").secondary_status == "Completed"
    assert (_free_on_demand(service), _lent(service, plan)) == (4, 2)


def test_preferring_lent_instances_a_spot_job_borrows_although_on_demand_capacity_is_free(
    start: Callable[[str], Service],
) -> None:
    service = start(_fleet(reservable=4, on_demand=4))
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    lending.set_policy(service.runtime, service.owner, plan.name)
    _spot_job(service, service.borrower, "first", 3)
    first = _job(service, service.borrower, "first")
    assert (first.lent_plan_id, [run.plan_id for run in _runs(service, first)]) == (plan.id, [plan.id])
    assert (_free_on_demand(service), _lent(service, plan)) == (4, 3)


# -- lending ends: turned off, the stop-lending point, the plan failing ----------------------------------


def _borrowing(service: Service, name: str, count: int, plan: Plan) -> TrainingJob:
    """A spot job of the borrower's, running on the plan's lent instances."""
    _spot_job(service, service.borrower, name, count)
    job = _job(service, service.borrower, name)
    assert (job.secondary_status, job.lent_plan_id) == ("Training", plan.id), job.status_message
    return job


def _policy_row(service: Service, plan: Plan) -> LendingPolicy | None:
    with service.runtime.db.read() as session:
        return session.get(LendingPolicy, plan.id)


def test_lending_turned_off_takes_the_open_runs_back_and_lends_nothing_more(lent_only: Service) -> None:
    service = lent_only
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    lending.set_policy(service.runtime, service.owner, plan.name)
    first = _borrowing(service, "first", 2, plan)
    second = _borrowing(service, "second", 1, plan)

    _set_clock(service, _now(service) + 10 * MINUTE)
    off_at = _now(service)
    lending.clear_policy(service.runtime, service.owner, plan.name)
    assert _policy_row(service, plan) is None
    # Both runs get the fleet's notice (the plan's own went with its policy: docs/SPOT.md).
    for job in (first, second):
        [run] = _runs(service, job)
        assert _reclaim(run) == ("lending-off", off_at, off_at + NOTICE)
        assert _job(service, service.borrower, job.name).secondary_status == "SpotInterrupted"
        _assert_told(service, _job(service, service.borrower, job.name), off_at + NOTICE)

    # The first saves its checkpoint and exits at once; the second is killed at the deadline.
    _set_clock(service, off_at + timedelta(seconds=30))
    _end_tasks(service, first)
    assert _runs(service, first)[0].ended_at == off_at + timedelta(seconds=30)
    assert _lent(service, plan) == 1
    _set_clock(service, off_at + NOTICE)
    _settle(service)
    assert _runs(service, second)[0].ended_at == off_at + NOTICE
    assert _lent(service, plan) == 0
    assert len(_reclaim_events(service, plan)) == 2
    # Both wait again, and nothing of the plan is lent to them: 4 instances idle, lending off.
    for job in (first, second):
        waiting = _job(service, service.borrower, job.name)
        assert (waiting.secondary_status, waiting.lent_plan_id) == ("Pending", None)
        assert len(_runs(service, job)) == 1


def test_the_stop_lending_point_interrupts_a_run_no_later_than_the_segments_reclaim_time(
    lent_only: Service,
) -> None:
    service = lent_only
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    # The margin holds the notice (a shorter one is refused): the notice ends at the reclaim time.
    lending.set_policy(service.runtime, service.owner, plan.name, notice=600, stop_margin=600)
    job = _borrowing(service, "sweep", 2, plan)
    reclaim_at = _reclaim_at(service, plan)
    stop = reclaim_at - 10 * MINUTE
    [run] = _runs(service, job)
    with service.runtime.db.read() as session:
        due = session.scalars(
            select(ScheduledEvent.due_at).where(
                ScheduledEvent.kind == spot.STOP_LENDING, ScheduledEvent.subject == f"spot-run:{run.id}"
            )
        ).all()
    assert due == [stop]

    _set_clock(service, stop - timedelta(seconds=1))
    assert _runs(service, job)[0].reclaim_requested_at is None
    _set_clock(service, stop)
    [run] = _runs(service, job)
    assert _reclaim(run) == ("segment-end", stop, reclaim_at)
    _assert_told(service, _job(service, service.borrower, "sweep"), reclaim_at)

    # Killed at the segment's reclaim time at the latest; no borrower starts again on the segment.
    _set_clock(service, reclaim_at)
    _settle(service)
    assert _runs(service, job)[0].ended_at == reclaim_at
    assert _reclaim_events(service, plan) == [
        "Took back 2 instance(s) lent to managed spot training before the segment's reclaim time: "
        "notice 600 s, the plan had them after 600 s (within the promise)."
    ]
    assert _job(service, service.borrower, "sweep").secondary_status == "Pending"
    assert len(_runs(service, job)) == 1
    # A margin shorter than the notice would cut it short at the reclaim time: refused, naming both.
    with pytest.raises(ValidationError, match=r"StopMargin \(60\) is shorter than Notice \(600\)"):
        lending.set_policy(service.runtime, service.owner, plan.name, notice=600, stop_margin=60)


def test_a_plan_that_fails_takes_its_runs_back(lent_only: Service) -> None:
    service = lent_only
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    lending.set_policy(service.runtime, service.owner, plan.name, notice=300)
    job = _borrowing(service, "sweep", 3, plan)

    _set_clock(service, _now(service) + 10 * MINUTE)
    failed_at = _now(service)
    plans.cancel(service.runtime, "vision", plan.name, "hardware recall", caller=service.admin)
    [run] = _runs(service, job)
    assert (run.reclaim_reason, run.reclaim_requested_at) == ("plan-ended", failed_at)
    assert run.reclaim_deadline == failed_at + timedelta(seconds=300)  # the plan's notice, as promised
    assert _job(service, service.borrower, "sweep").secondary_status == "SpotInterrupted"

    _set_clock(service, run.reclaim_deadline)
    _settle(service)
    assert _runs(service, job)[0].ended_at == run.reclaim_deadline
    assert "as the plan can no longer give capacity" in _reclaim_events(service, plan)[0]
    assert _job(service, service.borrower, "sweep").secondary_status == "Pending"
    assert len(_runs(service, job)) == 1


# -- what places no spot job -----------------------------------------------------------------------------


def test_a_drained_fleet_places_no_spot_job_and_resuming_places_it(lent_only: Service) -> None:
    service = lent_only
    plan = _buy(service, "vision-plan", 4, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    _spot_job(service, service.borrower, "sweep", 2)  # nothing lends yet: it waits
    assert _job(service, service.borrower, "sweep").secondary_status == "Pending"
    drain.drain(service.runtime, service.admin, stop_running=False)

    # The plan lends (a change that serves the spot queue) while the fleet is drained: nothing is placed.
    lending.set_policy(service.runtime, service.owner, plan.name)
    _set_clock(service, _now(service) + 10 * MINUTE)
    _settle(service)
    job = _job(service, service.borrower, "sweep")
    assert (job.secondary_status, job.lent_plan_id, _runs(service)) == ("Pending", None, [])
    assert "drained for maintenance" in job.status_message and "hyperplan admin resume" in job.status_message

    # As its message says, it waits until an administrator resumes the fleet: then it runs.
    drain.resume(service.runtime, service.admin)
    _settle(service)
    resumed = _job(service, service.borrower, "sweep")
    assert (resumed.secondary_status, resumed.lent_plan_id) == ("Training", plan.id), resumed.status_message
    assert [run.plan_id for run in _runs(service)] == [plan.id]


def test_an_account_whose_budget_cannot_pay_an_hour_at_the_spot_price_is_refused_a_spot_job(
    lent_only: Service,
) -> None:
    service = lent_only
    # One hour of 2 p5 at the spot price: 2 x 0.35 x 40.00 = 28.00.
    short = _account(service.runtime, "thrifty", mode="budget", budget="27.99")
    with pytest.raises(ResourceLimitExceeded) as refused:
        jobs.create(service.runtime, short, _request(short, "sweep", 2, spot_job=True))
    message = str(refused.value)
    assert "CreateTrainingJob: account thrifty pays from its budget, which holds 27.99 USD" in message
    assert "28.00 USD" in message
    with service.runtime.db.read() as session:
        assert job_records.list_jobs(session, short.account_id) == []

    enough = _account(service.runtime, "frugal", mode="budget", budget="28.00")
    jobs.create(service.runtime, enough, _request(enough, "sweep", 2, spot_job=True))
    assert _job(service, enough, "sweep").secondary_status == "Pending"  # no plan lends yet


# -- never lent above capacity ---------------------------------------------------------------------------


# What a story's step does, and how often: lending is turned off and on now and then, so that most of the
# time owners and borrowers meet on a lending plan.
STEPS = {"spot job": 4, "owner job": 2, "end a job": 3, "clock": 3, "lending": 1, "stop a job": 1}


@dataclass
class Story:
    """A random sequence of what owners and borrowers do to one lending plan, and what it has seen."""

    service: Service
    plan: Plan
    rng: random.Random
    lending_on: bool = True
    made: int = 0
    seen_runs: frozenset[int] = frozenset()

    def step(self) -> str:
        what = self.rng.choices(list(STEPS), weights=list(STEPS.values()))[0]
        getattr(self, "_" + what.replace(" ", "_"))()
        return what

    def _spot_job(self) -> None:
        self.made += 1
        borrower = self.rng.choice([self.service.borrower, self.service.other_borrower])
        _spot_job(self.service, borrower, f"spot-{self.made}", self.rng.randint(1, 4))

    def _owner_job(self) -> None:
        self.made += 1
        _plan_job(self.service, f"own-{self.made}", self.rng.randint(1, self.plan.segment.count), self.plan)

    def _end_a_job(self) -> None:
        running = [job for job in self._jobs() if job.attempt_state == AttemptState.RUNNING]
        if running:
            _end_tasks(self.service, self.rng.choice(running))

    def _clock(self) -> None:
        """Service time passes: reclaims' deadlines (SIGKILL) and stops' graces come."""
        _set_clock(self.service, _now(self.service) + timedelta(seconds=self.rng.randint(10, 150)))
        _settle(self.service)

    def _lending(self) -> None:
        runtime, owner, name = self.service.runtime, self.service.owner, self.plan.name
        if self.lending_on:
            lending.clear_policy(runtime, owner, name)
        else:
            lending.set_policy(runtime, owner, name, notice=self.rng.choice([30, 120, 600]))
        self.lending_on = not self.lending_on
        _settle(self.service)

    def _stop_a_job(self) -> None:
        live = [job for job in self._jobs() if job.status == "InProgress"]
        if live:
            job = self.rng.choice(live)
            caller = next(c for c in self._callers() if c.account_id == job.account_id)
            jobs.stop(self.service.runtime, caller, job.name)
            _settle(self.service)

    def _jobs(self) -> list[TrainingJob]:
        with self.service.runtime.db.read() as session:
            return list(session.scalars(select(TrainingJob).order_by(TrainingJob.id)))

    def _callers(self) -> list[Caller]:
        return [self.service.owner, self.service.borrower, self.service.other_borrower]

    def check(self, after: str) -> None:
        """What must hold whatever happened: the owner's claims and the open runs fit the segment; a run
        starts only while the plan has a lending policy; with none, every open run is being taken back;
        the open runs are exactly the jobs that say they borrow from the plan; a waiting job of the
        owner's is never kept waiting by a loan that is not being taken back."""
        service, plan = self.service, self.plan
        claimed, lent = _claimed(service, plan), _lent(service, plan)
        assert claimed + lent <= plan.segment.count, (after, claimed, lent)
        runs = _runs(service)
        new = [run for run in runs if run.id not in self.seen_runs]
        has_policy = _policy_row(service, plan) is not None
        assert has_policy == self.lending_on
        assert has_policy or not new, (after, [(run.id, run.started_at) for run in new])
        open_runs = [run for run in runs if run.ended_at is None]
        assert all(run.plan_id == plan.id for run in runs)  # the pool has no on-demand instances
        if not has_policy:
            assert all(run.reclaim_requested_at is not None for run in open_runs), after
        borrowing = {job.id for job in self._jobs() if job.lent_plan_id == plan.id}
        assert {run.job_id for run in open_runs} == borrowing, after
        # The owner's work comes first: the job at the head of the plan's queue, if the plan's instances
        # not claimed by the owner hold it, has enough of the lent ones being taken back for it.
        waiting = [job for job in self._jobs() if job.plan_id == plan.id and job.secondary_status in WAITING]
        unclaimed = plan.segment.count - claimed
        if waiting and waiting[0].instance_count <= unclaimed:
            kept = sum(run.count for run in open_runs if run.reclaim_requested_at is None)
            assert kept <= unclaimed - waiting[0].instance_count, (after, kept, unclaimed)
        self.seen_runs = frozenset(run.id for run in runs)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_plan_is_never_lent_above_its_capacity_whatever_its_owner_and_borrowers_do(
    start: Callable[[str], Service], seed: int
) -> None:
    service = start(_fleet(reservable=6, on_demand=0))
    plan = _buy(service, "vision-plan", 6, JOBS)
    _set_clock(service, plan.segment.start + MINUTE)
    lending.set_policy(service.runtime, service.owner, plan.name)
    story = Story(service, plan, random.Random(seed))
    steps: list[str] = []
    for _ in range(50):
        steps.append(story.step())
        story.check(" > ".join(steps))
    # The story lent, and took back for the owner's work, or it checked little.
    runs = _runs(service)
    assert len(runs) >= 3 and any(run.reclaim_reason == "owner-job" for run in runs), steps
