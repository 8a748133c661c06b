"""The in-process server (tests/inprocess.py) is the application: real HTTP, the real store, the
settings of its own environment, and nothing left behind when it stops."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from hyperplan.services.jobs.job_records import settings_of
from tests.harness import ADMIN, SERVER_START, service_now, wait_until
from tests.inprocess import InProcessServer


def test_it_answers_boto3_the_aws_cli_and_our_cli_over_real_http(fast_server: InProcessServer) -> None:
    assert service_now(fast_server) == SERVER_START
    assert fast_server.sagemaker().list_training_plans()["TrainingPlanSummaries"] == []
    assert fast_server.aws("sagemaker", "list-training-plans")["TrainingPlanSummaries"] == []
    fast_server.new_account("team-a")
    assert "team-a" in fast_server.cli("accounts", "list").stdout
    assert (fast_server.data_dir / "hyperplan.db").stat().st_size > 0  # a real SQLite file


def test_its_environment_is_its_own_and_restored_after(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    assert "HYPERPLAN_JOB_STOP_GRACE" not in os.environ
    server = fast_server_factory(data_dir=tmp_path / "d", env={"HYPERPLAN_JOB_STOP_GRACE": "7"}).start()
    assert server.runtime is not None
    assert settings_of(server.runtime.context).stop_grace.total_seconds() == 7
    server.stop()
    assert "HYPERPLAN_JOB_STOP_GRACE" not in os.environ


def test_it_stops_its_threads_and_restarts_over_the_same_store(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    before = set(threading.enumerate())
    server = fast_server_factory(data_dir=tmp_path / "d").start()
    key = server.new_account("kept")
    server.native().post("/api/v1/clock/advance", {"Duration": "1h"})
    server.restart()
    assert server.native(key).get("/api/v1/clock")["Now"]
    assert service_now(server) > SERVER_START  # the store kept the clock
    server.stop()

    def left() -> list[threading.Thread]:
        return [thread for thread in set(threading.enumerate()) - before if thread.is_alive()]

    # anyio's idle worker threads are told to end when the event loop closes; they take a moment.
    assert wait_until(lambda: not left(), timeout=30), left()


def test_an_instant_of_the_tests_choice(fast_server_factory: type[InProcessServer], tmp_path: Path) -> None:
    instant = SERVER_START.replace(year=2030)
    small = Path(__file__).parent.parent / "fleets" / "small.toml"  # no background load to store
    server = fast_server_factory(data_dir=tmp_path / "d", fleet=small, clock_start=instant).start()
    assert service_now(server) == instant
    assert server.native(ADMIN).get("/api/v1/clock")["Kind"] == "manual"


def test_a_crash_is_not_played_here(fast_server: InProcessServer) -> None:
    with pytest.raises(NotImplementedError):
        fast_server.kill()


def test_its_log_holds_the_servers_warnings(fast_server: InProcessServer) -> None:
    logging.getLogger("hyperplan.app").warning("a warning the test wrote")
    assert "a warning the test wrote" in fast_server.log()
