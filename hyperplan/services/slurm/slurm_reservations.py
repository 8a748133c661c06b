"""Plans' reserved capacities as Slurm reservations, and pools' capacity following their nodes' health.

Each reserved capacity of a paid plan is one Slurm reservation, ``hp-<account id>-<plan name>-rc<N>``,
for the account's OS user alone, on whole nodes the pass chooses from the pool
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

Health. Each pass also reads which of a pool's nodes Slurm reports DOWN, DRAINED, FAILED or the like
(not responding alone, or a state Slurm does not know yet, is passing: pool_health.py): the pool's
bookable count becomes its reservable count less those
(never below what is held: bookings stay), so searches and purchases see it, and the fleet's report
names them with Slurm's reason. A node of a started reservation that fails is replaced by a free one of
the same pool when there is one; otherwise the plan's history says its capacity is short.

The pass's parts, each a module beside this one: desired_reservations (the reservations there should
be, and their nodes), reservation_changes (made and corrected in Slurm), reservation_notes (the plans'
history), pool_health (pools following their nodes' health), job_time_limits (jobs' time limits
following the reservations), node_recovery (plans' cluster nodes on failed nodes) and slurm_on_demand
(on-demand work).
"""

from __future__ import annotations

import logging

from hyperplan.clock import utcnow
from hyperplan.core.fleet import Fleet
from hyperplan.core.node_assignment import Placement
from hyperplan.errors import StartRefused
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.slurm_placement import PREFIX
from hyperplan.services.runtime.slurm_state import SlurmState
from hyperplan.services.slurm import (
    desired_reservations,
    job_time_limits,
    node_recovery,
    pool_health,
    reservation_changes,
    reservation_notes,
    slurm_on_demand,
)
from hyperplan.services.slurm.desired_reservations import has_started, same_nodes
from hyperplan.services.slurm.reservation_notes import Note
from hyperplan.slurm.client import SlurmClient, SlurmError
from hyperplan.slurm.on_demand_time import Ahead, taken
from hyperplan.worker import Worker

log = logging.getLogger(__name__)

POLL_SECONDS = 2.0


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


# -- one pass ----------------------------------------------------------------------------------------------


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
    healthy = pool_health.follow_health(runtime.db, runtime.fleet, runtime.calendar, state, nodes)
    actual = {r.name: r for r in client.reservations() if r.name.startswith(PREFIX)}
    real_now = utcnow()
    with runtime.db.read() as session:
        wanted = desired_reservations.desired(session, runtime, real_now)
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
        notes.append(reservation_notes.removed_note(runtime, name))
    placements: dict[str, Placement] = {}
    # Nodes running work outside reservations (on-demand) go last for a reservation still to be made.
    outside = job_time_limits.outside_jobs(client) if wanted else []
    busy = {node for job in outside for node in job.nodes}
    for pool in runtime.fleet.pools:
        mine = [d for d in wanted if d.pool == pool.key]
        if mine:
            result = desired_reservations.place(pool, healthy, mine, actual, real_now, busy)
            placements.update(result.placements)
            notes += reservation_notes.short_notes(state, result, by_name, nodes)
    # Not started and on other nodes: deleted, made again below (a moved start or end rides along).
    remake = []
    for want in wanted:
        have = actual.get(want.name)
        chosen = placements[want.name].nodes
        if have is None or not chosen:
            continue
        if not same_nodes(have.nodes, chosen) and not has_started(have, real_now):
            try:
                client.delete_reservation(want.name)
            except SlurmError as error:
                log.warning("could not move Slurm reservation %s: %s", want.name, error.detail)
                continue
            del actual[want.name]
            remake.append(want.name)
    queue = job_time_limits.PassQueue(client)  # read once, if any reservation's end moves
    for want in wanted:
        have = actual.get(want.name)
        placement = placements[want.name]
        if have is None or not placement.nodes:
            continue
        notes += reservation_changes.correct(
            client, want, have, placement.nodes, placement.replaced, nodes, real_now, queue
        )
    with runtime.db.read() as session:
        made_before = reservation_notes.made_before(session, [w for w in wanted if w.name not in actual])
    present = set(actual)
    for want in wanted:
        if want.name in actual or not placements[want.name].nodes:
            continue
        made = reservation_changes.create(
            client, want, placements[want.name].nodes, want.name in made_before, remake
        )
        notes += made
        present |= {want.name} if made else set()
    reservation_notes.record(runtime, notes)
    # On-demand work on the reservations' nodes: cut to end before those Slurm holds, ended once one is
    # near (made or not: a refused one is tried again at the next pass).
    ahead = [Ahead(want.name, placements[want.name].nodes, want.start) for want in wanted]
    held = [reservation for reservation in ahead if reservation.name in present]
    job_time_limits.shorten_on_demand(client, held, outside, real_now, slurm_on_demand.lead(runtime))
    pool_nodes = {name for pool in runtime.fleet.pools for name in pool.nodes}
    unhealthy = {name: pool_health.state_of(nodes.get(name)) for name in pool_nodes if name not in healthy}
    node_recovery.recover_cluster_nodes(
        runtime, [note for note in notes if note.failed_node is not None], unhealthy
    )
    slurm_on_demand.police(runtime, unhealthy, taken(ahead, real_now, slurm_on_demand.LEAD), pool_nodes)
    slurm_on_demand.end_jobs(runtime, taken(ahead, real_now, slurm_on_demand.job_lead(runtime)), outside)
    return notes


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
