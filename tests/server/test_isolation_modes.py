"""Isolation as a server shows it without root: /healthz and the start's warning in mode none, the modes
of DATA_DIR and its files, the work directory's refusals, and `accounts delete`. (Mode users, with real
OS users, is tests/server/test_isolation.py, which needs root.)"""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from hyperplan.cli.client import ApiError
from hyperplan.store.master_key import KEY_FILE_NAME
from tests.harness import ADMIN, BIN, Server, free_port, service_now


def _healthz(server: Server) -> dict[str, object]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/healthz")
        return dict(json.loads(connection.getresponse().read()))
    finally:
        connection.close()


def test_a_server_in_mode_none_says_so_and_keeps_its_data_directory_to_itself(server: Server) -> None:
    assert _healthz(server)["isolation"] == "none"
    assert "accounts are NOT isolated from each other or from the server" in server.log()
    server.native().get("/api/v1/accounts")  # a write-ahead log and its index exist by now
    data = server.data_dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    server_files = ["hyperplan.db", "hyperplan.db-wal", "hyperplan.db-shm", "credentials", KEY_FILE_NAME]
    modes = {name: stat.S_IMODE((data / name).stat().st_mode) for name in server_files}
    assert modes == dict.fromkeys(server_files, 0o600)
    assert stat.S_IMODE(server.work_dir.stat().st_mode) == 0o711


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hyperplan"), "serve", "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=120,
        # A bare environment (no HYPERPLAN_ settings of the caller's), but the code under test: a
        # worktree run with PYTHONPATH would otherwise test the installed tree.
        env={"COLUMNS": "400", "PATH": "/usr/bin:/bin"}
        | {name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
    )


def test_a_work_directory_inside_the_data_directory_refuses_the_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    refused = _serve("--data-dir", str(data), "--isolation", "none", "--work-dir", str(data / "work"))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    said = " ".join(refused.stderr.split())
    assert f"StartRefused: work directory {data / 'work'}: it lies inside the data directory" in said
    assert not (data / "work").exists()


def test_an_unknown_isolation_mode_refuses_the_start(tmp_path: Path) -> None:
    refused = _serve("--data-dir", str(tmp_path / "data"), "--isolation", "both")
    assert refused.returncode == 2
    assert "isolation mode 'both': give 'users' or 'none'" in " ".join(refused.stderr.split())


# -- accounts delete ------------------------------------------------------------------------------------


def test_an_account_with_nothing_open_is_deleted_its_keys_revoked(fast_server: Server) -> None:
    gone = fast_server.new_account("gone")
    admin = fast_server.native()
    fast_server.native(gone).get("/api/v1/whoami")
    result = json.loads(fast_server.cli("accounts", "delete", "gone", "--json").stdout)
    assert (result["Name"], result["Deleted"], result["OsUser"]) == ("gone", True, None)  # mode none
    with pytest.raises(ApiError) as refused:
        fast_server.native(gone).get("/api/v1/whoami")
    assert refused.value.code == "UnrecognizedClientException"
    assert "gone" not in [a["Name"] for a in admin.get("/api/v1/accounts")["Accounts"]]
    assert admin.get(f"/api/v1/accounts/{result['AccountId']}/ledger")["Entries"] == []  # its books stay
    with pytest.raises(ApiError) as again:
        admin.delete("/api/v1/accounts/gone")
    assert again.value.code == "ResourceNotFound"


def test_an_account_is_not_deleted_while_it_has_work_or_by_itself(fast_server: Server) -> None:
    team = fast_server.new_account("team")
    client = fast_server.sagemaker(team)
    start = service_now(fast_server) + timedelta(days=1)
    offering = client.search_training_plan_offerings(
        InstanceType="ml.p5.48xlarge",
        InstanceCount=1,
        DurationHours=24,
        TargetResources=["training-job"],
        StartTimeAfter=start,
    )["TrainingPlanOfferings"][0]
    client.create_training_plan(
        TrainingPlanName="busy", TrainingPlanOfferingId=offering["TrainingPlanOfferingId"]
    )
    with pytest.raises(ApiError) as refused:
        fast_server.native().delete("/api/v1/accounts/team")
    assert refused.value.code == "ResourceInUse"
    assert "Account 'team' still has work that has not ended: plan busy." in refused.value.message
    fast_server.native(team).get("/api/v1/whoami")  # nothing changed
    with pytest.raises(ApiError) as itself:
        fast_server.native().delete("/api/v1/accounts/admin")
    assert "cannot delete itself" in itself.value.message
    with pytest.raises(ApiError) as not_admin:
        fast_server.native(team).delete("/api/v1/accounts/admin")
    assert not_admin.value.code == "AccessDeniedException"


def test_an_administrator_names_an_existing_os_user_never_root(fast_server: Server) -> None:
    named = fast_server.native().post("/api/v1/accounts", {"Name": "named", "OsUser": "nobody"})
    listed = {a["Name"]: a for a in fast_server.native().get("/api/v1/accounts")["Accounts"]}
    assert listed["named"]["OsUser"] == "nobody" and listed["admin"]["OsUser"] is None
    assert "nobody" in fast_server.cli("accounts", "list").stdout
    for user, why in (("root", "uid 0"), ("hp-nobody-here", "does not exist")):
        with pytest.raises(ApiError) as refused:
            fast_server.native().post("/api/v1/accounts", {"Name": "other", "OsUser": user})
        assert refused.value.code == "ValidationException" and why in refused.value.message
    assert named["AccountName"] == "named"
    assert ADMIN.access_key  # the administrator keeps its keys throughout
