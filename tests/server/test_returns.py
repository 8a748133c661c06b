"""Plans that can be returned (issue 53): a quote, then its return. The capacity is free in the calendar at
once, the plan's reserved capacities shrink on the wire while its fee stays what was paid, the refund is
what the policy says at that instant (the manual clock moves across each threshold), the ledger and the
budget follow, a stale or used quote is refused, a strict fleet refuses every quote, and a job on a
segment that now ends earlier is taken back as at any segment's end.

In-process servers over the fake back end (tests/inprocess.py): these are rules, spoken over real HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import ADMIN, Server, boundary_after, service_now, wait_until
from tests.inprocess import InProcessServer
from tests.server.test_jobs import JOB_PERIODS, _describe, _make_dataset, _sleeper, _wait_status

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
P5 = "ml.p5.48xlarge"
FULL_POOL = 8  # us-west-2a's p5s: only that pool holds 8, so a search for 8 shows what it has free
FLEXIBLE = '\n[cancellation]\npreset = "flexible"\nresale_discount = 0.25\n'


@pytest.fixture
def flexible(fast_server_factory: type[InProcessServer], tmp_path: Path) -> Iterator[InProcessServer]:
    """The small fleet under the flexible policy: full refund 7 days ahead, half up to the start; what
    only returned capacity can give is offered a quarter off."""
    fleet = tmp_path / "flexible.toml"
    fleet.write_text(SMALL_FLEET.read_text() + FLEXIBLE)
    server = fast_server_factory(data_dir=tmp_path / "flexible", fleet=fleet, env=JOB_PERIODS)
    yield server.start()
    assert "Traceback" not in server.log(), server.log()[-5000:]


@pytest.fixture
def strict(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    """The small fleet as it is: no [cancellation], so strict."""
    return fast_server_factory(data_dir=tmp_path / "strict", fleet=SMALL_FLEET).start()


# -- helpers -------------------------------------------------------------------------------------------


def _buy(
    server: Server, credentials: Credentials, name: str, count: int, start: datetime, days: int
) -> dict[str, Any]:
    """A plan of `count` p5s for `days` days from `start` (a boundary); DescribeTrainingPlan's answer."""
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5,
        InstanceCount=count,
        DurationHours=24 * days,
        TargetResources=["training-job"],
        StartTimeAfter=start,
        EndTimeBefore=start + timedelta(days=days),
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    plan = dict(client.describe_training_plan(TrainingPlanName=name))
    assert plan["StartTime"] == start, plan
    return plan


def _found(server: Server, credentials: Credentials, count: int, start: datetime, days: int) -> int:
    """How many offerings a search of another account finds for `count` p5s in [start, start + days)."""
    return len(
        server.sagemaker(credentials).search_training_plan_offerings(
            InstanceType=P5,
            InstanceCount=count,
            DurationHours=24 * days,
            TargetResources=["training-job"],
            StartTimeAfter=start,
            EndTimeBefore=start + timedelta(days=days),
        )["TrainingPlanOfferings"]
    )


def _quote(server: Server, credentials: Credentials, plan: str, **scope: Any) -> dict[str, Any]:
    return dict(server.native(credentials).post(f"/api/v1/training-plans/{plan}/return-quotes", scope))


def _return(server: Server, credentials: Credentials, quote_id: str) -> dict[str, Any]:
    return dict(server.native(credentials).post(f"/api/v1/return-quotes/{quote_id}/return"))


def _refused(call: Any, code: str, *words: str) -> str:
    with pytest.raises(ApiError) as refused:
        call()
    assert refused.value.code == code, (refused.value.code, refused.value.message)
    assert all(word in refused.value.message for word in words), (words, refused.value.message)
    return str(refused.value.message)


def _window(start: datetime, end: datetime, count: int, zone: str) -> dict[str, Any]:
    return {
        "InstanceType": P5,
        "AvailabilityZone": zone,
        "StartTime": start.isoformat().replace("+00:00", "Z"),
        "EndTime": end.isoformat().replace("+00:00", "Z"),
        "InstanceCount": count,
    }


def _ledger(server: Server, account: str) -> list[dict[str, Any]]:
    return list(server.native().get(f"/api/v1/accounts/{account}/ledger")["Entries"])


def _summaries(server: Server, credentials: Credentials, plan: str) -> list[tuple[datetime, datetime, int]]:
    described = server.sagemaker(credentials).describe_training_plan(TrainingPlanName=plan)
    return [
        (s["StartTime"], s["EndTime"], s["TotalInstanceCount"])
        for s in described["ReservedCapacitySummaries"]
    ]


# -- tests ---------------------------------------------------------------------------------------------


def test_a_whole_plan_returned_8_days_ahead_refunds_all_and_its_capacity_is_free_at_once(
    flexible: InProcessServer,
) -> None:
    team, other = flexible.new_account("team"), flexible.new_account("other")
    now = service_now(flexible)
    start = boundary_after(now + timedelta(days=8))
    plan = _buy(flexible, team, "whole", FULL_POOL, start, 1)
    fee = Decimal(plan["UpfrontFee"])
    assert _found(flexible, other, FULL_POOL, start, 1) == 0  # the pool is taken

    quote = _quote(flexible, team, "whole")
    assert quote["QuoteId"].startswith("rq-")
    assert datetime.fromisoformat(quote["ValidUntil"]) == now + timedelta(minutes=10)
    assert quote["Returned"] == [_window(start, start + timedelta(days=1), FULL_POOL, "us-west-2a")]
    assert quote["Segments"] == []
    assert (Decimal(quote["Refund"]), quote["CurrencyCode"]) == (fee, "USD")
    assert quote["Policy"]["Name"] == "flexible" and "Full refund" in quote["Policy"]["Description"]

    done = _return(flexible, team, quote["QuoteId"])
    assert (done["Status"], Decimal(done["Refund"])) == ("Expired", fee)
    assert _found(flexible, other, FULL_POOL, start, 1) == 1  # another account finds it at once
    after = flexible.sagemaker(team).describe_training_plan(TrainingPlanName="whole")
    assert after["Status"] == "Expired" and Decimal(after["UpfrontFee"]) == fee
    refund_line = _ledger(flexible, "team")[-1]
    assert Decimal(refund_line["Amount"]) == fee and "whole" in refund_line["Description"]
    events = flexible.native(team).get("/api/v1/plans/whole/events")["Events"]
    assert [e["Kind"] for e in events].count("returned") == 1


def test_the_refund_follows_the_clock_across_the_thresholds_and_a_budget_grows_by_it(
    flexible: InProcessServer,
) -> None:
    saver = flexible.new_account("saver", PaymentMode="budget")
    flexible.native().call("PATCH", "/api/v1/accounts/saver", body={"Budget": "100000.00"})
    start = boundary_after(service_now(flexible) + timedelta(days=9))
    fee = Decimal(_buy(flexible, saver, "later", 4, start, 2)["UpfrontFee"])

    flexible.set_clock(start - timedelta(days=7, minutes=1))
    assert Decimal(_quote(flexible, saver, "later", Segment=1)["Refund"]) == fee
    flexible.set_clock(start - timedelta(days=7) + timedelta(minutes=1))
    assert Decimal(_quote(flexible, saver, "later", Segment=1)["Refund"]) == fee / 2
    flexible.set_clock(start - timedelta(days=3))
    quote = _quote(flexible, saver, "later", Segment=1)
    assert Decimal(quote["Refund"]) == fee / 2

    budget_before = Decimal(_ledger(flexible, "saver")[-1]["BudgetAfter"])
    assert Decimal(_return(flexible, saver, quote["QuoteId"])["Refund"]) == fee / 2
    line = _ledger(flexible, "saver")[-1]
    assert Decimal(line["Amount"]) == fee / 2
    assert Decimal(line["BudgetAfter"]) == budget_before + fee / 2
    flexible.set_clock(start + timedelta(hours=1))  # nothing is left to start
    assert flexible.sagemaker(saver).describe_training_plan(TrainingPlanName="later")["Status"] == "Expired"


def test_a_started_segments_tail_refunds_nothing_and_is_free_in_the_calendar_at_once(
    flexible: InProcessServer,
) -> None:
    team, other = flexible.new_account("team"), flexible.new_account("other")
    start = boundary_after(service_now(flexible) + timedelta(days=1))
    _buy(flexible, team, "running", FULL_POOL, start, 2)
    flexible.set_clock(start + timedelta(hours=1))
    second_day = start + timedelta(days=1)
    assert _found(flexible, other, FULL_POOL, second_day, 1) == 0

    quote = _quote(flexible, team, "running", Segment=1, From="next")
    assert quote["Returned"] == [_window(second_day, start + timedelta(days=2), FULL_POOL, "us-west-2a")]
    assert Decimal(quote["Refund"]) == 0
    _refused(
        lambda: _quote(flexible, team, "running", Segment=1, From=(start + timedelta(hours=13)).isoformat()),
        "ValidationException",
        "not on a segment boundary",
    )

    _return(flexible, team, quote["QuoteId"])
    assert _summaries(flexible, team, "running") == [(start, second_day, FULL_POOL)]
    assert _found(flexible, other, FULL_POOL, second_day, 1) == 1
    assert Decimal(_ledger(flexible, "team")[-1]["Amount"]) < 0  # the payment: no refund line was added


def test_k_instances_shrink_the_segment_on_the_wire_and_the_fee_stays_what_was_paid(
    flexible: InProcessServer,
) -> None:
    team = flexible.new_account("team")
    start = boundary_after(service_now(flexible) + timedelta(days=8))
    end = start + timedelta(days=2)
    fee = Decimal(_buy(flexible, team, "shrink", FULL_POOL, start, 2)["UpfrontFee"])
    _refused(
        lambda: _quote(flexible, team, "shrink", Segment=1, Instances=3),
        "ValidationException",
        "would leave 5, a count the fleet does not allow",
    )

    # Through the CLI: quote-return, then return --quote.
    quoted = flexible.cli(
        "plans", "quote-return", "shrink", "--segment", "1", "--instances", "4", "--json", credentials=team
    )
    quote = json.loads(quoted.stdout)
    assert Decimal(quote["Refund"]) == fee / 2
    done = json.loads(
        flexible.cli("plans", "return", "--quote", quote["QuoteId"], "--json", credentials=team).stdout
    )
    assert done["RefundSettled"] == "ledger"
    assert _summaries(flexible, team, "shrink") == [(start, end, 4)]
    plan = flexible.sagemaker(team).describe_training_plan(TrainingPlanName="shrink")
    assert Decimal(plan["UpfrontFee"]) == fee

    # K of a started segment: it keeps its count up to the next boundary, the rest is a new segment.
    flexible.set_clock(start + timedelta(hours=1))
    second_day = start + timedelta(days=1)
    quote = _quote(flexible, team, "shrink", Segment=1, Instances=2)
    assert Decimal(quote["Refund"]) == 0
    assert [s["InstanceCount"] for s in quote["Segments"]] == [4, 2]
    _return(flexible, team, quote["QuoteId"])
    assert _summaries(flexible, team, "shrink") == [(start, second_day, 4), (second_day, end, 2)]


def test_a_stale_quote_is_a_conflict_and_a_quote_is_used_once(flexible: InProcessServer) -> None:
    team, other = flexible.new_account("team"), flexible.new_account("other")
    start = boundary_after(service_now(flexible) + timedelta(days=8))
    _buy(flexible, team, "kept", 4, start, 1)

    expired = _quote(flexible, team, "kept", Segment=1, Instances=2)
    flexible.advance_clock("10m1s")
    _refused(lambda: _return(flexible, team, expired["QuoteId"]), "ConflictException", "stale", "new quote")

    first = _quote(flexible, team, "kept", Segment=1, Instances=2)
    second = _quote(flexible, team, "kept")
    _refused(lambda: _return(flexible, other, first["QuoteId"]), "ResourceNotFound")  # not theirs
    _return(flexible, team, first["QuoteId"])
    _refused(lambda: _return(flexible, team, second["QuoteId"]), "ConflictException", "stale", "changed")
    _refused(lambda: _return(flexible, team, first["QuoteId"]), "ConflictException", "already used")
    assert _summaries(flexible, team, "kept") == [(start, start + timedelta(days=1), 2)]


def test_a_strict_fleet_refuses_a_quote_naming_its_policy(strict: InProcessServer) -> None:
    team = strict.new_account("team")
    start = boundary_after(service_now(strict) + timedelta(days=8))
    _buy(strict, team, "final", 1, start, 1)
    _refused(lambda: _quote(strict, team, "final"), "ValidationException", "strict", "allows no returns")


def test_a_job_on_a_returned_tail_is_sent_back_at_the_new_reclaim_time(flexible: InProcessServer) -> None:
    _make_dataset(flexible)
    team = ADMIN  # the job's account: its own plan
    start = boundary_after(service_now(flexible) + timedelta(days=1))
    arn = _buy(flexible, team, "trainer", 1, start, 2)["TrainingPlanArn"]
    flexible.sagemaker().create_training_job(**_sleeper("sleeper", plan=arn))
    flexible.set_clock(start)
    _wait_status(flexible, "sleeper", "Training")

    quote = _quote(flexible, team, "trainer", Segment=1, From="next")
    _return(flexible, team, quote["QuoteId"])
    flexible.set_clock(start + timedelta(days=1, minutes=-31))
    assert _describe(flexible, "sleeper")["SecondaryStatus"] == "Training"
    flexible.set_clock(start + timedelta(days=1, minutes=-30))  # the new end's reclaim time
    job = _wait_status(flexible, "sleeper", "Interrupted")
    stopping = [t["StatusMessage"] for t in job["SecondaryStatusTransitions"] if t["Status"] == "Stopping"]
    assert "It was the plan's last segment" in stopping[0], stopping


def test_a_refund_to_a_plan_awaiting_approval_makes_its_invoice_smaller_then_cancels_it(
    flexible: InProcessServer,
) -> None:
    team = flexible.new_account("waiting", PaymentMode="approval")
    start = boundary_after(service_now(flexible) + timedelta(days=8))
    fee = Decimal(_buy(flexible, team, "unpaid", 4, start, 1)["UpfrontFee"])

    def invoice() -> tuple[Decimal, str]:
        [found] = flexible.native().get("/api/v1/invoices", account="waiting")["Invoices"]
        return Decimal(found["Amount"]), found["Status"]

    assert invoice() == (fee, "Pending")
    done = _return(flexible, team, _quote(flexible, team, "unpaid", Segment=1, Instances=2)["QuoteId"])
    assert (Decimal(done["Refund"]), done["RefundSettled"]) == (fee / 2, "invoice reduced")
    assert invoice() == (fee / 2, "Pending")
    done = _return(flexible, team, _quote(flexible, team, "unpaid")["QuoteId"])
    assert (done["Status"], done["RefundSettled"]) == ("Expired", "invoice cancelled")
    assert invoice() == (fee / 2, "Failed")
    assert _ledger(flexible, "waiting") == []  # nothing was paid, so nothing is paid back


def test_returned_capacity_bought_by_another_account_credits_the_returner_its_share_once(
    flexible: InProcessServer,
) -> None:
    """The whole pool is booked, so what one team gives back is what another team's booking needs: the
    returning team is credited the flexible policy's resale share (half) of what it paid for those
    instance-hours, once, and a later booking of capacity the pool has of its own credits nothing."""
    team, other = flexible.new_account("team"), flexible.new_account("other")
    start = boundary_after(service_now(flexible) + timedelta(days=3))
    fee = Decimal(_buy(flexible, team, "given-back", FULL_POOL, start, 1)["UpfrontFee"])
    _buy(flexible, flexible.new_account("filler"), "second-zone", 4, start, 1)  # us-west-2b's 4: taken
    quote = _quote(flexible, team, "given-back", Segment=1, Instances=4)
    refund = Decimal(_return(flexible, team, quote["QuoteId"])["Refund"])
    assert refund == fee / 4  # 4 of 8 instances, 3 days ahead: half of their half of the fee
    credits_before = [e for e in _ledger(flexible, "team") if "Resale" in e["Description"]]
    assert credits_before == []

    # Only the 4 returned instances are free that day, in us-west-2a: the offering says so, a quarter off
    # (resale_discount), and the plan bought from it costs that.
    window = {"StartTimeAfter": start.timestamp(), "EndTimeBefore": (start + timedelta(days=1)).timestamp()}
    searched = flexible.native(other).post(
        "/api/v1/training-plan-offerings/search",
        {
            "InstanceTypes": [{"InstanceType": P5}],
            "InstanceCount": 4,
            "DurationHours": 24,
            "TargetResources": ["training-job"],
            **window,
        },
    )["TrainingPlanOfferings"][0]
    assert searched["PriceMultipliers"] == ["0.75"]
    list_price = fee / 2  # what the returning team paid for 4 of its 8 instances that day
    second_hand = _buy(flexible, other, "second-hand", 4, start, 1)
    assert second_hand["ReservedCapacitySummaries"][0]["AvailabilityZone"] == "us-west-2a"
    assert Decimal(second_hand["UpfrontFee"]) == list_price * Decimal("0.75")
    # The credit is settled at once by the lifecycle loop, in a transaction of its own.
    credits = wait_until(
        lambda: [e for e in _ledger(flexible, "team") if "Resale" in e["Description"]], timeout=30
    )
    assert len(credits) == 1
    paid_for_them = fee / 2  # the returned 4 of 8 instances for the whole day
    assert Decimal(credits[0]["Amount"]) == paid_for_them / 2  # the resale share, 0.5
    assert refund + Decimal(credits[0]["Amount"]) <= fee

    # Returned again and bought again: the same instance-hours are never credited twice.
    flexible.set_clock(start - timedelta(days=2))
    again = _quote(flexible, other, "second-hand", Segment=1)
    _return(flexible, other, again["QuoteId"])
    _buy(flexible, other, "third-hand", 4, start, 1)
    assert len([e for e in _ledger(flexible, "team") if "Resale" in e["Description"]]) == 1
    # A day the pool has room of its own costs the list price.
    later = start + timedelta(days=5)
    assert Decimal(_buy(flexible, other, "first-hand", 4, later, 1)["UpfrontFee"]) == list_price
