"""The audit trail read and written with the runtime: a record in a transaction of its own (an action
that is not one transaction, such as a clock move), and the listing behind `hyperplan audit list`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hyperplan.services import accounts, audit
from hyperplan.services.accounts import Caller
from hyperplan.services.audit import AuditView
from hyperplan.services.context import ServiceContext


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


def list_events(runtime: ServiceContext, since: datetime | None, account_ref: str | None) -> list[AuditView]:
    """The records from `since` (service time) on, of one account when named."""
    runtime.refusals.flush(runtime.db)  # this server's refusals so far, counted
    with runtime.db.read() as session:
        account_id = accounts.get_account(session, account_ref).id if account_ref else None
        return audit.list_events(session, since=since, account_id=account_id)
