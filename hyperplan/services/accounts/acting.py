"""The user whose request a transaction carries out: named by the plan events it writes.

A service that acts for a caller says so once, at the start of its transaction (`act`); the history it
writes in that transaction (lifecycle.record) names the user. What the service does by itself (a timed
event, a payment deadline, an event run by a clock move) runs in transactions of its own and names
nobody. The audit trail (issue 23) reads the same value.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

_ACTOR = "hyperplan.acting_user"


def act(session: Session, user_id: int | None) -> None:
    """This transaction is the request of `user_id` (None: of the service itself)."""
    session.info[_ACTOR] = user_id


def actor(session: Session) -> int | None:
    value = session.info.get(_ACTOR)
    return value if isinstance(value, int) else None
