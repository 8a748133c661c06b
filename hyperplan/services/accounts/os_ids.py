"""The OS ids the server hands accounts, recorded in the store so that none is ever handed out twice.

The rule is core/id_ranges.py's; this module reads and writes the record (``os_id_blocks``) inside the
caller's write, which is serial (store/db.py), so two servers on one database never give one id twice.
An id the system already has (a user or group someone else made) is skipped, never taken over, and so
is one another store on this machine handed out (its record, os_users.IDS_GIVEN).

Each account's containers get a block of 65536 host ids the same way (kind "subordinate", from the
fleet's ``[accounts] subordinate_ids``): never one another store on this machine gave (their record is a
second file beside IDS_GIVEN, os_users.SUBORDINATE_IDS_GIVEN, a ``FIRST-LAST`` a line, so that IDS_GIVEN
keeps single ids), nor any ids someone holds in /etc/subuid or /etc/subgid, nor a user's or group's id.
"""

from __future__ import annotations

import grp
import pwd
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from hyperplan.core.id_ranges import SUBORDINATE_BLOCK, IdRange, next_block, next_id
from hyperplan.errors import ValidationError
from hyperplan.services.accounts import os_users
from hyperplan.store.schema import OsIdBlock

USER = "user"
"""A block of one id: the uid of the account's OS user, and its own group's gid."""
SUBORDINATE = "subordinate"
"""A block of 65536 ids: the host's ids of the account's containers' ids 0..65535 (user namespaces)."""


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
    # Nor an id inside a block of containers' ids: that user would own what a container's ids write.
    ours = session.execute(
        select(OsIdBlock.first, OsIdBlock.count).where(OsIdBlock.kind == SUBORDINATE)
    ).all()
    blocks = _blocks_held() + [IdRange(row.first, row.first + row.count - 1) for row in ours]
    value = next_id(
        id_range, given | os_users.ids_given_here(), lambda v: in_use(v) or any(v in b for b in blocks)
    )
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


def subordinate_block_of(session: Session, account_id: str) -> IdRange | None:
    """The block of host ids handed to the account's containers, or None (none yet)."""
    row = session.execute(
        select(OsIdBlock.first, OsIdBlock.count)
        .where(OsIdBlock.kind == SUBORDINATE, OsIdBlock.account_id == account_id)
        .order_by(OsIdBlock.allocated_at.desc(), OsIdBlock.first.desc())
        .limit(1)
    ).first()
    return IdRange(row.first, row.first + row.count - 1) if row is not None else None


def allocate_subordinate_block(
    session: Session,
    account_id: str,
    id_range: IdRange,
    now: datetime,
    record: Path = os_users.SUBORDINATE_IDS_GIVEN,
) -> IdRange:
    """A new block of host ids for the account's containers, recorded now in the store and in this
    machine's ``record``: the next of ``id_range`` (the fleet's ``[accounts] subordinate_ids``) above
    every block this store ever gave from it, overlapping nothing another store on this machine gave,
    nobody's /etc/subuid or /etc/subgid entries, and no user's or group's id. Call it inside
    ``os_users.making_users()``. ValidationError when none is left."""
    rows = session.execute(select(OsIdBlock.kind, OsIdBlock.first, OsIdBlock.count)).all()
    recorded = [(row.kind, IdRange(row.first, row.first + row.count - 1)) for row in rows]
    given = [block for kind, block in recorded if kind == SUBORDINATE]
    taken = [block for _, block in recorded] + _blocks_held(record)
    taken += [IdRange(value, value) for value in _system_ids() | _uids_given_here()]
    block = next_block(id_range, SUBORDINATE_BLOCK, given, taken)
    if block is None:
        raise ValidationError(
            f"No block of {SUBORDINATE_BLOCK} ids is left in the fleet's [accounts] subordinate_ids range "
            f"{id_range} for the account's containers: blocks are never handed out twice. Give the fleet "
            "file a wider or another range."
        )
    session.add(
        OsIdBlock(
            kind=SUBORDINATE, first=block.first, count=block.size, account_id=account_id, allocated_at=now
        )
    )
    session.flush()
    os_users.note_block_given_here(block, record)
    return block


def _blocks_held(record: Path = os_users.SUBORDINATE_IDS_GIVEN) -> list[IdRange]:
    """Every block of subordinate ids a server on this machine gave, or someone holds in /etc/subuid or
    /etc/subgid."""
    return os_users.blocks_given_here(record) + [held for _, held in os_users.subordinate_ids_held()]


def _uids_given_here() -> set[int]:
    # Only root reads the machine's record of uids (0600), and only root makes users: a server that may
    # not read it made none of them.
    try:
        return os_users.ids_given_here()
    except PermissionError:
        return set()


def _system_ids() -> set[int]:
    """The uid of every user and the gid of every group this machine has."""
    return {entry.pw_uid for entry in pwd.getpwall()} | {entry.gr_gid for entry in grp.getgrall()}
