"""Accounts: the bootstrap administrator, creating accounts and keys, revoking keys, admin-only rules."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from hyperplan.cli.client import ApiError
from hyperplan.signing import Credentials
from tests.harness import ADMIN, BIN, Server


def test_first_start_writes_the_administrators_credentials_file(server: Server) -> None:
    path = server.data_dir / "credentials"
    parsed = configparser.ConfigParser()
    parsed.read(path)
    assert parsed["hyperplan"]["aws_access_key_id"] == ADMIN.access_key
    assert parsed["hyperplan"]["aws_secret_access_key"] == ADMIN.secret_key
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert "credentials" in server.log()


def test_without_bootstrap_variables_the_first_start_makes_keys_that_work(
    server_factory: type[Server], tmp_path: Path
) -> None:
    data_dir = tmp_path / "fresh"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPLAN_BOOTSTRAP")}
    server = server_factory(data_dir=data_dir, bootstrap=False).start()
    # `aws` with nothing but the credentials file the server wrote
    aws_env = {
        **env,
        "AWS_SHARED_CREDENTIALS_FILE": str(data_dir / "credentials"),
        "AWS_PROFILE": "hyperplan",
        "AWS_CONFIG_FILE": os.devnull,
    }
    aws_env.pop("AWS_ACCESS_KEY_ID", None)
    aws_env.pop("AWS_SECRET_ACCESS_KEY", None)
    out = subprocess.run(
        [str(BIN / "aws"), "sagemaker", "list-training-plans", "--endpoint-url", server.url],
        env=aws_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"TrainingPlanSummaries": []}
    # and our CLI finds the same file through --data-dir
    cli = subprocess.run(
        [
            str(BIN / "hyperplan"),
            "accounts",
            "list",
            "--json",
            "--data-dir",
            str(data_dir),
            "--endpoint-url",
            server.url,
        ],
        env=aws_env | {"AWS_PROFILE": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert "admin" in [a["Name"] for a in json.loads(cli.stdout)]


def test_create_account_prints_its_id_and_keys_as_json(fast_shared_server: Server) -> None:
    out = fast_shared_server.cli("accounts", "create", "vision-team", "--json")
    created = json.loads(out.stdout)
    assert set(created) == {"AccountId", "AccessKeyId", "SecretAccessKey"}
    assert len(created["AccountId"]) == 12 and created["AccountId"].isdigit()
    team = Credentials(created["AccessKeyId"], created["SecretAccessKey"])
    assert fast_shared_server.native(team).get("/api/v1/whoami")["AccountId"] == created["AccountId"]
    listed = json.loads(fast_shared_server.cli("accounts", "list", "--json").stdout)
    assert created["AccountId"] in {a["AccountId"] for a in listed}


def test_accounts_list_prints_a_table(fast_shared_server: Server) -> None:
    fast_shared_server.new_account("table-team")
    out = fast_shared_server.cli("accounts", "list").stdout
    assert "table-team" in out and "admin" in out


def test_an_account_can_hold_several_keys_and_lose_one(fast_shared_server: Server) -> None:
    first = fast_shared_server.new_account("two-keys")
    added = json.loads(fast_shared_server.cli("accounts", "add-key", "two-keys", "--json").stdout)
    second = Credentials(added["AccessKeyId"], added["SecretAccessKey"])
    fast_shared_server.cli("accounts", "revoke-key", first.access_key)
    assert fast_shared_server.sagemaker(second).list_training_plans()["TrainingPlanSummaries"] == []
    with pytest.raises(ClientError):
        fast_shared_server.sagemaker(first).list_training_plans()


def test_duplicate_account_names_are_refused(fast_shared_server: Server) -> None:
    fast_shared_server.new_account("twice")
    with pytest.raises(ApiError) as exc:
        fast_shared_server.new_account("twice")
    assert exc.value.code == "ResourceInUse"


def test_only_administrators_manage_accounts(fast_shared_server: Server) -> None:
    team = fast_shared_server.new_account("not-admin")
    with pytest.raises(ApiError) as exc:
        fast_shared_server.native(team).post("/api/v1/accounts", {"Name": "sneaky"})
    assert exc.value.code == "AccessDeniedException"
    refused = fast_shared_server.cli("accounts", "list", credentials=team, check=False)
    assert refused.returncode == 1
    assert "AccessDeniedException" in refused.stderr


def test_bad_account_names_are_refused_with_the_rule(fast_shared_server: Server) -> None:
    with pytest.raises(ApiError) as exc:
        fast_shared_server.new_account("Bad Name!")
    assert exc.value.code == "ValidationException"
    assert "lowercase" in exc.value.message
