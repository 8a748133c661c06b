"""SIGKILL at random points during purchases and clock moves loses nothing that was acknowledged.

After each crash the server restarts on the same data directory; at the end every acknowledged plan is
there, no pool is booked above its capacity, and every plan's and segment's status is what an
uninterrupted run gives at that time (the pure lifecycle rule, applied to what was bought).
"""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from botocore.exceptions import BotoCoreError, ClientError

from hyperplan.core.lifecycle import Window, segment_status_at, status_at
from tests.harness import Server, service_now

CRASH_FLEET = Path(__file__).parent.parent / "fleets" / "crash.toml"
STEPS = 40
RESERVABLE = 16


def _maybe_kill_during(server: Server, rng: random.Random) -> threading.Timer | None:
    if rng.random() > 0.35:
        return None
    timer = threading.Timer(rng.uniform(0.0, 0.06), _kill_quietly, args=(server,))
    timer.start()
    return timer


def _kill_quietly(server: Server) -> None:
    if server.process is not None:
        server.kill()


def _buy(server: Server, rng: random.Random, name: str) -> str | None:
    client = server.sagemaker()
    offerings = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge",
        InstanceCount=rng.choice([1, 2, 4, 8]),
        DurationHours=24 * rng.randint(1, 4),
        TargetResources=[rng.choice(["training-job", "hyperpod-cluster"])],
    )["TrainingPlanOfferings"]
    if not offerings:
        return None
    offering = rng.choice(offerings)
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return name


def test_sigkill_during_purchases_and_clock_moves_loses_nothing(
    server_factory: type[Server], tmp_path: Path
) -> None:
    rng = random.Random(20261130)
    server = server_factory(data_dir=tmp_path / "crash", fleet=CRASH_FLEET).start()
    target = service_now(server)
    acknowledged: list[str] = []
    crashes = 0
    for step in range(STEPS):
        timer = _maybe_kill_during(server, rng)
        try:
            if rng.random() < 0.6:
                bought = _buy(server, rng, f"plan-{step}")
                if bought:
                    acknowledged.append(bought)
            else:
                target += timedelta(hours=rng.randint(1, 40))
                server.native().post("/api/v1/clock/set", {"Time": target.isoformat()})
        except (httpx.TransportError, BotoCoreError, ClientError, ConnectionError):
            pass  # killed mid-request: not acknowledged (it may or may not have happened)
        if timer is not None:
            timer.join()
        if server.process is None:
            crashes += 1
            server.restart()
            if service_now(server) < target:  # a clock move cut short: finish it, as an operator would
                server.native().post("/api/v1/clock/set", {"Time": target.isoformat()})
    assert crashes >= 5, "too few crashes to mean anything"
    server.kill()
    server.restart()
    _check_final_state(server, acknowledged)


def _check_final_state(server: Server, acknowledged: list[str]) -> None:
    client = server.sagemaker()
    now = service_now(server)
    plans = [
        p
        for page in client.get_paginator("list_training_plans").paginate()
        for p in page["TrainingPlanSummaries"]
    ]
    names = {p["TrainingPlanName"] for p in plans}
    assert set(acknowledged) <= names, f"lost: {set(acknowledged) - names}"
    held: list[dict[str, Any]] = []
    for plan in plans:
        segments = plan["ReservedCapacitySummaries"]
        windows = [Window(s["StartTime"], s["EndTime"]) for s in segments]
        assert plan["Status"] == status_at(windows, now), plan["TrainingPlanName"]
        assert [s["Status"] for s in segments] == [segment_status_at(w, now) for w in windows]
        held += segments
    peaks: dict[str, int] = defaultdict(int)
    for s in held:
        at = s["StartTime"]
        load = sum(
            o["TotalInstanceCount"]
            for o in held
            if o["AvailabilityZone"] == s["AvailabilityZone"] and o["StartTime"] <= at < o["EndTime"]
        )
        peaks[s["AvailabilityZone"]] = max(peaks[s["AvailabilityZone"]], load)
    assert all(peak <= RESERVABLE for peak in peaks.values()), peaks
