"""The console in a real headless Chromium, against a real `hyperplan serve` on the demo fleet.

One walkthrough, as an ML engineer and an administrator would go: sign in; search for the seed's example
(16 x ml.p5.48xlarge for 10 days, for a HyperPod cluster) and buy a split offering; see the plan in the
list and on the capacity timeline; approve its invoice as the administrator; create a cluster whose
worker group takes the plan from the "Instance capacity" choice; follow a training job's status and its
log while it runs; sign out. With HYPERPLAN_SCREENSHOTS set to a directory (`make screenshots`), it
saves a screenshot of each main page there.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from hyperplan.signing import Credentials
from tests.console.browser import browser_page, sign_in
from tests.harness import ADMIN, Server

pytestmark = pytest.mark.browser  # a part of its own (tests/parts.py)
expect = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright").expect

P5 = "ml.p5.48xlarge"
SCREENSHOTS = os.environ.get("HYPERPLAN_SCREENSHOTS")


def _shoot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)


def _sign_in(page: Any, server: Server, credentials: Credentials) -> None:
    sign_in(page, server.url, credentials)


def _sign_out(page: Any) -> None:
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="Sign in").wait_for()


def _job_request(name: str, gate: Path) -> dict[str, Any]:
    """An on-demand job that prints, waits for the test to open its gate, prints again and ends."""
    script = (
        "import os, time; print('epoch 1: loss 0.50', flush=True); "
        f"[time.sleep(0.1) for _ in iter(lambda: os.path.exists({str(gate)!r}), True)]; "
        "print('epoch 2: loss 0.25, finished', flush=True)"
    )
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/DataAndAPIAccessRole",
        "AlgorithmSpecification": {
            "TrainingInputMode": "File",
            "TrainingImage": "123456789012.dkr.ecr.us-west-2.amazonaws.com/algo-image:tag",
            "ContainerEntrypoint": ["python", "-c"],
            "ContainerArguments": [script],
        },
        "OutputDataConfig": {"S3OutputPath": "s3://console-demo/output"},
        "ResourceConfig": {"InstanceType": "ml.m5.12xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def test_an_engineer_and_an_administrator_through_the_console(
    server_factory: type[Server], tmp_path: Path
) -> None:
    server = server_factory(data_dir=tmp_path / "data").start()
    team = server.new_account("ml-team", PaymentMode="approval")
    with browser_page() as page:
        page.goto(f"{server.url}/console")
        _shoot(page, "sign-in")
        _sign_in(page, server, team)

        # Search for the seed's example and buy a split offering.
        page.get_by_role("link", name="Plans").click()
        page.get_by_role("link", name="Search offerings").click()
        page.get_by_label("Target").select_option("hyperpod-cluster")
        page.get_by_label("Instance type").select_option(P5)
        page.get_by_label("Instance count").fill("16")
        page.get_by_label("Duration (days)").fill("10")
        page.get_by_role("button", name="Search").click()
        offerings = page.locator("li.offering")
        split = offerings.filter(has_text="2 segments").first
        split.wait_for()
        assert "Valid until" in split.inner_text() and "Price per instance-hour" in split.inner_text()
        assert page.locator(".timeline .mark").count() >= 2  # where it lands, on the pools' timelines
        _shoot(page, "search")
        split.get_by_role("button", name="Review").click()
        _shoot(page, "review")
        page.get_by_label("Plan name").fill("seed-plan")
        page.get_by_role("button", name="Purchase").click()
        page.get_by_role("heading", name="Training plan seed-plan").wait_for()
        _shoot(page, "plan")
        assert page.locator(".plan-line .segment").count() == 2
        assert "Pending" in page.locator("table", has_text="Invoice").first.inner_text()

        # In the list, and on the capacity timeline.
        page.get_by_role("link", name="Plans").click()
        row = page.locator("tr", has_text="seed-plan")
        assert "Pending" in row.inner_text()
        _shoot(page, "plans")
        page.get_by_role("link", name="Capacity").click()
        assert page.locator(".timeline .mark", has_text="seed-plan").count() == 2
        _shoot(page, "capacity")
        _sign_out(page)

        # The administrator approves the invoice.
        _sign_in(page, server, ADMIN)
        page.get_by_role("link", name="Admin").click()
        page.locator("tr", has_text="seed-plan").get_by_role("button", name="Approve").click()
        page.get_by_text("Invoice approved.").wait_for()
        _shoot(page, "admin")
        _sign_out(page)

        # A cluster whose worker group runs on the plan.
        _sign_in(page, server, team)
        page.get_by_role("link", name="Plans").click()
        assert "Scheduled" in page.locator("tr", has_text="seed-plan").inner_text()
        page.get_by_role("link", name="Clusters").click()
        page.get_by_role("link", name="Create a cluster").click()
        page.get_by_label("Cluster name").fill("seed-cluster")
        group = page.locator("fieldset", has_text="Instance group 1")
        group.get_by_label("Group name").fill("worker")
        group.get_by_label("Instance type").select_option(P5)
        group.get_by_label("Instance count").fill("16")
        capacity = group.get_by_label("Instance capacity")
        assert capacity.input_value() == ""  # on-demand by default
        choice = capacity.locator("option", has_text="seed-plan")
        capacity.select_option(choice.get_attribute("value"))
        _shoot(page, "cluster-new")
        page.get_by_role("button", name="Create cluster").click()
        page.get_by_role("heading", name="Cluster seed-cluster").wait_for()
        worker = page.locator("tr", has_text="worker")
        assert "seed-plan" in worker.inner_text() and "Scheduled" in worker.inner_text()
        _shoot(page, "cluster")

        # A training job's status and its log, followed while it runs.
        gate = tmp_path / "gate"
        server.sagemaker(team).create_training_job(**_job_request("console-job", gate))
        page.get_by_role("link", name="Training jobs").click()
        page.get_by_role("link", name="console-job").click()
        log = page.locator("#job-log")
        expect(log).to_contain_text("epoch 1")
        page.reload()  # the status as it is now that the job runs
        assert page.locator("#job-status").inner_text() == "InProgress"
        expect(log).to_contain_text("epoch 1")
        gate.touch()
        expect(log).to_contain_text("finished", timeout=60_000)  # followed live: no reload
        assert re.search(r"epoch 1.*\n.*epoch 2", log.inner_text())
        page.get_by_text("The job has ended").wait_for(timeout=60_000)
        page.reload()
        assert page.locator("#job-status").inner_text() == "Completed"
        page.get_by_text("The job has ended").wait_for()
        assert "not stored yet" not in page.locator("dl.facts").inner_text()  # the model is there
        _shoot(page, "training-job")
        _sign_out(page)
    assert "Traceback" not in server.log(), server.log()[-5000:]
