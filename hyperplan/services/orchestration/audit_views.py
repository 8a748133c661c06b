"""The audit trail read and written with the runtime: a record in a transaction of its own (an action
that is not one transaction, such as a clock move), and the listing behind `hyperplan audit list`.

A listing is a page: the newest records that one page holds, at most audit.MAX_LIST (1,000) and 1 MiB
of them (core/page_bytes.py; a record weighs its texts' UTF-8 bytes, its detail's JSON and
AUDIT_OVERHEAD), oldest first; the records before them are the next page, asked for by the first
one's id (`before`). A record's detail is small (a few named values), but some carry a person's text,
a cancellation's reason of up to 1,024 characters, so a thousand of them could pass the bound."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hyperplan.core.page_bytes import fitting, utf8_bytes
from hyperplan.services.accounts import accounts, audit
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.accounts.audit import AuditView
from hyperplan.services.runtime.context import ServiceContext


def record_alone(
    runtime: ServiceContext,
    caller: Caller | None,
    action: str,
    *,
    account_id: str | None = None,
    target: str = "",
    detail: Mapping[str, Any] | None = None,
) -> None:
    with runtime.db.write() as session:
        audit.record(
            session, runtime.clock.now(), caller, action, account_id=account_id, target=target, detail=detail
        )


AUDIT_OVERHEAD = 256
"""What a record weighs beyond its texts: its id, times, and the answer's names for its fields."""


@dataclass(frozen=True)
class AuditPage:
    events: list[AuditView]  # oldest first
    truncated: bool  # older records (from `since` on) were left out: ask `before` the first one


def list_events(
    runtime: ServiceContext, since: datetime | None, account_ref: str | None, before: int | None = None
) -> AuditPage:
    """The newest records from `since` (service time) on that one page holds, of one account when named,
    and with `before` (a record's id) of those listed before that record."""
    runtime.refusals.flush(runtime.db)  # this server's refusals so far, counted
    with runtime.db.read() as session:
        account_id = accounts.get_account(session, account_ref).id if account_ref else None
        newest = audit.list_events(
            session, since=since, account_id=account_id, before=before, limit=audit.MAX_LIST + 1
        )[::-1]
    held = min(audit.MAX_LIST, fitting(record_bytes(view) for view in newest))
    return AuditPage(newest[:held][::-1], held < len(newest))


def record_bytes(view: AuditView) -> int:
    """What a record weighs on a page."""
    texts = (
        view.action,
        view.actor_account_name,
        view.actor_user_name,
        view.access_key_id,
        view.remote_address,
        view.account_id or "",
        view.account_name,
        view.target,
        json.dumps(view.detail, default=str, ensure_ascii=False),
    )
    return sum(utf8_bytes(text) for text in texts) + AUDIT_OVERHEAD
