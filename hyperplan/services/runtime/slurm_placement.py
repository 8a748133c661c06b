"""Where a node or a job's instances run on a Slurm fleet: the Slurm reservation of the plan's current
segment (``hp-<account id>-<plan name>-rc<N>``, see ``slurm_reservations``), and the pool's node feature.
None on the local back end, which runs everything on this machine."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.backends.base import Placement
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import os_users
from hyperplan.services.runtime.containment import slurm_memory_for
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.store.schema import Account, ReservedCapacity, TrainingPlan

PREFIX = "hp-"  # of every reservation hyperplan makes (services/slurm/slurm_reservations.py)


def reservation_name(account_id: str, plan_name: str, ordinal: int) -> str:
    return f"{PREFIX}{account_id}-{plan_name}-rc{ordinal}"


def placement(
    runtime: ServiceContext,
    session: Session,
    plan_id: int | None,
    instance_type: str,
    group: str | None = None,
    group_size: int = 1,
    group_index: int = 0,
    zone: str | None = None,
) -> Placement | None:
    """Where the work runs, and the memory each of its instances may use there (``zone``: the pool's)."""
    if runtime.slurm is None:
        return None
    pools = runtime.fleet.pools_of_type(instance_type)
    feature = next((pool.feature or pool.instance_type for pool in pools), instance_type)
    reservation = None
    if plan_id is not None:
        now = runtime.clock.now()
        plan = session.get(TrainingPlan, plan_id)
        capacity = session.scalars(
            select(ReservedCapacity)
            .where(
                ReservedCapacity.plan_id == plan_id,
                ReservedCapacity.holds_capacity.is_(True),
                ReservedCapacity.instance_type == instance_type,
                ReservedCapacity.start <= now,
                ReservedCapacity.end > now,
            )
            .order_by(ReservedCapacity.ordinal)
        ).first()
        if plan is not None and capacity is not None:
            reservation = reservation_name(plan.account_id, plan.name, capacity.ordinal)
    return Placement(
        reservation=reservation,
        constraint=feature,
        group=group if group_size > 1 else None,
        group_size=group_size if group_size > 1 else 1,
        group_index=group_index if group_size > 1 else 0,
        memory_bytes=slurm_memory_for(runtime, instance_type, zone),
    )


def check_can_book(runtime: ServiceContext, account_id: str) -> None:
    """The Slurm back end's booking check (ServiceContext.booking_checks, installed by app.py): an
    account's work runs as its OS user, who must exist, so refuse to book otherwise, saying so."""
    with runtime.db.read() as session:
        account = session.get(Account, account_id)
        user = account.os_user if account is not None else None
    if user is None or not os_users.exists(user):
        who = f"'s OS user {user} does not exist on this machine" if user else " has no OS user"
        raise ValidationError(
            f"Account {account_id}{who}: on the Slurm back end every plan is a Slurm reservation for "
            "the account's OS user, who must exist on the cluster. Ask an administrator to create the "
            "user (a server run as root makes it at start), then buy again."
        )
