"""Reclaim warnings with extension prices at the account's lead times, delivered signed, and a plan's
extension policy buying (or saying why not) at its last segment's first warning (issue 50, points 1-2).

In-process servers on the manual clock (tests/inprocess.py); a real webhook receiver on loopback."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.services.webhooks.webhooks import verify
from hyperplan.signing import Credentials
from tests.harness import Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_webhooks import FAST_RETRIES, Receiver, receivers

__all__ = ["receivers"]  # the fixture, used by name

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"
RECLAIM_LEAD = timedelta(minutes=30)  # the fleet's default for every target
MINUTE = timedelta(minutes=1)


@pytest.fixture
def small(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Server:
    return fast_server_factory(data_dir=tmp_path / "small", fleet=SMALL_FLEET, env=FAST_RETRIES).start()


def _buy(
    server: Server, credentials: Credentials, name: str, count: int = 4, **window: Any
) -> dict[str, Any]:
    client = server.sagemaker(credentials)
    request = {"InstanceType": P5, "InstanceCount": count, "DurationHours": 48, **window}
    offering = client.search_training_plan_offerings(TargetResources=["training-job"], **request)
    offering_id = offering["TrainingPlanOfferings"][0]["TrainingPlanOfferingId"]
    client.create_training_plan(TrainingPlanName=name, TrainingPlanOfferingId=offering_id)
    return dict(client.describe_training_plan(TrainingPlanName=name))


def _events(server: Server, account: str, plan: str, kind: str) -> list[dict[str, Any]]:
    found = server.native().get(f"/api/v1/plans/{plan}/events", account=account)["Events"]
    return [e for e in found if e["Kind"] == kind]


def _warnings(server: Server, account: str, plan: str) -> list[str]:
    return [e["Message"] for e in _events(server, account, plan, "reclaim-warning")]


def _refused(call: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def _when(at: datetime) -> str:
    return f"{at:%Y-%m-%d %H:%M} UTC"


def test_warnings_arrive_at_24_and_1_hours_with_prices_and_are_delivered_signed(
    small: Server, receivers: Callable[..., Receiver]
) -> None:
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    team = small.new_account("team")
    receiver = receivers()
    secret = small.native().post("/api/v1/webhooks", {"Account": "team", "Url": receiver.url})["Secret"]
    plan = _buy(small, team, "soft", StartTimeAfter=start)
    reclaim = plan["EndTime"] - RECLAIM_LEAD
    client = small.sagemaker(team)
    for lead, sent_before in ((timedelta(hours=24), 0), (timedelta(hours=1), 1)):
        small.set_clock(reclaim - lead - MINUTE)
        assert len(_warnings(small, "team", "soft")) == sent_before  # not before its lead time
        small.set_clock(reclaim - lead + MINUTE)
        warnings = _warnings(small, "team", "soft")
        assert len(warnings) == sent_before + 1
        message = warnings[-1]
        hours = int(lead / timedelta(hours=1))
        assert f"ends at {_when(plan['EndTime'])}" in message
        assert f"taken back at {_when(reclaim)} (in {hours} h)" in message
        for days in (1, 2, 7):  # the prices a search with the plan's ARN gives now
            [offer] = client.search_training_plan_offerings(
                TrainingPlanArn=plan["TrainingPlanArn"], DurationHours=24 * days
            )["TrainingPlanExtensionOfferings"]
            label = "1 day" if days == 1 else f"{days} days"
            assert f"{label} {Decimal(offer['UpfrontFee']):.2f} USD" in message
        assert f"search-training-plan-offerings --training-plan-arn {plan['TrainingPlanArn']}" in message
        assert "tpeo-" not in message  # no offering id: they expire in 30 minutes

    def delivered() -> list[Any]:
        found = [r for r in receiver.accepted() if r.json["Kind"] == "reclaim-warning"]
        return found if len(found) == 2 else []

    deliveries = wait_until(delivered, timeout=30)
    assert deliveries
    assert [d.json["Message"] for d in deliveries] == _warnings(small, "team", "soft")
    for delivery in deliveries:
        assert verify(secret, delivery.body, delivery.headers["X-Hyperplan-Signature"])
        assert delivery.headers["X-Hyperplan-Event"] == "reclaim-warning"


def test_a_segment_before_the_last_names_the_next_segments_start(small: Server) -> None:
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    blocker, team = small.new_account("blocker"), small.new_account("team")
    window = {"StartTimeAfter": start + timedelta(days=1), "EndTimeBefore": start + timedelta(days=3)}
    _buy(small, blocker, "block", count=8, **window)
    plan = _buy(small, team, "split", count=8, StartTimeAfter=start, EndTimeBefore=start + timedelta(days=4))
    first, second = plan["ReservedCapacitySummaries"]
    small.set_clock(first["EndTime"] - RECLAIM_LEAD - timedelta(hours=1) + MINUTE)
    [one_hour, *_] = reversed(_warnings(small, "team", "split"))
    assert f"Segment 1 of plan split ends at {_when(first['EndTime'])}" in one_hour
    assert f"next segment starts at {_when(second['StartTime'])}" in one_hour
    assert "Extensions" not in one_hour and "search-training-plan-offerings" not in one_hour


def _set_budget(server: Server, account: str, budget: str) -> None:
    server.native().call("PATCH", f"/api/v1/accounts/{account}", body={"Budget": budget})


def _first_warning(server: Server, plan: dict[str, Any]) -> None:
    server.set_clock(plan["EndTime"] - RECLAIM_LEAD - timedelta(hours=24) + MINUTE)


def test_a_policy_within_budget_extends_the_plan_at_the_first_warning(small: Server) -> None:
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    team = small.new_account("payer", PaymentMode="budget")
    _set_budget(small, "payer", "20000.00")
    plan = _buy(small, team, "grow", StartTimeAfter=start)
    policy = small.native(team).call(
        "PUT", "/api/v1/training-plans/grow/extension-policy", body={"MaxDays": 2}
    )
    assert (policy["MaxDays"], policy["MaxPrice"], policy["Attempts"]) == (2, None, [])
    _first_warning(small, plan)
    after = small.sagemaker(team).describe_training_plan(TrainingPlanName="grow")
    assert after["EndTime"] == plan["EndTime"] + timedelta(days=2)
    [extension] = small.sagemaker(team).describe_training_plan_extension_history(
        TrainingPlanArn=plan["TrainingPlanArn"]
    )["TrainingPlanExtensions"]
    assert (extension["DurationHours"], extension["PaymentStatus"]) == (48, "Paid")
    fee = Decimal(extension["UpfrontFee"])
    lines = small.native().get("/api/v1/accounts/payer/ledger")["Entries"]
    assert Decimal(lines[-1]["Amount"]) == -fee
    [attempt] = small.native(team).get("/api/v1/training-plans/grow/extension-policy")["Attempts"]
    assert attempt["Bought"] is True
    assert f"bought 2 days for {fee:.2f} USD" in attempt["Message"]
    assert f"now ends at {_when(after['EndTime'])}" in attempt["Message"]
    assert attempt["Message"] in [e["Message"] for e in _events(small, "payer", "grow", "extension-policy")]
    # MaxDays is spent: the new end's warnings come, and the policy buys nothing more
    _first_warning(small, dict(after))
    assert (
        small.sagemaker(team).describe_training_plan(TrainingPlanName="grow")["EndTime"] == after["EndTime"]
    )
    assert len(_warnings(small, "payer", "grow")) == 2


@pytest.mark.parametrize(
    ("mode", "budget", "max_price", "why"),
    [
        ("budget", "100.00", None, "over the account's budget of 100.00 USD"),
        ("auto", None, "10.00", "over MaxPrice 10.00 USD"),
    ],
)
def test_a_policy_over_its_limits_buys_nothing_and_says_why(
    small: Server, mode: str, budget: str | None, max_price: str | None, why: str
) -> None:
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    team = small.new_account("short", PaymentMode=mode)
    if budget is not None:
        _set_budget(small, "short", "20000.00")  # the plan itself is paid
    plan = _buy(small, team, "stay", StartTimeAfter=start)
    if budget is not None:
        _set_budget(small, "short", budget)  # and then too little is left for any extension
    ledger_before = small.native().get("/api/v1/accounts/short/ledger")["Entries"]
    body: dict[str, Any] = {"MaxDays": 7} | ({"MaxPrice": max_price} if max_price else {})
    small.native(team).call("PUT", "/api/v1/training-plans/stay/extension-policy", body=body)
    _first_warning(small, plan)
    assert small.sagemaker(team).describe_training_plan(TrainingPlanName="stay")["EndTime"] == plan["EndTime"]
    [attempt] = small.native(team).get("/api/v1/training-plans/stay/extension-policy")["Attempts"]
    assert attempt["Bought"] is False and why in attempt["Message"]
    assert re.search(r"the cheapest, 1 day, costs \d+\.\d\d USD", attempt["Message"])
    assert small.native().get("/api/v1/accounts/short/ledger")["Entries"] == ledger_before
    # tried again at the next lead time (1 hour), with the same outcome
    small.set_clock(plan["EndTime"] - RECLAIM_LEAD - timedelta(hours=1) + MINUTE)
    attempts = small.native(team).get("/api/v1/training-plans/stay/extension-policy")["Attempts"]
    assert len(attempts) == 2 and not attempts[0]["Bought"]


def test_the_accounts_lead_times_are_followed_and_bad_values_refused(small: Server) -> None:
    start = boundary_after(service_now(small) + timedelta(minutes=30))
    team = small.new_account("leads")
    plan = _buy(small, team, "lead", StartTimeAfter=start + timedelta(days=3))
    answer = small.cli("accounts", "update", "leads", "--reclaim-warning-hours", "2,48", "--json").stdout
    assert json.loads(answer)["ReclaimWarningHours"] == [48, 2]
    reclaim = plan["EndTime"] - RECLAIM_LEAD
    small.set_clock(reclaim - timedelta(hours=48) - MINUTE)
    assert _warnings(small, "leads", "lead") == []
    small.set_clock(reclaim - timedelta(hours=24) + MINUTE)
    [at_48] = _warnings(small, "leads", "lead")
    assert "(in 48 h)" in at_48
    small.set_clock(reclaim - timedelta(hours=1) + MINUTE)
    assert ["(in 2 h)" in m for m in _warnings(small, "leads", "lead")] == [False, True]

    bad_values: list[tuple[object, str]] = [([0], "not 0"), ([169], "not 169"), ("24", "list")]
    for bad, named in [*bad_values, (list(range(1, 10)), "at most 8")]:
        body = {"Budget": "5.00", "ReclaimWarningHours": bad}
        error = _refused(partial(small.native().call, "PATCH", "/api/v1/accounts/leads", body=body))
        assert error.status == 400 and "ReclaimWarningHours" in error.message and named in error.message
    account = small.native().call("PATCH", "/api/v1/accounts/leads", body={})
    assert (Decimal(account["Budget"]), account["ReclaimWarningHours"]) == (0, [48, 2])  # nothing written


def test_policy_refusals_name_the_member_and_other_accounts_cannot_touch_it(small: Server) -> None:
    team, other = small.new_account("owner"), small.new_account("other")
    _buy(small, team, "mine", StartTimeAfter=boundary_after(service_now(small) + timedelta(hours=1)))
    path = "/api/v1/training-plans/mine/extension-policy"
    for body, named in (
        ({"MaxDays": 0}, "MaxDays"),
        ({"MaxDays": 183}, "MaxDays"),
        ({"MaxDays": 2, "MaxPrice": "0"}, "MaxPrice"),
        ({"MaxDays": 2, "MaxPrice": "-1"}, "MaxPrice"),
        ({"MaxDays": 2, "MaxPrice": 5}, "MaxPrice"),
    ):
        error = _refused(partial(small.native(team).call, "PUT", path, body=body))
        assert error.status == 400 and named in error.message, error.message
    assert _refused(lambda: small.native(team).get(path)).code == "ResourceNotFound"  # nothing written
    small.native(team).call("PUT", path, body={"MaxDays": 3, "MaxPrice": "99999.00"})
    for method in ("GET", "PUT", "DELETE"):
        given = {"MaxDays": 1} if method == "PUT" else None
        error = _refused(partial(small.native(other).call, method, path, body=given))
        assert error.code == "ResourceNotFound" and "mine" in error.message, (method, error.message)
    assert small.native(team).get(path)["MaxDays"] == 3
    shown = small.cli("plans", "auto-extend", "mine", credentials=team).stdout
    assert "mine: up to 3 days in all, each at most 99999.00 USD; 0 bought so far." in shown
    small.cli("plans", "auto-extend", "mine", "--off", credentials=team)
    assert _refused(lambda: small.native(team).get(path)).code == "ResourceNotFound"
