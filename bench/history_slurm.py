"""The Slurm reconciler's pass over a large fleet (issue 55): 2,000 nodes in 40 pools over 6 zones.

This machine cannot run 2,000 ``slurmd``, so the pass reads what Slurm 22.05 prints for such a cluster,
generated here in the shape of the real output captured from the dev cluster (tests/slurm/captured/:
``scontrol show node -o``, ``scontrol show reservation -o``, ``scontrol show job -o``; the same keys in
the same order). The pass itself is the real one (services/slurm/slurm_reservations.reconcile): the
real parsers, the real planning over a real SQLite store holding the matching plans and a year of
expired ones, the real notes written to the plans' histories. Only the running of the tools is
replaced, at the client's one door (``SlurmClient.run``), by :class:`RecordedSlurm`: it answers each
read with the recorded text, and each change (create, update, delete a reservation; a job's time limit)
the way slurmctld does, so the pass reads back what it asked for.

Each pool holds its live plans' reservations (one running, one ahead, sometimes a third) and one of
four situations the pass must handle: a reservation missing (it makes it), one whose end is wrong (it
corrects it), a stale one whose plan failed (it deletes it), or on-demand work without a time limit on
the nodes of a reservation ahead (it cuts the work's limit). Its last node is drained.

Printed, at 200 and 2,000 nodes and with the growth ratio: one pass's time (p50, p99 over several
passes over the same recorded output), its parsing, its store read (the reservations the plans call
for), its placement, and the changes it decided. ``python -m bench.history_slurm [--smoke]`` prints
the same on its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import insert

from bench.report import Figure, Report, heading, line, percentile
from bench.scale import Scale
from hyperplan.app import AppConfig, Application
from hyperplan.backends.fake import FakeBackend
from hyperplan.clock import utcnow
from hyperplan.core.fleet import Fleet, Pool
from hyperplan.core.fleet_file import parse_fleet
from hyperplan.core.hostlist import compress, expand
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.slurm_placement import reservation_name
from hyperplan.services.runtime.slurm_state import SlurmState
from hyperplan.services.slurm import desired_reservations, pool_health, slurm_reservations
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.parse import parse_jobs, parse_nodes, parse_reservations, parse_time
from hyperplan.store.schema import Account, ReservedCapacity, TrainingPlan

T = TypeVar("T")

TYPES = (
    ("ml.p5.48xlarge", "gpu:h100:8", 192),
    ("ml.p4d.24xlarge", "gpu:a100:8", 96),
    ("ml.p5e.48xlarge", "gpu:h200:8", 192),
    ("ml.p5en.48xlarge", "gpu:h200:8", 192),
    ("ml.trn1.32xlarge", "(null)", 128),
    ("ml.g5.12xlarge", "gpu:a10g:4", 48),
    ("ml.p4de.24xlarge", "gpu:a100:8", 96),
)
ZONES = tuple(f"us-east-1{letter}" for letter in "abcdef")
PARTITION = "hp"
SEGMENTS_PER_OLD_PLAN = 4
STEADY, CREATE, UPDATE, DELETE = "steady", "create", "update", "delete"
SITUATIONS = (CREATE, UPDATE, DELETE, STEADY)  # pool i has SITUATIONS[i % 4]


@dataclass(frozen=True)
class Shape:
    """A fleet of `nodes` nodes in `pools` pools over `zones` zones, `accounts` accounts, and a history
    of `old_plans` expired plans of four segments each over the past year."""

    nodes: int
    pools: int
    zones: int
    accounts: int
    old_plans: int

    @classmethod
    def of(cls, nodes: int, old_plans: int) -> Shape:
        pools = min(40, nodes // 5)
        return cls(nodes, pools, min(6, max(1, pools // 2)), max(2, old_plans // 50), old_plans)


# -- the cluster as Slurm prints it ----------------------------------------------------------------------


@dataclass
class Held:
    """A reservation as slurmctld holds it."""

    name: str
    nodes: tuple[str, ...]
    start: datetime
    end: datetime
    users: tuple[str, ...]
    flags: tuple[str, ...] = ("IGNORE_JOBS", "SPEC_NODES")


@dataclass(frozen=True)
class SlurmJob:
    id: int
    name: str
    user: str
    state: str  # RUNNING, COMPLETED
    nodes: tuple[str, ...]
    start: datetime
    limit_minutes: int | None  # None: UNLIMITED
    reservation: str | None = None


@dataclass
class Cluster:
    """What the cluster holds: its nodes' lines, its reservations and jobs (`now`: when it was read)."""

    now: datetime
    node_lines: list[str]
    reservations: dict[str, Held]
    jobs: list[SlurmJob]

    def node_text(self) -> str:
        return "".join(f"{text}\n" for text in self.node_lines)

    def reservation_text(self, names: Sequence[str] | None = None) -> str:
        chosen = self.reservations.values() if names is None else [self.reservations[n] for n in names]
        return "".join(reservation_line(held, self.now) + "\n" for held in chosen) or (
            "No reservations in the system\n"
        )

    def job_text(self) -> str:
        return "".join(job_line(job, self.now) + "\n" for job in self.jobs)

    def queue_json(self) -> str:
        """``squeue --json`` (OpenAPI v0.0.38), with the members the parser reads."""
        jobs = [
            {
                "job_id": job.id,
                "name": job.name,
                "job_state": job.state,
                "user_name": job.user,
                "nodes": compress(job.nodes),
                "resv_name": job.reservation or "",
                "exit_code": 0,
                "partition": PARTITION,
                "start_time": int(job.start.timestamp()),
            }
            for job in self.jobs
        ]
        meta = {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}}
        return json.dumps({"meta": meta, "errors": [], "jobs": jobs}, indent=2)


def _at(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"


def _duration(length: timedelta) -> str:
    """As Slurm prints a duration: ``07:05:48``, ``1-00:00:00``."""
    seconds = int(length.total_seconds())
    days, rest = divmod(seconds, 86_400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


def node_line(name: str, instance_type: str, gres: str, cpus: int, state: str, reason: str | None) -> str:
    """One line of ``scontrol show node -o`` (Slurm 22.05.8, as tests/slurm/captured/show_node.txt)."""
    boot = "2026-11-30T15:38:39"
    return (
        f"NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv={cpus} CPUTot={cpus} "
        f"CPULoad=0.42 AvailableFeatures={instance_type} ActiveFeatures={instance_type} Gres={gres} "
        f"NodeAddr={name} NodeHostName={name} Port=6818 Version=22.05.8 "
        "OS=Linux 6.1.0-28-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1 (2024-11-22)  "
        f"RealMemory=2000000 AllocMem=0 FreeMem=1981234 Sockets={cpus} Boards=1 State={state} "
        "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
        f"Partitions={PARTITION}  BootTime={boot} SlurmdStartTime={boot} LastBusyTime={boot} "
        f"CfgTRES=cpu={cpus},mem=2000000M,billing={cpus} AllocTRES= CapWatts=n/a CurrentWatts=0 "
        "AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
        + (f" Reason={reason} [root@2026-11-30T22:53:58]" if reason else "")
    )


def reservation_line(held: Held, now: datetime) -> str:
    """One line of ``scontrol show reservation -o`` (as tests/slurm/captured/show_reservation.txt)."""
    cores = 192 * len(held.nodes)
    state = "ACTIVE" if held.start <= now < held.end else "INACTIVE"
    return (
        f"ReservationName={held.name} StartTime={_at(held.start)} EndTime={_at(held.end)} "
        f"Duration={_duration(held.end - held.start)} Nodes={compress(held.nodes)} "
        f"NodeCnt={len(held.nodes)} CoreCnt={cores} Features=(null) PartitionName=(null) "
        f"Flags={','.join(held.flags)} TRES=cpu={cores} Users={','.join(held.users)} Groups=(null) "
        f"Accounts=(null) Licenses=(null) State={state} BurstBuffer=(null) Watts=n/a "
        "MaxStartDelay=(null)"
    )


def job_line(job: SlurmJob, now: datetime) -> str:
    """One line of ``scontrol show job -o`` (as tests/slurm/captured/show_job.txt)."""
    limit = "UNLIMITED" if job.limit_minutes is None else _duration(timedelta(minutes=job.limit_minutes))
    if job.state == "RUNNING":
        end = (
            "Unknown" if job.limit_minutes is None else _at(job.start + timedelta(minutes=job.limit_minutes))
        )
        run = _duration(now - job.start)
    else:
        end, run = _at(job.start + timedelta(minutes=3)), "00:03:00"
    hosts = compress(job.nodes)
    work = f"/home/{job.user}/work"
    return (
        f"JobId={job.id} JobName={job.name} UserId={job.user}(70001) GroupId={job.user}(70001) "
        "MCS_label=N/A Priority=4294901759 Nice=0 Account=(null) QOS=(null) "
        f"JobState={job.state} Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
        f"ExitCode=0:0 RunTime={run} TimeLimit={limit} TimeMin=N/A SubmitTime={_at(job.start)} "
        f"EligibleTime={_at(job.start)} AccrueTime={_at(job.start)} StartTime={_at(job.start)} "
        f"EndTime={end} Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval={_at(job.start)} "
        f"Scheduler=Backfill Partition={PARTITION} AllocNode:Sid=head:11389 ReqNodeList=(null) "
        f"ExcNodeList=(null) NodeList={hosts} BatchHost={job.nodes[0]} NumNodes={len(job.nodes)} "
        f"NumCPUs={len(job.nodes)} NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        f"TRES=cpu={len(job.nodes)},mem=1G,node={len(job.nodes)},billing=1 Socks/Node=* "
        "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=1G MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 "
        + (f"Reservation={job.reservation} " if job.reservation else "")
        + "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        f"WorkDir={work} StdErr={work}/slurm-{job.id}.out StdIn=/dev/null "
        f"StdOut={work}/slurm-{job.id}.out Power= "
    )


class RecordedSlurm(SlurmClient):
    """The client with its one door to the tools answered from a recorded cluster: reads get the
    recorded text; changes are applied as slurmctld applies them (and logged in `changes`), so that the
    read-back after each finds what was asked. :meth:`reset` puts the recorded state back."""

    def __init__(self, slurm_conf: Path | str, cluster: Cluster) -> None:
        super().__init__(slurm_conf, environment={})
        self.recorded = cluster
        self.cluster = _copy(cluster)
        self.changes: list[tuple[str, ...]] = []
        self.seconds = 0.0

    def reset(self) -> None:
        self.cluster = _copy(self.recorded)
        self.changes = []
        self.seconds = 0.0

    def run(self, *command: str) -> str:
        """The tool's answer; the time spent making it up is counted in `seconds`, so that a pass's time
        can leave it out (the real tools' own time is not the pass's to measure here)."""
        began = time.perf_counter()
        try:
            return self._answer(tuple(command))
        finally:
            self.seconds += time.perf_counter() - began

    def _answer(self, words: tuple[str, ...]) -> str:
        answer = _reads(self.cluster).get(words)
        if answer is not None:
            return answer()
        if words[:3] == ("scontrol", "show", "reservation") and len(words) == 5:
            return self._one_reservation(words)
        if words[:2] in (("scontrol", "create"), ("scontrol", "update"), ("scontrol", "delete")):
            return self._change(words)
        raise SlurmError(words, "not a command of the recorded cluster")

    def _one_reservation(self, words: tuple[str, ...]) -> str:
        name = words[3]
        if name not in self.cluster.reservations:
            raise SlurmError(words, f"Reservation {name} not found", 1)
        return self.cluster.reservation_text([name])

    def _limit(self, job_id: int, limit: str) -> None:
        """``scontrol update JobId=N TimeLimit=M``: M minutes from the job's start, or ``+M``/``-M``
        minutes more or less (an unlimited job stays unlimited)."""

        def limited(job: SlurmJob) -> SlurmJob:
            if job.id != job_id:
                return job
            if limit[0] not in "+-":
                return replace(job, limit_minutes=int(limit))
            moved = None if job.limit_minutes is None else job.limit_minutes + int(limit)
            return replace(job, limit_minutes=moved)

        self.cluster.jobs = [limited(job) for job in self.cluster.jobs]

    def _change(self, words: tuple[str, ...]) -> str:
        values = dict(word.split("=", 1) for word in words[2:] if "=" in word)
        self.changes.append(words)
        reservations = self.cluster.reservations
        if words[1] == "update" and "JobId" in values:
            self._limit(int(values["JobId"]), values["TimeLimit"])
            return ""
        name = values["ReservationName"]
        if words[1] == "delete":
            reservations.pop(name)
            return ""
        if words[1] == "create":
            reservations[name] = Held(name, (), self.cluster.now, self.cluster.now, ())
        held = reservations[name]
        if "Nodes" in values:
            held.nodes = expand(values["Nodes"])
        if "Users" in values:
            held.users = tuple(values["Users"].split(","))
        if "StartTime" in values:
            start = values["StartTime"]
            held.start = self.cluster.now if start == "now" else parse_time(start)
        if "EndTime" in values:
            held.end = parse_time(values["EndTime"])
        if "Flags" in values:
            held.flags = (*values["Flags"].split(","), "SPEC_NODES")
        return f"Reservation created: {name}\n" if words[1] == "create" else ""


def _reads(cluster: Cluster) -> dict[tuple[str, ...], Callable[[], str]]:
    return {
        ("scontrol", "show", "node", "-o"): cluster.node_text,
        ("scontrol", "show", "reservation", "-o"): cluster.reservation_text,
        ("scontrol", "show", "job", "-o"): cluster.job_text,
        ("squeue", "--json"): cluster.queue_json,
    }


def _copy(cluster: Cluster) -> Cluster:
    held = {name: replace(h) for name, h in cluster.reservations.items()}
    return Cluster(cluster.now, list(cluster.node_lines), held, list(cluster.jobs))


# -- the fleet, the store and the cluster, made to match ------------------------------------------------


def fleet_text(shape: Shape, slurm_conf: Path) -> str:
    lines = [
        'region = "us-east-1"',
        "[backend]",
        'kind = "slurm"',
        f'slurm_conf = "{slurm_conf}"',
        f'partition = "{PARTITION}"',
    ]
    for index in range(shape.zones):
        lines += ["[[zones]]", f'name = "{ZONES[index]}"', f'zone_id = "use1-az{index + 1}"']
    for index, nodes in enumerate(_pool_nodes(shape)):
        instance_type, _, _ = TYPES[index % len(TYPES)]
        lines += [
            "[[pools]]",
            f'instance_type = "{instance_type}"',
            f'zone = "{ZONES[index % shape.zones]}"',  # (type, zone) pairs differ up to 42 pools
            f'nodes = "{compress(nodes)}"',
            'price_per_instance_hour = "40.00"',
        ]
    return "\n".join(lines) + "\n"


def _pool_nodes(shape: Shape) -> list[tuple[str, ...]]:
    """The nodes of each pool: hp-n0001 on, as evenly as they go."""
    per, extra = divmod(shape.nodes, shape.pools)
    pools, first = [], 1
    for index in range(shape.pools):
        size = per + (1 if index < extra else 0)
        pools.append(tuple(f"hp-n{number:04d}" for number in range(first, first + size)))
        first += size
    return pools


@dataclass
class Scenario:
    """What the store and the cluster hold, and what a pass should do about it."""

    now: datetime
    accounts: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    segments: list[dict[str, Any]] = field(default_factory=list)
    reservations: dict[str, Held] = field(default_factory=dict)
    jobs: list[SlurmJob] = field(default_factory=list)
    node_lines: list[str] = field(default_factory=list)
    # What the pass should do: reservation names made, corrected, deleted; job ids whose limit it cuts.
    expect_created: list[str] = field(default_factory=list)
    expect_updated: list[str] = field(default_factory=list)
    expect_deleted: list[str] = field(default_factory=list)
    expect_limited: list[int] = field(default_factory=list)

    def cluster(self) -> Cluster:
        return Cluster(self.now, list(self.node_lines), dict(self.reservations), list(self.jobs))


def scenario(fleet: Fleet, shape: Shape, now: datetime) -> Scenario:
    """The store's accounts, live plans and history, and the cluster's nodes, reservations and jobs."""
    made = Scenario(now)
    for index in range(shape.accounts):
        account_id = f"{index + 100_000_000_000:012d}"
        made.accounts.append(
            {
                "id": account_id,
                "name": f"slurm-bench-{index}",
                "created_at": now - timedelta(days=400),
                "os_user": f"hp-{account_id}",
                "os_user_made": True,
                "budget": Decimal("0"),
                "payment_mode": "auto",
            }
        )
    for index, pool in enumerate(fleet.pools):
        _pool(made, index, pool)
    _history(made, fleet, shape)
    return made


def _pool(made: Scenario, index: int, pool: Pool) -> None:
    now, nodes = made.now, pool.nodes
    account = made.accounts[index % len(made.accounts)]
    user, count = account["os_user"], max(1, len(nodes) // 5)
    situation = SITUATIONS[index % len(SITUATIONS)]
    running = _plan(
        made, account, pool, f"live-{index}-a", PlanStatus.ACTIVE, now - timedelta(hours=6), 1, count
    )
    ahead = _plan(
        made, account, pool, f"live-{index}-b", PlanStatus.SCHEDULED, now + timedelta(days=1), 1, count
    )
    first, second = nodes[:count], nodes[count : 2 * count]
    made.reservations[running] = Held(
        running, first, now - timedelta(hours=6), now + timedelta(hours=18), (user,)
    )
    made.reservations[ahead] = Held(ahead, second, now + timedelta(days=1), now + timedelta(days=2), (user,))
    for node in first:  # a cluster node of the plan on each of its nodes
        made.jobs.append(_job(made, f"hpn.{node}", user, (node,), now - timedelta(hours=6), None, running))
    if situation in (CREATE, UPDATE):
        third = _plan(
            made, account, pool, f"live-{index}-c", PlanStatus.SCHEDULED, now + timedelta(days=3), 1, count
        )
        if situation == CREATE:
            made.expect_created.append(third)
        else:
            wrong_end = now + timedelta(days=4, hours=1)
            made.reservations[third] = Held(third, second, now + timedelta(days=3), wrong_end, (user,))
            made.expect_updated.append(third)
    elif situation == DELETE:  # bought, its reservation made, then the plan failed: nothing holds it now
        stale = _plan(
            made, account, pool, f"gone-{index}", PlanStatus.FAILED, now + timedelta(days=5), 1, count
        )
        made.segments[-1]["holds_capacity"] = False
        made.reservations[stale] = Held(
            stale, first, now + timedelta(days=5), now + timedelta(days=6), (user,)
        )
        made.expect_deleted.append(stale)
    else:  # on-demand work without a limit on a node of the reservation ahead: its limit is cut
        job = _job(made, "hpod.ondemand", user, second[:1], now - timedelta(hours=2), None, None)
        made.jobs.append(job)
        made.expect_limited.append(job.id)
    for node in nodes[2 * count : -1 : 3]:  # on-demand work on free nodes, and some ended
        made.jobs.append(_job(made, "hpod.ondemand", user, (node,), now - timedelta(hours=1), 120, None))
        made.jobs.append(
            _job(made, "hpod.done", user, (node,), now - timedelta(minutes=4), 60, None, "COMPLETED")
        )
    instance_type, gres, cpus = next(t for t in TYPES if t[0] == pool.instance_type)
    for node in nodes:
        drained = node == nodes[-1]
        state, reason = ("IDLE+DRAIN", "ECC errors on GPU 3") if drained else ("IDLE", None)
        made.node_lines.append(node_line(node, instance_type, gres, cpus, state, reason))


def _plan(
    made: Scenario,
    account: dict[str, Any],
    pool: Pool,
    name: str,
    status: PlanStatus,
    start: datetime,
    days: int,
    count: int,
    segments: int = 1,
) -> str:
    """A plan of `segments` segments of `days` days, one after the other; its first reservation's name."""
    plan_id = len(made.plans) + 1
    made.plans.append(
        {
            "id": plan_id,
            "account_id": account["id"],
            "name": name,
            "offering_id": f"bench-slurm-{plan_id}",
            "target": "hyperpod-cluster",
            "instance_type": pool.instance_type,
            "status": str(status),
            "status_message": "",
            "upfront_fee": Decimal("100.00"),
            "currency": "USD",
            "created_at": start - timedelta(days=7),
            "updated_at": start - timedelta(days=7),
        }
    )
    for ordinal in range(1, segments + 1):
        begins = start + timedelta(days=2 * days * (ordinal - 1))
        made.segments.append(
            {
                "plan_id": plan_id,
                "ordinal": ordinal,
                "instance_type": pool.instance_type,
                "availability_zone": pool.availability_zone,
                "count": count,
                "start": begins,
                "end": begins + timedelta(days=days),
                "status": str(status),
                "holds_capacity": True,
                "released_at": None,
            }
        )
    return reservation_name(account["id"], name, 1)


def _history(made: Scenario, fleet: Fleet, shape: Shape) -> None:
    """Expired plans over the past year: rows no pass should need to read."""
    for index in range(shape.old_plans):
        pool = fleet.pools[index % len(fleet.pools)]
        account = made.accounts[index % len(made.accounts)]
        start = made.now - timedelta(days=365) + timedelta(minutes=index * 300_000 // max(shape.old_plans, 1))
        name = f"old-{index}"
        _plan(made, account, pool, name, PlanStatus.EXPIRED, start, 1, 1, SEGMENTS_PER_OLD_PLAN)


def _job(
    made: Scenario,
    name: str,
    user: str,
    nodes: tuple[str, ...],
    start: datetime,
    limit: int | None,
    reservation: str | None,
    state: str = "RUNNING",
) -> SlurmJob:
    return SlurmJob(len(made.jobs) + 1, name, user, state, nodes, start, limit, reservation)


def write_store(runtime: ServiceContext, made: Scenario) -> None:
    with runtime.db.write() as session:
        session.execute(insert(Account), made.accounts)
        session.execute(insert(TrainingPlan), made.plans)
        session.execute(insert(ReservedCapacity), made.segments)


@contextmanager
def recorded_runtime(workdir: Path, shape: Shape) -> Iterator[tuple[ServiceContext, RecordedSlurm, Scenario]]:
    """A store with the shape's plans and history, and a runtime whose Slurm client replays the matching
    cluster. The composition root refuses a Slurm back end outside isolation mode `users` (root): the
    application is composed on a local back end with the fleet's pools and nodes, then handed the Slurm
    state every pass reads through."""
    slurm_conf = workdir / "slurm.conf"
    fleet = parse_fleet(fleet_text(shape, slurm_conf))
    local = replace(fleet, backend=replace(fleet.backend, kind="local"))
    data_dir = workdir / "data"
    application = Application(
        AppConfig(
            data_dir=data_dir,
            fleet=local,
            clock="wall",
            isolation="none",
            backend=lambda _work_dir: FakeBackend(),
            work_dir=workdir / "work",
        )
    )
    try:
        context = application.open()
        made = scenario(fleet, shape, utcnow().replace(microsecond=0))
        write_store(context, made)
        client = RecordedSlurm(slurm_conf, made.cluster())
        yield replace(context, slurm=SlurmState(client)), client, made
    finally:
        application.stop()


# -- the measurement -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    shape: Shape
    passes: list[float]  # seconds, each, the recorded tools' answering aside
    parse: float  # median seconds: the three listings parsed
    desired: float  # median seconds: the store's read of the reservations there should be
    placement: float  # median seconds: every pool's nodes assigned
    changes: dict[str, int]
    notes: int

    def ms(self, q: float) -> float:
        return percentile(self.passes, q) * 1000


def measure(workdir: Path, shape: Shape, passes: int) -> Measured:
    with recorded_runtime(workdir, shape) as (runtime, client, _made):
        durations, notes = [], 0
        changes: dict[str, int] = {}
        for _ in range(passes):
            client.reset()
            began = time.perf_counter()
            notes = len(slurm_reservations.reconcile(runtime))
            durations.append(time.perf_counter() - began - client.seconds)
            changes = count_changes(client.changes)
        parse = _median(passes, _parsing(client.recorded))
        desired = _median(passes, lambda: _desired(runtime))
        placing = _placing(runtime, client.recorded)
        placement = _median(passes, placing)
    return Measured(shape, durations, parse, desired, placement, changes, notes)


def count_changes(commands: Sequence[tuple[str, ...]]) -> dict[str, int]:
    """The pass's changes by kind: reservations created, updated, deleted; jobs' time limits cut."""
    counts: dict[str, int] = {}
    for words in commands:
        kind = "time limit cut" if any(w.startswith("JobId=") for w in words) else f"reservation {words[1]}d"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def _median(runs: int, work: Callable[[], object]) -> float:
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def _parsing(cluster: Cluster) -> Callable[[], None]:
    """The three listings a pass reads, parsed (their text made beforehand)."""
    nodes, reservations, jobs = cluster.node_text(), cluster.reservation_text(), cluster.job_text()

    def parse() -> None:
        parse_nodes(nodes)
        parse_reservations(reservations)
        parse_jobs(jobs)

    return parse


def _desired(runtime: ServiceContext) -> list[desired_reservations.Desired]:
    with runtime.db.read() as session:
        return desired_reservations.desired(session, runtime, utcnow())


def _placing(runtime: ServiceContext, cluster: Cluster) -> Callable[[], None]:
    """Every pool's nodes assigned, as the pass assigns them, on the inputs read beforehand."""
    nodes = {node.name: node for node in parse_nodes(cluster.node_text())}
    healthy = {name for name, node in nodes.items() if not pool_health.failed(node)}
    actual = {r.name: r for r in parse_reservations(cluster.reservation_text())}
    by_pool: dict[tuple[str, str], list[desired_reservations.Desired]] = {}
    for want in _desired(runtime):
        by_pool.setdefault(want.pool, []).append(want)
    real_now = utcnow()

    def place() -> None:
        for pool in runtime.fleet.pools:
            desired_reservations.place(pool, healthy, by_pool.get(pool.key, []), actual, real_now, set())

    return place


# -- the section -----------------------------------------------------------------------------------------


def sizes(scale: Scale) -> tuple[tuple[Shape, Shape], int]:
    """The two fleets (the smaller, then the larger) and the passes measured on each."""
    return scale.pick(
        full=((Shape.of(200, 5_000), Shape.of(2_000, 50_000)), 7),
        quick=((Shape.of(200, 500), Shape.of(2_000, 5_000)), 3),
        smoke=((Shape.of(10, 10), Shape.of(20, 20)), 2),
    )


def run(report: Report, workdir: Path, *, scale: Scale) -> None:
    heading("Slurm reconciler: one pass over recorded sinfo/scontrol output (issue 55)")
    (small, large), passes = sizes(scale)
    results = []
    for shape in (small, large):
        where = workdir / f"slurm-{shape.nodes}"
        where.mkdir(parents=True)
        try:
            results.append(measure(where, shape, passes))
        finally:
            shutil.rmtree(where, ignore_errors=True)
        _print(results[-1])
    before, after = results
    growth = after.ms(99) / before.ms(99) if before.ms(99) else float("nan")
    line(f"growth {before.shape.nodes} -> {after.shape.nodes} nodes: pass p99 x{growth:.1f}")
    report.add(
        Figure(
            f"Slurm reconciler pass p99 ({after.shape.nodes} nodes)",
            f"{after.ms(99):.0f} ms",
            "<= 2 s",
            after.ms(99) <= 2000,
            f"x{growth:.1f} from {before.shape.nodes} nodes (the work grows with the nodes)",
        )
    )


def _print(result: Measured) -> None:
    shape = result.shape
    line(
        f"{shape.nodes} nodes in {shape.pools} pools over {shape.zones} zones; {shape.accounts} accounts; "
        f"{shape.old_plans} expired plans ({shape.old_plans * SEGMENTS_PER_OLD_PLAN} segments) in the store"
    )
    changes = ", ".join(f"{count} {kind}" for kind, count in sorted(result.changes.items())) or "none"
    line(
        f"  pass (tools' answers aside) p50 {result.ms(50):.1f} ms, p99 {result.ms(99):.1f} ms "
        f"({len(result.passes)} passes); "
        f"parse {result.parse * 1000:.1f} ms, store read {result.desired * 1000:.1f} ms, "
        f"placement {result.placement * 1000:.1f} ms"
    )
    line(f"  decided: {changes}; {result.notes} notes in plans' histories")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.history_slurm", description=__doc__)
    parser.add_argument("--smoke", action="store_const", dest="scale", const=Scale.SMOKE)
    parser.add_argument("--quick", action="store_const", dest="scale", const=Scale.QUICK)
    parser.set_defaults(scale=Scale.FULL)
    scale = parser.parse_args(argv).scale
    workdir = Path(tempfile.mkdtemp(prefix="hyperplan-bench-slurm-"))
    report = Report()
    try:
        run(report, workdir, scale=scale)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report.print_summary()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
