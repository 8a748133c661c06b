"""Administrator operations on the service clock."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from hyperplan.core.durations import parse_duration
from hyperplan.errors import Conflict, ValidationError
from hyperplan.runtime import Runtime


@dataclass(frozen=True)
class ClockState:
    kind: str
    now: datetime
    time_scale: float | None
    events_run: int = 0


def show(runtime: Runtime) -> ClockState:
    scale = runtime.config.time_scale if runtime.clock.kind == "accelerated" else None
    return ClockState(runtime.clock.kind, runtime.clock.now(), scale)


def advance(runtime: Runtime, duration_text: str) -> ClockState:
    duration = parse_duration(duration_text)
    if duration.total_seconds() <= 0:
        raise ValidationError(f"Duration must be positive, not {duration_text!r}.")
    return _move(runtime, runtime.clock.now() + duration)


def set_time(runtime: Runtime, time_text: str) -> ClockState:
    return _move(runtime, parse_instant(time_text))


def parse_instant(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(
            f"Time {text!r} is not ISO 8601; give it with a zone, e.g. 2026-12-01T11:30:00Z."
        ) from None
    if when.tzinfo is None:
        raise ValidationError(f"Time {text!r} has no zone; add one, e.g. 'Z' or '+02:00'.")
    return when.astimezone(UTC)


def _move(runtime: Runtime, target: datetime) -> ClockState:
    if runtime.manual_clock is None:
        raise Conflict(
            f"The server runs the {runtime.clock.kind} clock; only a server started with "
            "--clock manual can be advanced or set."
        )
    ran = runtime.scheduler.advance_to(target)
    return ClockState(runtime.clock.kind, runtime.clock.now(), None, ran)
