"""Named values kept in the `settings` table."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy.orm import Session

from hyperplan.store.schema import Setting

CLOCK_NOW = "clock.now"
# The accelerated clock's anchor, shared by every process on the store: {"real": seconds since the epoch,
# "service": ISO instant, "scale": service seconds per real second} (hyperplan/clock.py).
CLOCK_ANCHOR = "clock.anchor"
# A Slurm back end's pools: bookable counts and unhealthy nodes, as the leader last read them
# (services/runtime/slurm_state.py).
POOL_HEALTH = "slurm.pool_health"
OFFERING_KEY = "offering.signing_key"
# The store's own id (random hex, made once: services/accounts/work_root.py), which its work roots' markers
# name, and whether the store was made by a version before ids ("true": it may claim such a version's roots).
STORE_ID = "store.id"
STORE_PREDATES_IDS = "store.predates_ids"
# A known text sealed under the master key: a store that has one keeps its secrets sealed, and a key file
# that does not open it is not this store's.
MASTER_KEY_CHECK = "secrets.master_key_check"


def get(session: Session, key: str) -> str | None:
    row = session.get(Setting, key)
    return None if row is None else row.value


def put(session: Session, key: str, value: str) -> None:
    row = session.get(Setting, key)
    if row is None:
        session.add(Setting(key=key, value=value))
    else:
        row.value = value


def get_time(session: Session, key: str) -> datetime | None:
    text = get(session, key)
    return None if text is None else datetime.fromisoformat(text)


def put_time(session: Session, key: str, when: datetime) -> None:
    put(session, key, when.isoformat())


def get_record(session: Session, key: str) -> dict[str, object] | None:
    """A setting kept as a JSON object (the clock's anchor: clock.Anchor.record)."""
    text = get(session, key)
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def put_record(session: Session, key: str, value: dict[str, object]) -> None:
    put(session, key, json.dumps(value))
