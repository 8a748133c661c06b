"""The accelerated clock runs N service seconds per real second, and stands still while the server is down.

On an in-process server (tests/inprocess.py): a stop and a start there are the runtime's own, over the
same SQLite file, without a process's start-up time, so a short downtime is already many service
minutes more than the time the server was up."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from hyperplan.cli.client import ApiError
from tests.harness import Server, wait_until
from tests.inprocess import InProcessServer

SCALE = 600
RATE_WINDOW = timedelta(minutes=30)  # service time the rate is measured over (3 real seconds)
DOWNTIME = 3.0  # real seconds down: 30 service minutes if the clock ran while the server was down
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"  # no background load to store


def _service_now(server: Server) -> tuple[datetime, float]:
    state = server.native().get("/api/v1/clock")
    assert state["Kind"] == "accelerated" and state["TimeScale"] == SCALE
    return datetime.fromisoformat(state["Now"]), time.monotonic()


def test_runs_at_its_rate(fast_server_factory: type[InProcessServer], tmp_path: Path) -> None:
    server = fast_server_factory(
        data_dir=tmp_path / "fast", fleet=SMALL_FLEET, clock="accelerated", time_scale=SCALE
    ).start()
    first, real_first = _service_now(server)
    # Wait on the event itself: the service clock has moved through the window.
    second, real_second = wait_until(
        lambda: (now := _service_now(server))[0] >= first + RATE_WINDOW and now, timeout=60
    )
    rate = (second - first).total_seconds() / (real_second - real_first)
    assert 0.8 * SCALE <= rate <= 1.2 * SCALE, rate


def test_stands_still_while_down(fast_server_factory: type[InProcessServer], tmp_path: Path) -> None:
    server = fast_server_factory(
        data_dir=tmp_path / "fast", fleet=SMALL_FLEET, clock="accelerated", time_scale=SCALE
    ).start()
    asked = time.monotonic()
    before_stop, _ = _service_now(server)
    server.stop()
    stopped = time.monotonic()
    time.sleep(DOWNTIME)  # the real time the clock must not count
    starting = time.monotonic()
    server.start()
    after_start, answered = _service_now(server)
    up = (stopped - asked) + (answered - starting)  # at most this much real time was the server up
    gap = (after_start - before_stop).total_seconds()
    # Up time counts, downtime does not: a clock that ran while down would be DOWNTIME * SCALE further
    # (more than the slack here and the two requests' latency, unless a request took over a second).
    assert 0 <= gap <= up * SCALE * 1.05 + 1, (gap, up)


def test_is_moved_ahead_and_never_back(fast_server_factory: type[InProcessServer], tmp_path: Path) -> None:
    server = fast_server_factory(
        data_dir=tmp_path / "fast", fleet=SMALL_FLEET, clock="accelerated", time_scale=SCALE
    ).start()
    before, _ = _service_now(server)
    moved = server.native().post("/api/v1/clock/advance", {"Duration": "2d"})
    assert moved["Kind"] == "accelerated" and moved["TimeScale"] == SCALE
    assert datetime.fromisoformat(moved["Now"]) >= before + timedelta(days=2)
    after, _ = _service_now(server)
    assert after >= datetime.fromisoformat(moved["Now"])  # and it runs on from there
    with pytest.raises(ApiError) as refused:
        server.native().post("/api/v1/clock/set", {"Time": before.isoformat()})
    assert refused.value.code == "ValidationException" and "backwards" in refused.value.message
