"""Users and self-service keys: an account's team rotates its keys and manages its users without an
administrator; at most two keys a user; never the account's last active key nor its last owner; a key
that stops working stops at once; plan events name the user who acted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from sqlalchemy import text

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from hyperplan.store.db import Database
from hyperplan.store.urls import sqlite_url
from tests.harness import ADMIN
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"


def refused(server: InProcessServer, credentials: Credentials) -> str:
    """The SageMaker API's answer to a key that should sign nothing (real boto3)."""
    with pytest.raises(ClientError) as exc:
        server.sagemaker(credentials).list_training_plans()
    return str(exc.value.response["Error"]["Code"])


def key_of(answer: dict[str, str]) -> Credentials:
    return Credentials(answer["AccessKeyId"], answer["SecretAccessKey"])


def api_error(call: object) -> ApiError:
    assert callable(call)
    with pytest.raises(ApiError) as exc:
        call()
    return exc.value


def test_an_account_rotates_its_key_with_the_cli_and_no_administrator(
    fast_shared_server: InProcessServer,
) -> None:
    server = fast_shared_server
    old = server.new_account("rotating")  # the administrator's last part: the account exists
    created = json.loads(server.cli("keys", "create", "--json", credentials=old).stdout)
    assert created["UserName"] == "rotating" and created["Status"] == "Active"
    new = key_of(created)
    # The new key works at once, for the real aws CLI, and is who whoami says.
    assert server.aws("sagemaker", "list-training-plans", credentials=new) == {"TrainingPlanSummaries": []}
    assert server.native(new).get("/api/v1/whoami")["AccessKeyId"] == new.access_key
    listed = json.loads(server.cli("keys", "list", "--json", credentials=new).stdout)
    assert {k["AccessKeyId"]: k["Status"] for k in listed} == {
        old.access_key: "Active",
        new.access_key: "Active",
    }
    assert all("SecretAccessKey" not in k for k in listed)  # never shown again

    out = server.cli("keys", "deactivate", old.access_key, credentials=new).stdout
    assert f"Access key {old.access_key} of user rotating deactivated." in out
    assert refused(server, old) == "UnrecognizedClientException"  # at once: no cache lag on this server
    server.cli("keys", "delete", old.access_key, credentials=new)
    assert refused(server, old) == "UnrecognizedClientException"
    assert [k["AccessKeyId"] for k in server.native(new).get("/api/v1/keys")["AccessKeys"]] == [
        new.access_key
    ]
    assert server.sagemaker(new).list_training_plans()["TrainingPlanSummaries"] == []


def test_two_keys_a_user_and_never_the_accounts_last_active_key(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    first = server.new_account("two-at-most")
    team = server.native(first)
    second = key_of(team.post("/api/v1/keys"))
    third = api_error(lambda: team.post("/api/v1/keys"))
    assert third.code == "ResourceLimitExceeded"
    assert "already has 2 access keys, the most a user may hold (2" in third.message
    # The second key deactivated: the first is the last active one, and neither goes.
    team.post(f"/api/v1/keys/{second.access_key}/deactivate")
    assert refused(server, second) == "UnrecognizedClientException"
    account = next(
        a for a in server.native().get("/api/v1/accounts")["Accounts"] if a["Name"] == "two-at-most"
    )
    assert {k["AccessKeyId"]: k["Status"] for k in account["AccessKeys"]} == {
        first.access_key: "Active",
        second.access_key: "Inactive",
    }
    for method, path in (
        ("POST", f"/api/v1/keys/{first.access_key}/deactivate"),
        ("DELETE", f"/api/v1/keys/{first.access_key}"),
    ):
        error = api_error(lambda m=method, p=path: team.call(m, p))
        assert (
            error.code == "ConflictException" and "last active key of account 'two-at-most'" in error.message
        )
    # Not even an administrator takes it away.
    assert (
        api_error(lambda: server.native().delete(f"/api/v1/keys/{first.access_key}")).code
        == "ConflictException"
    )
    team.post(f"/api/v1/keys/{second.access_key}/activate")
    assert server.sagemaker(second).list_training_plans()["TrainingPlanSummaries"] == []
    team.delete(f"/api/v1/keys/{first.access_key}")  # now it may go
    assert refused(server, first) == "UnrecognizedClientException"


def test_owners_manage_users_and_a_deleted_users_keys_stop_at_once(
    fast_shared_server: InProcessServer,
) -> None:
    server = fast_shared_server
    alice = server.new_account("owned")
    owner = server.native(alice)
    assert owner.get("/api/v1/whoami") | {"UserName": "owned", "Owner": True} == owner.get("/api/v1/whoami")
    made = json.loads(server.cli("users", "create", "bob", "--json", credentials=alice).stdout)
    assert made["User"]["Owner"] is False and made["AccessKey"]["UserName"] == "bob"
    bob = key_of(made["AccessKey"])
    colleague = server.native(bob)
    assert colleague.get("/api/v1/whoami")["UserName"] == "bob"
    # bob manages his own keys, not users nor the owner's keys.
    for call in (
        lambda: colleague.post("/api/v1/users", {"UserName": "eve"}),
        lambda: colleague.get("/api/v1/users"),
        lambda: colleague.delete(f"/api/v1/keys/{alice.access_key}"),
        lambda: colleague.get("/api/v1/keys", user="owned"),
    ):
        error = api_error(call)
        assert error.code == "AccessDeniedException" and "user 'bob' is not one" in error.message
    # Another account's owner learns nothing of this one's keys or users.
    stranger = server.native(server.new_account("stranger"))
    assert api_error(lambda: stranger.delete(f"/api/v1/keys/{bob.access_key}")).code == "ResourceNotFound"
    assert api_error(lambda: stranger.get("/api/v1/users", account="owned")).code == "AccessDeniedException"
    # The owner sees everyone; an administrator may act on the account by name.
    users = {u["UserName"]: u for u in owner.get("/api/v1/users")["Users"]}
    assert users["owned"]["Owner"] and users["bob"]["ActiveKeys"] == 1
    server.native().post("/api/v1/users", {"UserName": "carol", "Owner": True, "Account": "owned"})
    owner.delete("/api/v1/users/bob")
    assert refused(server, bob) == "UnrecognizedClientException"
    table = server.cli("users", "list", credentials=alice).stdout
    assert "carol" in table and "bob" not in table
    # carol, an owner an administrator made, may go; then the last owner may not.
    server.native().call("DELETE", "/api/v1/users/carol", query={"account": "owned"})
    error = api_error(lambda: owner.delete("/api/v1/users/owned"))
    assert error.code == "ConflictException" and "last owner of account 'owned'" in error.message


def test_plan_events_name_the_user_who_bought_and_who_cancelled(fast_shared_server: InProcessServer) -> None:
    server = fast_shared_server
    owner = server.new_account("buyers")
    buyer = key_of(server.native(owner).post("/api/v1/users", {"UserName": "dana"})["AccessKey"])
    sagemaker = server.sagemaker(buyer)
    offering = sagemaker.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge", InstanceCount=1, DurationHours=24, TargetResources=["training-job"]
    )["TrainingPlanOfferings"][0]
    sagemaker.create_training_plan(
        TrainingPlanName="named", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    server.native().post("/api/v1/accounts/buyers/plans/named/cancel", {"Reason": "tidy up"})
    events = server.native(owner).get("/api/v1/plans/named/events")["Events"]
    by_kind = {e["Kind"]: e["User"] for e in events}
    assert by_kind["created"] == {"UserName": "dana", "AccountName": "buyers"}
    assert by_kind["cancelled"] == {"UserName": "admin", "AccountName": "admin"}
    history = server.cli("plans", "events", "named", credentials=owner).stdout
    assert "dana (buyers)" in history and "admin (admin)" in history


# -- a store made before users -------------------------------------------------------------------------

TENANT = Credentials("AKHPOLDTENANT0000001", "old-tenant-secret-00000000000000000000x")
MADE_AT = 1_796_083_200_000_000  # 2026-12-01T00:00Z in microseconds, as the store keeps instants


def test_a_store_of_the_previous_version_gives_each_account_an_owner_holding_its_keys(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    data_dir = tmp_path / "old"
    data_dir.mkdir()
    database = Database(sqlite_url(data_dir))
    try:
        database.migrate("0011")
        with database.write() as session:
            for account_id, name, admin, key in (
                ("100000000001", "admin", True, ADMIN),
                ("100000000002", "old-tenant", False, TENANT),
            ):
                session.execute(
                    text(
                        "INSERT INTO accounts (id, name, is_admin, created_at, payment_mode, budget) "
                        "VALUES (:id, :name, :admin, :at, 'auto', '0')"
                    ),
                    {"id": account_id, "name": name, "admin": admin, "at": MADE_AT},
                )
                session.execute(
                    text(
                        "INSERT INTO access_keys (access_key_id, secret_access_key, account_id, created_at) "
                        "VALUES (:key, :secret, :account, :at)"
                    ),
                    {"key": key.access_key, "secret": key.secret_key, "account": account_id, "at": MADE_AT},
                )
    finally:
        database.close()
    server = fast_server_factory(data_dir=data_dir, fleet=SMALL_FLEET).start()
    tenant = server.native(TENANT)
    assert tenant.get("/api/v1/whoami") | {"UserName": "old-tenant", "Owner": True} == tenant.get(
        "/api/v1/whoami"
    )
    assert [(k["AccessKeyId"], k["Status"]) for k in tenant.get("/api/v1/keys")["AccessKeys"]] == [
        (TENANT.access_key, "Active")
    ]
    second = key_of(tenant.post("/api/v1/keys"))
    assert server.sagemaker(second).list_training_plans()["TrainingPlanSummaries"] == []
