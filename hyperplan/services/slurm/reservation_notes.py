"""What a reservation pass (slurm_reservations) writes in plans' histories, after its Slurm calls.

A deleted reservation's line, a capacity short of healthy nodes or whole again, whether a missing
reservation was made before (so it vanished), and the writing of the pass's lines.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.node_assignment import Assignment
from hyperplan.services.plans import lifecycle
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.services.runtime.slurm_state import SlurmState
from hyperplan.services.slurm.desired_reservations import Desired
from hyperplan.slurm.parse import Node
from hyperplan.store.schema import PlanEvent, TrainingPlan

log = logging.getLogger(__name__)

_NAME = re.compile(r"hp-(\d{12})-(.+)-rc(\d+)")


@dataclass(frozen=True)
class Note:
    """A line for a plan's history, written after the pass's Slurm calls."""

    plan_id: int | None
    kind: str
    message: str
    failed_node: str | None = None  # a Slurm node replaced in the plan's reservation
    why: str = ""  # what Slurm says of it


def removed_note(runtime: ServiceContext, name: str) -> Note:
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


def short_notes(
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


def made_before(session: Session, missing: Sequence[Desired]) -> set[str]:
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


def record(runtime: ServiceContext, notes: Sequence[Note]) -> None:
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
