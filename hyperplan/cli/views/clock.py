"""The service clock, in one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text


@dataclass(frozen=True)
class ClockLine:
    state: dict[str, Any]

    def __rich__(self) -> Text:
        state = self.state
        line = f"{state['Now']}  ({state['Kind']} clock"
        if state.get("TimeScale"):
            line += f", x{state['TimeScale']}"
        line += ")"
        if state.get("EventsRun"):
            line += f"; {state['EventsRun']} lifecycle events ran"
        return Text(line)
