"""The cancellation policy shown with every offering and plan (issue 53; docs/RETURNS.md), through the
native API and the `hyperplan` command against an in-process server.

On the demo fleet (`flexible`) the native search gives each offering its pool's `CancellationPolicy`,
the plan route gives a plan's, `GET /api/v1/cancellation-policies` every pool's; `hyperplan plans search`
prints the words once (the offerings share them) and `plans show` prints them with the plan. On a fleet
file without [cancellation] everything says "No returns (strict: ...)" and has no tiers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.core.cancellation_words import policy_json
from hyperplan.signing import Credentials
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"
SEARCH_ROUTE = "/api/v1/training-plan-offerings/search"
STRICT_WORDS = "No returns (strict: as SageMaker, plans are final)"
SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"  # no [cancellation]: strict


def _search_body(count: int = 1) -> dict[str, Any]:
    return {
        "InstanceTypes": [{"InstanceType": P5, "InstanceCount": count}],
        "DurationHours": 48,
        "TargetResources": ["training-job"],
    }


def _buy(server: InProcessServer, credentials: Credentials, name: str) -> str:
    client = server.sagemaker(credentials)
    offering = client.search_training_plan_offerings(
        InstanceType=P5, InstanceCount=1, DurationHours=48, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    created = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    return str(created["TrainingPlanArn"])


def _expected(server: InProcessServer, zone: str) -> dict[str, Any]:
    """The policy of P5's pool in `zone` as the fleet file made it, in the API's JSON."""
    assert server.runtime is not None
    return policy_json(server.runtime.context.fleet.cancellation_for(P5, zone))


def test_each_offering_and_plan_carries_its_pools_policy(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    team = server.new_account("shown-team")
    native = server.native(team)
    offerings = native.post(SEARCH_ROUTE, _search_body())["TrainingPlanOfferings"]
    assert offerings
    for offering in offerings:
        zone = offering["ReservedCapacityOfferings"][0]["AvailabilityZone"]
        assert offering["CancellationPolicy"] == _expected(server, zone)
    policy = offerings[0]["CancellationPolicy"]
    assert policy["Name"] == "flexible" and policy["Tiers"] == [
        {"BeforeSeconds": 7 * 24 * 3600, "Fraction": "1"},
        {"BeforeSeconds": 0, "Fraction": "0.5"},
    ]
    assert policy["Description"].startswith("Full refund up to 7 days before a segment starts, 50% up to")

    arn = _buy(server, team, "shown-plan")
    described = server.sagemaker(team).describe_training_plan(TrainingPlanName="shown-plan")
    for ref in ("shown-plan", arn):  # by name or by ARN: the same plan
        plan = native.get(f"/api/v1/training-plans/{ref}")
        assert plan["TrainingPlanArn"] == arn and plan["UpfrontFee"] == described["UpfrontFee"]
        zone = plan["ReservedCapacitySummaries"][0]["AvailabilityZone"]
        assert plan["CancellationPolicy"] == _expected(server, zone)
        assert [s["CancellationPolicy"] for s in plan["ReservedCapacitySummaries"]] == [
            _expected(server, s["AvailabilityZone"]) for s in described["ReservedCapacitySummaries"]
        ]
    # The routes under a plan's path are still theirs, not the plan's.
    assert native.get("/api/v1/training-plans/shown-plan/lending")["Mode"] == "none"

    fleet = native.get("/api/v1/cancellation-policies")
    assert fleet["Default"]["Name"] == "flexible"
    p5_pools = [pool for pool in fleet["Pools"] if pool["InstanceType"] == P5]
    assert len(p5_pools) == 3  # the demo's three zones
    for pool in p5_pools:
        assert pool["CancellationPolicy"] == _expected(server, pool["AvailabilityZone"])


def test_another_accounts_plan_is_not_found(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    owner = server.new_account("policy-owner")
    _buy(server, owner, "owned")
    with pytest.raises(ApiError) as refused:
        server.native(server.new_account("policy-stranger")).get("/api/v1/training-plans/owned")
    assert refused.value.code == "ResourceNotFound"


def test_the_cli_prints_the_policy_with_the_offerings_and_the_plan(
    fast_shared_server: InProcessServer,
) -> None:
    server = fast_shared_server
    team = server.new_account("shown-cli")
    words = _expected(server, "us-west-2a")["Description"]
    search = (
        "plans",
        "search",
        "--instance-type",
        P5,
        "--count",
        "1",
        "--days",
        "2",
        "--target",
        "training-job",
    )
    printed = " ".join(server.cli(*search, credentials=team).stdout.split())
    assert printed.count("Returns: ") == 1 and f"Returns: {' '.join(words.split())}" in printed
    as_json = json.loads(server.cli(*search, "--json", credentials=team).stdout)
    assert as_json and all(o["CancellationPolicy"]["Name"] == "flexible" for o in as_json)
    # Several types: the native search, whose offerings carry the policy themselves.
    across = " ".join(
        server.cli(*search, "--instance-type", "ml.trn2.48xlarge", credentials=team).stdout.split()
    )
    assert "ml.trn2.48xlarge" in across and across.count("Returns: ") == 1

    _buy(server, team, "shown-cli-plan")
    shown = " ".join(server.cli("plans", "show", "shown-cli-plan", credentials=team).stdout.split())
    assert "returns: " in shown and "Full refund up to 7 days" in shown
    shown_json = json.loads(server.cli("plans", "show", "shown-cli-plan", "--json", credentials=team).stdout)
    assert shown_json["CancellationPolicy"]["Name"] == "flexible"


def test_under_strict_no_offering_or_plan_can_be_returned(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    server = fast_server_factory(data_dir=tmp_path / "strict", fleet=SMALL_FLEET).start()
    team = server.new_account("strict-team")
    native = server.native(team)
    offerings = native.post(SEARCH_ROUTE, _search_body())["TrainingPlanOfferings"]
    assert offerings
    for offering in offerings:
        policy = offering["CancellationPolicy"]
        assert (policy["Name"], policy["Tiers"], policy["Description"]) == ("strict", [], STRICT_WORDS)

    _buy(server, team, "final")
    assert native.get("/api/v1/training-plans/final")["CancellationPolicy"]["Description"] == STRICT_WORDS
    assert native.get("/api/v1/cancellation-policies")["Default"]["Description"] == STRICT_WORDS
    printed = " ".join(server.cli("plans", "show", "final", credentials=team).stdout.split())
    assert f"returns: {STRICT_WORDS}" in printed
