"""Service clocks.

The service clock drives every deadline of the service (offering validity, payment, segment starts and
ends, pending limits). It is never used for SigV4 freshness or for grace periods given to real
processes: those follow real time.

- ``wall``: the machine's time.
- ``manual``: moves only when an administrator advances or sets it; never backwards.
- ``accelerated``: ``scale`` service seconds per real second from an anchor (moved on by an administrator's
  advance or set, as the manual clock is) (a real instant, the
  service instant it stands for, the scale). Every process on one store reads the same anchor (kept in
  the store's settings, app.py): the real instant is wall time, seconds since the epoch, which all the
  processes of a machine share and the machines of a fleet agree on (NTP). It stands still while the
  service is down because the first process to start anchors at the last service time saved; a process
  that starts while another is alive takes the anchor that one reads.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from hyperplan.errors import ValidationError

CLOCK_KINDS = ("wall", "manual", "accelerated")


def utcnow() -> datetime:
    """The real wall clock. The only place the service reads it."""
    return datetime.now(UTC)


class Clock(ABC):
    kind: str

    @abstractmethod
    def now(self) -> datetime: ...

    @property
    def moves_by_itself(self) -> bool:
        return True


class WallClock(Clock):
    kind = "wall"

    def now(self) -> datetime:
        return utcnow()


class ManualClock(Clock):
    kind = "manual"

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    @property
    def moves_by_itself(self) -> bool:
        return False

    def move_to(self, when: datetime) -> None:
        with self._lock:
            if when < self._now:
                raise ValidationError(
                    f"The clock cannot go backwards: it is {self._now.isoformat()}, "
                    f"and {when.isoformat()} is earlier."
                )
            self._now = when

    def rewind_to(self, when: datetime) -> None:
        """Set the clock back to `when`: only for a batch of timed events that stepped it forward and
        rolled back, so that the instants it stepped through never became real."""
        with self._lock:
            self._now = when

    def follow(self, when: datetime) -> None:
        """Take the time another process moved the shared clock to; never backwards."""
        with self._lock:
            if when > self._now:
                self._now = when


@dataclass(frozen=True)
class Anchor:
    """An accelerated clock's reference: the real instant `real` (seconds since the epoch) is the service
    instant `service`, and service time runs `scale` times faster than real time from there."""

    real: float
    service: datetime
    scale: float

    def record(self) -> dict[str, object]:
        """As kept in the store's settings (store/settings.py CLOCK_ANCHOR)."""
        return {"real": self.real, "service": self.service.isoformat(), "scale": self.scale}

    @classmethod
    def from_record(cls, value: Mapping[str, Any]) -> Anchor:
        return cls(float(value["real"]), datetime.fromisoformat(value["service"]), float(value["scale"]))


class AcceleratedClock(Clock):
    kind = "accelerated"

    def __init__(self, start: datetime, scale: float, real: float | None = None) -> None:
        if scale <= 0:
            raise ValidationError(f"--time-scale must be positive, not {scale}")
        self.anchor = Anchor(time.time() if real is None else real, start, scale)
        self._latest = start  # never read earlier than this: the wall clock may be stepped back
        self._lock = threading.Lock()

    @property
    def scale(self) -> float:
        return self.anchor.scale

    def now(self) -> datetime:
        anchor = self.anchor
        reading = anchor.service + timedelta(seconds=(time.time() - anchor.real) * anchor.scale)
        with self._lock:
            if reading > self._latest:
                self._latest = reading
            return self._latest

    def follow(self, anchor: Anchor) -> None:
        """Read time from `anchor` (the one the processes on the store share) from now on."""
        self.anchor = anchor

    def jump(self, when: datetime) -> None:
        """Read `when` now, and run on from there (a set or an advance); never backwards."""
        now = self.now()
        if when < now:
            raise ValidationError(
                f"The clock cannot go backwards: it is {now.isoformat()}, and {when.isoformat()} is earlier."
            )
        self.anchor = Anchor(time.time(), when, self.anchor.scale)


def check_clock_options(kind: str, start: datetime | None) -> None:
    """`serve --clock KIND --clock-start START` make sense together (make_clock's own check, which the
    CLI also makes before it loads the server's stack, so that a refused start costs little)."""
    if kind not in CLOCK_KINDS:
        raise ValidationError(f"--clock must be one of {', '.join(CLOCK_KINDS)}, not {kind!r}")
    if kind == "wall" and start is not None:
        raise ValidationError("--clock-start needs --clock manual or accelerated; the wall clock is now.")


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant with a zone (a bare local time is refused), in UTC."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise ValidationError(f"Time {text!r} has no zone; add one, e.g. 'Z' or '+02:00'.")
        return when.astimezone(UTC)
    except ValueError:
        raise ValidationError(
            f"Time {text!r} is not ISO 8601; give it with a zone, e.g. 2026-12-01T11:30:00Z."
        ) from None
    except OverflowError:  # such as the year 9999 moved into UTC from a zone behind it
        raise ValidationError(f"Time {text!r} is out of range once moved into UTC.") from None


def make_clock(kind: str, saved: datetime | None, scale: float = 1.0, start: datetime | None = None) -> Clock:
    """The clock of a starting server. `saved` is the service time it had when it last ran; `start`
    (manual and accelerated clocks only) is the first instant of a store that has no service time yet."""
    check_clock_options(kind, start)
    if kind == "wall":
        return WallClock()
    first = saved or start or utcnow()
    if kind == "manual":
        return ManualClock(first)
    return AcceleratedClock(first, scale)
