"""`hyperplan clock`: show the service clock; advance or set a manual one."""

from __future__ import annotations

from typing import Any

import typer

from hyperplan.cli.common import (
    DataDirOpt,
    EndpointOpt,
    JsonOpt,
    ProfileOpt,
    console,
    emit,
    native_client,
    reporting_errors,
)

app = typer.Typer(help="The service clock.", no_args_is_help=True)


def _render(state: dict[str, Any]) -> None:
    line = f"{state['Now']}  ({state['Kind']} clock"
    if state.get("TimeScale"):
        line += f", x{state['TimeScale']}"
    line += ")"
    if state.get("EventsRun"):
        line += f"; {state['EventsRun']} lifecycle events ran"
    console.print(line)


@app.command("show")
def show(
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the service time and the kind of clock."""
    with reporting_errors():
        emit(native_client(endpoint_url, profile, data_dir).get("/api/v1/clock"), as_json, _render)


@app.command("advance")
def advance(
    duration: str = typer.Argument(help="How far, e.g. 90m, 6h, 2d, 1d12h."),
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Move a manual clock forward; returns after every event due by then has run, in order."""
    with reporting_errors():
        state = native_client(endpoint_url, profile, data_dir).post(
            "/api/v1/clock/advance", {"Duration": duration}
        )
    emit(state, as_json, _render)


@app.command("set")
def set_time(
    time: str = typer.Argument(help="ISO 8601 with a zone, e.g. 2026-12-01T11:30:00Z."),
    endpoint_url: EndpointOpt = None,
    profile: ProfileOpt = None,
    data_dir: DataDirOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Move a manual clock to a time (never backwards)."""
    with reporting_errors():
        state = native_client(endpoint_url, profile, data_dir).post("/api/v1/clock/set", {"Time": time})
    emit(state, as_json, _render)
