"""`hyperplan clock`: show the service clock; advance or set a manual one."""

from __future__ import annotations

import typer

from hyperplan.cli.common import emit, native_client, reporting_errors
from hyperplan.cli.options import TIME_HELP, ClientTyper

app = ClientTyper(help="The service clock.", no_args_is_help=True)


@app.command("show")
def show() -> None:
    """Print the service time and the kind of clock."""
    from hyperplan.cli.views.clock import ClockLine

    with reporting_errors():
        emit(native_client().get("/api/v1/clock"), ClockLine)


@app.command("advance")
def advance(duration: str = typer.Argument(help="How far, e.g. 90m, 6h, 2d, 1d12h.")) -> None:
    """Move a manual clock forward; returns after every event due by then has run, in order."""
    from hyperplan.cli.views.clock import ClockLine

    with reporting_errors():
        state = native_client().post("/api/v1/clock/advance", {"Duration": duration})
    emit(state, ClockLine)


@app.command("set")
def set_time(
    time: str = typer.Argument(help=TIME_HELP),
) -> None:
    """Move a manual clock to a time (never backwards)."""
    from hyperplan.cli.times import iso_instants
    from hyperplan.cli.views.clock import ClockLine

    when = iso_instants({"TIME": time})["TIME"]
    with reporting_errors():
        state = native_client().post("/api/v1/clock/set", {"Time": when})
    emit(state, ClockLine)
