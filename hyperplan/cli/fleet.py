"""`hyperplan fleet show`: the pools, the size of their instances, how booked they are, and each zone's
subnets."""

from __future__ import annotations

from typing import Annotated

import typer

from hyperplan.cli.common import emit, json_output, native_client, reporting_errors
from hyperplan.cli.options import ClientTyper

app = ClientTyper(help="The fleet.", no_args_is_help=True)


@app.command("show")
def show(
    days: Annotated[int, typer.Option(help="How far ahead to report, in days.")] = 56,
) -> None:
    """Print each pool: its count, price, each instance's vCPUs, memory and accelerators, and a bar per
    day of how booked it is; then each zone's subnets (for a HyperPod cluster's VpcConfig)."""
    from hyperplan.cli.views.fleet import FleetTable

    with reporting_errors():
        fleet = native_client().get("/api/v1/fleet", days=days)

    # JSON is the pools alone, as before (each now with its type's VCpus, MemoryGiB, Accelerators and
    # AcceleratorKind); the table also needs the region and the time.
    emit(fleet["Pools"] if json_output() else fleet, lambda f: FleetTable(f, days))
