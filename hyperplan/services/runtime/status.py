"""The one place a stored status changes: checked against its entity's lifecycle, and recorded.

`change` sets the row's status column and records the move, in the caller's transaction. Plans and
training jobs keep their history in their own tables (plan_events, training_job_transitions: the wire
shows both), so their callers pass `record`; every other entity's moves go to status_events, as
core/status_rows.py shapes them (a purchase's few statements write the same rows: plan_purchase.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core import status_rows
from hyperplan.core.status import Lifecycle
from hyperplan.store.schema import StatusEvent

S = TypeVar("S", bound=StrEnum)


class HasId(Protocol):
    @property
    def id(self) -> int: ...


def change(
    session: Session,
    lifecycle: Lifecycle[S],
    row: HasId,
    new: S,
    now: datetime,
    message: str = "",
    *,
    column: str = "status",
    record: Callable[[], None] | None = None,
) -> S:
    """Move `row` (whose status is in `column`) to `new`, or raise IllegalTransition; returns the status
    it had. `record` writes the entity's own history once the status is set; without it, one
    status_events row (at `now`, service time) does."""
    old = lifecycle.states(getattr(row, column))
    if record is not None:
        lifecycle.check(old, new)
        setattr(row, column, new)
        record()
    else:
        event = status_rows.status_event(lifecycle, row.id, old, new, now, message)  # checks the move
        setattr(row, column, new)
        session.add(StatusEvent(**event))
    return old


def history(session: Session, lifecycle: Lifecycle[S], entity_id: int) -> list[StatusEvent]:
    """The recorded moves of one entity, oldest first."""
    return list(
        session.scalars(
            select(StatusEvent)
            .where(StatusEvent.entity_kind == lifecycle.kind, StatusEvent.entity_id == entity_id)
            .order_by(StatusEvent.id)
        )
    )
