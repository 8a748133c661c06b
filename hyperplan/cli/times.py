"""The CLI's time options, in the one syntax of hyperplan/core/user_times.py (the console's forms read
the same): a bad value is refused naming its option before any request (exit code 2), and a relative
time (`now`, `+3d`) is counted from the service clock, which the server is asked for only then.

Imported by the commands that take a time, when they run: other commands start without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import typer

from hyperplan.cli.common import native_client, reporting_errors
from hyperplan.core.user_times import GivenTime, read_time
from hyperplan.errors import ValidationError


def instants(given: Mapping[str, str | None]) -> dict[str, datetime | None]:
    """Each option's value (keyed by its flag, e.g. "--start-after") as an instant in UTC; None where
    the option was not given. The service clock is read once, and only if a value is relative."""
    read = {flag: _read(flag, text) for flag, text in given.items() if text is not None}
    now = service_now() if any(time.relative for time in read.values()) else None
    return {flag: _at(flag, read[flag], now) if flag in read else None for flag in given}


def iso_instants(given: Mapping[str, str | None]) -> dict[str, str | None]:
    """As instants, each as the native API takes it (iso)."""
    return {flag: None if when is None else iso(when) for flag, when in instants(given).items()}


def instant(flag: str, text: str | None) -> datetime | None:
    """One option's value as an instant in UTC (see instants)."""
    return instants({flag: text})[flag]


def absolute(flag: str, text: str) -> datetime:
    """A value that cannot be relative, as it sets where a clock starts: there is no service clock yet
    to count `now` or `+3d` from. A ValidationError names the option (the commands that take one work
    without a server, and report their refusals alike)."""
    try:
        time = read_time(text)
    except ValidationError as exc:
        raise ValidationError(f"{flag}: {exc.message}") from None
    if time.instant is None:
        raise ValidationError(
            f"{flag}: {time.text!r} is counted from now, and there is no service clock to count from yet; "
            "give a date (2026-12-07: midnight UTC) or a date and time (2026-12-07T10:00, UTC unless a "
            "zone such as Z or +02:00 follows)."
        )
    return time.instant


def iso(when: datetime) -> str:
    """An instant as the native API takes it: ISO 8601 in UTC, with Z."""
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def service_now() -> datetime:
    """The service clock's time (manual, accelerated or wall), as the server reads it."""
    with reporting_errors():
        state = native_client().get("/api/v1/clock")
    return datetime.fromisoformat(state["Now"])


def _read(flag: str, text: str) -> GivenTime:
    try:
        return read_time(text)
    except ValidationError as exc:
        raise typer.BadParameter(exc.message, param_hint=flag) from None


def _at(flag: str, time: GivenTime, now: datetime | None) -> datetime:
    if time.instant is not None:
        return time.instant
    assert now is not None  # instants() reads the clock whenever a value is relative
    try:
        return time.at(now)
    except ValidationError as exc:  # out of the calendar once counted from now
        raise typer.BadParameter(exc.message, param_hint=flag) from None
