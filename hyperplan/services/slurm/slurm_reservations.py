"""Plans' reserved capacities as Slurm reservations, and pools' capacity following their nodes' health.

Each reserved capacity of a paid plan is one Slurm reservation, ``hp-<account id>-<plan name>-rc<N>``,
for the account's OS user alone, on whole nodes this module chooses from the pool
(hyperplan/core/node_assignment.py; never ``NodeCnt=``, which Slurm silently shrinks). One pass
(:func:`reconcile`) reads the nodes and the ``hp-`` reservations Slurm holds, works out from the store
and the service clock the reservations there should be, and creates, corrects and deletes until Slurm
agrees, recording each change in the plan's history. It runs at start, whenever a plan changes (its
history grows: paid, started, ended, extended, cancelled, failed) and periodically
(:class:`ReservationWorker`), so a reservation deleted or changed by hand, or a node that fails, is
seen within a poll.

Times. Under the wall clock a reservation exists from the moment its plan is Scheduled, with the
segment's real start and end, so no other Slurm work can take the nodes meanwhile. Under a manual or
accelerated clock service time has no real instant: a reservation is made a little before its segment
starts (within the on-demand lead, ``slurm_on_demand.lead``, of service time, starting after the service
time left at the clock's rate: as under the wall clock, the on-demand work on its nodes is ended before
it starts), or when the segment starts if the clock jumps past that (``StartTime=now``), ending after
the segment's remaining service time, at the clock's rate; it is deleted when the segment ends.

On-demand work. Every reservation is made with ``IGNORE_JOBS`` (on-demand work may run on its nodes
without a time limit: Slurm would refuse it, "Requested nodes are busy"); each pass cuts the time limit
of the work running outside reservations on a reservation's nodes to end before it starts
(slurm/on_demand_time.py), and ends that work once the reservation is near (slurm_on_demand).

Health. Each pass also reads which of a pool's nodes Slurm reports DOWN, DRAINED, FAILED or not
responding (or does not know): the pool's bookable count becomes its reservable count less those
(never below what is held: bookings stay), so searches and purchases see it, and the fleet's report
names them with Slurm's reason. A node of a started reservation that fails is replaced by a free one of
the same pool when there is one; otherwise the plan's history says its capacity is short.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.core.fleet import Fleet, Pool, PoolKey
from hyperplan.core.hostlist import compress
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.node_assignment import Assignment, Placement, Wanted, assign
from hyperplan.core.status import NodeStatus
from hyperplan.errors import StartRefused
from hyperplan.services.clusters import cluster_nodes, cluster_reconcile
from hyperplan.services.clusters.cluster_nodes import NodeActions, shut_down
from hyperplan.services.clusters.cluster_records import LIVE
from hyperplan.services.clusters.cluster_request import ClusterSettings
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.live_calendar import LiveCalendar
from hyperplan.services.runtime.slurm_placement import PREFIX, reservation_name
from hyperplan.services.runtime.slurm_state import PoolHealth, SlurmState, UnhealthyNode, health_text
from hyperplan.services.slurm import slurm_on_demand
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.on_demand_time import Ahead, shortened_limit, taken
from hyperplan.slurm.parse import Job, Node, Reservation
from hyperplan.store import settings
from hyperplan.store.db import Database, after_commit
from hyperplan.store.schema import (
    Account,
    Cluster,
    ClusterNode,
    InstanceGroup,
    PlanEvent,
    ReservedCapacity,
    TrainingPlan,
)
from hyperplan.worker import Worker

log = logging.getLogger(__name__)

_NAME = re.compile(r"hp-(\d{12})-(.+)-rc(\d+)")
POLL_SECONDS = 2.0
# Under a manual or accelerated clock a reservation's real end follows the service time left; it is
# moved only when it is this far from where it should be (real time passes while a manual clock stands).
_DRIFT = timedelta(minutes=15)
_PAID = (PlanStatus.SCHEDULED, PlanStatus.ACTIVE)


# -- the start: the fleet's pools against Slurm's nodes -------------------------------------------------


def check_cluster(client: SlurmClient, fleet: Fleet) -> None:
    """Refuse to start when a pool names a node Slurm does not know, one without the pool's feature, or
    one outside the fleet's partition; the message names the node."""
    try:
        known = {node.name: node for node in client.sinfo_nodes()}
    except SlurmError as error:
        raise StartRefused(
            f"the Slurm cluster of {fleet.backend.slurm_conf} does not answer: {error}"
        ) from None
    partition = fleet.backend.partition
    problems = []
    for pool in fleet.pools:
        where = f"pool {pool.instance_type} in {pool.availability_zone}"
        for name in pool.nodes:
            node = known.get(name)
            if node is None:
                problems.append(f"{where}: node {name} is not a node of the Slurm cluster (sinfo)")
            elif pool.feature is not None and pool.feature not in node.features:
                has = ", ".join(node.features) or "none"
                problems.append(f"{where}: node {name} lacks the feature {pool.feature} (it has {has})")
            elif partition is not None and partition not in node.partitions:
                parts = ", ".join(node.partitions) or "none"
                problems.append(f"{where}: node {name} is not in partition {partition} (it is in {parts})")
    if problems:
        raise StartRefused("the fleet file does not match the Slurm cluster: " + "; ".join(problems))


# -- what there should be --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Desired:
    name: str
    plan_id: int
    plan_name: str
    ordinal: int
    pool: PoolKey
    user: str
    count: int
    start: datetime | None  # real; None: "now" (a manual or accelerated clock's reservation)
    end: datetime  # real
    # A manual or accelerated clock's reservation made before its segment starts: `start` is where the
    # service time left puts it now (it moves with real time while the clock stands), so it is not
    # corrected, and it is not taken as started before its segment is.
    early: bool = False
    # A manual or accelerated clock's reservation whose segment ends within the lead, before another
    # reservation of its pool starts: its Slurm end is brought to `end` when it is later (never kept up
    # to the drift later, which could overlap the next one).
    ending: bool = False


def desired(session: Session, runtime: ServiceContext, real_now: datetime) -> list[Desired]:
    """The reservations the store and the service clock call for now."""
    clock = runtime.clock
    now = clock.now()
    rate = getattr(clock, "scale", 1.0)
    rows = session.execute(
        select(ReservedCapacity, TrainingPlan, Account.os_user)
        .join(TrainingPlan, TrainingPlan.id == ReservedCapacity.plan_id)
        .join(Account, Account.id == TrainingPlan.account_id)
        .where(
            ReservedCapacity.holds_capacity.is_(True),
            TrainingPlan.status.in_([str(s) for s in _PAID]),
        )
        .order_by(ReservedCapacity.start, ReservedCapacity.id)
    ).all()
    slurm_pools = {pool.key for pool in runtime.fleet.pools if pool.nodes}
    lead = slurm_on_demand.lead(runtime)
    found = []
    for rc, plan, user in rows:
        end = rc.end if rc.released_at is None else min(rc.end, rc.released_at)
        if end <= now or user is None or (rc.instance_type, rc.availability_zone) not in slurm_pools:
            continue  # (a pool the fleet file no longer has: no nodes to reserve)
        early = False
        if clock.kind == "wall":
            start: datetime | None = rc.start
            real_end = end
        else:
            if rc.start - now > lead:
                continue  # made within the lead of the segment's start
            early = rc.start > now
            start = real_now + (rc.start - now) / rate if early else None
            real_end = real_now + (end - now) / rate
        found.append(
            Desired(
                reservation_name(plan.account_id, plan.name, rc.ordinal),
                plan.id,
                plan.name,
                rc.ordinal,
                (rc.instance_type, rc.availability_zone),
                user,
                rc.count,
                start,
                real_end,
                early,
                ending=clock.kind != "wall" and end - now <= lead,
            )
        )
    pools_with_early = {want.pool for want in found if want.early}
    return [replace(want, ending=want.ending and want.pool in pools_with_early) for want in found]


# -- one pass ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Note:
    """A line for a plan's history, written after the pass's Slurm calls."""

    plan_id: int | None
    kind: str
    message: str
    failed_node: str | None = None  # a Slurm node replaced in the plan's reservation
    why: str = ""  # what Slurm says of it


def reconcile(runtime: ServiceContext) -> list[Note]:
    """One pass: node health into the calendar, then Slurm's reservations brought to what the store
    says. Returns what it recorded."""
    state = runtime.slurm
    if state is None:
        return []
    with state.lock:
        notes = _reconcile(runtime, state)
        state.passes += 1
    return notes


def _reconcile(runtime: ServiceContext, state: SlurmState) -> list[Note]:
    client = state.client
    nodes = {node.name: node for node in client.nodes()}
    healthy = follow_health(runtime.db, runtime.fleet, runtime.calendar, state, nodes)
    actual = {r.name: r for r in client.reservations() if r.name.startswith(PREFIX)}
    real_now = utcnow()
    with runtime.db.read() as session:
        wanted = desired(session, runtime, real_now)
    notes: list[Note] = []
    by_name = {d.name: d for d in wanted}
    # Reservations no plan holds now (its segment ended, the plan was cancelled or failed, or it is a
    # stray): deleted first, so that their nodes are free for the rest.
    for name in sorted(actual.keys() - by_name.keys()):
        try:
            client.delete_reservation(name)
        except SlurmError as error:
            log.warning("could not delete Slurm reservation %s: %s", name, error.detail)
            continue
        del actual[name]
        notes.append(_removed_note(runtime, name))
    placements: dict[str, Placement] = {}
    # Nodes running work outside reservations (on-demand) go last for a reservation still to be made.
    outside = _outside_jobs(client) if wanted else []
    busy = {node for job in outside for node in job.nodes}
    for pool in runtime.fleet.pools:
        mine = [d for d in wanted if d.pool == pool.key]
        if mine:
            result = _place(pool, healthy, mine, actual, real_now, busy)
            placements.update(result.placements)
            notes += _short_notes(state, result, by_name, nodes)
    # Not started and on other nodes: deleted, made again below (a moved start or end rides along).
    remake = []
    for want in wanted:
        have = actual.get(want.name)
        chosen = placements[want.name].nodes
        if have is None or not chosen:
            continue
        if not _same_nodes(have.nodes, chosen) and not _started(have, real_now):
            try:
                client.delete_reservation(want.name)
            except SlurmError as error:
                log.warning("could not move Slurm reservation %s: %s", want.name, error.detail)
                continue
            del actual[want.name]
            remake.append(want.name)
    for want in wanted:
        have = actual.get(want.name)
        placement = placements[want.name]
        if have is None or not placement.nodes:
            continue
        notes += _correct(client, want, have, placement.nodes, placement.replaced, nodes, real_now)
    with runtime.db.read() as session:
        made_before = _made_before(session, [w for w in wanted if w.name not in actual])
    present = set(actual)
    for want in wanted:
        if want.name in actual or not placements[want.name].nodes:
            continue
        made = _create(client, want, placements[want.name].nodes, want.name in made_before, remake)
        notes += made
        present |= {want.name} if made else set()
    _record(runtime, notes)
    # On-demand work on the reservations' nodes: cut to end before those Slurm holds, ended once one is
    # near (made or not: a refused one is tried again at the next pass).
    ahead = [Ahead(want.name, placements[want.name].nodes, want.start) for want in wanted]
    held = [reservation for reservation in ahead if reservation.name in present]
    _shorten_on_demand(client, held, outside, real_now, slurm_on_demand.lead(runtime))
    pool_nodes = {name for pool in runtime.fleet.pools for name in pool.nodes}
    unhealthy = {name: _state_of(nodes.get(name)) for name in pool_nodes if name not in healthy}
    _recover_cluster_nodes(runtime, [note for note in notes if note.failed_node is not None], unhealthy)
    slurm_on_demand.police(runtime, unhealthy, taken(ahead, real_now, slurm_on_demand.LEAD), pool_nodes)
    slurm_on_demand.end_jobs(runtime, taken(ahead, real_now, slurm_on_demand.job_lead(runtime)), outside)
    return notes


def _outside_jobs(client: SlurmClient) -> list[Job]:
    """The jobs running outside any reservation (on-demand work)."""
    return [
        job
        for job in client.jobs()
        if job.reservation is None and job.state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")
    ]


def _shorten_on_demand(
    client: SlurmClient, ahead: Sequence[Ahead], outside: Sequence[Job], real_now: datetime, lead: timedelta
) -> None:
    """Work running outside reservations on a node of a reservation still ahead gets a time limit that
    ends it before (as root: ``scontrol update JobId=N TimeLimit=M``, minutes from its start): the
    reservation may have been made after the work started, without a limit or with one ending later."""
    for reservation in ahead:
        if reservation.start is None:
            continue
        for job in outside:
            if job.start is None or not set(job.nodes) & set(reservation.nodes):
                continue
            minutes = shortened_limit(job.start, job.end, reservation.start, real_now, lead)
            if minutes is None:
                continue
            try:
                client.run("scontrol", "update", f"JobId={job.id}", f"TimeLimit={minutes}")
            except SlurmError as error:
                log.warning(
                    "could not limit Slurm job %s before %s: %s", job.id, reservation.name, error.detail
                )
                continue
            log.info(
                "Slurm job %s (outside reservations, on %s) now ends before reservation %s: TimeLimit=%d",
                job.id, compress(job.nodes), reservation.name, minutes,
            )  # fmt: skip


def _state_of(node: Node | None) -> str:
    if node is None:
        return "MISSING (not in Slurm's list of nodes)"
    return _state_and_flags(node) + (f" ({node.reason})" if node.reason else "")


def _state_and_flags(node: Node) -> str:
    """As sinfo writes it: IDLE+DRAIN."""
    flags = "+".join(sorted(node.flags))
    return node.state + (f"+{flags}" if flags else "")


def follow_health(
    db: Database, fleet: Fleet, calendar: LiveCalendar, state: SlurmState, nodes: dict[str, Node]
) -> set[str]:
    """Each pool's health from Slurm's nodes: into this process's calendar and report, and published in
    the store for the others (services/runtime/slurm_state.py). Returns the healthy nodes' names."""
    healthy = set()
    health: PoolHealth = {}
    for pool in fleet.pools:
        bad = []
        for name in pool.nodes:
            node = nodes.get(name)
            if node is None:
                bad.append(UnhealthyNode(name, "MISSING", "not in Slurm's list of nodes"))
            elif not failed(node):
                healthy.add(name)
            else:
                bad.append(UnhealthyNode(name, _state_and_flags(node), node.reason))
        if pool.nodes:
            state.unhealthy[pool.key] = tuple(bad)
            bookable = max(0, min(pool.reservable, len(pool.nodes) - len(bad)))
            calendar.set_reservable(pool.key, bookable)
            health[pool.key] = (bookable, tuple(bad))
    _publish(db, state, health)
    return healthy


def _publish(db: Database, state: SlurmState, health: PoolHealth) -> None:
    """The pools' health in the store, when it changed (the write moves the settings counter, which
    every process reads before a request)."""
    text = health_text(health)
    if text == state.published:
        return
    with db.write() as session:
        if settings.get(session, settings.POOL_HEALTH) != text:
            settings.put(session, settings.POOL_HEALTH, text)
    state.published = text


# DOWN, DRAINED (or draining), FAIL and the like take a node out. Not responding alone, or a state Slurm
# does not know yet, does not: both are passing (a controller restarting, a node registering, a node
# just resumed), and Slurm marks a node that stays silent DOWN after SlurmdTimeout. Counting them would
# replace the nodes of running reservations at every controller restart (every node reads UNKNOWN for
# a few seconds after slurmctld restarts on its saved state).
_FAILED_STATES = frozenset({"DOWN", "FAIL", "FUTURE"})
_FAILED_FLAGS = frozenset({"DRAIN", "FAIL", "MAINTENANCE", "POWERED_DOWN"})


def failed(node: Node) -> bool:
    """Slurm reports the node out of service (see above)."""
    return node.state in _FAILED_STATES or bool(node.flags & _FAILED_FLAGS)


def _same_nodes(held: Sequence[str], chosen: Sequence[str]) -> bool:
    """Slurm lists a reservation's nodes in its own (slurm.conf) order, and a placement lists them in the
    order nodes were preferred (on-demand work's nodes last): the same nodes, whatever the order, are no
    change. Compared as tuples, a reservation over a busy node was deleted and made again every pass."""
    return set(held) == set(chosen)


def _started(reservation: Reservation, real_now: datetime) -> bool:
    return reservation.state == "ACTIVE" or reservation.start <= real_now


def _place(
    pool: Pool,
    healthy: set[str],
    mine: Sequence[Desired],
    actual: dict[str, Reservation],
    real_now: datetime,
    busy: set[str],
) -> Assignment:
    wanted = []
    for want in mine:
        have = actual.get(want.name)
        start = want.start if want.start is not None and want.start > real_now else real_now
        # (made early, its Slurm start may have passed while a manual clock stood: not started for all that)
        started = have is not None and _started(have, real_now) and not want.early
        if started and have is not None:
            start = min(start, have.start)
        wanted.append(
            Wanted(
                want.name,
                start,
                max(want.end, start + timedelta(seconds=1)),
                want.count,
                started=started,
                current=tuple(have.nodes) if have is not None else (),
            )
        )
    return assign(sorted(pool.nodes, key=lambda node: node in busy), healthy, wanted)  # (stable)


def _correct(
    client: SlurmClient,
    want: Desired,
    have: Reservation,
    nodes: tuple[str, ...],
    replaced: tuple[tuple[str, str], ...],
    health: dict[str, Node],
    real_now: datetime,
) -> list[Note]:
    changes: dict[str, object] = {}
    said = []
    if not _same_nodes(have.nodes, nodes):
        changes["nodes"] = nodes
        said.append(f"nodes {compress(have.nodes)} -> {compress(nodes)}")
    if tuple(have.users) != (want.user,):
        changes["users"] = [want.user]
        said.append(f"users {','.join(have.users) or 'none'} -> {want.user}")
    started = _started(have, real_now)
    if want.start is not None and not want.early and not started and have.start != want.start:
        changes["start"] = want.start
        said.append(f"start {_at(have.start)} -> {_at(want.start)}")
    elif want.start is None and have.start > real_now:  # made early; its segment has started meanwhile
        changes["start"] = "now"
        said.append(f"start {_at(have.start)} -> now")
    if _end_differs(want, have):
        changes["end"] = want.end
        said.append(f"end {_at(have.end)} -> {_at(want.end)}")
    if not changes:
        return []
    try:
        got = client.update_reservation(want.name, **changes)  # type: ignore[arg-type]
    except SlurmError as error:
        log.warning("could not correct Slurm reservation %s: %s", want.name, error.detail)
        return []
    _check_read_back(want, got, nodes)
    notes = _follow_end(client, want, have.end, got.end) if "end" in changes else []
    for failed, new in replaced:
        node = health.get(failed)
        why = f"{node.state} ({node.reason})" if node is not None and node.reason else "unhealthy"
        notes.append(
            Note(
                want.plan_id,
                "slurm-node-replaced",
                f"Node {failed} of {want.plan_name}-rc{want.ordinal} is {why}: replaced by {new} "
                f"in Slurm reservation {want.name}.",
                failed,
                why,
            )
        )
    if len(changes) > 1 or not replaced:  # more than the replacements said
        notes.append(
            Note(
                want.plan_id,
                "slurm-reservation-corrected",
                f"Slurm reservation {want.name} corrected: {'; '.join(said)}.",
            )
        )
    return notes


def _follow_end(client: SlurmClient, want: Desired, before: datetime, after: datetime) -> list[Note]:
    """The reservation's end moved (an extension, or a manual clock's drift): the jobs in it move their
    time limit by as much (as root: ``scontrol update JobId=... TimeLimit=+N|-N``, in whole minutes
    rounded so that no job ends after its reservation). Their limit was the reservation's end, at most."""
    seconds = (after - before).total_seconds()
    minutes = int(seconds // 60) if seconds >= 0 else -int(-seconds // 60 + (1 if -seconds % 60 else 0))
    if minutes == 0:
        return []
    moved = []
    try:
        jobs = client.queue()
    except SlurmError as error:
        log.warning("could not read the jobs of Slurm reservation %s: %s", want.name, error.detail)
        return []
    for job in jobs:
        if job.reservation != want.name or job.state not in ("PENDING", "RUNNING", "SUSPENDED"):
            continue
        try:
            client.run("scontrol", "update", f"JobId={job.id}", f"TimeLimit={minutes:+d}")
        except SlurmError as error:
            log.warning("could not move the time limit of Slurm job %s: %s", job.id, error.detail)
            continue
        moved.append(str(job.id))
    if not moved:
        return []
    message = (
        f"Slurm job(s) {', '.join(moved)} in reservation {want.name}: time limit moved by {minutes:+d} "
        "minute(s) with the reservation's end."
    )
    return [Note(want.plan_id, "slurm-jobs-time-moved", message)]


def _end_differs(want: Desired, have: Reservation) -> bool:
    if want.start is not None and not want.early:  # the wall clock: the real end
        return have.end != want.end.replace(microsecond=0)
    if want.ending and have.end > want.end:
        return True
    return abs(have.end - want.end) > _DRIFT


def _create(
    client: SlurmClient,
    want: Desired,
    nodes: tuple[str, ...],
    made_before: bool,
    moved: Iterable[str],
) -> list[Note]:
    real_now = utcnow()
    start: datetime | Literal["now"] = (
        "now" if want.start is None or want.start <= real_now else want.start.replace(microsecond=0)
    )
    # On nodes where on-demand work may still run (without a time limit, or one past the start): Slurm
    # would refuse ("Requested nodes are busy"). This pass cuts that work's limit, or ends it when the
    # reservation is near (slurm_on_demand); meanwhile nothing new lands there that would run into it.
    flags = ("IGNORE_JOBS",)
    try:
        got = client.create_reservation(
            want.name,
            users=[want.user],
            nodes=nodes,
            start=start,
            end=want.end.replace(microsecond=0),
            flags=flags,
        )
    except SlurmError as error:
        log.warning("could not make Slurm reservation %s: %s", want.name, error.detail)
        return []
    _check_read_back(want, got, nodes)
    where = f"on {compress(got.nodes)} for {want.user} from {_at(got.start)} to {_at(got.end)} UTC"
    if want.name in moved:
        kind, message = "slurm-reservation-moved", f"Slurm reservation {want.name} moved: now {where}."
    elif made_before:
        kind = "slurm-reservation-recreated"
        message = f"Slurm reservation {want.name} was missing; made again {where}."
    else:
        kind, message = "slurm-reservation-made", f"Slurm reservation {want.name} made {where}."
    return [Note(want.plan_id, kind, message)]


def _check_read_back(want: Desired, got: Reservation, nodes: tuple[str, ...]) -> None:
    """Slurm said yes: make sure it holds what was asked (nodes, user, times; its NodeCnt shrinks
    silently, so we never use it, but say so loudly if anything ever differs). The next pass corrects
    what it can."""
    wrong = []
    if not _same_nodes(got.nodes, nodes):
        wrong.append(f"nodes {compress(got.nodes) if got.nodes else 'none'}, not {compress(nodes)}")
    if tuple(got.users) != (want.user,):
        wrong.append(f"users {','.join(got.users) or 'none'}, not {want.user}")
    if want.start is not None and not want.early and want.start > utcnow() and got.start != want.start:
        wrong.append(f"start {_at(got.start)}, not {_at(want.start)}")
    if _end_differs(want, got):
        wrong.append(f"end {_at(got.end)}, not {_at(want.end)}")
    if wrong:
        log.error("Slurm reservation %s differs from what was asked: %s", want.name, "; ".join(wrong))


def _removed_note(runtime: ServiceContext, name: str) -> Note:
    match = _NAME.fullmatch(name)
    plan_id = None
    if match is not None:
        with runtime.db.read() as session:
            plan_id = session.scalar(
                select(TrainingPlan.id).where(
                    TrainingPlan.account_id == match.group(1), TrainingPlan.name == match.group(2)
                )
            )
    if plan_id is None:
        log.warning("deleted Slurm reservation %s: no plan of this server holds it", name)
    message = f"Slurm reservation {name} deleted: no capacity of the plan needs it now."
    return Note(plan_id, "slurm-reservation-deleted", message)


def _short_notes(
    state: SlurmState, result: Assignment, by_name: dict[str, Desired], nodes: dict[str, Node]
) -> list[Note]:
    notes = []
    for name, placement in result.placements.items():
        lacking = result.short.get(name, 0)
        if state.short.get(name, 0) == lacking:
            continue
        want = by_name[name]
        if lacking:
            state.short[name] = lacking
            failed = ", ".join(
                f"{n} ({nodes[n].reason or nodes[n].state})" if n in nodes else f"{n} (missing)"
                for n in placement.lost
            )
            notes.append(
                Note(
                    want.plan_id,
                    "capacity-short",
                    f"Reserved capacity {want.plan_name}-rc{want.ordinal} is short of {lacking} of its "
                    f"{want.count} instance(s): {'unhealthy nodes ' + failed + ' and ' if failed else ''}"
                    "no free healthy node of the pool to take their place.",
                )
            )
        else:
            state.short.pop(name, None)
            notes.append(
                Note(
                    want.plan_id,
                    "capacity-restored",
                    f"Reserved capacity {want.plan_name}-rc{want.ordinal} holds all its {want.count} "
                    "instance(s) again.",
                )
            )
    return notes


def _made_before(session: Session, missing: Sequence[Desired]) -> set[str]:
    """Those of `missing` the plan's history says were made once (so they vanished)."""
    found = set()
    for want in missing:
        kinds = ("slurm-reservation-made", "slurm-reservation-recreated", "slurm-reservation-moved")
        messages = session.scalars(
            select(PlanEvent.message).where(PlanEvent.plan_id == want.plan_id, PlanEvent.kind.in_(kinds))
        )
        if any(f" {want.name} " in message for message in messages):
            found.add(want.name)
    return found


def _record(runtime: ServiceContext, notes: Sequence[Note]) -> None:
    if not any(note.plan_id is not None for note in notes):
        return
    now = runtime.clock.now()
    with runtime.db.write() as session:
        for note in notes:
            if note.plan_id is None:
                continue
            plan = session.get(TrainingPlan, note.plan_id)
            if plan is not None:
                lifecycle.record(session, plan, note.kind, note.message, now)


def _recover_cluster_nodes(
    runtime: ServiceContext, replaced: Sequence[Note], unhealthy: Mapping[str, str]
) -> None:
    """HyperPod's automatic node recovery, for nodes on plans:

    - a cluster node on a Slurm node that its plan's reservation replaced is shut down (its instance
      ends, Terminated), and its group, now a node short, gets a new instance at once, which Slurm starts
      on the reservation's replacement node;
    - a cluster node that has failed (its Slurm job ended: NODE_FAIL when its node stopped answering) on a
      Slurm node that is still unhealthy, which no free node could replace, is replaced too: the new
      instance is Pending in the reservation until a node of it is healthy again.

    A cluster created with ``NodeRecovery=None`` keeps its node as it is (failed, when Slurm ended its
    job)."""
    if not replaced and not unhealthy:
        return
    with runtime.db.read() as session:  # most passes find none: no write then
        if not replaced and not _failed_on(session, unhealthy):
            return
    now = runtime.clock.now()
    actions = NodeActions()
    with runtime.db.write() as session:
        found = [
            (node, note.failed_node, note.why, "on the reservation's replacement node")
            for note in replaced
            for node in _live_plan_nodes(session, note.plan_id)
            if slurm_on_demand.slurm_node_of(node) == note.failed_node
        ]
        found += [
            (node, host, unhealthy[host], "in the reservation, Pending until a node of it is healthy")
            for node, host in _failed_on(session, unhealthy)
            if all(node.id != seen.id for seen, *_ in found)
        ]
        plans = set()
        for node, host, why, where_new in found:
            cluster = session.get(Cluster, node.cluster_id)
            group = session.get(InstanceGroup, node.group_id)
            if cluster is None or group is None or group.plan_id is None:
                continue
            if ClusterSettings.from_json(cluster.settings).as_given.get("NodeRecovery") == "None":
                continue
            shut_down(session, node, actions, now)
            node.message = (
                f"Automatic node recovery: Slurm node {host} is {why}; "
                "this instance is replaced by a new one."
            )
            plans.add(group.plan_id)
            plan = session.get(TrainingPlan, group.plan_id)
            if plan is not None:
                message = (
                    f"Cluster node {node.instance_id} (group {group.name}) was on Slurm node {host}, "
                    f"{why}: automatic node recovery terminates it and starts a new one {where_new}."
                )
                lifecycle.record(session, plan, "cluster-node-recovered", message, now)
        for plan_id in sorted(plans):
            cluster_reconcile.reconcile_plan(session, runtime, plan_id, now)
        after_commit(session, lambda: cluster_nodes.run_actions(runtime, actions))


def _live_plan_nodes(session: Session, plan_id: int | None) -> list[ClusterNode]:
    return list(
        session.scalars(
            select(ClusterNode)
            .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
            .where(InstanceGroup.plan_id == plan_id, ClusterNode.status.in_(LIVE))
            .order_by(ClusterNode.id)
        )
    )


def _failed_on(session: Session, unhealthy: Mapping[str, str]) -> list[tuple[ClusterNode, str]]:
    """Failed cluster nodes of plans on an unhealthy Slurm node, with that node's name."""
    if not unhealthy:
        return []
    failed = session.scalars(
        select(ClusterNode)
        .join(InstanceGroup, InstanceGroup.id == ClusterNode.group_id)
        .where(InstanceGroup.plan_id.is_not(None), ClusterNode.status == NodeStatus.FAILURE)
        .order_by(ClusterNode.id)
    )
    return [(node, host) for node in failed if (host := slurm_on_demand.slurm_node_of(node)) in unhealthy]


def _at(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S}"


# -- the worker --------------------------------------------------------------------------------------------


class ReservationWorker(Worker):
    """The periodic pass (thread `slurm-reservations`), woken whenever a plan's history grows."""

    def __init__(self, runtime: ServiceContext, poll: float = POLL_SECONDS) -> None:
        assert runtime.slurm is not None
        self.runtime = runtime
        super().__init__("slurm-reservations", self._step, poll=poll, wake=runtime.slurm.wake)

    def _step(self) -> float | None:
        reconcile(self.runtime)
        return None
