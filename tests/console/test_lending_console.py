"""A plan's lending policy in the console, over HTTP against an in-process server (issue 51, point 1).

The plan's page has a "Lending" panel: the mode and terms in force, what the plan lent (instances now,
instance-hours, reclaims, promises kept and broken, credits), a form that lends (blank values: the
fleet's defaults) and a button that stops. What the service reads back after each form is the proof that
it worked; a refusal is the service's own message next to its field, with what was typed (escaped), and
writes nothing; another account's user gets a 404 for the page and both forms, and changes nothing. The
owner sees counts; only an administrator sees the borrowers' runs.
"""

from __future__ import annotations

import html
import re

import httpx
import pytest

from hyperplan.errors import ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views
from hyperplan.services.plans import lending
from hyperplan.services.plans.lending import LendingView
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.signing import Credentials
from tests.console.test_console import Console
from tests.harness import ADMIN, service_now
from tests.inprocess import InProcessServer
from tests.server.test_lending_policy import _write_runs

P5 = "ml.p5.48xlarge"


def _buy(server: InProcessServer, credentials: Credentials, name: str) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
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


def _view(server: InProcessServer, credentials: Credentials, plan: str) -> LendingView:
    return lending.view(*_service(server, credentials), plan)


def _panel(page: str) -> str:
    found = re.search(r'<section class="lending" id="lending".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _facts(panel: str) -> dict[str, str]:
    pairs = re.findall(r"<dt>(.*?)</dt><dd>(.*?)</dd>", panel, re.S)
    return {_text(term): _text(value) for term, value in pairs}


def _field_error(page: str, field: str) -> str:
    found = re.search(rf'<span class="error" id="{field}-error" role="alert">(.*?)</span>', page, re.S)
    return _text(found.group(1)) if found else ""


def _lend(
    console: Console, plan: str, notice: str = "", min_run: str = "", margin: str = ""
) -> httpx.Response:
    return console.post(
        f"/console/plans/{plan}/lending",
        {"lending_notice": notice, "lending_min_run": min_run, "lending_margin": margin},
    )


NO_FIGURES = {
    "Lent now": "0 instances",
    "Lent instance-hours": "0.00",
    "Reclaims": "0",
    "Promises kept": "0",
    "Promises broken": "0",
    "Credited": "0.00 USD",
}


@pytest.fixture
def team(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Credentials:
    """An account of this test's own (the plans' pool is the server's, shared by the module)."""
    name = "lend-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return fast_shared_server.new_account(name)


def test_the_panel_shows_the_policy_set_through_the_service(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "shown")
    console = _signed_in(server, team)
    panel = _panel(console.get("/console/plans/shown").text)
    assert "Lending: none. This plan lends nothing." in _text(panel)
    assert _facts(panel) == NO_FIGURES
    assert "lending/off" not in panel  # nothing to stop
    assert 'placeholder="120"' in panel and 'placeholder="300"' in panel and 'placeholder="900"' in panel

    lending.set_policy(*_service(server, team), "shown", notice=45, min_run=0, stop_margin=1800)
    panel = _panel(console.get("/console/plans/shown").text)
    assert _facts(panel) == {
        "Lending": "idle instances",
        "Notice": "45 s",
        "Minimum run": "0 s",
        "Stop-lending margin": "1800 s",
        **NO_FIGURES,
    }
    assert "lending/off" in panel and "Lending: none" not in _text(panel)
    # The form shows the terms in force, to be changed.
    assert re.search(r'name="lending_notice" type="text" value="45"', panel), panel
    assert re.search(r'name="lending_margin" type="text" value="1800"', panel), panel


def test_the_form_lends_and_the_stop_button_stops(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    arn = _buy(server, team, "formed")
    console = _signed_in(server, team)
    console.get("/console/plans/formed")

    saved = _lend(console, "formed")  # every value blank: the fleet's defaults
    assert saved.status_code == 303, saved.text
    location = saved.headers["location"]
    assert location == "/console/plans/formed?notice=lending-set#lending"
    view = _view(server, team, arn)  # by ARN as by name: the same plan
    assert (view.mode, view.notice_seconds, view.min_run_seconds, view.stop_margin_seconds) == (
        "idle",
        120,
        300,
        900,
    )
    page = console.get(location).text
    assert "Lending saved: the plan lends its idle instances." in page
    assert _facts(_panel(page))["Notice"] == "120 s"

    assert _lend(console, "formed", "30", "60", "600").status_code == 303
    view = _view(server, team, "formed")
    assert (view.notice_seconds, view.min_run_seconds, view.stop_margin_seconds) == (30, 60, 600)

    stopped = console.post("/console/plans/formed/lending/off", {})
    assert stopped.headers["location"] == "/console/plans/formed?notice=lending-cleared#lending"
    assert _view(server, team, "formed").mode == "none"
    page = console.get(stopped.headers["location"]).text
    assert "Lending stopped: the plan lends nothing." in page
    assert "Lending: none" in _text(_panel(page))


def test_a_bad_value_shows_the_services_message_and_writes_nothing(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "refused")
    runtime, caller = _service(server, team)
    lending.set_policy(runtime, caller, "refused", notice=60)
    before = _view(server, team, "refused")
    console = _signed_in(server, team)
    console.get("/console/plans/refused")

    for field, values in (
        ("lending_notice", {"notice": 601}),
        ("lending_notice", {"notice": 0}),
        ("lending_min_run", {"min_run": 604_801}),
        ("lending_margin", {"stop_margin": 10**9}),
    ):
        with pytest.raises(ValidationError) as refusal:
            lending.set_policy(runtime, caller, "refused", **values)
        typed = str(next(iter(values.values())))
        form = {"lending_notice": "", "lending_min_run": "", "lending_margin": "", field: typed}
        answer = console.post("/console/plans/refused/lending", form)
        assert answer.status_code == 400, answer.text
        assert _field_error(answer.text, field) == refusal.value.message
        panel = _panel(answer.text)
        assert f'name="{field}" type="text" value="{typed}"' in panel  # what was typed, to correct it
        assert _facts(panel)["Notice"] == "60 s"  # the policy still in force
        assert _view(server, team, "refused") == before

    # What is no number is the form's to refuse, next to its field, shown back escaped.
    answer = _lend(console, "refused", notice="<b>soon</b>")
    assert _field_error(answer.text, "lending_notice") == "Notice must be a whole number of seconds."
    assert 'value="&lt;b&gt;soon&lt;/b&gt;"' in answer.text and "<b>soon</b>" not in answer.text
    assert _field_error(_lend(console, "refused", margin="-5").text, "lending_margin") == (
        "Margin must be a whole number of seconds."
    )
    assert _view(server, team, "refused") == before


def test_another_accounts_user_can_neither_see_nor_change_the_lending(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "guarded")
    lending.set_policy(*_service(server, team), "guarded", notice=321)
    before = _view(server, team, "guarded")

    other = server.new_account("lending-intruders")
    _buy(server, other, "intruders-own")
    intruder = _signed_in(server, other)
    intruder.get("/console/plans/intruders-own")
    seen = intruder.get("/console/plans/guarded")
    assert seen.status_code == 404 and "321" not in seen.text
    for path, form in (
        ("/console/plans/guarded/lending", {"lending_notice": "9"}),
        ("/console/plans/guarded/lending/off", {}),
    ):
        answer = intruder.post(path, form)
        assert answer.status_code == 404, (path, answer.status_code)
        assert "321" not in answer.text
    assert _view(server, team, "guarded") == before


def test_the_owner_sees_the_figures_and_an_administrator_the_runs(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "counted")
    _buy(server, ADMIN, "admins-counted")
    server.new_account("console-borrower")
    now = service_now(server)
    _write_runs(server, "counted", "console-borrower", now)
    _write_runs(server, "admins-counted", "console-borrower", now, job_name="borrowed-job-2")
    figures = {
        "Lent now": "4 instances",
        "Lent instance-hours": "7.50",
        "Reclaims": "3",
        "Promises kept": "1",
        "Promises broken": "2",
        "Credited": "2.05 USD",
    }

    panel = _panel(_signed_in(server, team).get("/console/plans/counted").text)
    assert _facts(panel) == figures  # lending "none": no terms, the figures of its past loans
    assert "lending-runs" not in panel
    assert "borrowed-job" not in panel and "console-borrower" not in panel  # counts only

    panel = _panel(_signed_in(server, ADMIN).get("/console/plans/admins-counted").text)
    assert _facts(panel) == figures
    rows = re.findall(r"<tr>(<td.*?)</tr>", panel, re.S)
    cells = [[_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]
    assert [(c[0], c[1], c[2], c[5], c[6], c[7]) for c in cells] == [
        ("borrowed-job-2", "console-borrower", "1", "owner-job", "120", ""),
        ("borrowed-job-2", "console-borrower", "3", "", "", ""),
        ("borrowed-job-2", "console-borrower", "1", "owner-job", "120", "200"),
        ("borrowed-job-2", "console-borrower", "1", "owner-job", "120", "100"),
        ("borrowed-job-2", "console-borrower", "2", "", "", ""),
    ]
