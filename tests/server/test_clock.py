"""The manual clock: show, advance, set, never backwards, kept across restarts."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.cli.client import ApiError
from tests.harness import BIN, Server, service_now


def test_manual_clock_starts_at_the_wall_time_of_the_first_start(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = server_factory(data_dir=tmp_path / "data", clock_start=None).start()  # about the wall clock
    assert abs(service_now(server) - datetime.now(UTC)) < timedelta(minutes=1)
    assert server.native().get("/api/v1/clock")["Kind"] == "manual"


def test_clock_start_sets_a_new_stores_first_instant_and_later_starts_keep_their_time(
    server_factory: type[Server], tmp_path: Path
) -> None:
    first = datetime(2031, 7, 31, 23, 59, 30, tzinfo=UTC)
    server = server_factory(data_dir=tmp_path / "data", clock_start=first).start()
    assert service_now(server) == first
    server.cli("clock", "advance", "1h")
    server.stop()
    server.clock_start = datetime(2040, 1, 1, tzinfo=UTC)  # ignored: the store has a time of its own
    server.restart()
    assert service_now(server) == first + timedelta(hours=1)
    assert "--clock-start 2040-01-01T00:00:00+00:00 ignored" in server.log()


def test_clock_start_is_refused_with_the_wall_clock(tmp_path: Path) -> None:
    refused = subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--data-dir", str(tmp_path / "data"), "--isolation", "none",
         "--work-dir", str(tmp_path / "work"), "--clock", "wall",
         "--clock-start", "2031-01-01T00:00:00Z"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--clock-start needs --clock manual or accelerated" in refused.stderr


def test_clock_start_must_be_a_time(tmp_path: Path) -> None:
    # The CLI's one time syntax (a time without a zone is UTC); one that does not exist is refused.
    refused = subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--data-dir", str(tmp_path / "data"), "--isolation", "none",
         "--work-dir", str(tmp_path / "work"), "--clock", "manual",
         "--clock-start", "2031-01-01T24:00:00"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "'2031-01-01T24:00:00' is not a real date and time" in refused.stderr


def test_advance_by_durations(fast_server: Server) -> None:
    start = service_now(fast_server)
    out = json.loads(fast_server.cli("clock", "advance", "1d12h", "--json").stdout)
    assert datetime.fromisoformat(out["Now"]) - start == timedelta(hours=36)
    fast_server.cli("clock", "advance", "90m")
    assert service_now(fast_server) - start == timedelta(hours=37, minutes=30)


def test_set_moves_forward_and_refuses_to_go_back(fast_server: Server) -> None:
    target = (service_now(fast_server) + timedelta(days=3)).replace(microsecond=0)
    fast_server.cli("clock", "set", target.isoformat())
    assert service_now(fast_server) == target
    refused = fast_server.cli("clock", "set", (target - timedelta(hours=1)).isoformat(), check=False)
    assert refused.returncode == 1
    assert "ValidationException" in refused.stderr and "backwards" in refused.stderr
    assert service_now(fast_server) == target


def test_set_needs_a_zone(fast_server: Server) -> None:
    with pytest.raises(ApiError) as exc:
        fast_server.native().post("/api/v1/clock/set", {"Time": "2030-01-01T00:00:00"})
    assert exc.value.code == "ValidationException" and "zone" in exc.value.message


def test_bad_durations_are_refused(fast_server: Server) -> None:
    for text in ("soon", "-5m", "0m"):
        with pytest.raises(ApiError) as exc:
            fast_server.native().post("/api/v1/clock/advance", {"Duration": text})
        assert exc.value.code == "ValidationException", text


def test_the_clock_keeps_its_time_across_a_restart(server: Server) -> None:
    server.cli("clock", "advance", "10d")
    before = service_now(server)
    assert server.stop() == 0  # SIGTERM is a graceful shutdown
    assert "hyperplan stopped" in server.log()
    server.restart()
    assert service_now(server) == before


def test_the_clock_keeps_its_time_across_a_crash(server: Server) -> None:
    server.cli("clock", "advance", "2d")
    before = service_now(server)
    server.kill()
    server.restart()
    assert service_now(server) == before


def test_a_wall_clock_cannot_be_advanced(server_factory: type[Server], tmp_path) -> None:  # type: ignore[no-untyped-def]
    wall = server_factory(data_dir=tmp_path / "wall", clock="wall").start()
    with pytest.raises(ApiError) as exc:
        wall.native().post("/api/v1/clock/advance", {"Duration": "1h"})
    assert exc.value.code == "ConflictException"
