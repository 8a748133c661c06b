"""Where things sit on a timeline drawn as positioned boxes: shares of a window, in percent.

Presentation only: the intervals come from the services' views; this says how far along the window
each begins and how much of it each covers, clipped to the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime

    @classmethod
    def around(
        cls, moments: list[tuple[datetime, datetime]], margin: timedelta = timedelta(days=1)
    ) -> Window:
        return cls(min(s for s, _ in moments) - margin, max(e for _, e in moments) + margin)

    def place(self, start: datetime, end: datetime) -> Placed:
        span = (self.end - self.start).total_seconds()
        left = max((start - self.start).total_seconds(), 0.0)
        right = min((end - self.start).total_seconds(), span)
        if right <= left:
            return Placed(0.0, 0.0, visible=False)
        return Placed(round(100 * left / span, 3), round(100 * (right - left) / span, 3), visible=True)

    def ticks(self, every: timedelta = timedelta(days=7)) -> list[tuple[float, datetime]]:
        """A label every `every` from the window's start: (percent along, moment)."""
        found = []
        at = self.start
        while at < self.end:
            found.append((self.place(at, self.end).left, at))
            at += every
        return found


@dataclass(frozen=True)
class Placed:
    left: float  # percent of the window before the box
    width: float  # percent of the window the box covers
    visible: bool

    @property
    def style(self) -> str:
        return f"left:{self.left}%;width:{max(self.width, 0.4)}%"
