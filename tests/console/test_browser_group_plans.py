"""A plan group's further plan added and removed in a real headless Chromium (issue 48, point 1).

As a user would: on the cluster's page, choose the plan in the group's "Add a plan" choice, add it, see it
beside the primary, then remove it with its own button (the primary has none).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.console.browser import browser_page, sign_in
from tests.inprocess import InProcessServer

pytestmark = pytest.mark.browser  # a part of its own (tests/parts.py)

P5E = "ml.p5e.48xlarge"  # in one zone of the demo fleet: its plans may feed one group
ROLE = "arn:aws:iam::123456789012:role/hyperpod"


def _buy(client: Any, name: str, **window: Any) -> str:
    offering = client.search_training_plan_offerings(
        InstanceType=P5E,
        InstanceCount=1,
        DurationHours=24,
        TargetResources=["hyperpod-cluster"],
        **window,
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return str(client.describe_training_plan(TrainingPlanName=name)["TrainingPlanArn"])


def test_a_further_plan_is_added_and_removed_in_the_browser(fast_server: InProcessServer) -> None:
    server = fast_server
    team = server.new_account("browser-team")
    client = server.sagemaker(team)
    primary = _buy(client, "primary-plan")
    described = client.describe_training_plan(TrainingPlanName="primary-plan")
    _buy(client, "further-plan", StartTimeAfter=described["StartTime"], EndTimeBefore=described["EndTime"])
    group = {
        "InstanceGroupName": "worker",
        "InstanceType": P5E,
        "InstanceCount": 2,
        "LifeCycleConfig": {"SourceS3Uri": "s3://lifecycle/src", "OnCreate": "on_create.sh"},
        "ExecutionRole": ROLE,
        "TrainingPlanArn": primary,
    }
    client.create_cluster(ClusterName="browsed", InstanceGroups=[group])
    with browser_page() as page:
        sign_in(page, server.url, team)
        page.goto(f"{server.url}/console/clusters/browsed")
        plans = page.locator("section#plans-worker")
        assert plans.get_by_role("button", name="Remove plan primary-plan from group worker").count() == 0
        choice = page.get_by_label("Add a plan to group worker")
        choice.select_option(label=choice.locator("option", has_text="further-plan").inner_text())
        plans.get_by_role("button", name="Add plan").click()
        page.get_by_text("Training plan added to the instance group.").wait_for()
        further = plans.locator("tr", has_text="further-plan")
        assert "Further" in further.inner_text()
        assert "Primary" in plans.locator("tr", has_text="primary-plan").inner_text()
        further.get_by_role("button", name="Remove plan further-plan from group worker").click()
        page.get_by_text("Training plan removed from the instance group.").wait_for()
        assert plans.locator("tr", has_text="further-plan").count() == 0
        assert (
            page.get_by_label("Add a plan to group worker").locator("option", has_text="further-plan").count()
        )
    assert "Traceback" not in server.log(), server.log()[-5000:]
