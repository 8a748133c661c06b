"""The statuses of plans and reserved capacities, as data, and the pure rules that move them.

Plan: Pending -> Scheduled (paid) -> Active (a segment is open) -> Scheduled (between segments) ->
Expired (after the last); Pending -> Failed; an administrator may fail a Scheduled or Active plan.
Each reserved capacity (segment) has its own status from the same enum: Scheduled before its start,
Active while open, Expired after its end; Pending with its plan, and Failed with it unless it
has already Expired. `PLAN_LIFECYCLE` and `RESERVED_CAPACITY_LIFECYCLE` list the moves.

Once paid, a plan's status follows from its segments and the time alone (`status_at`), so the
lifecycle loop and a restarted server always agree on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from hyperplan.core.status import Lifecycle


class PlanStatus(StrEnum):
    PENDING = "Pending"
    SCHEDULED = "Scheduled"
    ACTIVE = "Active"
    EXPIRED = "Expired"
    FAILED = "Failed"

    @property
    def is_final(self) -> bool:
        return self in FINAL

    @property
    def is_usable(self) -> bool:
        """Consumers (clusters, jobs) may name a plan in these statuses."""
        return self in (PlanStatus.SCHEDULED, PlanStatus.ACTIVE)


# Every move a plan may make; anything else is a bug (`Lifecycle.check` refuses it).
PLAN_LIFECYCLE = Lifecycle(
    kind="training-plan",
    noun="plan",
    states=PlanStatus,
    initial=PlanStatus.PENDING,
    moves={
        PlanStatus.PENDING: frozenset(
            {PlanStatus.SCHEDULED, PlanStatus.ACTIVE, PlanStatus.EXPIRED, PlanStatus.FAILED}
        ),
        PlanStatus.SCHEDULED: frozenset({PlanStatus.ACTIVE, PlanStatus.EXPIRED, PlanStatus.FAILED}),
        PlanStatus.ACTIVE: frozenset({PlanStatus.SCHEDULED, PlanStatus.EXPIRED, PlanStatus.FAILED}),
        PlanStatus.EXPIRED: frozenset(),
        PlanStatus.FAILED: frozenset(),
    },
)

FINAL = PLAN_LIFECYCLE.final

# A segment follows the time only forwards: it never goes back to Scheduled, and once Expired it stays
# so (its plan failing later does not rewrite what happened). SageMaker's ReservedCapacityStatus has the
# values of TrainingPlanStatus, so segments use PlanStatus too.
RESERVED_CAPACITY_LIFECYCLE = Lifecycle(
    kind="reserved-capacity",
    noun="reserved capacity",
    states=PlanStatus,
    initial=PlanStatus.PENDING,
    moves={
        PlanStatus.PENDING: frozenset(
            {PlanStatus.SCHEDULED, PlanStatus.ACTIVE, PlanStatus.EXPIRED, PlanStatus.FAILED}
        ),
        PlanStatus.SCHEDULED: frozenset({PlanStatus.ACTIVE, PlanStatus.EXPIRED, PlanStatus.FAILED}),
        PlanStatus.ACTIVE: frozenset({PlanStatus.EXPIRED, PlanStatus.FAILED}),
        PlanStatus.EXPIRED: frozenset(),
        PlanStatus.FAILED: frozenset(),
    },
)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime


def segment_status_at(segment: Window, now: datetime) -> PlanStatus:
    if now < segment.start:
        return PlanStatus.SCHEDULED
    if now < segment.end:
        return PlanStatus.ACTIVE
    return PlanStatus.EXPIRED


def status_at(segments: Sequence[Window], now: datetime) -> PlanStatus:
    """The status of a paid plan at `now`: Active in a segment, Expired after the last, else Scheduled."""
    statuses = [segment_status_at(segment, now) for segment in segments]
    if PlanStatus.ACTIVE in statuses:
        return PlanStatus.ACTIVE
    if statuses and all(status == PlanStatus.EXPIRED for status in statuses):
        return PlanStatus.EXPIRED
    return PlanStatus.SCHEDULED


def status_message(segments: Sequence[Window], status: PlanStatus, now: datetime) -> str:
    """What a person reads next to a paid plan's status: what is happening and what comes next."""
    if status == PlanStatus.ACTIVE:
        current = next(s for s in segments if segment_status_at(s, now) == PlanStatus.ACTIVE)
        return f"Reserved capacity is active until {_when(current.end)}."
    if status == PlanStatus.EXPIRED:
        return f"The training plan ended at {_when(segments[-1].end)}."
    upcoming = [s for s in segments if now < s.start]
    if upcoming and any(s.end <= now for s in segments):
        return f"Between reserved capacities; the next one starts at {_when(upcoming[0].start)}."
    return "Payment confirmed, training plan scheduled."


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")
