"""How many `exec` calls may wait on tenant processes at once, as values.

An exec holds a thread of its server process for as long as the command runs (up to an hour), so the
number of them is bounded twice, in each server process:

- ``per_account``: one account's execs at once (fleet file ``[rate_limits] concurrent_exec``), so that
  one account cannot take every exec thread; beyond it a call is refused with ThrottlingException;
- ``total``: every account's together (``[rate_limits] concurrent_exec_total``): the exec threads a
  process may have, whatever the accounts; beyond it a call is refused with ServiceUnavailable.

Administrators are exempt from ``per_account`` (as from the rate limits: they are trusted, and their
commands are what un-sticks a fleet in trouble) but not from ``total``, which bounds the server's own
threads, not anyone's share. The counting is services/runtime/exec_slots.py's; the rule is here, without a
lock or a thread, so that it is tested as plain values.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from hyperplan.errors import ValidationError

DEFAULT_PER_ACCOUNT = 8  # a fan-out over a small cluster's nodes, or a few people at terminals
DEFAULT_TOTAL = 64  # a few busy accounts at once; each is a mostly idle thread polling its command
MAX_TOTAL = 1024  # threads of one process: beyond this a server would spend itself on polling


@dataclass(frozen=True)
class ExecLimits:
    per_account: int = DEFAULT_PER_ACCOUNT
    total: int = DEFAULT_TOTAL

    def __post_init__(self) -> None:
        if not (_whole(self.total) and 1 <= self.total <= MAX_TOTAL):
            raise ValidationError(f"the execs at once in all are a whole number from 1 to {MAX_TOTAL}")
        if not (_whole(self.per_account) and 1 <= self.per_account <= self.total):
            raise ValidationError(
                f"an account's execs at once are a whole number from 1 to the total, {self.total}"
            )


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ExecRefusal(Enum):
    ACCOUNT_FULL = "account"  # the account runs its limit already: ThrottlingException
    SERVER_FULL = "server"  # the process runs its total already: ServiceUnavailable


def refusal(limits: ExecLimits, account_running: int, total_running: int, exempt: bool) -> ExecRefusal | None:
    """Why one more exec may not start now (None: it may), given what runs already. The account's limit
    is looked at first, so that an account at its own limit hears about its own limit, whatever the
    others do."""
    if not exempt and account_running >= limits.per_account:
        return ExecRefusal.ACCOUNT_FULL
    if total_running >= limits.total:
        return ExecRefusal.SERVER_FULL
    return None
