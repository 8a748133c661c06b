"""A plan's automatic extension policy in the console, over HTTP against an in-process server (issue 50,
point 2).

The plan's page has an "Automatic extension" panel: the policy in force (max days, max price and
currency) or none, a form that sets it, a button that turns it off, and the attempts made under it. What
the service reads back after each form is the proof that it worked; a refusal is the service's own
message next to its field, and writes nothing; another account's user gets a 404 for the page and both
forms, and changes nothing.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest

from hyperplan.console.web import utc_minute
from hyperplan.errors import ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views
from hyperplan.services.plans import extension_policy
from hyperplan.services.plans.extension_policy import TRYING, PolicyView
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.signing import Credentials
from tests.console.test_console import Console
from tests.harness import wait_until
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"


def _buy(server: InProcessServer, credentials: Credentials, name: str, days: int = 2) -> str:
    """A plan for clusters at the soonest start; its ARN."""
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24 * days, TargetResources=["hyperpod-cluster"]
    )["TrainingPlanOfferings"][0]
    created = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return str(created["TrainingPlanArn"])


def _signed_in(server: InProcessServer, credentials: Credentials) -> Console:
    console = Console(server)
    assert console.sign_in(credentials).status_code == 303
    return console


def _service(server: InProcessServer, credentials: Credentials) -> tuple[ServiceContext, Caller]:
    """The runtime and the caller the native API and the CLI would call the service with."""
    assert server.runtime is not None
    runtime = server.runtime.context
    found = account_views.caller_for_key(runtime, credentials.access_key)
    assert found is not None
    return runtime, found[1]


def _policy(server: InProcessServer, credentials: Credentials, plan: str) -> PolicyView | None:
    return extension_policy.get_policy(*_service(server, credentials), plan)


def _panel(page: str) -> str:
    found = re.search(r'<section class="extension-policy" id="extension-policy".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _facts(panel: str) -> dict[str, str]:
    """The policy's figures as shown: each term and its value."""
    pairs = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", panel, re.S)
    return {_text(term): _text(value) for term, value in pairs}


def _field_error(page: str, field: str) -> str:
    found = re.search(rf'<span class="error" id="{field}-error" role="alert">(.*?)</span>', page, re.S)
    return _text(found.group(1)) if found else ""


def _set(console: Console, plan: str, max_days: str, max_price: str = "") -> httpx.Response:
    return console.post(
        f"/console/plans/{plan}/extension-policy",
        {"policy_max_days": max_days, "policy_max_price": max_price},
    )


@pytest.fixture
def team(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Credentials:
    """An account of this test's own (the plans' pool is the server's, shared by the module)."""
    name = "team-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return fast_shared_server.new_account(name)


def test_the_panel_shows_a_policy_set_through_the_service(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "shown")
    console = _signed_in(server, team)
    panel = _panel(console.get("/console/plans/shown").text)
    assert "Policy: none" in _text(panel) and _facts(panel) == {}
    assert "extension-policy/off" not in panel  # nothing to turn off

    runtime, caller = _service(server, team)
    view = extension_policy.set_policy(runtime, caller, "shown", 3, Decimal("12345.5"))
    panel = _panel(console.get("/console/plans/shown").text)
    assert _facts(panel) == {
        "Extend by": "up to 3 days in all",
        "Max price": f"12,345.50 {view.currency} per extension",
        "Bought so far": "0 days",
    }
    assert "Policy: none" not in _text(panel) and "extension-policy/off" in panel
    # The form shows the policy in force, to be changed.
    assert re.search(r'name="policy_max_days" type="number" value="3"', panel), panel
    assert re.search(r'name="policy_max_price" type="text" value="12345.5', panel), panel
    assert "No attempt yet." in panel

    extension_policy.set_policy(runtime, caller, "shown", 1, None)
    facts = _facts(_panel(console.get("/console/plans/shown").text))
    assert facts["Extend by"] == "up to 1 day in all"
    assert facts["Max price"] == "no limit but the account's budget"


def test_the_form_sets_the_policy_and_the_off_button_clears_it(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    arn = _buy(server, team, "formed")
    console = _signed_in(server, team)
    console.get("/console/plans/formed")

    saved = _set(console, "formed", "5", "900.25")
    assert saved.status_code == 303, saved.text
    location = saved.headers["location"]
    assert location == "/console/plans/formed?notice=policy-set#extension-policy"
    view = _policy(server, team, arn)  # by ARN as by name: the same plan
    assert view is not None and (view.plan_name, view.max_days, view.max_price) == (
        "formed",
        5,
        Decimal("900.25"),
    )
    page = console.get(location).text
    assert "Automatic extension policy saved." in page
    assert _facts(_panel(page))["Max price"] == f"900.25 {view.currency} per extension"

    # Changed: no price limit now (a blank price).
    assert _set(console, "formed", "7").status_code == 303
    view = _policy(server, team, "formed")
    assert view is not None and (view.max_days, view.max_price) == (7, None)

    cleared = console.post("/console/plans/formed/extension-policy/off", {})
    assert cleared.headers["location"] == "/console/plans/formed?notice=policy-cleared#extension-policy"
    assert _policy(server, team, "formed") is None
    page = console.get(cleared.headers["location"]).text
    assert "Automatic extension turned off." in page and "Policy: none" in _text(_panel(page))


def test_a_bad_max_days_shows_the_services_message_and_writes_nothing(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "refused")
    runtime, caller = _service(server, team)
    extension_policy.set_policy(runtime, caller, "refused", 2, Decimal("500"))
    before = _policy(server, team, "refused")
    console = _signed_in(server, team)
    console.get("/console/plans/refused")

    for days in ("0", "183"):
        with pytest.raises(ValidationError) as refusal:
            extension_policy.set_policy(runtime, caller, "refused", int(days), None)
        answer = _set(console, "refused", days, "700")
        assert answer.status_code == 400, answer.text
        page = answer.text
        assert _field_error(page, "policy_max_days") == refusal.value.message
        panel = _panel(page)
        assert f'value="{days}"' in panel and 'value="700"' in panel  # what was typed, to correct it
        assert _facts(panel)["Extend by"] == "up to 2 days in all"  # the policy still in force
        assert _policy(server, team, "refused") == before

    # What is no number at all is the form's to refuse, next to its field.
    page = _set(console, "refused", "many").text
    assert _field_error(page, "policy_max_days") == "Max days must be a whole number of days."
    page = _set(console, "refused", "4", "cheap").text
    assert _field_error(page, "policy_max_price").startswith("Max price must be an amount")
    page = _set(console, "refused", "4", "NaN").text
    assert _field_error(page, "policy_max_price").startswith("Max price must be an amount")
    assert _policy(server, team, "refused") == before


def test_another_accounts_user_can_neither_see_nor_change_the_policy(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "guarded")
    runtime, caller = _service(server, team)
    extension_policy.set_policy(runtime, caller, "guarded", 4, Decimal("321"))
    before = _policy(server, team, "guarded")

    other = server.new_account("policy-intruders")
    _buy(server, other, "intruders-own")
    intruder = _signed_in(server, other)
    intruder.get("/console/plans/intruders-own")
    seen = intruder.get("/console/plans/guarded")
    assert seen.status_code == 404 and "321" not in seen.text
    for path, form in (
        ("/console/plans/guarded/extension-policy", {"policy_max_days": "9", "policy_max_price": ""}),
        ("/console/plans/guarded/extension-policy/off", {}),
    ):
        answer = intruder.post(path, form)
        assert answer.status_code == 404, (path, answer.status_code)
        assert "321" not in answer.text
    assert _policy(server, team, "guarded") == before


def test_the_attempts_made_at_the_reclaim_warnings_are_listed(fast_server: InProcessServer) -> None:
    server = fast_server
    team = server.new_account("attempts-team")
    arn = _buy(server, team, "tried")
    console = _signed_in(server, team)
    console.get("/console/plans/tried")
    assert _set(console, "tried", "1").status_code == 303
    assert _attempt_rows(_panel(console.get("/console/plans/tried").text)) == []

    # The first warning of the plan's only segment: 24 hours before its capacity is taken back.
    end = server.sagemaker(team).describe_training_plan(TrainingPlanName="tried")["EndTime"]
    server.set_clock(end - timedelta(minutes=30) - timedelta(hours=24) + timedelta(minutes=1))

    def finished() -> PolicyView | None:
        view = _policy(server, team, arn)
        return view if view and view.attempts and view.attempts[0].message != TRYING else None

    assert wait_until(lambda: finished() is not None, timeout=60), _policy(server, team, arn)
    view = finished()
    assert view is not None
    rows = _attempt_rows(_panel(console.get("/console/plans/tried").text))
    assert rows == [(utc_minute(a.at), "yes" if a.bought else "no", a.message) for a in view.attempts]
    assert len(rows) == 1 and "No attempt yet." not in console.get("/console/plans/tried").text


def _attempt_rows(panel: str) -> list[tuple[str, ...]]:
    """Each attempt as shown: its time, whether it bought, its message."""
    table = re.search(r'<table class="policy-attempts">.*?</table>', panel, re.S)
    if table is None:
        return []
    rows = re.findall(r"<tr>(<td>.*?)</tr>", table.group(0), re.S)
    return [tuple(_text(cell) for cell in re.findall(r"<td>(.*?)</td>", row, re.S)) for row in rows]
