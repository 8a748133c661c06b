"""Administrator operations on the service clock.

A manual or accelerated clock moves at most MAX_MOVE (366 days) per advance or set. A move runs every
lifecycle event due on the way, in order, before it answers, and each simulated day of a busy fleet has
dozens of them (a year of the demo fleet takes minutes); a longer move would hold the request, and the
server's shutdown, for as long as it takes. A year or more ahead is reached in several moves. The
accelerated clock runs on from where it was moved to (events/loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from hyperplan.clock import AcceleratedClock, ManualClock, parse_instant
from hyperplan.core.durations import parse_duration
from hyperplan.errors import Conflict, ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import audit_views
from hyperplan.services.runtime.context import ServiceContext

MAX_MOVE = timedelta(days=366)


@dataclass(frozen=True)
class ClockState:
    kind: str
    now: datetime
    time_scale: float | None
    events_run: int = 0


def show(runtime: ServiceContext) -> ClockState:
    scale = getattr(runtime.clock, "scale", None) if runtime.clock.kind == "accelerated" else None
    return ClockState(runtime.clock.kind, runtime.clock.now(), scale)


def advance(runtime: ServiceContext, duration_text: str, caller: Caller | None = None) -> ClockState:
    duration = parse_duration(duration_text)
    if duration.total_seconds() <= 0:
        raise ValidationError(f"Duration must be positive, not {duration_text!r}.")
    return _move(
        runtime, runtime.clock.now() + duration, f"Duration {duration_text!r}", caller, "clock.advance"
    )


def set_time(runtime: ServiceContext, time_text: str, caller: Caller | None = None) -> ClockState:
    return _move(runtime, parse_instant(time_text), f"Time {time_text!r}", caller, "clock.set")


def _move(
    runtime: ServiceContext, target: datetime, asked: str, caller: Caller | None = None, action: str = ""
) -> ClockState:
    if not isinstance(runtime.clock, ManualClock | AcceleratedClock):
        raise Conflict(
            f"The server runs the {runtime.clock.kind} clock; only a server started with "
            "--clock manual or accelerated can be advanced or set."
        )
    furthest = runtime.clock.now() + MAX_MOVE
    if target > furthest:
        raise ValidationError(
            f"{asked} is further than the clock moves at once: at most {MAX_MOVE.days} days per advance "
            f"or set (now to {furthest.isoformat()}); move it in several steps."
        )
    start = runtime.clock.now()
    # Recorded before the move (which runs many transactions and may stop part way): what was asked.
    if action:
        detail = {"From": start, "To": target, "Asked": asked}
        audit_views.record_alone(runtime, caller, action, detail=detail)
    ran = runtime.advance_clock(target)
    if runtime.shared is not None:  # carried out by the leader, maybe another process: its time, here too
        runtime.shared.follow_clock()
    return replace(show(runtime), events_run=ran)
