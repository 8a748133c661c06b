"""The keys of what a write transaction notes in its SQLAlchemy session's `info` as it goes: read by the
store when it commits (store/db.py) and set aside or undone per purchase by a batch (store/group_commit.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

AFTER_COMMIT = "after_commit"  # callbacks to run once the transaction committed
NOTIFIED = "notified_on_insert"  # the wakes already asked for rows inserted
WANTED = "change_counters_wanted"  # the change counters the transaction moves when it commits


@dataclass(frozen=True)
class Early:
    """An after-commit callback that runs before the others: what keeps the live calendar in step with
    the commit (services/runtime/live_calendar.py), so that no other callback (a search, a purchase,
    actions on nodes) reads the calendar, or keeps another thread's read waiting, before it is."""

    callback: Callable[[], None]

    def __call__(self) -> None:
        self.callback()


def early_first(callbacks: Iterable[Callable[[], None]]) -> Iterator[Callable[[], None]]:
    """The callbacks in the order they run: the early ones, then the others, each in the order given."""
    listed = list(callbacks)
    yield from (callback for callback in listed if isinstance(callback, Early))
    yield from (callback for callback in listed if not isinstance(callback, Early))
