"""The keys of what a write transaction notes in its SQLAlchemy session's `info` as it goes: read by the
store when it commits (store/db.py) and set aside or undone per purchase by a batch (store/group_commit.py).
"""

from __future__ import annotations

AFTER_COMMIT = "after_commit"  # callbacks to run once the transaction committed
NOTIFIED = "notified_on_insert"  # the wakes already asked for rows inserted
WANTED = "change_counters_wanted"  # the change counters the transaction moves when it commits
