"""The cancellation policy in the console, and a plan's capacity returned from its page (issue 53), over
HTTP against an in-process server.

Each offering of a search, the review page and the plan's page say the policy of the pool; under
`strict` (a fleet file without [cancellation]) they say no return is possible and the plan's page has no
return form. On the demo fleet (`flexible`) the plan's "Return capacity" panel asks for a quote, shows
it (what goes back, what the plan keeps, the refund), and its confirm button carries it out: what
DescribeTrainingPlan and the ledger say afterwards is the proof. A used quote is refused with the
service's words; another account's user gets a 404 and changes nothing.
"""

from __future__ import annotations

import html
import re
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from hyperplan.core.cancellation_words import policy_words
from hyperplan.core.returns import Scope
from hyperplan.errors import ValidationError
from hyperplan.services.accounts.accounts import Caller
from hyperplan.services.orchestration import account_views
from hyperplan.services.plans import returns
from hyperplan.services.runtime.context import ServiceContext
from hyperplan.signing import Credentials
from tests.console.test_console import Console
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"
STRICT_WORDS = "No returns (strict: as SageMaker, plans are final)"
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"  # no [cancellation]: strict


def _now(server: InProcessServer) -> datetime:
    assert server.runtime is not None
    return server.runtime.context.clock.now()


def _buy(server: InProcessServer, credentials: Credentials, name: str, count: int = 2) -> dict[str, Any]:
    """A 2-day plan starting at least 10 days from now (every tier of `flexible` still ahead); the plan
    as DescribeTrainingPlan answers it."""
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=count,
        DurationHours=48,
        TargetResources=["training-job"],
        StartTimeAfter=_now(server) + timedelta(days=10),
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return dict(client.describe_training_plan(TrainingPlanName=name))


def _signed_in(server: InProcessServer, credentials: Credentials) -> Console:
    console = Console(server)
    assert console.sign_in(credentials).status_code == 303
    return console


def _service(server: InProcessServer, credentials: Credentials) -> tuple[ServiceContext, Caller]:
    assert server.runtime is not None
    runtime = server.runtime.context
    found = account_views.caller_for_key(runtime, credentials.access_key)
    assert found is not None
    return runtime, found[1]


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def _returns_panel(page: str) -> str:
    found = re.search(r'<section class="returns" id="returns".*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _facts(fragment: str) -> dict[str, str]:
    pairs = re.findall(r"<dt>(.*?)</dt><dd[^>]*>(.*?)</dd>", fragment, re.S)
    return {_text(term): _text(value) for term, value in pairs}


def _money(amount: str, currency: str) -> str:
    return f"{Decimal(amount):,.2f} {currency}"


def _quote_id(page: str) -> str:
    found = re.search(r'<input type="hidden" name="quote_id" value="(rq-[0-9a-f]+)">', page)
    assert found, page
    return found.group(1)


def _field_error(page: str, field: str) -> str:
    found = re.search(rf'<span class="error" id="{field}-error" role="alert">(.*?)</span>', page, re.S)
    return _text(found.group(1)) if found else ""


def _search(console: Console, count: int = 2) -> str:
    console.get("/console/offerings")
    answer = console.post(
        "/console/offerings",
        {"target": "training-job", "instance_type": P5, "instance_count": str(count), "duration_days": "2"},
    )
    assert answer.status_code == 200, answer.text
    return answer.text


@pytest.fixture
def team(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Credentials:
    name = "ret-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return fast_shared_server.new_account(name)


def test_offerings_review_and_the_plan_page_say_the_pools_policy(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    runtime, _ = _service(server, team)
    console = _signed_in(server, team)
    page = _search(console)
    offerings = re.findall(r'<li class="offering">.*?</li>', page, re.S)
    assert offerings, page
    for offering in offerings:
        zone = re.search(r'<td class="name">([a-z0-9-]+)</td>', offering)
        assert zone, offering
        expected = policy_words(runtime.fleet.cancellation_for(P5, zone.group(1)))
        assert _facts(offering)["Returns"] == expected
        assert expected.startswith("Full refund up to 7 days before a segment starts")  # the demo's flexible

    offering_id = re.search(r'name="offering_id" value="([^"]+)"', page)
    assert offering_id
    review = console.post("/console/offerings/review", {"offering_id": offering_id.group(1)}).text
    assert _facts(review)["Returns"].startswith("Full refund up to 7 days")

    plan = _buy(server, team, "shown-policy")
    zone = plan["ReservedCapacitySummaries"][0]["AvailabilityZone"]
    page = console.get("/console/plans/shown-policy").text
    words = policy_words(runtime.fleet.cancellation_for(P5, zone))
    assert _facts(page)["Returns"] == words
    panel = _returns_panel(page)
    assert f"Cancellation policy: {words}." in _text(panel)
    assert 'action="/console/plans/shown-policy/return-quote"' in panel


def test_a_quote_then_its_confirmation_returns_the_whole_plan_for_a_full_refund(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    plan = _buy(server, team, "whole")
    fee, currency = plan["UpfrontFee"], plan["CurrencyCode"]
    console = _signed_in(server, team)
    console.get("/console/plans/whole")

    quoted = console.post("/console/plans/whole/return-quote", {"return_scope": "plan"})
    assert quoted.status_code == 200, quoted.text
    panel = _returns_panel(quoted.text)
    facts = _facts(re.search(r'<dl class="facts quote">.*?</dl>', panel, re.S).group(0))  # type: ignore[union-attr]
    assert facts["Refund"] == _money(fee, currency)  # 10 days ahead: every tier met, all of it
    returned = re.search(r'<table class="returned-windows">.*?</table>', panel, re.S)
    assert returned and f"2 \N{MULTIPLICATION SIGN} {P5}" in _text(returned.group(0))
    assert "None: the plan keeps nothing." in panel
    # Nothing has changed yet: the quote is only a promise.
    assert server.sagemaker(team).describe_training_plan(TrainingPlanName="whole")["Status"] == plan["Status"]

    quote_id = _quote_id(panel)
    done = console.post("/console/plans/whole/return", {"quote_id": quote_id})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/console/plans/whole?notice=returned#returns"
    after = server.sagemaker(team).describe_training_plan(TrainingPlanName="whole")
    assert after["Status"] == "Expired" and after["UpfrontFee"] == fee  # what was paid stays shown
    assert "Capacity returned" in console.get(done.headers["location"]).text
    ledger = server.native().get(f"/api/v1/accounts/{_service(server, team)[1].account_id}/ledger")
    assert any(Decimal(entry["Amount"]) == Decimal(fee) for entry in ledger["Entries"]), ledger

    # The same quote again: used, refused in the service's words, and nothing moves.
    again = console.post("/console/plans/whole/return", {"quote_id": quote_id})
    assert again.status_code == 400, again.text
    panel = _returns_panel(again.text)
    assert f"Return quote {quote_id} was already used" in _text(panel)
    assert "nothing is left to return" in _text(panel) and "return-quote" not in panel  # Expired now


def test_some_instances_of_a_segment_leave_it_smaller(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    plan = _buy(server, team, "fewer", count=2)
    console = _signed_in(server, team)
    console.get("/console/plans/fewer")
    quoted = console.post(
        "/console/plans/fewer/return-quote",
        {"return_scope": "instances", "return_segment": "1", "return_instances": "1"},
    )
    assert quoted.status_code == 200, quoted.text
    kept = re.search(r'<table class="kept-segments">.*?</table>', quoted.text, re.S)
    assert kept and f"1 \N{MULTIPLICATION SIGN} {P5}" in _text(kept.group(0))
    assert (
        console.post("/console/plans/fewer/return", {"quote_id": _quote_id(quoted.text)}).status_code == 303
    )
    after = server.sagemaker(team).describe_training_plan(TrainingPlanName="fewer")
    first = after["ReservedCapacitySummaries"][0]
    assert first["TotalInstanceCount"] == plan["ReservedCapacitySummaries"][0]["TotalInstanceCount"] - 1
    assert after["UpfrontFee"] == plan["UpfrontFee"]


def test_refusals_are_shown_next_to_their_field_and_quote_nothing(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "refusals")
    runtime, caller = _service(server, team)
    console = _signed_in(server, team)
    console.get("/console/plans/refusals")

    page = console.post("/console/plans/refusals/return-quote", {"return_scope": "segment"}).text
    assert _field_error(page, "return_segment") == "Segment is required."
    page = console.post(
        "/console/plans/refusals/return-quote",
        {"return_scope": "instances", "return_segment": "1", "return_instances": "many"},
    ).text
    assert _field_error(page, "return_instances") == "Instances must be a whole number of at least 1."
    # What was typed comes back escaped, to be corrected.
    typed = '<b>"soon"</b>'
    page = console.post(
        "/console/plans/refusals/return-quote",
        {"return_scope": "tail", "return_segment": "1", "return_from": typed},
    ).text
    assert typed not in page and 'value="&lt;b&gt;&#34;soon&#34;&lt;/b&gt;"' in page
    assert _field_error(page, "return_from").startswith("From:")

    # A count the service refuses: its own message, on the page, and no quote.
    with pytest.raises(ValidationError) as refusal:
        returns.quote(runtime, caller, "refusals", Scope("instances", ordinal=1, instances=99))
    answer = console.post(
        "/console/plans/refusals/return-quote",
        {"return_scope": "instances", "return_segment": "1", "return_instances": "99"},
    )
    assert answer.status_code == 400
    assert refusal.value.message in _text(_returns_panel(answer.text))
    assert 'name="quote_id"' not in answer.text
    # The form's own choices are the only scopes.
    page = console.post("/console/plans/refusals/return-quote", {"return_scope": "everything"}).text
    assert _field_error(page, "return_scope").startswith("Choose what to return")


def test_another_accounts_user_can_neither_quote_nor_return(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    plan = _buy(server, team, "guarded-return")
    runtime, caller = _service(server, team)
    quoted = returns.quote(runtime, caller, "guarded-return", Scope("plan"))

    intruder = _signed_in(server, server.new_account("return-intruders"))
    intruder.get("/console/plans")
    for path, form in (
        ("/console/plans/guarded-return/return-quote", {"return_scope": "plan"}),
        ("/console/plans/guarded-return/return", {"quote_id": quoted.quote_id}),
    ):
        answer = intruder.post(path, form)
        assert answer.status_code == 404, (path, answer.status_code)
    after = server.sagemaker(team).describe_training_plan(TrainingPlanName="guarded-return")
    assert after["ReservedCapacitySummaries"] == plan["ReservedCapacitySummaries"]


def test_under_strict_offerings_and_plans_say_no_returns_and_the_form_is_gone(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    server = fast_server_factory(data_dir=tmp_path / "strict", fleet=SMALL_FLEET).start()
    team = server.new_account("strict-team")
    console = _signed_in(server, team)
    page = _search(console)
    offerings = re.findall(r'<li class="offering">.*?</li>', page, re.S)
    assert offerings and all(_facts(o)["Returns"] == STRICT_WORDS for o in offerings)

    _buy(server, team, "final")
    page = console.get("/console/plans/final").text
    assert _facts(page)["Returns"] == STRICT_WORDS
    panel = _returns_panel(page)
    assert "return-quote" not in panel and "This plan cannot be returned" in _text(panel)
    # A hand-made request is refused by the service, naming the policy.
    answer = console.post("/console/plans/final/return-quote", {"return_scope": "plan"})
    assert answer.status_code == 400
    assert "strict" in _text(_returns_panel(answer.text))
