"""Registry credentials: set by an administrator through our CLI (the password on standard input), sealed
under the master key, listed without the password, opened for the runtime that pulls an image, sealed
again by a master-key rotation; refused to anyone else, and for a HOST that is not one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from hyperplan.cli.client import ApiError
from hyperplan.services.accounts.registry_credentials import RegistryLogin, login_for
from tests.inprocess import InProcessServer

HOST = "registry.example.com:5000"
PASSWORD = "reg-password-7f3a9c1e5b2d8f4a6c0e"  # distinctive: a scan of the database files would find it
DATABASE_FILES = ("hyperplan.db", "hyperplan.db-wal", "hyperplan.db-shm")


def database_bytes(data_dir: Path) -> bytes:
    """What a copy of the database files holds (the write-ahead log too, if there is one)."""
    raw = b"".join((data_dir / name).read_bytes() for name in DATABASE_FILES if (data_dir / name).exists())
    assert raw, "no database file to scan"
    return raw


def assert_sealed_at_rest(server: InProcessServer) -> None:
    """The stored column holds a Fernet token, and (on SQLite) no byte of the files holds the password."""
    assert server.runtime is not None
    with server.runtime.context.db.read() as session:
        stored = session.execute(text("SELECT password FROM registry_credentials")).scalars().all()
    assert stored and all(token.startswith("gAAAAA") and PASSWORD not in token for token in stored)
    if server.database_url is None:  # SQLite: the files a copy of the data directory would hold
        assert PASSWORD.encode() not in database_bytes(server.data_dir)


def login(server: InProcessServer, host: str) -> RegistryLogin | None:
    """What the container runtime gets for `host`, from the running server's store and key."""
    assert server.runtime is not None
    context = server.runtime.context
    return login_for(context.db, context.secret_box, host)


def set_credentials(server: InProcessServer, host: str, password: str, **extra: object) -> dict[str, object]:
    done = server.cli(
        "registries", "set-credentials", host, "--username", "puller", "--password-stdin", "--json",
        stdin=password + "\n",
    )  # fmt: skip
    assert password not in done.stdout + done.stderr
    return dict(json.loads(done.stdout))


def listed(server: InProcessServer) -> dict[str, dict[str, object]]:
    shown = server.cli("registries", "list", "--json").stdout
    assert PASSWORD not in shown
    return {entry["Host"]: entry for entry in json.loads(shown)}


def test_credentials_are_stored_sealed_listed_without_the_password_and_survive_a_rotation(
    fast_server: InProcessServer,
) -> None:
    server = fast_server
    assert set_credentials(server, HOST, PASSWORD)["Username"] == "puller"

    registries = listed(server)
    assert registries[HOST]["Username"] == "puller" and registries[HOST]["CredentialsSetAt"]
    assert (registries[HOST]["Insecure"], registries[HOST]["InFleet"]) == (False, False)
    dev = registries["127.0.0.1:5000"]  # the demo fleet's [registries."127.0.0.1:5000"]
    assert (dev["Insecure"], dev["InFleet"], dev["Username"]) == (True, True, None)
    table = server.cli("registries", "list").stdout
    assert HOST in table and "puller" in table and "http (insecure)" in table and PASSWORD not in table

    assert login(server, HOST) == RegistryLogin("puller", PASSWORD)
    assert login(server, "Registry.Example.com:5000") == RegistryLogin("puller", PASSWORD)  # case
    assert login(server, "127.0.0.1:5000") is None  # pulled anonymously
    assert PASSWORD not in repr(login(server, HOST))  # never into a log or a traceback
    assert_sealed_at_rest(server)

    rotated = json.loads(server.cli("accounts", "rotate-master-key", "--json").stdout)
    assert rotated["RegistryCredentialsResealed"] == 1
    assert login(server, HOST) == RegistryLogin("puller", PASSWORD)
    assert_sealed_at_rest(server)
    server.stop()
    if server.database_url is None:
        assert PASSWORD.encode() not in database_bytes(server.data_dir)  # nothing left in a log either
    server.start()  # a fresh start reads the new key file
    assert login(server, HOST) == RegistryLogin("puller", PASSWORD)

    set_credentials(server, HOST, "a-new-token")  # setting again replaces them
    assert login(server, HOST) == RegistryLogin("puller", "a-new-token")
    deleted = server.cli("registries", "delete-credentials", HOST)
    assert f"Deleted the credentials of {HOST}" in deleted.stdout
    assert login(server, HOST) is None and HOST not in listed(server)
    again = server.cli("registries", "delete-credentials", HOST, check=False)
    assert again.returncode == 1 and f"ResourceNotFound: No credentials are stored for registry {HOST}" in (
        " ".join(again.stderr.split())
    )

    audit = server.native().get("/api/v1/audit")["Events"]
    actions = [(e["Action"], e["Target"]) for e in audit if e["Action"].startswith("registry.")]
    assert actions == [
        ("registry.set-credentials", HOST),
        ("registry.set-credentials", HOST),
        ("registry.delete-credentials", HOST),
    ]
    assert "a-new-token" not in json.dumps(audit) and PASSWORD not in json.dumps(audit)


def test_only_administrators_set_list_or_delete_credentials(fast_server: InProcessServer) -> None:
    tenant = fast_server.new_account("registry-tenant")
    for args, stdin in (
        (("set-credentials", HOST, "--username", "u", "--password-stdin"), PASSWORD),
        (("list",), None),
        (("delete-credentials", HOST), None),
    ):
        refused = fast_server.cli("registries", *args, credentials=tenant, check=False, stdin=stdin)
        assert refused.returncode == 1, refused
        assert "AccessDenied" in refused.stderr and "not an administrator" in refused.stderr, refused.stderr
    assert login(fast_server, HOST) is None


@pytest.mark.parametrize(
    "host",
    ["registry.example.com/team", "bad host", "registry.example.com:99999", "https://registry.example.com"],
)
def test_a_host_that_is_not_a_registry_is_refused_saying_so(fast_server: InProcessServer, host: str) -> None:
    refused = fast_server.cli(
        "registries",
        "set-credentials",
        host,
        "--username",
        "u",
        "--password-stdin",
        stdin=PASSWORD,
        check=False,
    )
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and f"'{host}' is not a registry" in said, said
    assert "HOST" in said  # the argument it is about
    # The server refuses it too, whoever sends it.
    with pytest.raises(ApiError) as caught:
        fast_server.native().post(
            "/api/v1/registries/bad%20host/credentials", {"Username": "u", "Password": PASSWORD}
        )
    assert (
        caught.value.code == "ValidationException" and "'bad host' is not a registry" in caught.value.message
    )
    assert fast_server.native().get("/api/v1/registries")["Registries"][0]["Username"] is None


def test_the_password_comes_on_standard_input_only(fast_server: InProcessServer) -> None:
    no_flag = fast_server.cli("registries", "set-credentials", HOST, "--username", "u", check=False)
    assert no_flag.returncode == 2 and "give the password on standard input" in " ".join(
        no_flag.stderr.split()
    )
    empty = fast_server.cli(
        "registries", "set-credentials", HOST, "--username", "u", "--password-stdin", stdin="\n", check=False
    )
    assert empty.returncode == 2 and "standard input is empty" in " ".join(empty.stderr.split())
    assert login(fast_server, HOST) is None
