"""Per-account request rate limits: a flood from one account is throttled while another is served."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from hyperplan.store.changes import CALENDAR
from tests.harness import ADMIN, REGION, Credentials, Server, healthy, wait_until
from tests.inprocess import InProcessServer

FLEETS = Path(__file__).parent.parent / "fleets"
P5 = "ml.p5.48xlarge"
SEARCH = {"InstanceType": P5, "InstanceCount": 1, "DurationHours": 24, "TargetResources": ["training-job"]}
# Slow refill, so that what a test sees does not depend on how fast this machine runs it.
TIGHT = """
[rate_limits]
search = { rate = 0.01, burst = 3 }
read = { rate = 0.01, burst = 4 }
"""


@pytest.fixture
def tight(fast_server_factory: type[InProcessServer], tmp_path: Path) -> InProcessServer:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text((FLEETS / "small.toml").read_text() + TIGHT)
    return fast_server_factory(data_dir=tmp_path / "data", fleet=fleet).start()


SHARED_BURST = 6  # the search burst of an account limited by `limited_account`


def limited_account(server: Server, name: str) -> Credentials:
    """A new account whose searches are limited on its own: SHARED_BURST at once, then one per 100 s
    (slow enough that no token comes back while a test runs)."""
    credentials = server.new_account(name)
    limits = {"search": {"Rate": 0.01, "Burst": SHARED_BURST}}
    server.native().call("PATCH", f"/api/v1/accounts/{name}", body={"RateLimits": limits})
    return credentials


def searches(client: Any, count: int) -> list[str]:
    """What each of ``count`` searches got: "ok" or the error's code."""
    outcomes = []
    for _ in range(count):
        try:
            client.search_training_plan_offerings(**SEARCH)
            outcomes.append("ok")
        except ClientError as error:
            outcomes.append(error.response["Error"]["Code"])
    return outcomes


def test_a_flood_from_one_account_is_throttled_while_another_is_served(tight: InProcessServer) -> None:
    flooder = tight.sagemaker(tight.new_account("flooder"))
    patient = tight.sagemaker(tight.new_account("patient"))
    assert searches(flooder, 6) == ["ok"] * 3 + ["ThrottlingException"] * 3
    # the other account's bucket is its own
    assert searches(patient, 3) == ["ok"] * 3
    # a search and a read are different classes: the flooder may still look at its plans
    assert flooder.list_training_plans()["TrainingPlanSummaries"] == []
    with pytest.raises(ClientError) as refused:
        flooder.search_training_plan_offerings(**SEARCH)
    error = refused.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "'flooder'" in error["Error"]["Message"] and "search" in error["Error"]["Message"]
    assert "0.01/s, burst 3" in error["Error"]["Message"]


def test_administrators_are_never_throttled(tight: InProcessServer) -> None:
    assert searches(tight.sagemaker(), 10) == ["ok"] * 10


def test_the_aws_tools_retry_a_throttled_request_by_themselves(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.toml"
    fleet.write_text(
        (FLEETS / "small.toml").read_text() + "[rate_limits]\nsearch = { rate = 4, burst = 1 }\n"
    )
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=fleet).start()
    key = server.new_account("retrier")
    client = boto3.client(
        "sagemaker",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=key.access_key,
        aws_secret_access_key=key.secret_key,
        config=Config(retries={"mode": "standard", "max_attempts": 10}),
    )
    for _ in range(3):  # the second and third wait for a token; botocore retries ThrottlingException
        assert client.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"]


def test_the_native_api_is_limited_as_reads_and_writes(tight: InProcessServer) -> None:
    native = tight.native(tight.new_account("reader"))
    for _ in range(4):
        native.get("/api/v1/whoami")
    with pytest.raises(ApiError) as refused:
        native.get("/api/v1/whoami")
    assert refused.value.code == "ThrottlingException" and refused.value.status == 400


def test_a_search_across_types_is_limited_as_a_search_and_shares_its_bucket(tight: InProcessServer) -> None:
    """POST /api/v1/training-plan-offerings/search searches, whatever its method says: it takes the
    search bucket's tokens (3 here), which the wire's searches share, not the writes'."""
    searcher = tight.new_account("across")
    native, client = tight.native(searcher), tight.sagemaker(searcher)
    across = {
        "InstanceTypes": [{"InstanceType": P5, "InstanceCount": 1}],
        "DurationHours": 24,
        "TargetResources": ["training-job"],
    }
    for _ in range(2):
        native.call("POST", "/api/v1/training-plan-offerings/search", body=across)
    assert searches(client, 2) == ["ok", "ThrottlingException"]
    with pytest.raises(ApiError) as refused:
        native.call("POST", "/api/v1/training-plan-offerings/search", body=across)
    assert refused.value.code == "ThrottlingException"


def test_an_administrator_gives_one_account_its_own_limits_and_takes_them_back(
    tight: InProcessServer,
) -> None:
    flooder = tight.sagemaker(tight.new_account("busy"))
    assert searches(flooder, 4)[-1] == "ThrottlingException"
    shown = json.loads(
        tight.cli("accounts", "update", "busy", "--rate-limit", "search=1000/1000", "--json").stdout
    )
    assert shown["RateLimits"]["search"] == {"Rate": 1000.0, "Burst": 1000, "Set": "account"}
    assert shown["RateLimits"]["read"] == {"Rate": 0.01, "Burst": 4, "Set": "fleet"}
    assert searches(flooder, 10) == ["ok"] * 10  # at once: the cached signer forgot its old limits
    tight.cli("accounts", "update", "busy", "--rate-limit", "search=default")
    assert "ThrottlingException" in searches(flooder, 4)
    listed = {a["Name"]: a for a in tight.native().get("/api/v1/accounts")["Accounts"]}
    assert listed["busy"]["RateLimits"]["search"]["Set"] == "fleet"


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"search": {"Rate": 0, "Burst": 1}}, "RateLimits.search.Rate"),
        ({"search": {"Rate": 1}}, "RateLimits.search.Burst"),
        ({"search": {"Rate": 1, "Burst": 1, "Per": 2}}, "Per"),
        ({"searches": {"Rate": 1, "Burst": 1}}, "searches"),
        ({"search": "fast"}, "search"),
    ],
)
def test_a_wrong_rate_limit_is_refused_naming_it(
    fast_shared_server: InProcessServer, limits: dict[str, Any], named: str
) -> None:
    with pytest.raises(ApiError) as refused:
        fast_shared_server.native().call("PATCH", "/api/v1/accounts/admin", body={"RateLimits": limits})
    assert refused.value.code == "ValidationException" and named in refused.value.message


def test_the_cli_names_a_malformed_rate_limit(fast_shared_server: InProcessServer) -> None:
    refused = fast_shared_server.cli(
        "accounts", "update", "admin", "--rate-limit", "search=fast", check=False
    )
    assert refused.returncode == 2 and "CLASS=RATE/BURST" in refused.stderr


def test_a_search_waiting_for_the_store_stalls_no_other_request(fast_shared_server: InProcessServer) -> None:
    """Searches are first tried on the event loop (server/loop_or_pool.py); one that must wait (here for a
    lease of its account's tokens, a write, while another connection holds SQLite's write lock) is
    answered in the thread pool instead, and meanwhile a search that needs nothing from the store and a
    request on another connection are answered: the loop never waits."""
    server = fast_shared_server
    assert server.runtime is not None
    limiter = server.runtime.context.rate_limiter
    waiting = limited_account(server, "waiting")  # batches of one token: its first search leases
    patient = boto3.client(  # an administrator: never limited; no retry, a stall fails the test
        "sagemaker",
        endpoint_url=server.url,
        region_name=REGION,
        aws_access_key_id=ADMIN.access_key,
        aws_secret_access_key=ADMIN.secret_key,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=20),
    )
    warm = patient.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"]
    holder = sqlite3.connect(server.data_dir / "hyperplan.db", isolation_level=None)
    outcome: list[str] = []
    holder.execute("BEGIN IMMEDIATE")
    try:
        waiter = threading.Thread(target=lambda: outcome.extend(searches(server.sagemaker(waiting), 1)))
        waiter.start()
        # Its lease has begun (the bucket's lease lock, taken only around the write): it waits for the lock.
        assert wait_until(lambda: any(lock.locked() for lock in limiter._leasing.values()), timeout=30)
        again = patient.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"]
        assert [o["ReservedCapacityOfferings"] for o in again] == [
            o["ReservedCapacityOfferings"] for o in warm
        ]
        assert healthy(server.port)  # a new connection, answered
        assert waiter.is_alive() and outcome == []  # the search that must write still waits
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    waiter.join(60)
    assert outcome == ["ok"]


def test_searches_whose_caches_went_cold_answer_as_before_and_are_admitted_once_each(
    fast_shared_server: InProcessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search first tried on the event loop takes its token there; when the calendar counter moved (as
    another process's booking moves it), its quota check and the calendar must be read again, so it is
    finished in the thread pool instead (server/loop_or_pool.py): the same answer, admitted once, so an
    account gets exactly its burst, as when every search ran in the pool."""
    server = fast_shared_server
    assert server.runtime is not None
    context = server.runtime.context
    limiter = context.rate_limiter
    # Time stands still for the buckets (this process's batches and the store's bucket): no token comes
    # back while the test runs, so the counts are exact whatever the machine's speed.
    monkeypatch.setattr(limiter, "_clock", lambda: 1_000.0)
    assert limiter._store is not None
    monkeypatch.setattr(limiter._store, "_clock", lambda: 1_800_000_000.0)
    burst = 12  # leased in batches of 3: a token taken on the loop from a batch, most searches
    cold = server.new_account("cold")
    limits = {"search": {"Rate": 1000, "Burst": burst}}
    server.native().call("PATCH", "/api/v1/accounts/cold", body={"RateLimits": limits})
    client = server.sagemaker(cold)
    first = client.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"]
    outcomes = ["ok"]
    for _ in range(burst + 2):
        context.db.bump(CALENDAR)  # as a booking by another process moves it
        try:
            again = client.search_training_plan_offerings(**SEARCH)["TrainingPlanOfferings"]
        except ClientError as error:
            outcomes.append(error.response["Error"]["Code"])
            continue
        outcomes.append("ok")
        assert [o["ReservedCapacityOfferings"] for o in again] == [
            o["ReservedCapacityOfferings"] for o in first
        ]
    assert outcomes == ["ok"] * burst + ["ThrottlingException"] * 3
