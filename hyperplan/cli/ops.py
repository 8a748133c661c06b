"""`hyperplan audit`, `hyperplan admin` (drain, resume) and `hyperplan usage`: operating the fleet
(docs/OPERATIONS.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

audit_app = ClientTyper(help="The audit trail (administrators).", no_args_is_help=True)
admin_app = ClientTyper(help="Fleet maintenance (administrators): drain and resume.", no_args_is_help=True)


@audit_app.command("list")
def list_audit(
    since: Annotated[str | None, typer.Option(help="From this instant on (ISO 8601, service time).")] = None,
    account: Annotated[str | None, typer.Option(help="Records made by or concerning this account.")] = None,
) -> None:
    """Administrator actions and security-relevant events, oldest first."""
    from hyperplan.cli.views.ops import AuditTable

    with reporting_errors():
        result = native_client().get("/api/v1/audit", since=since, account=account)
    emit(result["Events"], AuditTable)


@admin_app.command("drain")
def drain(
    stop_running: Annotated[
        bool, typer.Option("--stop-running", help="Also stop running jobs (checkpointed) and nodes.")
    ] = False,
) -> None:
    """Refuse new purchases, clusters, group growth and jobs (503); reads and searches go on."""
    from hyperplan.cli.views.ops import DrainLine

    with reporting_errors():
        state = native_client().post("/api/v1/drain", {"StopRunning": stop_running})
    emit(state, DrainLine)


@admin_app.command("resume")
def resume() -> None:
    """End a drain: new work is accepted, groups and queues get their capacity back."""
    from hyperplan.cli.views.ops import DrainLine

    with reporting_errors():
        state = native_client().post("/api/v1/resume")
    emit(state, DrainLine)


@admin_app.command("status")
def status() -> None:
    """Whether the fleet is drained."""
    from hyperplan.cli.views.ops import DrainLine

    with reporting_errors():
        state = native_client().get("/api/v1/drain")
    emit(state, DrainLine)
