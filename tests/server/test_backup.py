"""`hyperplan backup` while a server takes a burst of purchases, `hyperplan restore` into an empty data
directory, and a server started there.

What is provable, and asserted: every plan whose purchase was acknowledged before the backup started
is in the restored store (the backup reads one snapshot taken after it started, and an acknowledged
purchase is committed). A purchase acknowledged after the backup started may or may not be there; a
plan that is there is whole (it describes, with its segments). The restored server opens the accounts'
keys, so the key file came along and matches the store."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from botocore.exceptions import ClientError

from hyperplan.signing import Credentials
from tests.harness import BIN, Server, wait_until

BUYERS = 4


def hyperplan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "hyperplan"), *args], capture_output=True, text=True, timeout=120)


def test_a_backup_taken_during_a_purchase_burst_restores_every_acknowledged_plan(
    server_factory: type[Server], tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    server = server_factory(data_dir=data_dir).start()  # SQLite, the demo fleet
    buyers = [server.new_account(f"buyer-{n}") for n in range(BUYERS)]
    acknowledged: list[tuple[float, Credentials, str]] = []  # (when, who, plan name), in order
    stop = threading.Event()
    failures: list[BaseException] = []

    def burst(number: int) -> None:
        client = server.sagemaker(buyers[number])
        round_ = 0
        try:
            while not stop.is_set():
                round_ += 1
                offerings = client.search_training_plan_offerings(
                    InstanceType="ml.p5.48xlarge" if number % 2 else "ml.p4d.24xlarge",
                    InstanceCount=1 + round_ % 2,
                    DurationHours=24,
                    TargetResources=["training-job"],
                )["TrainingPlanOfferings"]
                name = f"burst-{number}-{round_}"
                try:
                    client.create_training_plan(
                        TrainingPlanName=name, TrainingPlanOfferingId=offerings[0]["TrainingPlanOfferingId"]
                    )
                except ClientError as exc:  # a racing buyer took the capacity: a modelled refusal
                    assert exc.response["Error"]["Code"] == "ResourceLimitExceeded", exc.response
                    continue
                acknowledged.append((time.monotonic(), buyers[number], name))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=burst, args=(n,)) for n in range(BUYERS)]
    for thread in threads:
        thread.start()
    try:
        assert wait_until(lambda: len(acknowledged) >= 6 or failures, timeout=120), "the burst never bought"
        backup_started = time.monotonic()
        taken = hyperplan("backup", str(tmp_path / "backup"), "--data-dir", str(data_dir))
        backup_ended = time.monotonic()
        bought_by_then = len(acknowledged)
        # The burst goes on after the backup: it was taken in the middle of it. With one purchase in
        # flight per buyer, at least one of these was asked for after the backup ended.
        more = BUYERS + 1
        assert wait_until(lambda: len(acknowledged) >= bought_by_then + more or failures, timeout=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert not failures, failures
    assert taken.returncode == 0, taken.stdout + taken.stderr
    before = [(who, name) for when, who, name in acknowledged if when < backup_started]
    during = [(who, name) for when, who, name in acknowledged if backup_started <= when <= backup_ended]
    assert before, "no purchase was acknowledged before the backup started"

    refused = hyperplan("restore", str(tmp_path / "backup"), "--data-dir", str(data_dir))
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and f"{data_dir} is not empty" in said  # never over a live data directory
    restored_dir = tmp_path / "restored"
    restored = hyperplan("restore", str(tmp_path / "backup"), "--data-dir", str(restored_dir))
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert sorted(p.name for p in restored_dir.iterdir()) == ["credentials", "hyperplan.db", "master.key"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in [restored_dir, *restored_dir.iterdir()])

    server.stop()
    copy = server_factory(data_dir=restored_dir, clock_start=None).start()
    for who, name in before:
        plan = copy.sagemaker(who).describe_training_plan(TrainingPlanName=name)
        assert plan["Status"] == "Scheduled" and plan["ReservedCapacitySummaries"], name
    present = _plan_names(copy, buyers)
    assert {name for _, name in before} <= present
    assert present <= {name for _, _, name in acknowledged}  # nothing that was never acknowledged
    assert len(present) < len(acknowledged)  # ... and not what was asked for after the backup ended
    _ = during  # acknowledged while the backup ran: either side of its snapshot, both are correct


def _plan_names(server: Server, buyers: list[Credentials]) -> set[str]:
    names: set[str] = set()
    for who in buyers:
        client: Any = server.sagemaker(who)
        for page in client.get_paginator("list_training_plans").paginate():
            names |= {plan["TrainingPlanName"] for plan in page["TrainingPlanSummaries"]}
    return names
