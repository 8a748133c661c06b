"""The audit trail: every administrator action and security-relevant event, with who, when, from where
and what changed (docs/OPERATIONS.md lists the actions).

A service records an action inside the transaction that makes the change (`record`), so the trail and
the state never disagree: a refused or rolled-back change leaves no record. Who is the caller (its
account, user and access key) and from where its remote address; None is the service itself. When is
service time (what the rest of the store says) and the real wall time the row was written. Nothing in
the API changes or removes a record.

Refused signatures come in bulk (a misconfigured client, or someone guessing): `RefusedSignatures`
writes one record per remote address and minute of real time, with the count and the reasons, instead
of one per request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from hyperplan.clock import utcnow
from hyperplan.core.jsonable import jsonable
from hyperplan.services.accounts.accounts import Caller
from hyperplan.store.db import Database
from hyperplan.store.schema import Account, AuditEvent
from hyperplan.waits import may_wait

MAX_LIST = 1000  # records one listing returns at most (the newest, in time order)
REFUSAL_WINDOW = 60.0  # seconds of real time one record of refused signatures covers


@dataclass(frozen=True)
class AuditView:
    id: int
    at: datetime
    wall_at: datetime
    action: str
    actor_account_name: str
    actor_user_name: str
    access_key_id: str
    remote_address: str
    account_id: str | None
    account_name: str
    target: str
    detail: Mapping[str, Any]


def record(
    session: Session,
    now: datetime,
    caller: Caller | None,
    action: str,
    *,
    account_id: str | None = None,
    target: str = "",
    detail: Mapping[str, Any] | None = None,
    remote_address: str = "",
) -> None:
    """One record, in the caller's transaction. `caller` None: the service acted by itself."""
    session.add(
        AuditEvent(
            at=now,
            wall_at=utcnow(),
            action=action,
            actor_account_id=caller.account_id if caller else None,
            actor_account_name=caller.account_name if caller else "",
            actor_user_name=caller.user_name if caller else "",
            access_key_id=caller.access_key_id if caller else "",
            remote_address=(caller.remote_address if caller else "") or remote_address,
            account_id=account_id,
            target=target,
            detail=json.dumps(jsonable(dict(detail or {})), sort_keys=True, default=str),
        )
    )


def list_events(
    session: Session,
    *,
    since: datetime | None,
    account_id: str | None,
    limit: int = MAX_LIST,
    before: int | None = None,
) -> list[AuditView]:
    """Records from `since` on (service time), concerning or made by `account_id` when given, and with
    `before` (a record's id) only those listed before that record; the newest `limit` of them, oldest
    first."""
    query = select(AuditEvent)
    if since is not None:
        query = query.where(AuditEvent.at >= since)
    if before is not None:
        mark = session.get(AuditEvent, before)
        if mark is None:
            return []
        query = query.where(
            or_(AuditEvent.at < mark.at, and_(AuditEvent.at == mark.at, AuditEvent.id < mark.id))
        )
    if account_id is not None:
        query = query.where(
            or_(AuditEvent.account_id == account_id, AuditEvent.actor_account_id == account_id)
        )
    rows = list(session.scalars(query.order_by(AuditEvent.at.desc(), AuditEvent.id.desc()).limit(limit)))
    names = {account_id: name for account_id, name in session.execute(select(Account.id, Account.name))}
    return [
        AuditView(
            id=row.id,
            at=row.at,
            wall_at=row.wall_at,
            action=row.action,
            actor_account_name=row.actor_account_name,
            actor_user_name=row.actor_user_name,
            access_key_id=row.access_key_id,
            remote_address=row.remote_address,
            account_id=row.account_id,
            account_name=names.get(row.account_id, "") if row.account_id else "",
            target=row.target,
            detail=json.loads(row.detail or "{}"),
        )
        for row in reversed(rows)
    ]


@dataclass
class _Window:
    started: float
    count: int
    reasons: dict[str, int]
    key_ids: set[str]
    row_id: int | None = None


class RefusedSignatures:
    """Refused signatures counted per remote address: the first of a window is recorded at once, the
    window's count and reasons are written into that record when the window closes (the next refusal
    after it, a listing of the trail, or the server's stop)."""

    MAX_KEY_IDS = 10  # the distinct access key ids one record names at most

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}

    def note(self, db: Database, now: datetime, remote: str, access_key_id: str, code: str) -> None:
        # Counts, then may write under the lock: never on the event loop, where it would count twice
        # (the refused request is answered again in the thread pool: hyperplan/waits.py).
        may_wait("the refused signatures' count")
        with self._lock:
            self._close_old(db, self._clock())
            window = self._windows.get(remote)
            first = window is None
            if window is None:
                window = self._windows[remote] = _Window(self._clock(), 0, {}, set())
            window.count += 1
            window.reasons[code] = window.reasons.get(code, 0) + 1
            if access_key_id and len(window.key_ids) < self.MAX_KEY_IDS:
                window.key_ids.add(access_key_id)
            if first:
                with db.write() as session:
                    row = self._row(window, now, remote)
                    session.add(row)
                    session.flush()
                    window.row_id = row.id

    def flush(self, db: Database) -> None:
        """Write every open window's count (its record stays the window's until the window closes)."""
        with self._lock:
            for window in self._windows.values():
                self._write(db, window)

    def _close_old(self, db: Database, now: float) -> None:
        for remote, window in list(self._windows.items()):
            if now - window.started >= REFUSAL_WINDOW:
                self._write(db, window)
                del self._windows[remote]

    def _write(self, db: Database, window: _Window) -> None:
        if window.row_id is None:
            return
        with db.write() as session:
            row = session.get(AuditEvent, window.row_id)
            if row is not None:
                row.detail = self._detail(window)

    def _row(self, window: _Window, now: datetime, remote: str) -> AuditEvent:
        return AuditEvent(
            at=now,
            wall_at=utcnow(),
            action="signature.refused",
            actor_account_id=None,
            actor_account_name="",
            actor_user_name="",
            access_key_id="",
            remote_address=remote,
            account_id=None,
            target=remote,
            detail=self._detail(window),
        )

    @staticmethod
    def _detail(window: _Window) -> str:
        return json.dumps(
            {
                "Count": window.count,
                "Reasons": dict(sorted(window.reasons.items())),
                "AccessKeyIds": sorted(window.key_ids),
                "WindowSeconds": REFUSAL_WINDOW,
            },
            sort_keys=True,
        )
