"""The accelerated clock runs N service seconds per real second, and stands still while the server is down."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from tests.harness import Server

SCALE = 600


def _service_now(server: Server) -> tuple[datetime, float]:
    state = server.native().get("/api/v1/clock")
    assert state["Kind"] == "accelerated" and state["TimeScale"] == SCALE
    return datetime.fromisoformat(state["Now"]), time.monotonic()


def test_runs_at_its_rate_and_stands_still_while_down(server_factory: type[Server], tmp_path: Path) -> None:
    server = server_factory(
        data_dir=tmp_path / "fast", clock="accelerated", extra_args=("--time-scale", str(SCALE))
    ).start()
    first, real_first = _service_now(server)
    time.sleep(3)
    second, real_second = _service_now(server)
    rate = (second - first).total_seconds() / (real_second - real_first)
    assert 0.8 * SCALE <= rate <= 1.2 * SCALE, rate

    before_stop, _ = _service_now(server)
    server.stop()
    time.sleep(8)  # 80 service minutes if the clock ran while the server was down
    server.start()
    after_start, _ = _service_now(server)
    gap_minutes = (after_start - before_stop).total_seconds() / 60
    # Only the seconds spent stopping and starting count (a few real seconds: tens of service minutes).
    assert 0 <= gap_minutes < 45, gap_minutes
