"""A plan's lending policy through the native API and the plan's tag (issue 51, point 1), against an
in-process server on the manual clock (tests/inprocess.py).

The owner sets, reads and clears it; values out of bounds are refused naming the member and write
nothing; another account's plan is not found, by name or ARN; an administrator reaches any plan by ARN
and alone sees the borrowers' runs. The tag `hyperplan:lending` at CreateTrainingPlan (boto3) sets the
same policy, and a bad value is a ValidationException that buys nothing. The figures are read from spot
runs written into the store here: the spot scheduler that writes them is another part of the issue.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from botocore.exceptions import ClientError
from sqlalchemy import select

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from hyperplan.store.schema import Account, SpotRun, TrainingJob, TrainingPlan
from tests.harness import ADMIN, service_now
from tests.inprocess import InProcessServer

P5 = "ml.p5.48xlarge"
TAG = "hyperplan:lending"
SECOND = timedelta(seconds=1)
FIGURES_NONE = {
    "LentNow": 0,
    "LentInstanceHours": 0.0,
    "Reclaims": 0,
    "PromisesKept": 0,
    "PromisesBroken": 0,
    "Credited": "0.00",
}


@pytest.fixture
def team(fast_shared_server: InProcessServer, request: pytest.FixtureRequest) -> Credentials:
    """An account of this test's own (the plans' pool is the server's, shared by the module)."""
    name = "lender-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[-40:].strip("-")
    return fast_shared_server.new_account(name)


def _offering(server: InProcessServer, credentials: Credentials, target: str = "training-job") -> str:
    found = server.sagemaker(credentials).search_training_plan_offerings(
        InstanceType=P5, InstanceCount=2, DurationHours=24, TargetResources=[target]
    )["TrainingPlanOfferings"][0]
    return str(found["TrainingPlanOfferingId"])


def _buy(
    server: InProcessServer,
    credentials: Credentials,
    name: str,
    target: str = "training-job",
    tags: list[dict[str, str]] | None = None,
) -> str:
    client = server.sagemaker(credentials)
    offering = _offering(server, credentials, target)
    created = client.create_training_plan(
        TrainingPlanName=name, TrainingPlanOfferingId=offering, **({"Tags": tags} if tags else {})
    )
    return str(created["TrainingPlanArn"])


def _path(plan: str) -> str:
    return f"/api/v1/training-plans/{plan}/lending"


def _refused(call: Callable[[], Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call()
    return caught.value


def _kinds(server: InProcessServer, account: str, plan: str, kind: str) -> list[str]:
    events = server.native().get(f"/api/v1/plans/{plan}/events", account=account)["Events"]
    return [e["Message"] for e in events if e["Kind"] == kind]


def test_the_owner_sets_reads_and_clears_the_policy(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    account = server.native(team).get("/api/v1/whoami")["AccountName"]
    arn = _buy(server, team, "lends")
    owner = server.native(team)

    shown = owner.get(_path("lends"))
    assert shown == {
        "TrainingPlanName": "lends",
        "Mode": "none",
        "NoticeSeconds": None,
        "MinRunSeconds": None,
        "StopMarginSeconds": None,
        **FIGURES_NONE,
        "CurrencyCode": "USD",
    }  # no "Runs": the owner is no administrator

    # Every member left out: the fleet's defaults ([spot]).
    lent = owner.call("PUT", _path("lends"), body={})
    assert (lent["Mode"], lent["NoticeSeconds"], lent["MinRunSeconds"], lent["StopMarginSeconds"]) == (
        "idle",
        120,
        300,
        900,
    )
    changed = owner.call("PUT", _path("lends"), body={"Notice": 45, "MinRun": 0, "StopMargin": 3600})
    assert (changed["NoticeSeconds"], changed["MinRunSeconds"], changed["StopMarginSeconds"]) == (45, 0, 3600)
    assert owner.get(_path(arn)) == changed  # by ARN as by name: the same plan
    assert len(_kinds(server, account, "lends", "lending.policy")) == 2
    assert "45 s of notice" in _kinds(server, account, "lends", "lending.policy")[-1]
    # The same policy again changes nothing, and says nothing.
    owner.call("PUT", _path("lends"), body={"Notice": 45, "MinRun": 0, "StopMargin": 3600})
    assert len(_kinds(server, account, "lends", "lending.policy")) == 2

    cleared = owner.delete(_path("lends"))
    assert cleared["Mode"] == "none" and cleared["NoticeSeconds"] is None
    assert owner.get(_path("lends"))["Mode"] == "none"
    assert (
        _kinds(server, account, "lends", "lending.policy")[-1] == "Lending stopped: the plan lends nothing."
    )
    assert owner.delete(_path("lends"))["Mode"] == "none"  # nothing to stop is fine

    actions = [
        (record["Action"], record["Detail"])
        for record in server.native().get("/api/v1/audit", account=account)["Events"]
        if record["Action"].startswith("plan.lending")
    ]
    assert actions == [
        (
            "plan.lending-set",
            {"Mode": "idle", "NoticeSeconds": 120, "MinRunSeconds": 300, "StopMarginSeconds": 900},
        ),
        (
            "plan.lending-set",
            {"Mode": "idle", "NoticeSeconds": 45, "MinRunSeconds": 0, "StopMarginSeconds": 3600},
        ),
        ("plan.lending-clear", {"Mode": "none"}),
    ]


def test_values_out_of_bounds_are_refused_by_name_and_write_nothing(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    _buy(server, team, "bounded", target="hyperpod-cluster")
    owner = server.native(team)
    owner.call("PUT", _path("bounded"), body={"Notice": 30})
    before = owner.get(_path("bounded"))
    for body, message in (
        ({"Notice": 0}, "Notice (0) must be at least 1 second."),
        ({"Notice": 601}, "Notice (601) is longer than the fleet's longest notice, 600 seconds."),
        ({"MinRun": 604_801}, "MinRun (604801) is longer than the longest allowed, 604800 seconds."),
        (
            {"StopMargin": 10**12},
            "StopMargin must be a whole number from 0 to 2147483647, not 1000000000000.",
        ),
        ({"StopMargin": -1}, "StopMargin must be a whole number from 0 to 2147483647, not -1."),
        ({"Notice": "60"}, "Notice must be a whole number from 0 to 2147483647"),
    ):
        error = _refused(partial(owner.call, "PUT", _path("bounded"), body=body))
        assert (error.status, error.code) == (400, "ValidationException"), error
        assert error.message.startswith(message), error.message
    assert "Mode" in _refused(partial(owner.call, "PUT", _path("bounded"), body={"Mode": "idle"})).message
    assert owner.get(_path("bounded")) == before


def test_an_ended_plan_lends_nothing_but_may_stop(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    account = server.native(team).get("/api/v1/whoami")["AccountName"]
    _buy(server, team, "ending")
    server.native(team).call("PUT", _path("ending"), body={})
    server.native().post(f"/api/v1/accounts/{account}/plans/ending/cancel", {"Reason": "test"})
    error = _refused(partial(server.native(team).call, "PUT", _path("ending"), body={"Notice": 60}))
    assert error.message == "Training plan ending is Failed: it has nothing left to lend."
    assert server.native(team).delete(_path("ending"))["Mode"] == "none"


def test_another_accounts_plan_is_not_found_and_an_administrator_reaches_it_by_arn(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    arn = _buy(server, team, "guarded")
    server.native(team).call("PUT", _path("guarded"), body={"Notice": 90})
    before = server.native(team).get(_path("guarded"))
    other = server.native(server.new_account("lending-intruder"))
    for plan in ("guarded", arn):
        for method in ("GET", "PUT", "DELETE"):
            body = {"Notice": 10} if method == "PUT" else None
            error = _refused(partial(other.call, method, _path(plan), body=body))
            assert (error.code, error.message) == (
                "ResourceNotFound",
                f"Training plan {plan} does not exist.",
            )
    assert server.native(team).get(_path("guarded")) == before

    admin = server.native(ADMIN)
    seen = admin.get(_path(arn))
    assert seen["NoticeSeconds"] == 90 and seen["Runs"] == []
    assert admin.call("PUT", _path(arn), body={"Notice": 15})["NoticeSeconds"] == 15
    assert server.native(team).get(_path("guarded"))["NoticeSeconds"] == 15
    # By name, an administrator names a plan of its own account: there is none of that name.
    assert _refused(lambda: admin.get(_path("guarded"))).code == "ResourceNotFound"


# -- the figures, from spot runs written into the store ------------------------------------------------


def _write_runs(
    server: InProcessServer, plan_name: str, borrower: str, now: datetime, job_name: str = "borrowed-job"
) -> None:
    """Five runs of one borrower's job on the plan: two ended without a reclaim or kept their promise,
    one broke it (gone after its deadline plus the fleet's 10 s grace), two still hold instances, one of
    them past its deadline plus the grace (broken too)."""
    assert server.runtime is not None
    runtime = server.runtime.context
    with runtime.db.write() as session:
        plan = session.scalars(select(TrainingPlan).where(TrainingPlan.name == plan_name)).one()
        account = session.scalars(select(Account).where(Account.name == borrower)).one()
        job = TrainingJob(
            account_id=account.id,
            name=job_name,
            instance_type=P5,
            instance_count=3,
            status="Completed",
            secondary_status="Completed",
            request="{}",
            created_at=now - timedelta(hours=6),
            updated_at=now,
            spot=True,
            max_wait_seconds=86_400,
        )
        session.add(job)
        session.flush()
        hour, minute = timedelta(hours=1), timedelta(minutes=1)
        runs = [  # count, started, ended, requested, deadline, credited
            (2, now - 5 * hour, now - 4 * hour, None, None, "1.50"),
            (
                1,
                now - 4 * hour,
                now - 3 * hour,
                now - 3 * hour - 100 * SECOND,
                now - 3 * hour + 20 * SECOND,
                "0.25",
            ),
            (
                1,
                now - 3 * hour,
                now - 2 * hour,
                now - 2 * hour - 200 * SECOND,
                now - 2 * hour - 80 * SECOND,
                "0.30",
            ),
            (3, now - 30 * minute, None, None, None, "0"),
            (1, now - 2 * hour, None, now - 10 * minute, now - 8 * minute, "0"),
        ]
        for attempt, (count, started, ended, asked, deadline, credited) in enumerate(runs, start=1):
            session.add(
                SpotRun(
                    job_id=job.id,
                    attempt=attempt,
                    account_id=account.id,
                    plan_id=plan.id,
                    owner_account_id=plan.account_id,
                    instance_type=P5,
                    availability_zone="us-west-2a",
                    count=count,
                    price_per_instance_hour=Decimal("10.00"),
                    currency="USD",
                    lender_share=Decimal("0.8"),
                    started_at=started,
                    ended_at=ended,
                    reclaim_reason="" if asked is None else "owner-job",
                    reclaim_requested_at=asked,
                    reclaim_deadline=deadline,
                    credited=Decimal(credited),
                    settled=ended is not None,
                )
            )


def test_the_owner_sees_counts_and_an_administrator_the_runs(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    arn = _buy(server, team, "counted")
    server.new_account("lending-borrower")
    now = service_now(server)
    _write_runs(server, "counted", "lending-borrower", now)

    owner = server.native(team).get(_path("counted"))
    # 2x1h + 1x1h + 1x1h ended; 3x0.5h and 1x2h open until now.
    expected = {
        "LentNow": 4,
        "LentInstanceHours": 7.5,
        "Reclaims": 3,
        "PromisesKept": 1,
        "PromisesBroken": 2,
        "Credited": "2.05",
    }
    assert {key: owner[key] for key in expected} == expected
    assert "Runs" not in owner
    shown = repr(owner)
    assert "borrowed-job" not in shown and "lending-borrower" not in shown

    admin = server.native(ADMIN).get(_path(arn))
    assert {key: admin[key] for key in expected} == expected
    assert [(r["TrainingJobName"], r["AccountName"], r["InstanceCount"]) for r in admin["Runs"]] == [
        ("borrowed-job", "lending-borrower", 1),
        ("borrowed-job", "lending-borrower", 3),
        ("borrowed-job", "lending-borrower", 1),
        ("borrowed-job", "lending-borrower", 1),
        ("borrowed-job", "lending-borrower", 2),
    ]  # newest first
    reclaims = [(r["ReclaimReason"], r["NoticeSeconds"], r["OwnerHadSeconds"]) for r in admin["Runs"]]
    assert reclaims == [
        ("owner-job", 120, None),  # still holding its instances
        ("", None, None),
        ("owner-job", 120, 200),  # broken: 200 s is past 120 s and the 10 s grace
        ("owner-job", 120, 100),  # kept
        ("", None, None),
    ]
    assert admin["Runs"][1]["EndTime"] is None
    first_start = datetime.fromisoformat(admin["Runs"][4]["StartTime"])
    assert abs(first_start - (now - timedelta(hours=5))) < SECOND


# -- the tag ---------------------------------------------------------------------------------------------


def test_the_tag_at_create_sets_the_policy_and_a_bad_one_buys_nothing(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    client = server.sagemaker(team)
    offering = _offering(server, team)
    for value, message in (
        ("idle notice=900", f"Tag {TAG}: notice=900 is longer than the fleet's longest notice, 600 seconds."),
        ("lend", f"Tag {TAG}: 'lend' is not a lending mode"),
    ):
        with pytest.raises(ClientError) as refused:
            client.create_training_plan(
                TrainingPlanName="tagged",
                TrainingPlanOfferingId=offering,
                Tags=[{"Key": TAG, "Value": value}],
            )
        error = refused.value.response["Error"]
        assert error["Code"] == "ValidationException" and error["Message"].startswith(message), error
        assert client.list_training_plans()["TrainingPlanSummaries"] == []  # nothing bought

    # The same offering is still there to buy, with a good value.
    tags = [{"Key": TAG, "Value": "idle notice=60 margin=1200"}, {"Key": "team", "Value": "vision"}]
    arn = client.create_training_plan(TrainingPlanName="tagged", TrainingPlanOfferingId=offering, Tags=tags)[
        "TrainingPlanArn"
    ]
    shown = server.native(team).get(_path("tagged"))
    assert (shown["Mode"], shown["NoticeSeconds"], shown["MinRunSeconds"], shown["StopMarginSeconds"]) == (
        "idle",
        60,
        300,
        1200,
    )
    assert {"Key": TAG, "Value": "idle notice=60 margin=1200"} in client.list_tags(ResourceArn=arn)["Tags"]


def test_add_tags_sets_or_clears_and_delete_tags_stops_lending(
    fast_shared_server: InProcessServer, team: Credentials
) -> None:
    server = fast_shared_server
    client = server.sagemaker(team)
    arn = _buy(server, team, "retagged")
    owner = server.native(team)

    client.add_tags(ResourceArn=arn, Tags=[{"Key": TAG, "Value": "idle min-run=60"}])
    assert owner.get(_path("retagged"))["MinRunSeconds"] == 60
    with pytest.raises(ClientError) as refused:
        client.add_tags(
            ResourceArn=arn, Tags=[{"Key": "team", "Value": "nlp"}, {"Key": TAG, "Value": "idle notice=0"}]
        )
    assert refused.value.response["Error"]["Message"] == f"Tag {TAG}: notice=0 must be at least 1 second."
    assert owner.get(_path("retagged"))["MinRunSeconds"] == 60  # unchanged, and no tag written
    assert client.list_tags(ResourceArn=arn)["Tags"] == [{"Key": TAG, "Value": "idle min-run=60"}]

    client.add_tags(ResourceArn=arn, Tags=[{"Key": TAG, "Value": "none"}])
    assert owner.get(_path("retagged"))["Mode"] == "none"
    client.add_tags(ResourceArn=arn, Tags=[{"Key": TAG, "Value": "idle"}])
    assert owner.get(_path("retagged"))["Mode"] == "idle"
    client.delete_tags(ResourceArn=arn, TagKeys=["team"])  # another key: lending goes on
    assert owner.get(_path("retagged"))["Mode"] == "idle"
    client.delete_tags(ResourceArn=arn, TagKeys=[TAG])
    assert owner.get(_path("retagged"))["Mode"] == "none"
