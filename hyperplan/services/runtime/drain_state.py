"""Whether the fleet is drained for maintenance (`hyperplan admin drain`), kept in the store so that
every server reads the same and a restart keeps it; and the refusal every new piece of work gets then.

Drained, the service refuses new purchases (plans, extensions), clusters, instance-group growth and
training jobs with ServiceUnavailable (503, which the AWS SDKs retry), answers reads and searches, and
starts nothing new: clusters' groups get no node they do not have (a segment's scale-up waits), plans'
queues place no job. With `stop_running`, groups hold no node and no job runs. services/orchestration/drain.py
moves in and out of it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.errors import ServiceUnavailable
from hyperplan.store.schema import Setting

SETTING = "fleet.drain"


@dataclass(frozen=True)
class DrainState:
    draining: bool
    since: datetime | None = None
    stop_running: bool = False
    by: str = ""  # who drained it: account/user


NOT_DRAINED = DrainState(False)


def current(session: Session) -> DrainState:
    row = session.get(Setting, SETTING)
    return from_setting(row.value if row is not None else None)


def from_setting(stored: str | None) -> DrainState:
    """The state the setting's stored value says (None: no such row, not drained)."""
    if stored is None:
        return NOT_DRAINED
    value = json.loads(stored)
    return DrainState(
        True, datetime.fromisoformat(value["since"]), bool(value.get("stop_running")), value.get("by", "")
    )


def store(session: Session, state: DrainState) -> None:
    row = session.get(Setting, SETTING)
    if not state.draining:
        if row is not None:
            session.delete(row)
        return
    since = state.since.isoformat() if state.since else ""
    value = json.dumps({"since": since, "stop_running": state.stop_running, "by": state.by})
    if row is None:
        session.add(Setting(key=SETTING, value=value))
    else:
        row.value = value


def refuse_if_drained(session: Session, what: str) -> None:
    """Raise ServiceUnavailable when the fleet is drained: `what` (e.g. "CreateTrainingPlan") waits."""
    refuse_if(current(session), what)


def refuse_if(state: DrainState, what: str) -> None:
    """refuse_if_drained, for a state already read."""
    if state.draining:
        since = f" since {state.since.isoformat()}" if state.since else ""
        raise ServiceUnavailable(
            f"The fleet is drained for maintenance{since}: {what} is refused until an administrator runs "
            "`hyperplan admin resume`. Reads and searches are answered; retry later."
        )
