"""A plan group's plans in the console, over HTTP against an in-process server (issue 48, point 1).

The cluster's page shows each plan group's plans, the primary first and marked, each with its status,
whether it is active now, its capacity now and the nodes it serves; its add form offers only the plans
that could feed the group; a further plan is added and removed through the forms (what the service lists
afterwards is the proof), the primary's removal is refused with the service's message, and another
account's user can neither see nor change the group.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from hyperplan.services.clusters import group_plans
from hyperplan.services.orchestration import account_views
from hyperplan.signing import Credentials
from tests.console.test_console import Console
from tests.harness import wait_until
from tests.inprocess import InProcessServer

# The demo fleet has this type in one zone only: every plan of it may feed the same group.
P5E = "ml.p5e.48xlarge"
P5 = "ml.p5.48xlarge"
CLUSTER_TARGET = "hyperpod-cluster"


@dataclass(frozen=True)
class Plan:
    name: str
    arn: str
    start: datetime
    end: datetime


def _buy(
    server: InProcessServer,
    credentials: Credentials,
    name: str,
    count: int,
    *,
    instance_type: str = P5E,
    target: str = CLUSTER_TARGET,
    within: Plan | None = None,
) -> Plan:
    """A one-day plan, at the soonest start or in the window of `within` (overlapping it wholly)."""
    client = server.sagemaker(credentials)
    window = {"StartTimeAfter": within.start, "EndTimeBefore": within.end} if within else {}
    offering = client.search_training_plan_offerings(
        InstanceType=instance_type,
        InstanceCount=count,
        DurationHours=24,
        TargetResources=[target],
        **window,
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    plan = client.describe_training_plan(TrainingPlanName=name)
    return Plan(name, plan["TrainingPlanArn"], plan["StartTime"], plan["EndTime"])


def _signed_in(server: InProcessServer, credentials: Credentials) -> Console:
    console = Console(server)
    assert console.sign_in(credentials).status_code == 303
    return console


def _create_cluster(console: Console, cluster: str, primary: Plan, count: int) -> None:
    """Through the console's own form: a cluster whose group `worker` runs on `primary`."""
    console.get("/console/new-cluster")
    form = {
        "cluster_name": cluster,
        "group_1_name": "worker",
        "group_1_type": P5E,
        "group_1_count": str(count),
        "group_1_capacity": primary.arn,
    }
    created = console.post("/console/new-cluster", form)
    assert created.status_code == 303, created.text


def _plan_group(name: str, count: int, plan: Plan) -> dict[str, Any]:
    """A group on `plan` without lifecycle scripts (its nodes run nothing when created)."""
    return {
        "InstanceGroupName": name,
        "InstanceType": P5E,
        "InstanceCount": count,
        "ExecutionRole": "arn:aws:iam::123456789012:role/hyperpod",
        "TrainingPlanArn": plan.arn,
    }


def _add(console: Console, cluster: str, plan: str, group: str = "worker") -> Any:
    return console.post(f"/console/clusters/{cluster}/groups/{group}/plans", {"plan": plan})


def _remove(console: Console, cluster: str, plan: str, group: str = "worker") -> Any:
    return console.post(f"/console/clusters/{cluster}/groups/{group}/plans/remove", {"plan": plan})


def _listed(
    server: InProcessServer, credentials: Credentials, cluster: str, group: str = "worker"
) -> group_plans.GroupPlansView:
    """The group's plans as the service lists them (what the native API and the CLI show)."""
    assert server.runtime is not None
    runtime = server.runtime.context
    found = account_views.caller_for_key(runtime, credentials.access_key)
    assert found is not None
    return group_plans.list_plans(runtime, found[1], cluster, group)


def _names(view: group_plans.GroupPlansView) -> list[tuple[str, bool]]:
    return [(plan.name, plan.primary) for plan in view.plans]


def _section(page: str, group: str) -> str:
    found = re.search(rf'<section class="group-plans" id="plans-{group}".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment)).strip()


def _rows(section: str) -> list[tuple[str, ...]]:
    """Each plan's row as shown: name, role, status, active now, capacity now, nodes served."""
    rows = re.findall(r'<tr data-plan="[^"]+">(.*?)</tr>', section, re.S)
    return [tuple(_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[:6]) for row in rows]


def _offered(section: str) -> list[str]:
    """The plans the group's add form offers (their ARNs)."""
    select = re.search(r'<select id="plan-for-[^"]+" name="plan".*?</select>', section, re.S)
    return re.findall(r'<option value="([^"]+)"', select.group(0)) if select else []


def _removable(section: str) -> list[str]:
    """The plans a remove button is shown for (their ARNs)."""
    forms = re.findall(r'<form [^>]*class="remove-plan">(.*?)</form>', section, re.S)
    return [re.search(r'name="plan" value="([^"]+)"', form).group(1) for form in forms]  # type: ignore[union-attr]


def _totals(section: str) -> list[str]:
    """The footer's sums: capacity now, nodes served."""
    footer = re.search(r"<tfoot>(.*?)</tfoot>", section, re.S)
    assert footer, section
    return re.findall(r'<td class="number">(\d+)</td>', footer.group(1))


def _error(page: str, group: str = "worker") -> str:
    found = re.search(rf'<p class="error" role="alert" id="plan-for-{group}-error">(.*?)</p>', page, re.S)
    return _text(found.group(1)) if found else ""


@pytest.fixture
def team(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Credentials:
    """An account of this test's own (the plans' pool is the server's, shared by the module)."""
    name = "team-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return fast_shared_server.new_account(name)


def test_a_group_shows_its_primary_and_further_plans_with_what_each_serves(
    fast_server: InProcessServer,
) -> None:
    server = fast_server
    team = server.new_account("pair-team")
    first = _buy(server, team, "first", 2)
    second = _buy(server, team, "second", 2, within=first)
    # Three nodes on two plans of two: the figures differ from plan to plan. A failed node is kept as
    # it is (NodeRecovery None), so that a plan's capacity and the nodes it serves differ too, below.
    server.sagemaker(team).create_cluster(
        ClusterName="pair",
        InstanceGroups=[_plan_group("worker", 3, first)],
        NodeRecovery="None",
    )
    console = _signed_in(server, team)
    console.get("/console/clusters/pair")
    added = _add(console, "pair", second.arn)
    assert added.headers["location"] == "/console/clusters/pair?notice=plan-added#plans-worker"

    # Before the plans start: both shown, the primary first, nothing active, no capacity, no node.
    section = _section(console.get("/console/clusters/pair").text, "worker")
    assert _rows(section) == [
        ("first", "Primary", "Scheduled", "no", "0", "0"),
        ("second", "Further", "Scheduled", "no", "0", "0"),
    ]
    assert _removable(section) == [second.arn]  # the primary is never removed here

    # While both are Active the group runs its 3 nodes across them: the primary's 2, then 1 more.
    server.set_clock(first.start + timedelta(minutes=1))
    assert wait_until(lambda: _listed(server, team, "pair").running_count == 3), _listed(server, team, "pair")
    page = console.get("/console/clusters/pair").text
    section = _section(page, "worker")
    assert _rows(section) == [
        ("first", "Primary", "Active", "yes", "2", "2"),
        ("second", "Further", "Active", "yes", "1", "1"),
    ]
    assert "Group worker: 3 of 3 \N{MULTIPLICATION SIGN} ml.p5e.48xlarge running" in _text(section)
    assert _totals(section) == ["3", "3"]
    assert "and 1 more" in _text(page.split("<h2>Instance groups</h2>")[1].split("</table>")[0])

    # A node fails: its plan still holds its instance for the group, but the node serves no more.
    lost = next(iter(server.backend.world.nodes))
    server.backend.lose_node(lost, "host rebooted")
    assert server.runtime is not None
    server.runtime.context.wakes.nodes.notify()  # the watcher looks now, not at its next safety poll
    assert wait_until(lambda: _listed(server, team, "pair").running_count == 2), _listed(server, team, "pair")
    view = _listed(server, team, "pair")
    section = _section(console.get("/console/clusters/pair").text, "worker")
    assert _rows(section) == [
        (p.name, "Primary" if p.primary else "Further", p.status, "yes", str(p.capacity_now), str(p.serving))
        for p in view.plans
    ]
    assert [p.capacity_now for p in view.plans] == [2, 1] and sum(p.serving for p in view.plans) == 2
    assert _totals(section) == ["3", "2"]


def test_a_further_plan_is_added_and_removed_through_the_forms(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    primary = _buy(server, team, "adds-primary", 1)
    further = _buy(server, team, "adds-further", 1, within=primary)
    _buy(server, team, "adds-jobs", 1, target="training-job")  # for training jobs: never a group's
    _buy(server, team, "adds-p5", 1, instance_type=P5)  # another instance type
    console = _signed_in(server, team)
    _create_cluster(console, "adds", primary, 1)

    section = _section(console.get("/console/clusters/adds").text, "worker")
    assert _rows(section) == [("adds-primary", "Primary", "Scheduled", "no", "0", "0")]
    assert _offered(section) == [further.arn]  # not the group's own, nor another type's or target's

    added = _add(console, "adds", further.arn)
    assert added.status_code == 303
    assert _names(_listed(server, team, "adds")) == [("adds-primary", True), ("adds-further", False)]
    page = console.get(added.headers["location"]).text
    assert "Training plan added to the instance group." in page
    section = _section(page, "worker")
    assert [row[:2] for row in _rows(section)] == [("adds-primary", "Primary"), ("adds-further", "Further")]
    assert _offered(section) == [] and "No other plan of this account can feed this group" in section

    removed = _remove(console, "adds", further.arn)
    assert removed.headers["location"] == "/console/clusters/adds?notice=plan-removed#plans-worker"
    assert _names(_listed(server, team, "adds")) == [("adds-primary", True)]
    page = console.get(removed.headers["location"]).text
    assert "Training plan removed from the instance group." in page
    assert _offered(_section(page, "worker")) == [further.arn]  # offered again

    # A plan given by name works as its ARN does; a blank one is refused next to the form.
    assert _add(console, "adds", "adds-further").status_code == 303
    assert _names(_listed(server, team, "adds")) == [("adds-primary", True), ("adds-further", False)]
    blank = _add(console, "adds", "")
    assert blank.status_code == 400 and _error(blank.text) == "Training plan is required."


def test_the_primary_plans_removal_is_refused_with_the_services_message(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    primary = _buy(server, team, "keeps-primary", 1)
    further = _buy(server, team, "keeps-further", 1, within=primary)
    console = _signed_in(server, team)
    _create_cluster(console, "keeps", primary, 2)
    console.get("/console/clusters/keeps")
    assert _add(console, "keeps", further.arn).status_code == 303
    before = _listed(server, team, "keeps")

    refused = _remove(console, "keeps", primary.arn)
    assert refused.status_code == 400, refused.text
    message = _error(refused.text)
    assert "primary" in message.lower() and "keeps-primary" in message, message
    assert _listed(server, team, "keeps") == before  # nothing changed
    # The page still shows the group's plans, beside the message.
    assert [row[:2] for row in _rows(_section(refused.text, "worker"))] == [
        ("keeps-primary", "Primary"),
        ("keeps-further", "Further"),
    ]
    # A plan the group does not have is the service's refusal, on the page; a group the cluster lacks is a
    # page of its own (404); neither is a server error.
    missing = _remove(console, "keeps", "no-such-plan")
    assert missing.status_code == 400 and "no-such-plan" in _error(missing.text)
    absent = _add(console, "keeps", further.arn, group="nobody")
    assert absent.status_code == 404 and "has no instance group nobody" in absent.text
    assert _listed(server, team, "keeps") == before


def test_another_accounts_user_can_neither_see_nor_change_the_group(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    primary = _buy(server, team, "owned-primary", 1)
    further = _buy(server, team, "owned-further", 1, within=primary)
    owner = _signed_in(server, team)
    _create_cluster(owner, "owned", primary, 2)
    owner.get("/console/clusters/owned")
    assert _add(owner, "owned", further.arn).status_code == 303
    before = _listed(server, team, "owned")

    other = server.new_account("intruders")
    own = _buy(server, other, "intruders-plan", 1)
    intruder = _signed_in(server, other)
    _create_cluster(intruder, "intruders-cluster", own, 1)
    seen = intruder.get("/console/clusters/owned")
    assert seen.status_code == 404 and "owned-primary" not in seen.text and "owned-further" not in seen.text
    tries: list[tuple[str, dict[str, Any]]] = [
        ("/console/clusters/owned/groups/worker/plans", {"plan": own.arn}),
        ("/console/clusters/owned/groups/worker/plans/remove", {"plan": further.arn}),
        ("/console/clusters/owned/groups/worker/plans/remove", {"plan": primary.arn}),
    ]
    for path, form in tries:
        answer = intruder.post(path, form)
        assert answer.status_code == 404, (path, answer.status_code)
        assert "owned-further" not in answer.text and "owned-primary" not in answer.text
    assert _listed(server, team, "owned") == before

    # Nor may the other account feed its own group with the first one's plan: it is not offered, and
    # given by ARN it is refused as a plan that account does not have.
    section = _section(intruder.get("/console/clusters/intruders-cluster").text, "worker")
    assert further.arn not in _offered(section) and primary.arn not in _offered(section)
    refused = _add(intruder, "intruders-cluster", further.arn)
    assert refused.status_code == 400 and _error(refused.text), refused.text
    assert "owned-further" not in _error(refused.text).replace(further.arn, "")
    assert _names(_listed(server, other, "intruders-cluster")) == [("intruders-plan", True)]
    assert _listed(server, team, "owned") == before
