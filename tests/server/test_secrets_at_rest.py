"""Secrets at rest: the store keeps access-key and webhook secrets sealed under the master key file.

A copy of the database files alone reveals none of them; a rotated master key keeps every key signing
requests that work (boto3 against a real server); a plain-text store of the previous version is sealed
at its first start on this one and its keys keep working; a sealed store without its key file refuses to
start, saying why.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import text

from hyperplan.app import AppConfig, Application
from hyperplan.cli.client import ApiError
from hyperplan.errors import MasterKeyUnavailable
from hyperplan.services.webhooks import webhooks
from hyperplan.signing import Credentials
from hyperplan.store.db import Database
from hyperplan.store.master_key import KEY_FILE_NAME
from hyperplan.store.schema import Webhook
from hyperplan.store.urls import sqlite_url
from tests.harness import ADMIN, BIN, free_port, unisolated
from tests.inprocess import InProcessServer

SMALL_FLEET = Path(__file__).parent.parent / "fleets" / "small.toml"
DATABASE_FILES = ("hyperplan.db", "hyperplan.db-wal", "hyperplan.db-shm")
NOWHERE = "http://127.0.0.1:9/hook"  # registered, never delivered to: no plan events in these tests


def database_bytes(data_dir: Path) -> bytes:
    """What a copy of the database files holds (the write-ahead log too, if there is one)."""
    return b"".join((data_dir / name).read_bytes() for name in DATABASE_FILES if (data_dir / name).exists())


def assert_reveals_none(data_dir: Path, secrets: list[str]) -> None:
    raw = database_bytes(data_dir)
    assert raw, "no database file to scan"
    shown = [secret for secret in secrets if secret.encode() in raw]
    assert not shown, f"the database files hold {len(shown)} secrets in plain text"


def works(server: InProcessServer, credentials: Credentials) -> bool:
    try:
        server.sagemaker(credentials).list_training_plans()
    except ClientError as error:
        assert error.response["Error"]["Code"] in ("UnrecognizedClientException", "InvalidSignatureException")
        return False
    return True


def test_a_copy_of_the_database_reveals_no_secret(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=SMALL_FLEET).start()
    keys = [server.new_account(f"tenant-{i}") for i in range(3)]
    extra = server.native().post("/api/v1/accounts/tenant-0/keys")
    hook = server.native().post("/api/v1/webhooks", {"Account": "tenant-1", "Url": NOWHERE})
    secrets = [ADMIN.secret_key, *(key.secret_key for key in keys), extra["SecretAccessKey"], hook["Secret"]]
    assert all(works(server, key) for key in keys)
    assert_reveals_none(server.data_dir, secrets)  # while it runs
    server.stop()
    assert_reveals_none(server.data_dir, secrets)  # and once it has stopped
    key_file = server.data_dir / KEY_FILE_NAME
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_after_rotating_the_master_key_every_key_still_signs_requests(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    server = fast_server_factory(data_dir=tmp_path / "data", fleet=SMALL_FLEET).start()
    tenants = [server.new_account(f"rotating-{i}") for i in range(2)]
    revoked = server.new_account("revoked-one")
    server.native().post("/api/v1/accounts/revoked-one/keys")  # the account's last key is never deleted
    server.native().delete(f"/api/v1/keys/{revoked.access_key}")
    hook = server.native().post("/api/v1/webhooks", {"Account": "rotating-0", "Url": NOWHERE})
    key_file = server.data_dir / KEY_FILE_NAME
    old_key = key_file.read_bytes().strip()

    with pytest.raises(ApiError, match="not an administrator"):
        server.native(tenants[0]).post("/api/v1/master-key/rotate")
    rotated = server.cli("accounts", "rotate-master-key", "--json")
    assert '"AccessKeysResealed"' in rotated.stdout and '"WebhooksResealed": 1' in rotated.stdout

    new_key = key_file.read_bytes().strip()
    assert new_key != old_key and b"\n" not in new_key  # the old key is gone from the file
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert all(works(server, key) for key in [ADMIN, *tenants])
    assert not works(server, revoked)
    assert _signing_secret(server, int(hook["WebhookId"])) == hook["Secret"]
    _assert_sealed_under(server.data_dir, new_key, not_under=old_key)
    raw = database_bytes(server.data_dir)
    assert len(_tokens_opened_by(new_key, raw)) >= 5  # the scan finds tokens where they are
    assert not _tokens_opened_by(old_key, raw)  # and none of the old key's, not even in a free page

    server.restart()  # a fresh start reads the new key file
    assert all(works(server, key) for key in [ADMIN, *tenants])
    assert _signing_secret(server, int(hook["WebhookId"])) == hook["Secret"]


def _signing_secret(server: InProcessServer, webhook_id: int) -> str:
    assert server.runtime is not None
    context = server.runtime.context
    with context.db.read() as session:
        hook = session.get(Webhook, webhook_id)
        assert hook is not None
        return webhooks.signing_secret(hook, context.secret_box)


def _tokens_opened_by(key: bytes, raw: bytes) -> list[bytes]:
    """Every Fernet token anywhere in `raw` that `key` opens. A record stores its columns side by side, so
    a token may run on into the next column's text: each candidate is tried at every length a token may
    have (a multiple of 4), longest first."""
    opened = []
    for candidate in re.findall(rb"gAAAAA[A-Za-z0-9_=-]+", raw):
        for length in range(len(candidate) - len(candidate) % 4, 99, -4):
            with contextlib.suppress(InvalidToken):
                Fernet(key).decrypt(candidate[:length])
                opened.append(candidate[:length])
                break
    return opened


def _assert_sealed_under(data_dir: Path, key: bytes, *, not_under: bytes) -> None:
    database = Database(sqlite_url(data_dir))
    try:
        with database.read() as session:
            tokens = session.execute(text("SELECT secret_access_key FROM access_keys")).scalars().all()
            tokens += session.execute(text("SELECT secret FROM webhooks")).scalars().all()
    finally:
        database.close()
    for token in tokens:
        Fernet(key).decrypt(token.encode())
        with pytest.raises(InvalidToken):
            Fernet(not_under).decrypt(token.encode())


# -- a store of the previous version -------------------------------------------------------------------

TENANT = Credentials("AKHPPLAINTENANT00001", "plain-tenant-secret-0000000000000000000x")
PLAIN_HOOK_SECRET = "whsec_plain-text-webhook-secret-of-the-previous-version"
MADE_AT = 1_796_083_200_000_000  # 2026-12-01T00:00Z in microseconds, as the store keeps instants


def make_previous_version_store(data_dir: Path) -> None:
    """A store as the version before sealed secrets left it: the schema at revision 0005, two accounts
    whose keys and a webhook whose secret are in plain text."""
    data_dir.mkdir(parents=True)
    database = Database(sqlite_url(data_dir))
    try:
        database.migrate("0005")
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
            session.execute(
                text(
                    "INSERT INTO webhooks (account_id, url, secret, created_at) "
                    "VALUES ('100000000002', :url, :secret, :at)"
                ),
                {"url": NOWHERE, "secret": PLAIN_HOOK_SECRET, "at": MADE_AT},
            )
    finally:
        database.close()
    assert ADMIN.secret_key.encode() in database_bytes(data_dir)  # the test's premise: plain text


def test_a_plain_text_store_of_the_previous_version_is_sealed_and_its_keys_keep_working(
    fast_server_factory: type[InProcessServer], tmp_path: Path
) -> None:
    data_dir = tmp_path / "old"
    make_previous_version_store(data_dir)
    server = fast_server_factory(data_dir=data_dir, fleet=SMALL_FLEET).start()
    assert works(server, ADMIN) and works(server, TENANT)
    assert server.native(TENANT).get("/api/v1/whoami")["AccountName"] == "old-tenant"
    assert _signing_secret(server, 1) == PLAIN_HOOK_SECRET
    assert_reveals_none(data_dir, [ADMIN.secret_key, TENANT.secret_key, PLAIN_HOOK_SECRET])
    server.restart()  # sealed once: a second start opens what the first sealed
    assert works(server, ADMIN) and works(server, TENANT)
    server.stop()
    assert_reveals_none(data_dir, [ADMIN.secret_key, TENANT.secret_key, PLAIN_HOOK_SECRET])


# -- a sealed store without its key --------------------------------------------------------------------


def sealed_store(data_dir: Path, key_file: Path | None = None) -> None:
    application = Application(
        AppConfig(data_dir=data_dir, fleet_path=SMALL_FLEET, key_file=key_file, **unisolated(data_dir))
    )
    try:
        application.bootstrap()
    finally:
        application.stop()


def serve_output(data_dir: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """`hyperplan serve` on the data directory: its exit status and what it printed (it must not start)."""
    process = subprocess.run(
        [
            *(str(BIN / "hyperplan"), "serve", "--port", str(free_port()), "--data-dir", str(data_dir)),
            *("--isolation", "none", "--work-dir", str(data_dir.with_name(data_dir.name + "-work"))),
        ],
        env={**os.environ, "COLUMNS": "400", **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return process.returncode, " ".join((process.stdout + process.stderr).split())


def test_a_sealed_store_without_its_key_file_refuses_to_start_saying_why(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    sealed_store(data_dir)
    key_file = data_dir / KEY_FILE_NAME
    kept = tmp_path / "kept.key"
    key_file.rename(kept)

    status, output = serve_output(data_dir)
    assert status == 2, output
    assert f"MasterKeyUnavailable: The master key file {key_file} does not exist." in output
    assert "restore the key file from its backup" in output
    assert not key_file.exists()  # no new key made over a store that needs the old one

    other = tmp_path / "other.key"
    other.write_bytes(Fernet.generate_key() + b"\n")
    status, output = serve_output(data_dir, {"HYPERPLAN_KEY_FILE": str(other)})
    assert status == 2, output
    assert f"The master key file {other} does not open this store's secrets" in output

    key_file.mkdir()  # unreadable as a file, even by root
    with pytest.raises(MasterKeyUnavailable, match=r"Cannot read the master key file .*directory"):
        Application(AppConfig(data_dir=data_dir, fleet_path=SMALL_FLEET, **unisolated(data_dir))).open()
    key_file.rmdir()

    kept.rename(key_file)  # restored from its backup: the store opens again
    application = Application(AppConfig(data_dir=data_dir, fleet_path=SMALL_FLEET, **unisolated(data_dir)))
    try:
        assert application.open().secret_box.path == key_file
    finally:
        application.stop()


def test_servers_sharing_a_database_name_one_key_file(tmp_path: Path) -> None:
    shared_key = tmp_path / "keys" / "shared.key"
    data_dir = tmp_path / "data"
    sealed_store(data_dir, key_file=shared_key)
    assert shared_key.stat().st_mode & 0o777 == 0o600
    assert not (data_dir / KEY_FILE_NAME).exists()
    with pytest.raises(MasterKeyUnavailable, match="does not exist"):
        Application(AppConfig(data_dir=data_dir, fleet_path=SMALL_FLEET, **unisolated(data_dir))).open()
    second = Application(
        AppConfig(data_dir=data_dir, fleet_path=SMALL_FLEET, key_file=shared_key, **unisolated(data_dir))
    )
    try:
        assert second.open().secret_box.keys == [shared_key.read_bytes().strip()]
    finally:
        second.stop()
