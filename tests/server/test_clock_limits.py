"""Bounded clock moves: refused beyond 366 days, and a long catch-up that a SIGTERM stops within seconds.

A year of the demo fleet is thousands of lifecycle events (its background load is topped up daily) and
minutes of work. The stop tests start such a catch-up, send SIGTERM once events are visibly running,
and check that the server is gone long before the catch-up could have ended, that what ran is
committed, and that what did not run is still pending.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from tests.harness import Server, service_now, wait_until

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
STOPS_WITHIN = 30  # seconds; the catch-ups below take minutes


def _refused(server: Server, route: str, body: dict[str, str]) -> str:
    with pytest.raises(ApiError) as refused:
        server.native().post(route, body)
    assert refused.value.code == "ValidationException", refused.value.message
    return refused.value.message


def test_moves_beyond_366_days_are_refused_naming_the_limit(fast_server: Server) -> None:
    start = service_now(fast_server)
    for duration in ("367d", "366d1s", "99999999999999d", "9" * 1000 + "s"):
        message = _refused(fast_server, "/api/v1/clock/advance", {"Duration": duration})
        assert "366 days" in message or "at most 36500d" in message, message
    for time in ("9999-12-31T00:00:00Z", (start + timedelta(days=367)).isoformat()):
        assert "at most 366 days" in _refused(fast_server, "/api/v1/clock/set", {"Time": time})
    for time in ("9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+01:00"):
        assert "out of range" in _refused(fast_server, "/api/v1/clock/set", {"Time": time})
    refused = fast_server.cli("clock", "advance", "99999999999999d", check=False)
    assert refused.returncode == 1 and "ValidationException" in refused.stderr
    assert service_now(fast_server) == start


def test_a_move_of_exactly_366_days_is_allowed(fast_server_factory: type[Server], tmp_path: Path) -> None:
    server = fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET).start()
    start = service_now(server)
    server.cli("clock", "advance", "366d")
    assert service_now(server) - start == timedelta(days=366)
    server.cli("clock", "set", (start + timedelta(days=732)).isoformat())
    assert service_now(server) - start == timedelta(days=732)


# -- a SIGTERM during a long catch-up ------------------------------------------------------------------


def _events(server: Server, due_by: datetime | None = None) -> tuple[int, int]:
    """(done, pending) lifecycle events, read from the store as it stands on disk; with `due_by`, only
    the pending ones due by then."""
    micros = int((due_by or datetime.max.replace(tzinfo=UTC)).timestamp() * 1_000_000)
    with contextlib.closing(
        sqlite3.connect(f"file:{server.data_dir / 'hyperplan.db'}?mode=ro", uri=True, timeout=30)
    ) as db:
        done = db.execute("SELECT count(*) FROM scheduled_events WHERE done").fetchone()[0]
        pending = db.execute(
            "SELECT count(*) FROM scheduled_events WHERE NOT done AND due_at <= ?", (micros,)
        ).fetchone()[0]
    return int(done), int(pending)


def _terminate_within(server: Server, seconds: float, starting: threading.Thread | None = None) -> int:
    """SIGTERM; the exit code, which must come within `seconds`. `starting`: the thread still waiting
    for the server to be ready, which gives up once it has exited."""
    process = server.process
    assert process is not None
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=seconds)
    if starting is not None:
        starting.join(timeout=seconds)
    server.process = None
    return code


def _post_in_background(
    server: Server, route: str, body: dict[str, Any], answers: list[Any]
) -> threading.Thread:
    """Send a request from a thread (the test goes on while it runs); its answer or error lands in
    `answers`."""
    client = server.native()

    def send() -> None:
        try:
            answers.append(client.post(route, body))
        except Exception as exc:  # an error answer, or a connection the stopping server cut
            answers.append(exc)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def test_sigterm_during_a_long_advance_stops_the_server_with_each_event_committed(server: Server) -> None:
    start = service_now(server)
    answers: list[Any] = []
    request = _post_in_background(server, "/api/v1/clock/advance", {"Duration": "366d"}, answers)
    assert wait_until(lambda: service_now(server) > start + timedelta(days=2)), "no events ran"
    reached = service_now(server)
    done_before, _ = _events(server)

    assert _terminate_within(server, STOPS_WITHIN) == 0
    request.join(timeout=STOPS_WITHIN)
    (answer,) = answers
    assert isinstance(answer, ApiError), answer
    assert (answer.status, answer.code) == (503, "ServiceUnavailable") and "stopping" in answer.message

    done_after, pending = _events(server, due_by=start + timedelta(days=366))
    assert done_after >= done_before and pending > 0  # what ran is kept; the rest of the year waits
    server.restart()
    stopped_at = service_now(server)
    assert reached <= stopped_at < start + timedelta(days=366)
    assert json.loads(server.cli("clock", "advance", "1h", "--json").stdout)["Now"]


def test_sigterm_during_the_catch_up_at_startup_stops_the_server_within_seconds(
    server_factory: type[Server], tmp_path: Path
) -> None:
    # A manual clock that starts 300 days ago leaves its events due; a wall clock then has 300 days of
    # the demo fleet to catch up on before it serves anything.
    past = datetime.now(UTC) - timedelta(days=300)
    data = tmp_path / "data"
    first = server_factory(data_dir=data, clock_start=past).start()
    assert first.stop() == 0

    server = server_factory(data_dir=data, clock="wall")
    starting = threading.Thread(target=lambda: _start_quietly(server), daemon=True)
    starting.start()
    assert wait_until(lambda: server.process is not None and _events(server)[0] > 10), "no catch-up"
    done_before, _ = _events(server)
    assert _terminate_within(server, STOPS_WITHIN, starting) == 0

    done_after, missed = _events(server, due_by=datetime.now(UTC))
    assert done_after >= done_before
    assert missed > 0  # cut short: events already due are still pending, for the next start
    assert "hyperplan stopped" in server.log()


def _start_quietly(server: Server) -> None:
    with contextlib.suppress(RuntimeError):  # the server exits (SIGTERM) before it is ever ready
        server.start(timeout=600)
