"""The Slurm reservations a pass should find (slurm_reservations), and the nodes each is on.

:func:`desired` works them out from the store and the service clock (their times: see
slurm_reservations); :func:`place` names each one's whole nodes of its pool
(hyperplan/core/node_assignment.py), nodes running on-demand work last for one still to be made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.fleet import Pool, PoolKey
from hyperplan.core.lifecycle import PlanStatus
from hyperplan.core.node_assignment import Assignment, Wanted, assign
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.slurm_placement import reservation_name
from hyperplan.services.slurm import slurm_on_demand
from hyperplan.slurm.parse import Reservation
from hyperplan.store.schema import Account, ReservedCapacity, SpotRun, TrainingPlan

_PAID = (PlanStatus.SCHEDULED, PlanStatus.ACTIVE)


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
    # The OS users of the managed spot jobs the plan lends this segment's nodes to now (services/jobs/
    # spot.py): admitted while their runs are open, the owner's user alone otherwise.
    borrowers: tuple[str, ...] = ()

    @property
    def users(self) -> tuple[str, ...]:
        return (self.user, *self.borrowers)


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
            # Bounded by the segments' end (ix_rc_end): a year of expired plans' segments is not read.
            ReservedCapacity.end > now,
            ReservedCapacity.holds_capacity.is_(True),
            TrainingPlan.status.in_([str(s) for s in _PAID]),
        )
        .order_by(ReservedCapacity.start, ReservedCapacity.id)
    ).all()
    slurm_pools = {pool.key for pool in runtime.fleet.pools if pool.nodes}
    borrowers = _borrowers(session)
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
                borrowers=borrowers.get(rc.id, ()),
            )
        )
    pools_with_early = {want.pool for want in found if want.early}
    return [replace(want, ending=want.ending and want.pool in pools_with_early) for want in found]


def _borrowers(session: Session) -> dict[int, tuple[str, ...]]:
    """Each segment's borrowers now: the OS users of the accounts whose spot runs on it are open."""
    rows = session.execute(
        select(SpotRun.reserved_capacity_id, Account.os_user)
        .join(Account, Account.id == SpotRun.account_id)
        .where(SpotRun.ended_at.is_(None), SpotRun.reserved_capacity_id.is_not(None))
        .order_by(SpotRun.id)
    ).all()
    found: dict[int, tuple[str, ...]] = {}
    for segment_id, user in rows:
        if segment_id is not None and user is not None and user not in found.get(segment_id, ()):
            found[segment_id] = (*found.get(segment_id, ()), user)
    return found


# -- which nodes -------------------------------------------------------------------------------------------


def same_nodes(held: Sequence[str], chosen: Sequence[str]) -> bool:
    """Slurm lists a reservation's nodes in its own (slurm.conf) order, and a placement lists them in the
    order nodes were preferred (on-demand work's nodes last): the same nodes, whatever the order, are no
    change. Compared as tuples, a reservation over a busy node was deleted and made again every pass."""
    return set(held) == set(chosen)


def has_started(reservation: Reservation, real_now: datetime) -> bool:
    return reservation.state == "ACTIVE" or reservation.start <= real_now


def place(
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
        started = have is not None and has_started(have, real_now) and not want.early
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
