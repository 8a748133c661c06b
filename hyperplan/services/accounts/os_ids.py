"""The OS ids the server hands accounts, recorded in the store so that none is ever handed out twice.

The rule is core/id_ranges.py's; this module reads and writes the record (``os_id_blocks``) inside the
caller's write, which is serial (store/db.py), so two servers on one database never give one id twice.
An id the system already has (a user or group someone else made) is skipped, never taken over, and so
is one another store on this machine handed out (its record, os_users.IDS_GIVEN).
"""

from __future__ import annotations

import grp
import pwd
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.id_ranges import IdRange, next_id
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import os_users
from hyperplan.store.schema import OsIdBlock

USER = "user"
"""A block of one id: the uid of the account's OS user, and its own group's gid."""


def in_use(value: int, but: str | None = None) -> bool:
    """Whether this machine already has a user with this uid or a group with this gid (other than the
    user or group named ``but``)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            entry = lookup(value)
        except KeyError:
            continue
        if entry[0] != but:
            return True
    return False


def user_id_of(session: Session, account_id: str) -> int | None:
    """The uid (and gid) handed to the account, or None (a named user's account, or none yet)."""
    return session.scalar(
        select(OsIdBlock.first)
        .where(OsIdBlock.kind == USER, OsIdBlock.account_id == account_id)
        .order_by(OsIdBlock.allocated_at.desc(), OsIdBlock.first.desc())
        .limit(1)
    )


def allocate_user_id(session: Session, account_id: str, id_range: IdRange, now: datetime) -> int:
    """A new uid for the account's OS user, recorded now in the store and in this machine's record: the
    next of ``id_range`` (the fleet's ``[accounts] os_ids``) above every id ever handed out from it, by
    this store or another on this machine. Call it inside ``os_users.making_users()``. ValidationError
    when none is left."""
    given = set(
        session.scalars(
            select(OsIdBlock.first).where(
                OsIdBlock.kind == USER, OsIdBlock.first >= id_range.first, OsIdBlock.first <= id_range.last
            )
        )
    )
    value = next_id(id_range, given | os_users.ids_given_here(), in_use)
    if value is None:
        raise ValidationError(
            f"No OS id is left in the fleet's [accounts] os_ids range {id_range}: every id has been handed "
            "out (ids are never handed out twice). Give the fleet file a wider or another range."
        )
    record(session, account_id, value, now)
    os_users.note_given_here(value)
    return value


def record(session: Session, account_id: str, value: int, now: datetime) -> None:
    """Record ``value`` as the account's (handed out now, or found on a user made before ids were
    recorded), so that it is never handed out again."""
    if session.get(OsIdBlock, (USER, value)) is None:
        session.add(OsIdBlock(kind=USER, first=value, count=1, account_id=account_id, allocated_at=now))
        session.flush()
