"""`hyperplan audit`, `hyperplan admin` (drain, resume) and `hyperplan usage`: operating the fleet
(docs/OPERATIONS.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import emit, json_output, native_client, reporting_errors
from hyperplan.cli.options import TIME_HELP, ClientTyper

audit_app = ClientTyper(help="The audit trail (administrators).", no_args_is_help=True)
admin_app = ClientTyper(help="Fleet maintenance (administrators): drain and resume.", no_args_is_help=True)


@audit_app.command("list")
def list_audit(
    since: Annotated[str | None, typer.Option(help="From this instant on. " + TIME_HELP)] = None,
    account: Annotated[str | None, typer.Option(help="Records made by or concerning this account.")] = None,
    before: Annotated[int | None, typer.Option(help="Only records listed before this one (its id).")] = None,
) -> None:
    """Administrator actions and security-relevant events, oldest first: the newest page of them (1,000
    records or 1 MiB); --before the first one's id for the page before."""
    from hyperplan.cli.times import iso_instants
    from hyperplan.cli.views.ops import AuditTable

    since = iso_instants({"--since": since})["--since"]
    with reporting_errors():
        result = native_client().get("/api/v1/audit", since=since, account=account, before=before)
    emit(result["Events"], AuditTable)
    if result.get("Truncated") and result["Events"] and not json_output():
        typer.echo(f"Older records: --before {result['Events'][0]['Id']}", err=True)


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


def usage(
    account: Annotated[
        str | None, typer.Option(help="One account (administrators; others see their own).")
    ] = None,
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="From this instant; default: 30 days before --to (--monthly: the first of the month two "
            "months before). " + TIME_HELP,
        ),
    ] = None,
    to: Annotated[str | None, typer.Option(help="Until this instant; default: now. " + TIME_HELP)] = None,
    by_tag: Annotated[
        str | None, typer.Option(help="Group by this tag key's value too (daily only).")
    ] = None,
    monthly: Annotated[
        bool,
        typer.Option(
            "--monthly",
            help="Per account and calendar month: reserved, used, idle, lent, returned; paid, refunded, "
            "credited, net cost.",
        ),
    ] = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV with a header line, for a spreadsheet.")] = False,
) -> None:
    """Instance-hours per account, pool and UTC day (service time): reserved by plans, used of them by
    the plans' clusters and jobs (never more than reserved), and on demand (work on no plan) apart;
    lent to spot jobs by the plans, and run by the account's spot jobs, with their money; returned by
    the plans, refunded and credited for resales. --monthly: the books per account and month."""
    from hyperplan.cli.times import iso_instants

    window = iso_instants({"--from": from_, "--to": to})  # a bad time refused before any request
    from_, to = window["--from"], window["--to"]
    if monthly:
        if by_tag is not None:
            raise typer.BadParameter(
                "--by-tag groups the daily report only, not --monthly.", param_hint="--by-tag"
            )
        _monthly_usage(account, from_, to, csv)
        return
    _daily_usage(account, from_, to, by_tag, csv)


def _daily_usage(
    account: str | None, from_: str | None, to: str | None, by_tag: str | None, csv: bool
) -> None:
    from hyperplan.cli.views.ops import UsageTable

    with reporting_errors():
        rows = native_client().get("/api/v1/usage", account=account, to=to, tag=by_tag, **{"from": from_})[
            "Usage"
        ]
    if not csv:
        emit(rows, UsageTable)
        return
    tagged = by_tag is not None
    # New columns go at the end: a sheet that reads the earlier ones by position still reads them.
    header = [
        "account",
        *(["tag_value"] if tagged else []),
        "instance_type",
        "zone",
        "day",
        "reserved_instance_hours",
        "used_instance_hours",
        "plan_used_instance_hours",
        "on_demand_instance_hours",
        "lent_instance_hours",
        "spot_instance_hours",
        "spot_charged",
        "lending_credited",
        "returned_instance_hours",
        "refunded",
        "resale_credited",
    ]
    lines = [
        [
            r["Account"],
            *([r["TagValue"]] if tagged else []),
            r["InstanceType"],
            r["AvailabilityZone"],
            r["Day"],
            r["ReservedInstanceHours"],
            r["UsedInstanceHours"],
            r["PlanUsedInstanceHours"],
            r["OnDemandInstanceHours"],
            r["LentInstanceHours"],
            r["SpotInstanceHours"],
            r["SpotCharged"],
            r["LendingCredited"],
            r["ReturnedInstanceHours"],
            r["Refunded"],
            r["ResaleCredited"],
        ]
        for r in rows
    ]
    _write_csv(header, lines)


MONTHLY_COLUMNS = (
    ("account", "Account"),
    ("month", "Month"),
    ("reserved_instance_hours", "ReservedInstanceHours"),
    ("plan_used_instance_hours", "PlanUsedInstanceHours"),
    ("idle_instance_hours", "IdleInstanceHours"),
    ("lent_instance_hours", "LentInstanceHours"),
    ("returned_instance_hours", "ReturnedInstanceHours"),
    ("paid", "Paid"),
    ("refunded", "Refunded"),
    ("credited", "Credited"),
    ("net_cost", "NetCost"),
)
"""The monthly CSV's columns, each with the API member it holds."""


def _monthly_usage(account: str | None, from_: str | None, to: str | None, csv: bool) -> None:
    from hyperplan.cli.views.ops import MonthlyUsageTable

    with reporting_errors():
        books = native_client().get("/api/v1/usage/monthly", account=account, to=to, **{"from": from_})
    if not csv:
        emit(books, MonthlyUsageTable)
        return
    _write_csv(
        [column for column, _member in MONTHLY_COLUMNS],
        [[row[member] for _column, member in MONTHLY_COLUMNS] for row in books["Months"]],
    )


def _write_csv(header: list[str], lines: list[list[object]]) -> None:
    import csv as csv_module
    import sys

    writer = csv_module.writer(sys.stdout, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(lines)
