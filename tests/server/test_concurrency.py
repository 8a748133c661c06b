"""Eight buyers racing over HTTP for the same capacity: nobody is ever booked above a pool's capacity,
on SQLite and on PostgreSQL (tests/postgres.py)."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from tests.harness import Server, service_now
from tests.postgres import Stores

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
RESERVABLE = {("ml.p5.48xlarge", "us-west-2a"): 8, ("ml.p5.48xlarge", "us-west-2b"): 4}
CLIENTS = 8
ROUNDS = 6


def _buyer(
    server: Server, credentials: Any, number: int, start: threading.Barrier, outcomes: dict[str, list[Any]]
) -> None:
    client = server.sagemaker(credentials)
    start.wait()
    for round_ in range(ROUNDS):
        offerings = client.search_training_plan_offerings(
            InstanceType="ml.p5.48xlarge",
            InstanceCount=2 if number % 2 else 4,
            DurationHours=24 * (1 + number % 3),
            TargetResources=["training-job" if number % 2 else "hyperpod-cluster"],
        )["TrainingPlanOfferings"]
        if not offerings:
            outcomes["empty"].append(number)
            continue
        try:
            arn = client.create_training_plan(
                TrainingPlanName=f"racer-{number}-{round_}",
                TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"],
            )["TrainingPlanArn"]
            outcomes["bought"].append((credentials, arn))
        except ClientError as exc:
            outcomes["refused"].append(
                (exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"])
            )


def _peak_per_pool(segments: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """Brute force over every segment boundary: the most instances any pool holds at one instant."""
    points = sorted({s["StartTime"] for s in segments})
    peak: dict[tuple[str, str], int] = defaultdict(int)
    for moment in points:
        held: dict[tuple[str, str], int] = defaultdict(int)
        for s in segments:
            if s["StartTime"] <= moment < s["EndTime"]:
                held[(s["InstanceType"], s["AvailabilityZone"])] += s["TotalInstanceCount"]
        for pool, count in held.items():
            peak[pool] = max(peak[pool], count)
    return peak


def test_racing_buyers_never_overbook_and_every_success_persists(
    server_factory: type[Server], tmp_path: Path, stores: Stores
) -> None:
    url = stores.url()  # SQLite in the data directory, or a PostgreSQL database of the test's own
    server = server_factory(data_dir=tmp_path / "race", fleet=SMALL_FLEET, database_url=url).start()
    accounts = [server.new_account(f"racer-{n}") for n in range(CLIENTS)]
    outcomes: dict[str, list[Any]] = defaultdict(list)
    start = threading.Barrier(CLIENTS)
    threads = [
        threading.Thread(target=_buyer, args=(server, accounts[n], n, start, outcomes))
        for n in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert outcomes["bought"], "nobody managed to buy anything"
    assert outcomes["refused"], "the race never collided; it proves nothing"
    # every refusal is a modeled error, never a server error
    assert {code for code, _ in outcomes["refused"]} <= {"ResourceLimitExceeded", "ResourceNotFound"}
    assert all(status == 400 for _, status in outcomes["refused"])

    server.kill()
    server.restart()
    segments = []
    for credentials, arn in outcomes["bought"]:
        plan = server.sagemaker(credentials).describe_training_plan(TrainingPlanName=arn)
        assert plan["Status"] == "Scheduled"
        segments += plan["ReservedCapacitySummaries"]
    listed = sum(len(server.sagemaker(c).list_training_plans()["TrainingPlanSummaries"]) for c in accounts)
    assert listed == len(outcomes["bought"])  # nothing half-written by a refused purchase
    for pool, peak in _peak_per_pool(segments).items():
        assert peak <= RESERVABLE[pool], (pool, peak)
    fleet = server.native().get("/api/v1/fleet", days=60)["Pools"]
    for pool in fleet:
        assert all(run["Booked"] <= pool["ReservableCount"] for run in pool["BookedProfile"])
    now = service_now(server)
    assert all(s["EndTime"] > now for s in segments)
